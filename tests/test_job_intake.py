"""What the take loop keeps between takes: remembered stops (bounded however many unknown ids
a stop answer names, docs/security.md) and the capacity it asks for (``Capacity`` and
``StopMemory`` in trio_worker/_job.py)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio

from tests.conftest import serve_in_process
from trio_worker._job import Capacity, StopMemory
from trio_worker.testing import FakePlatform


def test_stop_memory_consumes_once() -> None:
    memory = StopMemory(seconds=120.0, size=4)
    memory.remember("a", now=0.0)
    assert not memory.consume("b")
    assert memory.consume("a")
    assert not memory.consume("a")


def test_stop_memory_forgets_old_ids_only_past_its_size() -> None:
    memory = StopMemory(seconds=10.0, size=3)
    for n, job_id in enumerate("abc"):
        memory.remember(job_id, now=float(n))
    assert len(memory) == 3  # at the size: nothing forgotten, however old
    memory.remember("d", now=11.5)  # a (t=0) and b (t=1) are 10 s old or more
    assert len(memory) == 2
    assert not memory.consume("a")
    assert not memory.consume("b")
    assert memory.consume("c")
    assert memory.consume("d")


def test_stop_memory_holds_at_most_its_size_under_a_flood_of_unknown_ids() -> None:
    # A flood of recent stops for ids never taken must not be kept whole while all are
    # recent, nor cost a rebuild of the memory on every stop past its size.
    memory = StopMemory(seconds=120.0, size=1_024)
    for n in range(20_000):
        memory.remember(f"unknown-{n}", now=0.0)
    assert len(memory) == 1_024
    assert memory.forgotten_early == 20_000 - 1_024
    # The newest are kept: the take that carries a real job follows its stop closely.
    assert memory.consume("unknown-19999")
    assert not memory.consume("unknown-0")


def test_a_repeated_stop_is_remembered_from_its_last_time() -> None:
    memory = StopMemory(seconds=10.0, size=2)
    memory.remember("a", now=0.0)
    memory.remember("b", now=1.0)
    memory.remember("a", now=9.0)  # "a" is now the newest
    memory.remember("c", now=10.5)  # over the size: "b" goes, not "a"
    assert memory.consume("a")
    assert memory.consume("c")
    assert not memory.consume("b")


def test_capacity_fixed() -> None:
    capacity = Capacity(3)
    assert (capacity.evaluate(), capacity.value) == (3, 3)


@pytest.mark.parametrize(
    ("answers", "expected"),
    [([2, 5], [2, 5]), ([0, 2], [1, 2]), ([True, 3], [1, 3]), (["4", 2.0], [1, 1])],
)
def test_capacity_callable_keeps_the_current_value_on_a_bad_answer(
    answers: list[object], expected: list[int]
) -> None:
    asked: list[int] = []
    it = iter(answers)

    def wanted(current: int) -> int:
        asked.append(current)
        return next(it)  # type: ignore[return-value]

    capacity = Capacity(wanted)
    assert [capacity.evaluate() for _ in answers] == expected
    assert asked == [1, *expected[:-1]]


def test_capacity_callable_that_raises_keeps_the_current_value() -> None:
    calls = iter([4, None])

    def wanted(current: int) -> int:
        value = next(calls)
        if value is None:
            raise ValueError("oops")
        return value

    capacity = Capacity(wanted)
    assert capacity.evaluate() == 4
    assert capacity.evaluate() == 4


@pytest.mark.parametrize("broken", ["raises", "returns 0"])
async def test_a_broken_concurrency_callable_is_one_log_line_not_one_per_take(
    broken: str,
    nursery: trio.Nursery,
    caplog: pytest.LogCaptureFixture,
    virtual_clock: trio.abc.Clock,
) -> None:
    # It is asked before every take; the worker keeps its last good value and goes on,
    # and says so once, not once per take (a worker takes thousands of jobs a minute).
    caplog.set_level(logging.ERROR, logger="trio_worker")

    def concurrency(current: int) -> int:
        if broken == "raises":
            raise RuntimeError("the modifier is broken")
        return 0

    async def handler(job: dict[str, Any]) -> object:
        # Async: a sync handler's thread would race the virtual clock's jumps.
        return job["input"]

    platform = FakePlatform(take_hold=0.05)
    handle = await nursery.start(serve_in_process(platform, handler, concurrency=concurrency))
    ids = [platform.enqueue(n) for n in range(20)]
    with trio.fail_after(30):
        for job_id in ids:
            assert (await platform.wait_for_status(job_id)).status == "COMPLETED"
    complaints = [r for r in caplog.records if "concurrency callable" in r.getMessage()]
    assert len(complaints) == 1, [r.getMessage() for r in complaints]
    assert complaints[0].getMessage().endswith("keeping 1")
    if broken == "raises":
        assert complaints[0].exc_info is not None  # the first one carries the traceback
    handle.shutdown()
