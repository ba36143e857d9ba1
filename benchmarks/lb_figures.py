"""Load-balancing endpoints: ``start_app`` beside hypercorn alone and uvicorn alone.

Two figures (docs/benchmarks.md, "Load-balancing endpoints"):

* **requests/s, p50 and p99** of a no-op FastAPI route, through ``start_app``, under
  hypercorn alone and under uvicorn alone (what users run today), measured in alternating
  rounds (``_figures.alternating``: A B C, then C B A, ...), each server started fresh for
  its round. The target: ``start_app`` within 10% of hypercorn alone (the median of the
  rounds' ratios); uvicorn's figure is reported as it is.
* **process start to the first 200 on /ping**, with an initializer that returns at once:
  from ``Popen`` to the first 200, polled every millisecond.

The load: ``CONNECTIONS`` keep-alive connections, each a thread with a blocking socket
sending one request at a time (a client far cheaper per request than the server it
measures), for ``seconds`` per round. ``python benchmarks/lb_figures.py [--quick]`` runs it
alone and prints the table; ``benchmarks/run.py`` runs it among trio_worker's figures.
"""

from __future__ import annotations

import argparse
import functools
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._figures import alternating, round_ratios

HERE = Path(__file__).resolve().parent
SERVER = HERE / "lb_server.py"
MODES = ("start_app", "hypercorn", "uvicorn")
CONNECTIONS = 8
_REQUEST = b"GET /noop HTTP/1.1\r\nhost: bench\r\n\r\n"
_PING = b"GET /ping HTTP/1.1\r\nhost: bench\r\n\r\n"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNPOD_", "PORT"))}
    env["RUNPOD_SKIP_AUTO_SYSTEM_CHECKS"] = "true"
    return env


def _answer(sock: socket.socket, buffer: bytearray) -> tuple[int, bool]:
    """Read one answer (Content-Length framed, as every server here sends): its status,
    and whether the server closes the connection after it (hypercorn does so after
    ``keep_alive_max_requests`` requests on one connection)."""
    while b"\r\n\r\n" not in buffer:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        buffer += chunk
    head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
    length, closing = 0, False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"connection" and b"close" in value.lower():
            closing = True
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        rest += chunk
    buffer[:] = rest[length:]
    return int(head.split(b" ", 2)[1]), closing


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _first_200(port: int, bound: float) -> float:
    """Poll /ping until it answers 200; the monotonic time it did."""
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                sock.sendall(_PING)
                if _answer(sock, bytearray())[0] == 200:
                    return time.monotonic()
        except OSError:
            pass
        time.sleep(0.001)
    raise TimeoutError(f"no 200 on /ping within {bound} s")


