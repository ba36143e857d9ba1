"""The supervisor's decisions on the job and phase machines (docs/design.md §3, §6, §9).

First, lives of a worker written out step by step, in the manner of h11's
``test_state.py``: the worker phase and a few held jobs are driven by hand, and at each
turn the decision of ``trio_worker._state`` is asked, checked, and carried out the way
the driver carries it out (``trio_worker/_job.py``). Then each decision's own table of
hand-written cases, the precedence between them included.
"""

from __future__ import annotations

import pytest

from trio_worker import Timings
from trio_worker._state import (
    ADMISSION_EVENTS,
    TRANSITIONS,
    Admission,
    HeldJob,
    JobEvent,
    JobState,
    Ledger,
    Outcome,
    PhaseEvent,
    WorkerPhase,
    WorkerState,
    on_admit,
    on_cancelled,
    on_delivered,
    on_stuck,
    releases_at_shutdown,
)

S = JobState
E = JobEvent
P = WorkerPhase
PE = PhaseEvent

# The event that carries out each settling outcome (the driver's _settle_now, settle_stuck).
SETTLES = {
    Outcome.STOP: E.STOP,
    Outcome.RELEASE: E.RELEASE,
    Outcome.REPORT_INIT_FAILURE: E.FAIL,
    Outcome.REPORT_SHUTDOWN: E.FINISH,
}


class Worker:
    """The worker's two machines, driven by hand; every decision asked as the driver does."""

    def __init__(self) -> None:
        self.phases = WorkerState(Timings())
        self.ledger = Ledger()
        self.stops: set[str] = set()

    def admit(self, job_id: str, expected: Admission, *, malformed: bool = False) -> HeldJob:
        job = self.ledger.add(job_id, {"id": job_id})
        assert job is not None
        admission = on_admit(
            self.phases.phase,
            gate_open=self.phases.gate_open,
            stop_remembered=job_id in self.stops,
            malformed=malformed,
        )
        assert admission is expected
        event = ADMISSION_EVENTS.get(admission)
        if event is not None:
            self.ledger.fire(job, event)
        return job

    def cancelled(
        self, job: HeldJob, expected: Outcome, then: JobState, *, grace_over: bool = False
    ) -> None:
        """A cancellation reaches *job*'s task: settled as ``on_cancelled`` says."""
        outcome = on_cancelled(job.state, self.phases.phase, grace_over=grace_over)
        assert outcome is expected
        if outcome is not Outcome.PROPAGATE:
            assert self.ledger.fire(job, SETTLES[outcome]) is then
        assert job.state is then

    def delivered(
        self, job: HeldJob, ok: bool, expected: tuple[JobEvent, bool], *, refresh: bool = False
    ) -> None:
        decision = on_delivered(self.phases.phase, delivered=ok, refresh_worker=refresh)
        assert decision == expected
        self.ledger.fire(job, decision[0])
        if decision[1]:
            self.phases.fire(PE.DRAIN)

    def shutdown(self) -> list[str]:
        """SIGTERM: drain, and request the release of what ``releases_at_shutdown`` says."""
        self.phases.fire(PE.DRAIN)
        released = []
        for job in self.ledger:
            if releases_at_shutdown(job.state, gate_open=self.phases.gate_open):
                self.ledger.fire(job, E.REQUEST_RELEASE)
                released.append(job.id)
        return released


# --- lives of a worker --------------------------------------------------------------------


def test_jobs_wait_at_the_gate_then_run_once_the_initializer_returns() -> None:
    worker = Worker()
    a = worker.admit("a", Admission.RUN)
    assert a.state is S.TAKEN
    worker.ledger.fire(a, E.WAIT_FOR_INIT)
    worker.phases.fire(PE.INIT_OK)
    assert (worker.phases.phase, worker.phases.gate_open) == (P.READY, True)
    worker.ledger.fire(a, E.START)
    # A cancellation from outside while it runs (serve() itself cancelled): not settled.
    worker.cancelled(a, Outcome.PROPAGATE, S.RUNNING)
    worker.ledger.fire(a, E.FINISH)
    worker.delivered(a, True, (E.ACKNOWLEDGE, False))
    assert a.history == [S.TAKEN, S.WAITING_FOR_INIT, S.RUNNING, S.REPORTING]
    assert worker.ledger.get("a") is None


