"""The worker under benchmark, reference SDK side (run with ``benchmarks/.venv-reference``).

The same scenarios and handlers as ``worker_trio.py`` (see there), on asyncio, started the
way a runpod worker is: ``runpod.serverless.start({"handler": h, "concurrency_modifier":
lambda c: N})``. runpod 1.12 has no initializer, so there is no ``initfail`` scenario.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import TYPE_CHECKING, Any

import runpod  # type: ignore[import-not-found, unused-ignore]

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

SCENARIO = os.environ.get("BENCH_SCENARIO", "noop")
CONCURRENCY = int(os.environ.get("BENCH_CONCURRENCY", "1"))
CHUNKS = int(os.environ.get("BENCH_CHUNKS", "100"))
MARK_FILE = os.environ.get("BENCH_MARK_FILE", os.devnull)
CHUNK_INTERVAL = float(os.environ.get("BENCH_CHUNK_INTERVAL", "0.02"))


def mark(event: str, job_id: str) -> None:
    """Append ``event job_id time`` to the mark file (the time is taken first)."""
    now = time.time()
    with open(MARK_FILE, "a") as marks:
        marks.write(f"{event} {job_id} {now!r}\n")


async def noop(job: dict[str, Any]) -> dict[str, Any]:
    return {"ok": True, "n": job["input"].get("n")}


def noop_sync(job: dict[str, Any]) -> dict[str, Any]:
    return {"ok": True, "n": job["input"].get("n")}


async def stream(job: dict[str, Any]) -> AsyncIterator[dict[str, int]]:
    for i in range(CHUNKS):
        yield {"i": i}


async def stream_paced(job: dict[str, Any]) -> AsyncIterator[dict[str, float]]:
    start = time.monotonic()
    for i in range(CHUNKS):
        await asyncio.sleep(max(0.0, start + i * CHUNK_INTERVAL - time.monotonic()))
        yield {"i": i, "t": time.time()}


async def wait_for_stop(job: dict[str, Any]) -> dict[str, Any]:
    mark("start", job["id"])
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        mark("cancel", job["id"])
        raise
    return {"ok": True}


if __name__ == "__main__":
    handlers = {
        "noop": noop,
        "noop_sync": noop_sync,
        "stream": stream,
        "stream_paced": stream_paced,
        "stop": wait_for_stop,
    }
    runpod.serverless.start(
        {"handler": handlers[SCENARIO], "concurrency_modifier": lambda current: CONCURRENCY}
    )
