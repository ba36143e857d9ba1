"""The shutdown plan (trio_worker/_shutdown_plan.py) in virtual time: the deadlines it
computes, the scopes bound to it, and the wait before a retry."""

from __future__ import annotations

import math

import pytest
import trio
import trio.testing

from trio_worker import Timings
from trio_worker._shutdown_plan import ShutdownPlan, StopPhase

TIMINGS = Timings(
    shutdown_grace=20.0, take_drain=0.5, claim_grace=10.0, report_deadline=10.0, report_budget=300
)


def test_a_drain_sets_every_deadline_from_one_place() -> None:
    plan = ShutdownPlan(TIMINGS)
    assert not plan.stopping
    assert plan.drain("SIGTERM", now=100.0)
    assert (plan.phase, plan.reason) == (StopPhase.DRAINING, "SIGTERM")
    assert (plan.deadline, plan.grace_end, plan.take_end) == (120.0, 120.0, 100.5)
    # A second drain changes nothing: the first grace stands.
    assert not plan.drain("again", now=110.0)
    assert (plan.deadline, plan.reason) == (120.0, "SIGTERM")
    assert "draining" in repr(plan)


def test_an_init_failure_cuts_reports_and_gives_the_take_claim_grace() -> None:
    plan = ShutdownPlan(TIMINGS)
    plan.fail_init("the initializer failed", failed_at=50.0)
    assert plan.phase is StopPhase.INIT_FAILED
    assert (plan.deadline, plan.take_end, plan.grace_end) == (50.0, 60.0, math.inf)
    # A report that began at 45 keeps its report_deadline floor; one that began long
    # before is cut at the failure.
    assert plan.report_deadline(45.0) == 55.0
    assert plan.report_deadline(10.0) == 50.0


def test_a_cut_ends_reports_at_their_floor_but_leaves_the_grace() -> None:
    plan = ShutdownPlan(TIMINGS)
    plan.drain("SIGTERM", now=0.0)
    plan.cut("cancelled", now=5.0)
    assert (plan.phase, plan.deadline, plan.grace_end) == (StopPhase.CUT, 5.0, 20.0)
    assert plan.report_deadline(4.0) == 14.0
    assert plan.report_deadline(-100.0) == 5.0


async def test_bound_scopes_move_earlier_with_the_plan_never_later(
    autojump_clock: trio.testing.MockClock,
) -> None:
    plan = ShutdownPlan(TIMINGS)
    start = trio.current_time()
    early = trio.CancelScope(deadline=start + 5.0)
    plan.bind(early, lambda plan: plan.deadline)
    with plan.open_scope(lambda plan: plan.grace_end) as late:
        assert late.deadline == math.inf
        plan.drain("SIGTERM", now=start)
        assert late.deadline == start + 20.0
        assert early.deadline == start + 5.0  # already earlier: left alone
        await trio.lowlevel.checkpoint()
    plan.unbind(early)
    plan.cut("cancelled", now=start)
    assert early.deadline == start + 5.0  # unbound: the plan no longer moves it
    with plan.open_scope(ShutdownPlan.when_stopping) as stopped:
        assert stopped.deadline == -math.inf


async def test_a_retry_wait_past_the_deadline_leaves_room_for_one_last_attempt(
    autojump_clock: trio.testing.MockClock,
) -> None:
    plan = ShutdownPlan(TIMINGS)
    start = trio.current_time()
    with trio.move_on_at(start + 20.0):
        await plan.wait_to_retry(start + 30.0, bound=4.0)
    assert trio.current_time() == pytest.approx(start + 16.0)


async def test_a_retry_wait_is_measured_again_when_the_plan_cuts_its_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    plan = ShutdownPlan(TIMINGS)
    start = trio.current_time()
    woke: list[float] = []

    async def report() -> None:
        with plan.open_scope(lambda plan: min(start + 300.0, plan.deadline)):
            await plan.wait_to_retry(start + 30.0, bound=4.0)
            woke.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(report)
        await trio.sleep(1.0)
        plan.drain("SIGTERM", now=trio.current_time())  # the deadline is now 21
    assert woke == [pytest.approx(start + 17.0)]


async def test_a_retry_wait_with_no_room_left_is_not_cut_to_a_hot_loop(
    autojump_clock: trio.testing.MockClock,
) -> None:
    plan = ShutdownPlan(TIMINGS)
    start = trio.current_time()
    with trio.move_on_at(start + 2.0):
        await plan.wait_to_retry(start + 1.0, bound=4.0)
    # No room for a whole attempt before the deadline: the wait is the one asked for.
    assert trio.current_time() == pytest.approx(start + 1.0)
