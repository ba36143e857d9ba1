"""``benchmarks/handler_alone.py``: the paced handler with no SDK, its streams started
together or phased over one interval (docs/benchmarks.md, "The paced handler alone")."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

# The benchmarks package is not installed: imported from the checkout, after everything
# installed (as tests/test_benchmarks_smoke.py does).
sys.path.append(str(Path(__file__).resolve().parents[1]))

from benchmarks import handler_alone, worker_trio

INTERVAL = 0.008  # 4 streams: phased 2 ms apart


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
@pytest.mark.parametrize("phased", [False, True])
def test_streams_start_together_or_spread_over_one_interval(
    backend: str, phased: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    starts: dict[int, float] = {}
    waits: list[float] = []
    real_sleep = worker_trio.sleep

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        await real_sleep(seconds)

    async def first_step(job: dict[str, Any]) -> AsyncIterator[dict[str, float]]:
        starts[int(job["id"])] = time.monotonic()
        yield {"i": 0}
        if backend == "asyncio":
            await asyncio.sleep(0)

    monkeypatch.setattr(worker_trio, "CHUNK_INTERVAL", INTERVAL)
    monkeypatch.setattr(worker_trio, "CHUNKS", worker_trio.CHUNKS)  # run() sets it
    monkeypatch.setattr(worker_trio, "stream_paced", first_step)
    monkeypatch.setattr(worker_trio, "sleep", sleep)

    assert handler_alone.run(backend, 4, 1, phased=phased) > 0

    assert sorted(starts) == [0, 1, 2, 3]
    offsets = [starts[job_id] - starts[0] for job_id in range(4)]
    if phased:
        # Stream k waits k/4 of the interval before its first step, so it starts at least
        # that long after the first (a loop's timer may fire a clock tick early). Only lower
        # bounds: a loaded machine may run two due streams in either order.
        assert sorted(waits) == pytest.approx([INTERVAL / 4, INTERVAL / 2, 3 * INTERVAL / 4])
        for k, offset in enumerate(offsets):
            assert offset >= 0.75 * k * INTERVAL / 4, offsets
    else:
        assert waits == []  # all started in the same loop pass
