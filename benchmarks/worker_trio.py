"""The worker under benchmark, trio_worker side (run by ``benchmarks/run.py``).

``BENCH_SCENARIO`` picks what it does; ``worker_reference.py`` is the same file for the
reference SDK, so both answer the same jobs with the same handlers:

* ``noop``: an async handler returning a small dict;
* ``stream``: an async generator yielding ``BENCH_CHUNKS`` small chunks;
* ``stop``: an async handler that waits, and writes the wall-clock time at which it was
  cancelled to ``BENCH_MARK_FILE``;
* ``initfail``: an initializer that holds the jobs for ``BENCH_INIT_SECONDS``, writes the
  wall-clock time of its failure to ``BENCH_MARK_FILE``, then raises.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

import trio

import trio_worker

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

SCENARIO = os.environ.get("BENCH_SCENARIO", "noop")
CONCURRENCY = int(os.environ.get("BENCH_CONCURRENCY", "1"))
CHUNKS = int(os.environ.get("BENCH_CHUNKS", "100"))
MARK_FILE = os.environ.get("BENCH_MARK_FILE", os.devnull)
INIT_SECONDS = float(os.environ.get("BENCH_INIT_SECONDS", "0.5"))


def mark(event: str, job_id: str) -> None:
    """Append ``event job_id time`` to the mark file (the time is taken first)."""
    now = time.time()
    with open(MARK_FILE, "a") as marks:
        marks.write(f"{event} {job_id} {now!r}\n")


async def noop(job: dict[str, Any]) -> dict[str, Any]:
    return {"ok": True, "n": job["input"].get("n")}


async def stream(job: dict[str, Any]) -> AsyncIterator[dict[str, int]]:
    for i in range(CHUNKS):
        yield {"i": i}


async def wait_for_stop(job: dict[str, Any]) -> dict[str, Any]:
    mark("start", job["id"])
    try:
        await trio.sleep(60)
    except trio.Cancelled:
        mark("cancel", job["id"])
        raise
    return {"ok": True}


async def failing_init() -> None:
    await trio.sleep(INIT_SECONDS)
    mark("init_failed", "-")
    raise RuntimeError("benchmark: the model failed to load")


if __name__ == "__main__":
    if SCENARIO == "initfail":
        trio_worker.start(noop, initializer=failing_init, concurrency=CONCURRENCY)
    handlers = {"noop": noop, "stream": stream, "stop": wait_for_stop}
    trio_worker.start(
        {"handler": handlers[SCENARIO], "concurrency_modifier": lambda current: CONCURRENCY}
    )
