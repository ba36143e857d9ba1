"""The local endpoint on hypercorn: checks on the head, named hosts, 405, loopback, limits.

Real loopback sockets against ``serve_endpoint`` (the server ``--rp_serve_api`` runs), and
the embedded worker of ``--rp_serve_api`` itself behind an unreachable ``HTTP_PROXY``.
"""

from __future__ import annotations

import functools
import socket
from typing import TYPE_CHECKING

import httpx
import pytest
import trio

from trio_worker._endpoint import EndpointLimits, serve_endpoint
from trio_worker._flags import LocalArgs
from trio_worker._local import _dev_server, local_endpoint_app
from trio_worker._options import worker_options

if TYPE_CHECKING:
    from trio_worker._endpoint import EndpointApp

HUGE = 300 * 1024 * 1024


async def serve(
    nursery: trio.Nursery, app: EndpointApp, limits: EndpointLimits | None = None
) -> int:
    port: int = await nursery.start(
        functools.partial(serve_endpoint, app, "127.0.0.1", 0, limits=limits or EndpointLimits())
    )
    return port


def head_only(port: int, head: bytes, timeout: float = 10.0) -> bytes:
    """Send *head* (no body) and read what comes back until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(head)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
            if b"\r\n\r\n" in answer and b"connection: close" in answer.lower():
                break
        return answer


async def test_worker_routes_check_the_key_before_reading_a_body(nursery: trio.Nursery) -> None:
    port = await serve(nursery, local_endpoint_app("127.0.0.1"))
    head = (
        b"POST /v2/local/job-done/w/j1 HTTP/1.1\r\nhost: 127.0.0.1:%d\r\n"
        b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % (port, HUGE)
    )
    answer = await trio.to_thread.run_sync(head_only, port, head)
    assert answer.startswith(b"HTTP/1.1 401"), answer[:80]


async def test_a_declared_body_past_the_limit_is_refused_on_the_head(
    nursery: trio.Nursery,
) -> None:
    port = await serve(nursery, local_endpoint_app("127.0.0.1"))
    head = (
        b"POST /run HTTP/1.1\r\nhost: 127.0.0.1:%d\r\n"
        b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % (port, HUGE)
    )
    answer = await trio.to_thread.run_sync(head_only, port, head)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:80]


async def test_a_named_host_is_refused_with_how_to_allow_it_then_allowed(
    nursery: trio.Nursery,
) -> None:
    refusing = await serve(nursery, local_endpoint_app("0.0.0.0"))
    allowing = await serve(nursery, local_endpoint_app("0.0.0.0", ("worker",)))
    async with httpx.AsyncClient(timeout=10) as client:
        refused = await client.get(
            f"http://127.0.0.1:{refusing}/health", headers={"host": f"worker:{refusing}"}
        )
        allowed = await client.get(
            f"http://127.0.0.1:{allowing}/health", headers={"host": f"worker:{allowing}"}
        )
    assert refused.status_code == 403
    reason = refused.json()["error"]
    assert "--rp_api_allow_host worker" in reason and "--allow-host worker" in reason
    assert allowed.status_code == 200


async def test_get_runsync_is_405_not_415(nursery: trio.Nursery) -> None:
    port = await serve(nursery, local_endpoint_app("127.0.0.1"))
    async with httpx.AsyncClient(timeout=10) as client:
        answer = await client.get(f"http://127.0.0.1:{port}/runsync")
    assert answer.status_code == 405


async def test_a_head_dripped_past_its_deadline_closes_the_connection(
    nursery: trio.Nursery,
) -> None:
    port = await serve(nursery, local_endpoint_app("127.0.0.1"), EndpointLimits(head_timeout=0.05))

    def drip() -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\n")
            return sock.recv(1024)  # b"" once the server closes it

    assert await trio.to_thread.run_sync(drip) == b""


async def test_a_body_dripped_past_its_deadline_gets_408(nursery: trio.Nursery) -> None:
    port = await serve(nursery, local_endpoint_app("127.0.0.1"), EndpointLimits(body_timeout=0.05))
    head = (
        b"POST /run HTTP/1.1\r\nhost: 127.0.0.1:%d\r\n"
        b"content-type: application/json\r\ncontent-length: 100\r\n\r\n{" % port
    )
    answer = await trio.to_thread.run_sync(head_only, port, head)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:80]


async def test_requests_past_the_cap_get_503(nursery: trio.Nursery) -> None:
    platform = local_endpoint_app("127.0.0.1")
    port = await serve(nursery, platform, EndpointLimits(max_in_flight=1))
    base = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(timeout=10) as client:
        queued = (await client.post(base + "/run", json={"input": {}})).json()["id"]
        assert queued
        holding = trio.Event()

        async def runsync() -> None:
            holding.set()
            with pytest.raises(httpx.ReadError):  # its client closes under it at the end
                await client.post(base + "/runsync?wait=60000", json={"input": {}})

        nursery.start_soon(runsync)
        await holding.wait()
        with trio.fail_after(10):
            while True:  # until the runsync is in flight (no worker: it waits)
                answer = await client.get(base + "/health")
                if answer.status_code == 503:
                    break
                await trio.sleep(0.001)
    assert "too many requests" in answer.json()["error"]


async def test_the_embedded_worker_never_goes_through_a_proxy(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Port 9 (discard) on loopback: nothing listens, every proxied request would fail.
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    options = worker_options(lambda job: {"echo": job["input"]}, capture_logs="off")
    args = LocalArgs(serve_api=True, api_host="127.0.0.1", api_port=port)
    nursery.start_soon(_dev_server, options, args)
    async with httpx.AsyncClient(timeout=30, trust_env=False) as client:
        with trio.fail_after(30):
            while True:
                try:
                    answer = await client.post(
                        f"http://127.0.0.1:{port}/runsync", json={"input": {"n": 1}}
                    )
                    break
                except httpx.ConnectError:
                    await trio.sleep(0.01)
    assert answer.json()["status"] == "COMPLETED", answer.text
    assert answer.json()["output"] == {"echo": {"n": 1}}
    nursery.cancel_scope.cancel()