def test_an_init_failure_fails_every_held_job_a_stop_still_wins() -> None:
    worker = Worker()
    waiting = worker.admit("waiting", Admission.RUN)
    worker.ledger.fire(waiting, E.WAIT_FOR_INIT)
    bad = worker.admit("bad", Admission.MALFORMED, malformed=True)
    assert bad.state is S.MALFORMED
    worker.stops.add("stopped")
    stopped = worker.admit("stopped", Admission.STOP)
    assert stopped.state is S.STOPPING
    worker.phases.fire(PE.INIT_FAIL)
    # The init failure wins over the malformed job's own report; the stop over both.
    worker.cancelled(waiting, Outcome.REPORT_INIT_FAILURE, S.REPORTING)
    worker.cancelled(bad, Outcome.REPORT_INIT_FAILURE, S.REPORTING)
    worker.cancelled(stopped, Outcome.STOP, S.STOPPED)
    # The claim take's job is failed at once, however malformed; a remembered stop wins.
    late = worker.admit("late", Admission.FAIL, malformed=True)
    assert late.state is S.TAKEN
    worker.cancelled(late, Outcome.REPORT_INIT_FAILURE, S.REPORTING)
    worker.stops.add("later")
    worker.admit("later", Admission.STOP)
    # Reports after the init failure never ask for a drain, even with refresh_worker.
    worker.delivered(waiting, True, (E.ACKNOWLEDGE, False), refresh=True)
    worker.delivered(bad, False, (E.GIVE_UP, False), refresh=True)
    assert worker.phases.phase is P.INIT_FAILED
    assert set(worker.ledger.held_ids) == {"late", "later"}


def test_sigterm_during_the_initializer_releases_the_jobs_behind_the_gate() -> None:
    worker = Worker()
    a = worker.admit("a", Admission.RUN)
    worker.ledger.fire(a, E.WAIT_FOR_INIT)
    b = worker.admit("b", Admission.RUN)  # still TAKEN: its task has not moved yet
    bad = worker.admit("bad", Admission.MALFORMED, malformed=True)
    assert worker.shutdown() == ["a", "b"]  # the malformed job is reported, not released
    assert (a.state, b.state, bad.state) == (S.RELEASING, S.RELEASING, S.MALFORMED)
    # A take still in flight delivers another: the gate is closed, released unstarted.
    c = worker.admit("c", Admission.RELEASE)
    assert c.state is S.RELEASING
    # The initializer returns in the same step: the gate opens, the phase stays DRAINING,
    # and what was released stays released.
    worker.phases.fire(PE.INIT_OK)
    assert (worker.phases.phase, worker.phases.gate_open) == (P.DRAINING, True)
    for job in (a, b, c):
        worker.cancelled(job, Outcome.RELEASE, S.RELEASED)
    # The malformed job's task does not settle on a cancellation: it reports.
    worker.cancelled(bad, Outcome.PROPAGATE, S.MALFORMED)
    # Now the gate is open: the drained take's job runs within the grace.
    worker.admit("d", Admission.RUN)


def test_sigterm_with_a_handler_running_lets_it_finish_within_the_grace() -> None:
    worker = Worker()
    worker.phases.fire(PE.INIT_OK)
    fast = worker.admit("fast", Admission.RUN)
    slow = worker.admit("slow", Admission.RUN)
    queued = worker.admit("queued", Admission.RUN)
    worker.ledger.fire(fast, E.START)
    worker.ledger.fire(slow, E.START)
    worker.ledger.fire(queued, E.WAIT_FOR_SLOT)
    # Only the job with no handler slot is released: it would never start in time.
    assert worker.shutdown() == ["queued"]
    worker.cancelled(queued, Outcome.RELEASE, S.RELEASED)
    # Within the grace a running handler is left alone, and its result goes out.
    worker.cancelled(fast, Outcome.PROPAGATE, S.RUNNING)
    worker.ledger.fire(fast, E.FINISH)
    worker.delivered(fast, True, (E.ACKNOWLEDGE, False), refresh=True)
    # At the grace's end the one still running is reported worker_shutdown.
    worker.cancelled(slow, Outcome.REPORT_SHUTDOWN, S.REPORTING, grace_over=True)
    worker.delivered(slow, False, (E.GIVE_UP, False))
    assert worker.ledger.held_ids == ()