class _Server:
    def __init__(self, python: str, mode: str) -> None:
        self.port = _free_port()
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            [python, str(SERVER), mode, str(self.port)],
            env=_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def ready(self) -> float:
        """Seconds from Popen to the first 200 on /ping."""
        try:
            return _first_200(self.port, 60.0) - self.started
        except TimeoutError:
            self.stop()
            assert self.process.stderr is not None
            raise RuntimeError(self.process.stderr.read().decode()[-2000:]) from None

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _load(port: int, seconds: float) -> dict[str, Any]:
    """Requests/s and latency percentiles of CONNECTIONS connections for *seconds*."""
    latencies: list[list[float]] = [[] for _ in range(CONNECTIONS)]
    errors: list[str] = []
    begin = threading.Barrier(CONNECTIONS + 1, timeout=60)
    stop_at: list[float] = []

    def connection(index: int) -> None:
        sock = _connect(port)
        try:
            buffer = bytearray()
            sock.sendall(_REQUEST)  # warm: the first request of a connection
            _answer(sock, buffer)
            begin.wait()
            mine = latencies[index]
            while time.monotonic() < stop_at[0]:
                sent = time.perf_counter()
                sock.sendall(_REQUEST)
                status, closing = _answer(sock, buffer)
                if status != 200:
                    raise RuntimeError(f"answered {status}")
                mine.append(time.perf_counter() - sent)
                if closing:
                    sock.close()
                    sock, buffer = _connect(port), bytearray()
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            sock.close()

    threads = [threading.Thread(target=connection, args=(i,)) for i in range(CONNECTIONS)]
    for thread in threads:
        thread.start()
    stop_at.append(time.monotonic() + 1e9)
    begin.wait()
    started = time.monotonic()
    stop_at[0] = started + seconds
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    if errors:
        raise RuntimeError(errors[0])
    every = sorted(x for per in latencies for x in per)
    return {
        "requests": len(every),
        "requests_per_s": round(len(every) / elapsed, 1),
        "p50_ms": round(every[len(every) // 2] * 1000, 3),
        "p99_ms": round(every[min(len(every) - 1, int(len(every) * 0.99))] * 1000, 3),
    }


def _round(python: str, mode: str, seconds: float) -> dict[str, Any]:
    server = _Server(python, mode)
    try:
        server.ready()
        return _load(server.port, seconds)
    finally:
        server.stop()


def _start(python: str, mode: str) -> float:
    server = _Server(python, mode)
    try:
        return server.ready()
    finally:
        server.stop()


def _has(python: str, module: str) -> bool:
    probe = subprocess.run([python, "-c", f"import {module}"], capture_output=True, check=False)
    return probe.returncode == 0


def lb(python: str = sys.executable, *, quick: bool = False, say: Any = print) -> dict[str, Any]:
    """Both figures; the modes whose server is not installed are left out, and say so."""
    rounds, seconds, starts = (1, 0.3, 1) if quick else (6, 3.0, 7)
    modes = [m for m in MODES if m != "uvicorn" or _has(python, "uvicorn")]
    if "uvicorn" not in modes:
        say("  uvicorn is not installed (pip install '.[bench]'): left out")
    runs = alternating(rounds, [functools.partial(_round, python, m, seconds) for m in modes])
    result: dict[str, Any] = {"rounds": rounds, "seconds": seconds, "connections": CONNECTIONS}
    for mode, per_round in zip(modes, runs, strict=True):
        rates = [r["requests_per_s"] for r in per_round]
        result[mode] = {
            "requests_per_s": statistics.median(rates),
            "p50_ms": statistics.median(r["p50_ms"] for r in per_round),
            "p99_ms": statistics.median(r["p99_ms"] for r in per_round),
            "rounds": per_round,
        }
    ratios = round_ratios(
        [r["requests_per_s"] for r in runs[0]], [r["requests_per_s"] for r in runs[1]]
    )
    result["start_app_over_hypercorn"] = round(statistics.median(ratios), 3)
    # The same app's start under each server, in alternating rounds too: start_app's
    # figure beside what the tutorial's uvicorn worker takes to its first 200.
    starts_by_mode = alternating(starts, [functools.partial(_start, python, m) for m in modes])
    result["start_to_first_200_s"] = {
        mode: {"median": round(statistics.median(s), 3), "samples": [round(x, 3) for x in s]}
        for mode, s in zip(modes, starts_by_mode, strict=True)
    }
    return result


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "| server | requests/s | p50 ms | p99 ms |",
        "|---|---|---|---|",
    ]
    for mode in MODES:
        if mode in result:
            row = result[mode]
            lines.append(
                f"| {mode} | {row['requests_per_s']:.0f} | {row['p50_ms']:.2f} |"
                f" {row['p99_ms']:.2f} |"
            )
    lines.append("")
    lines.append(
        f"start_app / hypercorn alone, median of {result['rounds']} rounds' ratios: "
        f"{result['start_app_over_hypercorn']:.3f} (target: at least 0.90)"
    )
    lines.append("")
    lines.append("process start to the first 200 on /ping (an initializer that returns at once):")
    for mode, starts in result["start_to_first_200_s"].items():
        lines.append(f"- {mode}: median {starts['median'] * 1000:.0f} ms of {starts['samples']}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    print(markdown(lb(quick=args.quick)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
