"""The worker under benchmark, trio_worker side (run by ``benchmarks/run.py``).

``BENCH_SCENARIO`` picks what it does; ``worker_reference.py`` is the same file for the
reference SDK, so both answer the same jobs with the same handlers:

* ``noop``: an async handler returning a small dict;
* ``noop_sync``: the same handler as a plain function (run in a worker thread);
* ``stream``: an async generator yielding ``BENCH_CHUNKS`` small chunks;
* ``stream_paced``: the same, one chunk every ``BENCH_CHUNK_INTERVAL`` seconds, each chunk
  carrying the wall-clock time of its ``yield`` (for yield-to-receipt latency);
* ``raising``: an async handler that prints a line and raises (a failing job: its error
  report carries the output tail, so it flushes the capture);
* ``stop``: an async handler that waits, and writes the wall-clock time at which it was
  cancelled to ``BENCH_MARK_FILE``;
* ``initfail``: an initializer that holds the jobs for ``BENCH_INIT_SECONDS``, writes the
  wall-clock time of its failure to ``BENCH_MARK_FILE``, then raises.

``BENCH_BACKEND`` ("trio" by default, or "asyncio") is the worker's ``async_backend``; the
handlers sleep on whichever loop runs them. ``BENCH_REPO``, if set, is the checkout whose
``trio_worker`` runs instead of this file's own (``run.py --against``: an older commit,
whose ``start`` may have no ``async_backend``; it then runs on trio, its only backend).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

# The checkout this file lives in (or BENCH_REPO's), not whatever trio_worker the interpreter
# has installed (the harness strips PYTHONPATH from a worker's environment).
sys.path.insert(0, os.environ.get("BENCH_REPO") or str(Path(__file__).resolve().parents[1]))

import sniffio
import trio

import trio_worker

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

if os.environ.get("BENCH_REPO") and not str(trio_worker.__file__).startswith(sys.path[0]):
    raise SystemExit(f"BENCH_REPO is set, but trio_worker came from {trio_worker.__file__}")

SCENARIO = os.environ.get("BENCH_SCENARIO", "noop")
CONCURRENCY = int(os.environ.get("BENCH_CONCURRENCY", "1"))
CHUNKS = int(os.environ.get("BENCH_CHUNKS", "100"))
MARK_FILE = os.environ.get("BENCH_MARK_FILE", os.devnull)
INIT_SECONDS = float(os.environ.get("BENCH_INIT_SECONDS", "0.5"))
BACKEND: Literal["trio", "asyncio"] = (
    "asyncio" if os.environ.get("BENCH_BACKEND") == "asyncio" else "trio"
)
CHUNK_INTERVAL = float(os.environ.get("BENCH_CHUNK_INTERVAL", "0.02"))


async def sleep(seconds: float) -> None:
    if sniffio.current_async_library() == "asyncio":
        await asyncio.sleep(seconds)
    else:
        await trio.sleep(seconds)


def mark(event: str, job_id: str) -> None:
    """Append ``event job_id time`` to the mark file (the time is taken first)."""
    now = time.time()
    with open(MARK_FILE, "a") as marks:
        marks.write(f"{event} {job_id} {now!r}\n")


async def noop(job: dict[str, Any]) -> dict[str, Any]:
    return {"ok": True, "n": job["input"].get("n")}


def noop_sync(job: dict[str, Any]) -> dict[str, Any]:
    return {"ok": True, "n": job["input"].get("n")}


async def raising(job: dict[str, Any]) -> dict[str, Any]:
    print(f"job {job['id']}: about to fail", flush=True)
    raise RuntimeError(f"benchmark: job {job['input'].get('n')} failed")


async def stream(job: dict[str, Any]) -> AsyncIterator[dict[str, int]]:
    for i in range(CHUNKS):
        yield {"i": i}


async def stream_paced(job: dict[str, Any]) -> AsyncIterator[dict[str, float]]:
    start = time.monotonic()
    for i in range(CHUNKS):
        # Paced against a fixed schedule, so a late step does not push back the rest.
        await sleep(max(0.0, start + i * CHUNK_INTERVAL - time.monotonic()))
        yield {"i": i, "t": time.time()}


async def wait_for_stop(job: dict[str, Any]) -> dict[str, Any]:
    mark("start", job["id"])
    try:
        await sleep(60)
    except (trio.Cancelled, asyncio.CancelledError):
        mark("cancel", job["id"])
        raise
    return {"ok": True}


async def failing_init() -> None:
    await sleep(INIT_SECONDS)
    mark("init_failed", "-")
    raise RuntimeError("benchmark: the model failed to load")


if __name__ == "__main__":
    options: dict[str, Any] = {}
    if "async_backend" in inspect.signature(trio_worker.start).parameters:
        options["async_backend"] = BACKEND
    if SCENARIO == "initfail":
        trio_worker.start(noop, initializer=failing_init, concurrency=CONCURRENCY, **options)
    handlers = {
        "noop": noop,
        "noop_sync": noop_sync,
        "raising": raising,
        "stream": stream,
        "stream_paced": stream_paced,
        "stop": wait_for_stop,
    }
    trio_worker.start(
        {"handler": handlers[SCENARIO], "concurrency_modifier": lambda current: CONCURRENCY},
        **options,
    )
