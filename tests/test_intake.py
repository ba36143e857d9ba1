"""What the take loop keeps between takes: remembered stops and the capacity it asks for
(``Capacity`` and ``StopMemory`` in trio_worker/_job.py)."""

from __future__ import annotations

import pytest

from trio_worker._job import Capacity, StopMemory


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
