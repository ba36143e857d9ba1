"""Serving a FakePlatform over loopback: in a nursery, or as its own process.

``python -m trio_worker.testing --port 0 --preload 1000`` is what the benchmark harness
runs: it prints the base URL as the first line of stdout (so a parent can read it before
anything else), then serves until SIGINT or SIGTERM. ``GET /_stats`` gives the counters,
a throughput/take-to-done latency summary and per-job timestamps.
"""

from __future__ import annotations

import argparse
import signal
import sys
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import trio

from ._app import FakePlatform
from ._http_server import serve_asgi, url_of

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence

__all__ = ["main", "run_platform_server"]


@asynccontextmanager
async def run_platform_server(
    platform: FakePlatform, host: str = "127.0.0.1", port: int = 0
) -> AsyncIterator[str]:
    """Serve *platform* over HTTP while the block runs; yields the base URL.

    Also runs the platform's deadline checker, so requeues, execution timeouts and expiries
    happen at their deadline even when no request arrives, and its webhook sender.
    Leaving the block stops the server and closes its sockets.

    Raises:
        OSError: if the address cannot be bound.
    """
    async with trio.open_nursery() as nursery:
        bound = await nursery.start(serve_asgi, platform, host, port)
        await nursery.start(platform.run_requeue_checker)
        await nursery.start(platform.run_webhook_sender)
        try:
            yield url_of(host, bound)
        finally:
            nursery.cancel_scope.cancel()


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m trio_worker.testing",
        description="Run the fake Runpod platform as its own process (tests, benchmarks).",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--preload", type=int, default=0, help='queue N jobs {"n": i}')
    parser.add_argument("--take-hold", type=float, default=5.0, help="take long-poll, seconds")
    parser.add_argument("--stop-hold", type=float, default=5.0, help="stop long-poll, seconds")
    parser.add_argument("--requeue-after", type=float, default=None, help="seconds; off if unset")
    parser.add_argument("--api-key", default=None, help="require this Authorization value")
    parser.add_argument("--endpoint-id", default="test-ep")
    parser.add_argument(
        "--record-requests",
        action="store_true",
        help="keep every request in memory (off by default: benchmarks send millions)",
    )
    return parser.parse_args(argv)


async def _serve(args: argparse.Namespace) -> None:
    platform = FakePlatform(
        api_key=args.api_key,
        take_hold=args.take_hold,
        stop_hold=args.stop_hold,
        requeue_after=args.requeue_after,
        endpoint_id=args.endpoint_id,
        record_requests=args.record_requests,
    )
    for i in range(args.preload):
        platform.enqueue({"n": i})
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with run_platform_server(platform, args.host, args.port) as url:
            print(url, flush=True)
            async for _ in signals:
                break


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m trio_worker.testing``; returns the exit status."""
    args = _parse_args(argv)
    try:
        trio.run(_serve, args)
    except OSError as exc:
        print(f"cannot serve on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    return 0