def test_handlers_that_swallow_the_grace_are_settled_on_their_behalf() -> None:
    worker = Worker()
    worker.phases.fire(PE.INIT_OK)
    running = worker.admit("running", Admission.RUN)
    stopping = worker.admit("stopping", Admission.RUN)
    reporting = worker.admit("reporting", Admission.RUN)
    for job in (running, stopping, reporting):
        worker.ledger.fire(job, E.START)
    worker.ledger.fire(stopping, E.REQUEST_STOP)
    worker.ledger.fire(reporting, E.FINISH)
    worker.shutdown()
    decided = {job.id: on_stuck(job.state) for job in worker.ledger}
    assert decided == {
        "running": Outcome.REPORT_SHUTDOWN,
        "stopping": Outcome.STOP,
        "reporting": Outcome.PROPAGATE,  # its report is already on its way
    }
    worker.ledger.fire(running, SETTLES[decided["running"]])
    worker.ledger.fire(stopping, SETTLES[decided["stopping"]])
    assert (running.state, stopping.state) == (S.REPORTING, S.STOPPED)


def test_refresh_worker_drains_after_the_first_report() -> None:
    worker = Worker()
    bad = worker.admit("bad", Admission.MALFORMED, malformed=True)
    worker.ledger.fire(bad, E.FAIL)
    # Even before the initializer returned, a malformed job's report ends the worker.
    worker.delivered(bad, False, (E.GIVE_UP, True), refresh=True)
    assert worker.phases.phase is P.DRAINING
    # A report after the drain asks for no second one.
    worker.phases.fire(PE.INIT_OK)
    other = worker.admit("other", Admission.RUN)
    worker.ledger.fire(other, E.START)
    worker.ledger.fire(other, E.FINISH)
    worker.delivered(other, True, (E.ACKNOWLEDGE, False), refresh=True)


# --- each decision's table ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("phase", "gate_open", "stop", "malformed", "expected"),
    [
        (P.INITIALIZING, False, False, False, Admission.RUN),
        (P.READY, True, False, False, Admission.RUN),
        (P.DRAINING, True, False, False, Admission.RUN),  # the drained take, gate open
        (P.DRAINING, False, False, False, Admission.RELEASE),
        (P.INIT_FAILED, False, False, False, Admission.FAIL),
        (P.READY, True, False, True, Admission.MALFORMED),
        (P.DRAINING, False, False, True, Admission.MALFORMED),  # reported, not released
        (P.INIT_FAILED, False, False, True, Admission.FAIL),  # the init failure wins
        (P.READY, True, True, False, Admission.STOP),
        (P.READY, True, True, True, Admission.STOP),
        (P.DRAINING, False, True, False, Admission.STOP),
        (P.INIT_FAILED, False, True, False, Admission.STOP),  # a stop wins over everything
    ],
)
def test_on_admit(
    phase: WorkerPhase, gate_open: bool, stop: bool, malformed: bool, expected: Admission
) -> None:
    assert (
        on_admit(phase, gate_open=gate_open, stop_remembered=stop, malformed=malformed) is expected
    )


CANCELLED = [
    # A stop wins: whatever the phase, even past the grace.
    *[(S.STOPPING, p, g, Outcome.STOP) for p in P for g in (False, True)],
    (S.RUNNING, P.DRAINING, True, Outcome.REPORT_SHUTDOWN),
    (S.RUNNING, P.DRAINING, False, Outcome.PROPAGATE),  # serve() itself cancelled
    (S.RUNNING, P.READY, False, Outcome.PROPAGATE),
    (S.TAKEN, P.INIT_FAILED, False, Outcome.REPORT_INIT_FAILURE),
    (S.WAITING_FOR_INIT, P.INIT_FAILED, False, Outcome.REPORT_INIT_FAILURE),
    (S.MALFORMED, P.INIT_FAILED, False, Outcome.REPORT_INIT_FAILURE),
    (S.RELEASING, P.INIT_FAILED, False, Outcome.REPORT_INIT_FAILURE),
    (S.RELEASING, P.DRAINING, False, Outcome.RELEASE),
    (S.RELEASING, P.DRAINING, True, Outcome.RELEASE),
    (S.TAKEN, P.DRAINING, False, Outcome.RELEASE),
    (S.WAITING_FOR_INIT, P.DRAINING, True, Outcome.RELEASE),
    # Waiting for a handler slot is waiting at the gate's twin: released, never run.
    (S.WAITING_FOR_SLOT, P.DRAINING, False, Outcome.RELEASE),
    (S.WAITING_FOR_SLOT, P.DRAINING, True, Outcome.RELEASE),
    (S.WAITING_FOR_SLOT, P.INIT_FAILED, False, Outcome.REPORT_INIT_FAILURE),
    (S.WAITING_FOR_SLOT, P.READY, False, Outcome.PROPAGATE),
    (S.TAKEN, P.READY, False, Outcome.PROPAGATE),
    (S.WAITING_FOR_INIT, P.INITIALIZING, False, Outcome.PROPAGATE),
    (S.MALFORMED, P.DRAINING, False, Outcome.PROPAGATE),
    (S.REPORTING, P.INIT_FAILED, True, Outcome.PROPAGATE),  # a report in flight goes out
    (S.REPORTING, P.DRAINING, True, Outcome.PROPAGATE),
]


