"""The floor: the least a client can do per job, against the same fake platform.

``python benchmarks/floor_client.py MODE BASE_URL JOBS [LOOPS]`` takes and reports *JOBS*
no-op jobs and prints one JSON line: jobs, seconds, jobs/s and this process's CPU seconds.

* ``raw``: one blocking socket, prebuilt request bytes, minimal response parsing. The
  client costs almost nothing, so this is what the *platform* (and loopback) can serve:
  the ceiling for any worker measured against it.
* ``httpx``: a bare trio + httpx loop (``GET`` job-take, ``POST`` job-done, prebuilt URLs,
  one shared ``AsyncClient``), *LOOPS* of them concurrently: what httpx costs per job with
  no worker logic at all (docs/benchmarks.md, "The floor").
* ``lean``: the same loop on trio_worker's own HTTP client
  (``trio_worker._platform._http.HttpPool``,
  a private API: this mode is for the benchmark only). This is trio_worker's floor: the
  worker minus everything but its HTTP.
"""

from __future__ import annotations

import json
import socket
import sys
import time
from urllib.parse import urlsplit

import httpx
import trio

TAKE = "/v2/test-ep/job-take/w1?gpu=fake-gpu&job_in_progress=0"
DONE = "/v2/test-ep/job-done/w1/{}?gpu=fake-gpu&isStream=false"
RESULT = b'{"output":{"ok":true}}'
AUTH = "fake-key"


def _read_response(sock: socket.socket, buffer: bytearray) -> bytes:
    """Read one HTTP/1.1 response with a Content-Length (or none, for 204); its body."""
    while b"\r\n\r\n" not in buffer:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the platform closed the connection")
        buffer += chunk
    head, _, _ = bytes(buffer).partition(b"\r\n\r\n")
    header_end = len(head) + 4
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(buffer) < header_end + length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the platform closed the connection")
        buffer += chunk
    body = bytes(buffer[header_end : header_end + length])
    del buffer[: header_end + length]
    return body


def run_raw(base_url: str, jobs: int) -> int:
    parts = urlsplit(base_url)
    assert parts.hostname is not None
    assert parts.port is not None
    host = f"{parts.hostname}:{parts.port}"
    take = f"GET {TAKE} HTTP/1.1\r\nHost: {host}\r\nAuthorization: {AUTH}\r\n\r\n".encode()
    done_head = (
        f"POST {DONE} HTTP/1.1\r\nHost: {host}\r\nAuthorization: {AUTH}\r\n"
        f"Content-Length: {len(RESULT)}\r\n\r\n"
    )
    done = 0
    buffer = bytearray()
    with socket.create_connection((parts.hostname, parts.port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while done < jobs:
            sock.sendall(take)
            body = _read_response(sock, buffer)
            if not body:
                break  # 204: the queue is empty
            job_id = json.loads(body)["id"]
            sock.sendall(done_head.format(job_id).encode() + RESULT)
            _read_response(sock, buffer)
            done += 1
    return done


async def run_httpx(base_url: str, jobs: int, loops: int) -> int:
    take_url = base_url + TAKE
    done_url = base_url + DONE
    headers = {"Authorization": AUTH}
    done = 0

    async def loop(client: httpx.AsyncClient) -> None:
        nonlocal done
        while done < jobs:
            response = await client.get(take_url)
            if response.status_code == 204:
                return
            job_id = response.json()["id"]
            await client.post(done_url.format(job_id), content=RESULT)
            done += 1

    limits = httpx.Limits(max_connections=loops, max_keepalive_connections=loops)
    async with httpx.AsyncClient(headers=headers, limits=limits) as client:
        async with trio.open_nursery() as nursery:
            for _ in range(loops):
                nursery.start_soon(loop, client)
    return done


async def run_lean(base_url: str, jobs: int, loops: int) -> int:
    from trio_worker._platform._http import HttpPool

    client = HttpPool({"Authorization": AUTH})
    take_url = base_url + TAKE
    done_url = base_url + DONE
    done = 0

    async def loop() -> None:
        nonlocal done
        while done < jobs:
            [response] = await client.exchange("GET", [(take_url, b"")])
            if response.status == 204:
                return
            job_id = json.loads(response.body)["id"]
            await client.exchange("POST", [(done_url.format(job_id), RESULT)])
            done += 1

    try:
        async with trio.open_nursery() as nursery:
            for _ in range(loops):
                nursery.start_soon(loop)
    finally:
        await client.aclose()
    return done


def main(argv: list[str]) -> int:
    mode, base_url, jobs = argv[1], argv[2].rstrip("/"), int(argv[3])
    loops = int(argv[4]) if len(argv) > 4 else 1
    cpu0, t0 = time.process_time(), time.perf_counter()
    if mode == "raw":
        done = run_raw(base_url, jobs)
    elif mode == "httpx":
        done = trio.run(run_httpx, base_url, jobs, loops)
    elif mode == "lean":
        done = trio.run(run_lean, base_url, jobs, loops)
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    seconds = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    print(
        json.dumps(
            {
                "mode": mode,
                "loops": loops,
                "jobs": done,
                "seconds": seconds,
                "jobs_per_s": done / seconds if seconds > 0 else None,
                "client_cpu_ms_per_job": cpu * 1000 / done if done else None,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
