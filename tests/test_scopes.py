"""The deadlines a stop sets (trio_worker/_state.py, ``WorkerState``) and the one deadline
registry over them (trio_worker/_scopes.py) in virtual time: the scopes bound to it, the
waits for threads, and the wait before a retry."""

from __future__ import annotations

import math

import pytest
import trio
import trio.testing

from trio_worker import Timings
from trio_worker._scopes import Scopes, when_stopping
from trio_worker._state import WorkerPhase, WorkerState

TIMINGS = Timings(
    shutdown_grace=20.0, take_drain=0.5, claim_grace=10.0, report_deadline=10.0, report_budget=300
)


def test_a_drain_sets_every_deadline_from_one_place() -> None:
    plan = WorkerState(TIMINGS)
    assert not plan.stopping
    assert plan.drain("SIGTERM", now=100.0)
    assert (plan.phase, plan.reason) == (WorkerPhase.DRAINING, "SIGTERM")
    assert (plan.deadline, plan.grace_end, plan.take_end) == (120.0, 120.0, 100.5)
    # A second drain changes nothing: the first grace stands.
    assert not plan.drain("again", now=110.0)
    assert (plan.deadline, plan.reason) == (120.0, "SIGTERM")
    assert "draining" in repr(plan)


def test_an_init_failure_cuts_reports_and_gives_the_take_claim_grace() -> None:
    plan = WorkerState(TIMINGS)
    plan.fail_init("the initializer failed", failed_at=50.0)
    assert plan.phase is WorkerPhase.INIT_FAILED
    assert (plan.deadline, plan.take_end, plan.grace_end) == (50.0, 60.0, math.inf)
    # A report that began at 45 keeps its report_deadline floor; one that began long
    # before is cut at the failure.
    assert plan.report_deadline(45.0) == 55.0
    assert plan.report_deadline(10.0) == 50.0


def test_a_cut_ends_reports_at_their_floor_but_leaves_the_grace() -> None:
    plan = WorkerState(TIMINGS)
    plan.drain("SIGTERM", now=0.0)
    plan.cut_now("cancelled", now=5.0)
    assert (plan.cut, plan.deadline, plan.grace_end) == (True, 5.0, 20.0)
    assert plan.report_deadline(4.0) == 14.0
    assert plan.report_deadline(-100.0) == 5.0


async def test_bound_scopes_move_earlier_with_the_plan_never_later(
    autojump_clock: trio.testing.MockClock,
) -> None:
    plan = Scopes(TIMINGS)
    start = trio.current_time()
    early = trio.CancelScope(deadline=start + 5.0)
    plan.bind(early, lambda state: state.deadline)
    with plan.open_scope(lambda state: state.grace_end) as late:
        assert late.deadline == math.inf
        plan.state.drain("SIGTERM", now=start)
        assert late.deadline == start + 20.0
        assert early.deadline == start + 5.0  # already earlier: left alone
        await trio.lowlevel.checkpoint()
    plan.unbind(early)
    plan.state.cut_now("cancelled", now=start)
    assert early.deadline == start + 5.0  # unbound: the registry no longer moves it
    with plan.open_scope(when_stopping) as stopped:
        assert stopped.deadline == -math.inf


async def test_a_retry_wait_past_the_deadline_leaves_room_for_one_last_attempt(
    autojump_clock: trio.testing.MockClock,
) -> None:
    plan = Scopes(TIMINGS)
    start = trio.current_time()
    with trio.move_on_at(start + 20.0):
        await plan.wait_to_retry(start + 30.0, bound=4.0)
    assert trio.current_time() == pytest.approx(start + 16.0)


async def test_a_retry_wait_is_measured_again_when_the_plan_cuts_its_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    plan = Scopes(TIMINGS)
    start = trio.current_time()
    woke: list[float] = []

    async def report() -> None:
        with plan.open_scope(lambda state: min(start + 300.0, state.deadline)):
            await plan.wait_to_retry(start + 30.0, bound=4.0)
            woke.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(report)
        await trio.sleep(1.0)
        plan.state.drain("SIGTERM", now=trio.current_time())  # the deadline is now 21
    assert woke == [pytest.approx(start + 17.0)]


async def test_a_retry_wait_with_no_room_left_is_not_cut_to_a_hot_loop(
    autojump_clock: trio.testing.MockClock,
) -> None:
    plan = Scopes(TIMINGS)
    start = trio.current_time()
    with trio.move_on_at(start + 2.0):
        await plan.wait_to_retry(start + 1.0, bound=4.0)
    # No room for a whole attempt before the deadline: the wait is the one asked for.
    assert trio.current_time() == pytest.approx(start + 1.0)


async def test_a_wait_for_a_thread_ends_with_the_grace_and_one_that_starts_after_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The waits for handler threads are bound in the same registry (no second one): a
    drain gives them the grace's end, and a wait that starts past it is cancelled at its
    first checkpoint, shielded or not."""
    plan = Scopes(TIMINGS)
    start = trio.current_time()
    never = trio.Event()
    with plan.shielded() as wait:
        assert wait.shield and wait.deadline == math.inf
        plan.state.drain("SIGTERM", now=start)
        assert wait.deadline == start + 20.0
        await never.wait()
    assert trio.current_time() == pytest.approx(start + 20.0)
    with plan.shielded(bound=5.0) as late:
        await never.wait()
    assert late.cancelled_caught and trio.current_time() == pytest.approx(start + 20.0)
    await plan.hold(never)  # ends at once too: the grace is over
    with plan.bounded(1.0) as close:
        assert not close.shield


async def test_end_by_cuts_every_wait_for_a_worker_with_no_grace(
    autojump_clock: trio.testing.MockClock,
) -> None:
    plan = Scopes(TIMINGS)
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(plan.hold, trio.Event())
        await trio.sleep(1.0)
        plan.end_by(start + 3.0)
    assert trio.current_time() == pytest.approx(start + 3.0)