@pytest.mark.parametrize(("state", "phase", "grace_over", "expected"), CANCELLED)
def test_on_cancelled(
    state: JobState, phase: WorkerPhase, grace_over: bool, expected: Outcome
) -> None:
    assert on_cancelled(state, phase, grace_over=grace_over) is expected


@pytest.mark.parametrize("state", list(S))
@pytest.mark.parametrize("phase", list(P))
@pytest.mark.parametrize("grace_over", [False, True])
def test_every_outcome_is_a_transition_from_that_state(
    state: JobState, phase: WorkerPhase, grace_over: bool
) -> None:
    event = {
        Outcome.STOP: E.STOP,
        Outcome.RELEASE: E.RELEASE,
        Outcome.REPORT_INIT_FAILURE: E.FAIL,
        Outcome.REPORT_SHUTDOWN: E.FINISH,
    }.get(on_cancelled(state, phase, grace_over=grace_over))
    assert event is None or (state, event) in TRANSITIONS


@pytest.mark.parametrize(
    ("state", "gate_open", "expected"),
    [
        (S.TAKEN, False, True),
        (S.WAITING_FOR_INIT, False, True),
        (S.TAKEN, True, False),  # the gate is open: it will run within the grace
        (S.WAITING_FOR_SLOT, True, True),  # no handler slot: it would never start in time
        (S.MALFORMED, False, False),
        (S.STOPPING, False, False),
        (S.RUNNING, False, False),
        (S.RELEASING, False, False),
    ],
)
def test_releases_at_shutdown(state: JobState, gate_open: bool, expected: bool) -> None:
    assert releases_at_shutdown(state, gate_open=gate_open) is expected


@pytest.mark.parametrize("state", list(S))
def test_on_stuck_settles_only_a_handler_still_running_or_stopping(state: JobState) -> None:
    expected = {S.RUNNING: Outcome.REPORT_SHUTDOWN, S.STOPPING: Outcome.STOP}
    outcome = on_stuck(state)
    assert outcome is expected.get(state, Outcome.PROPAGATE)
    event = {Outcome.STOP: E.STOP, Outcome.REPORT_SHUTDOWN: E.FINISH}.get(outcome)
    assert event is None or (state, event) in TRANSITIONS


@pytest.mark.parametrize(
    ("phase", "delivered", "refresh", "expected"),
    [
        (P.READY, True, False, (E.ACKNOWLEDGE, False)),
        (P.READY, False, False, (E.GIVE_UP, False)),
        (P.READY, True, True, (E.ACKNOWLEDGE, True)),
        (P.READY, False, True, (E.GIVE_UP, True)),
        (P.INITIALIZING, True, True, (E.ACKNOWLEDGE, True)),  # a malformed job's report
        (P.DRAINING, True, True, (E.ACKNOWLEDGE, False)),
        (P.INIT_FAILED, True, True, (E.ACKNOWLEDGE, False)),
    ],
)
def test_on_delivered(
    phase: WorkerPhase, delivered: bool, refresh: bool, expected: tuple[JobEvent, bool]
) -> None:
    assert on_delivered(phase, delivered=delivered, refresh_worker=refresh) == expected
