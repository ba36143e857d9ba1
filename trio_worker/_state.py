"""The worker's state and rules, with no I/O: h11's rule 1 for the worker.

Theory of operation: ``TRANSITIONS`` moves one job (:class:`HeldJob`), ``PHASE_TRANSITIONS``
the worker (:class:`WorkerState`, with the deadlines a stop sets); the decisions
(``on_admit``, ``on_cancelled``, ...) are pure functions of these states. The trio tasks only
fire events; what the outside must learn goes through hooks (``records``, ``on_change``).
docs/how-it-works.md, "The state and its deadlines" and "The job state machine", explains
and draws the tables (``scripts/state_diagrams.py``); "The ledger" and docs/security.md
why the held ids' snapshot is rebuilt lazily, once per read that follows a change.
"""

from __future__ import annotations

import enum
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Iterator

    from ._config import Timings


class JobState(enum.Enum):
    __hash__ = object.__hash__  # by identity, in C: every transition hashes a pair

    TAKEN = "taken"
    MALFORMED = "malformed"
    WAITING_FOR_INIT = "waiting_for_init"
    WAITING_FOR_SLOT = "waiting_for_slot"
    RUNNING = "running"
    STOPPING = "stopping"
    RELEASING = "releasing"
    REPORTING = "reporting"
    DONE = "done"
    UNDELIVERED = "undelivered"
    STOPPED = "stopped"
    RELEASED = "released"

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL


class JobEvent(enum.Enum):
    __hash__ = object.__hash__  # as JobState's

    MARK_MALFORMED = "mark_malformed"
    WAIT_FOR_INIT = "wait_for_init"
    WAIT_FOR_SLOT = "wait_for_slot"
    START = "start"
    FINISH = "finish"
    FAIL = "fail"
    ACKNOWLEDGE = "acknowledge"
    GIVE_UP = "give_up"
    REQUEST_STOP = "request_stop"
    STOP = "stop"
    REQUEST_RELEASE = "request_release"
    RELEASE = "release"


_TERMINAL = frozenset({JobState.DONE, JobState.UNDELIVERED, JobState.STOPPED, JobState.RELEASED})
# Requests after which the platform expects no report for the job (docs/design.md §9).
_NOTHING_OWED = frozenset({JobEvent.REQUEST_STOP, JobEvent.REQUEST_RELEASE})

S, E = JobState, JobEvent
TRANSITIONS: dict[tuple[JobState, JobEvent], JobState] = {
    (S.TAKEN, E.MARK_MALFORMED): S.MALFORMED,
    (S.TAKEN, E.WAIT_FOR_INIT): S.WAITING_FOR_INIT,
    (S.TAKEN, E.START): S.RUNNING,
    (S.TAKEN, E.FAIL): S.REPORTING,
    (S.TAKEN, E.REQUEST_STOP): S.STOPPING,
    (S.TAKEN, E.REQUEST_RELEASE): S.RELEASING,
    # Cancelled from outside during a shutdown, before it ever waited at the gate.
    (S.TAKEN, E.RELEASE): S.RELEASED,
    (S.MALFORMED, E.FAIL): S.REPORTING,
    (S.MALFORMED, E.REQUEST_STOP): S.STOPPING,
    (S.WAITING_FOR_INIT, E.START): S.RUNNING,
    (S.WAITING_FOR_INIT, E.FAIL): S.REPORTING,
    (S.WAITING_FOR_INIT, E.REQUEST_STOP): S.STOPPING,
    (S.WAITING_FOR_INIT, E.REQUEST_RELEASE): S.RELEASING,
    (S.WAITING_FOR_INIT, E.RELEASE): S.RELEASED,
    # Past the gate, every handler slot taken: the job waits, held and pinged, not started.
    (S.TAKEN, E.WAIT_FOR_SLOT): S.WAITING_FOR_SLOT,
    (S.WAITING_FOR_INIT, E.WAIT_FOR_SLOT): S.WAITING_FOR_SLOT,
    (S.WAITING_FOR_SLOT, E.START): S.RUNNING,
    (S.WAITING_FOR_SLOT, E.FAIL): S.REPORTING,
    (S.WAITING_FOR_SLOT, E.REQUEST_STOP): S.STOPPING,
    (S.WAITING_FOR_SLOT, E.REQUEST_RELEASE): S.RELEASING,
    (S.WAITING_FOR_SLOT, E.RELEASE): S.RELEASED,
    (S.RUNNING, E.FINISH): S.REPORTING,
    (S.RUNNING, E.REQUEST_STOP): S.STOPPING,
    (S.STOPPING, E.STOP): S.STOPPED,
    # The handler returned before the stop reached it: the result goes out.
    (S.STOPPING, E.FINISH): S.REPORTING,
    (S.RELEASING, E.RELEASE): S.RELEASED,
    (S.RELEASING, E.REQUEST_STOP): S.STOPPING,
    # The initializer failed in the same step as the shutdown request.
    (S.RELEASING, E.FAIL): S.REPORTING,
    (S.REPORTING, E.ACKNOWLEDGE): S.DONE,
    (S.REPORTING, E.GIVE_UP): S.UNDELIVERED,
}


class WorkerPhase(enum.Enum):
    INITIALIZING = "initializing"
    READY = "ready"
    INIT_FAILED = "init_failed"
    DRAINING = "draining"


class PhaseEvent(enum.Enum):
    INIT_OK = "init_ok"
    INIT_FAIL = "init_fail"
    DRAIN = "drain"


P, PE = WorkerPhase, PhaseEvent
PHASE_TRANSITIONS: dict[tuple[WorkerPhase, PhaseEvent], WorkerPhase] = {
    (P.INITIALIZING, PE.INIT_OK): P.READY,
    (P.INITIALIZING, PE.INIT_FAIL): P.INIT_FAILED,
    (P.INITIALIZING, PE.DRAIN): P.DRAINING,
    (P.READY, PE.DRAIN): P.DRAINING,
    (P.DRAINING, PE.INIT_OK): P.DRAINING,  # it returned in the same step as the drain
    (P.DRAINING, PE.INIT_FAIL): P.INIT_FAILED,
}


class IllegalTransition(RuntimeError):
    """An event fired in a state with no transition for it (a bug)."""

    def __init__(self, who: str, state: enum.Enum, event: enum.Enum) -> None:
        super().__init__(f"{who}: no transition from {state.value} on {event.value}")
        self.who, self.state, self.event = who, state, event


class CrashRecords(Protocol):  # what the crash watchdog learns (``_watch._records``)
    def take(self, job_id: str) -> None: ...
    def settle(self, job_id: str) -> None: ...
    def ready(self) -> None: ...


@dataclass
class HeldJob:
    """One job the worker took, with its current state."""

    id: str
    payload: dict[str, Any]
    state: JobState = JobState.TAKEN
    history: list[JobState] = field(default_factory=list)  # the states it left, in order
    reason: str = ""  # why a MALFORMED job cannot be run
    # Settled on its behalf after its handler swallowed the shutdown's cancellation: if the
    # handler ever returns, its task must not settle it again.
    abandoned: bool = False

    def can(self, event: JobEvent) -> bool:
        return (self.state, event) in TRANSITIONS

    def fire(self, event: JobEvent) -> JobState:
        """Apply *event*; raises :class:`IllegalTransition` when it does not apply."""
        try:
            new = TRANSITIONS[(self.state, event)]
        except KeyError:
            raise IllegalTransition(f"job {self.id}", self.state, event) from None
        self.history.append(self.state)
        self.state = new
        return new


TransitionHook = Callable[[HeldJob, JobState, JobEvent], None]
PhaseHook = Callable[[WorkerPhase, PhaseEvent, WorkerPhase], None]


class Ledger:
    """Which jobs the worker holds; ``on_change`` runs after each change of the held set."""

    def __init__(self, on_change: Callable[[], None] | None = None) -> None:
        self._jobs: dict[str, HeldJob] = {}
        self._lock = threading.Lock()
        self._snapshot: tuple[str, ...] | None = ()  # None: stale, rebuilt on the next read
        self._on_change = on_change
        self.observers: list[TransitionHook] = []
        self.records: CrashRecords | None = None
        self.ever_held = 0

    def __len__(self) -> int:
        return len(self._jobs)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._jobs

    def __iter__(self) -> Iterator[HeldJob]:
        return iter(list(self._jobs.values()))

    @property
    def held_ids(self) -> tuple[str, ...]:
        """A snapshot, safe to read from another thread."""
        snapshot = self._snapshot
        if snapshot is None:
            with self._lock:
                snapshot = self._snapshot
                if snapshot is None:
                    snapshot = self._snapshot = tuple(self._jobs)
        return snapshot

    def reporting(self) -> bool:  # a terminal report being delivered (each has a deadline)
        return any(job.state is JobState.REPORTING for job in self._jobs.values())

    def get(self, job_id: str) -> HeldJob | None:
        return self._jobs.get(job_id)

    def add(self, job_id: str, payload: dict[str, Any]) -> HeldJob | None:
        """Hold a newly taken job; None when that id is already held (delivered twice)."""
        if job_id in self._jobs:
            return None
        job = HeldJob(job_id, payload)
        with self._lock:
            self._jobs[job_id] = job
            self._snapshot = None
        if self.records is not None:
            self.records.take(job_id)
        self.ever_held += 1
        self._changed()
        return job

    def fire(self, job: HeldJob, event: JobEvent) -> JobState:
        before = job.state
        state = job.fire(event)
        for observer in self.observers:
            observer(job, before, event)
        if event in _NOTHING_OWED and self.records is not None:
            # The watchdog must not report it either, should the worker die now.
            self.records.settle(job.id)
        if state.terminal:
            with self._lock:
                del self._jobs[job.id]
                self._snapshot = None
            if self.records is not None:
                self.records.settle(job.id)
            self._changed()
        return state

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()


class WorkerState:
    """The worker's phase, its gate, and the deadlines a stop sets (:attr:`deadline`,
    :attr:`grace_end`, :attr:`take_end`: docs/how-it-works.md, "The state and its
    deadlines"). Deadlines only move earlier; ``on_change`` runs after each move,
    ``observers`` see each phase change as ``f(before, event, after)``.
    """

    def __init__(self, timings: Timings) -> None:
        self.timings = timings
        self.phase = WorkerPhase.INITIALIZING
        self.gate_open = False  # once init_ok fired, whatever the phase since
        self.reason = ""
        self.cut = False  # the whole worker was cancelled
        self.deadline = self.grace_end = self.take_end = math.inf
        self.observers: list[PhaseHook] = []
        self.records: CrashRecords | None = None
        self.on_change: Callable[[], None] | None = None

    def __repr__(self) -> str:
        times = f"deadline={self.deadline:.3f} grace_end={self.grace_end:.3f}"
        return f"<WorkerState {self.phase.value} reason={self.reason!r} cut={self.cut} {times}>"

    @property
    def stopping(self) -> bool:
        return self.cut or self.phase in (WorkerPhase.DRAINING, WorkerPhase.INIT_FAILED)

    @property
    def taking(self) -> bool:
        return self.phase in (WorkerPhase.INITIALIZING, WorkerPhase.READY)

    def can(self, event: PhaseEvent) -> bool:
        return (self.phase, event) in PHASE_TRANSITIONS

    def fire(self, event: PhaseEvent) -> WorkerPhase:
        """Apply *event*; raises :class:`IllegalTransition` when it does not apply."""
        before = self.phase
        try:
            self.phase = PHASE_TRANSITIONS[(before, event)]
        except KeyError:
            raise IllegalTransition("worker", before, event) from None
        if event is PhaseEvent.INIT_OK:
            self.gate_open = True
            if self.records is not None:
                self.records.ready()
        for observer in self.observers:
            observer(before, event, self.phase)
        return self.phase

    def init_ok(self) -> None:
        self.fire(PhaseEvent.INIT_OK)

    def drain(self, reason: str, *, now: float) -> bool:
        """A shutdown from *now*; False (and nothing changes) when one is under way."""
        if not self.can(PhaseEvent.DRAIN):
            return False
        self.fire(PhaseEvent.DRAIN)
        timings, self.reason = self.timings, reason
        self.grace_end = now + timings.shutdown_grace
        self.deadline = min(self.deadline, self.grace_end)
        # The take in flight is the platform's to answer within take_drain: whatever it
        # hands over is run, failed or released on purpose (docs/design.md §9).
        self.take_end = min(self.take_end, now + min(timings.take_drain, timings.shutdown_grace))
        self._changed()
        return True

    def fail_init(self, reason: str, *, failed_at: float) -> None:
        """The initializer failed at *failed_at*: reports are cut from then on, a take may
        run ``claim_grace`` more to claim a job to fail (docs/design.md §6)."""
        self.fire(PhaseEvent.INIT_FAIL)
        self.reason, self.deadline = reason, min(self.deadline, failed_at)
        # Set, not shortened: the take that claims a job to fail gets claim_grace even
        # after a drain's take_drain (a take already in flight keeps its own deadline).
        self.take_end = min(failed_at + self.timings.claim_grace, self.grace_end)
        self._changed()

    def cut_now(self, reason: str, *, now: float) -> None:
        """The whole worker is cancelled: every report ends at its ``report_deadline``
        floor; the grace is left alone (the jobs' threads are waited for until it ends)."""
        if now >= self.deadline:
            return
        self.cut, self.reason, self.deadline = True, reason, now
        self._changed()

    def grace_over(self, now: float) -> bool:
        return now >= self.grace_end

    def report_deadline(self, started: float) -> float:
        """A terminal report that started at *started* ends by this: its budget, cut to the
        deadline, never to less than ``report_deadline`` from its start."""
        floor = max(self.deadline, started + self.timings.report_deadline)
        return min(started + self.timings.report_budget, floor)

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()


# -- the decisions ---------------------------------------------------------------------


class Admission(enum.Enum):
    RUN = "run"  # wait at the gate, then run the handler
    STOP = "stop"  # a stop for this id was remembered: stopped on arrival
    MALFORMED = "malformed"  # reported as not runnable
    RELEASE = "release"  # shutting down with the gate closed: released unstarted
    FAIL = "fail"  # init failed: reported with the init failure at once


ADMISSION_EVENTS: dict[Admission, JobEvent] = {
    Admission.STOP: JobEvent.REQUEST_STOP,
    Admission.MALFORMED: JobEvent.MARK_MALFORMED,
    Admission.RELEASE: JobEvent.REQUEST_RELEASE,
}  # what each admission fires at once (RUN and FAIL leave the job TAKEN)


def on_admit(
    phase: WorkerPhase, *, gate_open: bool, stop_remembered: bool, malformed: bool
) -> Admission:
    """What becomes of a job a take just delivered."""
    if stop_remembered:
        return Admission.STOP
    if phase is P.INIT_FAILED:
        return Admission.FAIL
    if malformed:
        return Admission.MALFORMED
    if phase is P.DRAINING and not gate_open:
        return Admission.RELEASE
    return Admission.RUN


# Held, never started: released at shutdown, failed with the init failure.
_NOT_STARTED = (S.TAKEN, S.WAITING_FOR_INIT, S.WAITING_FOR_SLOT)


class Outcome(enum.Enum):
    STOP = "stop"  # fire STOP, report nothing
    RELEASE = "release"  # fire RELEASE, report nothing
    REPORT_INIT_FAILURE = "report_init_failure"  # fire FAIL, report the init failure
    REPORT_SHUTDOWN = "report_shutdown"  # fire FINISH, report worker_shutdown
    PROPAGATE = "propagate"  # nothing to settle: let the cancellation through


def on_cancelled(state: JobState, phase: WorkerPhase, *, grace_over: bool) -> Outcome:
    """How a job in *state* is settled when a cancellation reaches its task."""
    if state is S.STOPPING:
        return Outcome.STOP
    if state is S.RUNNING:
        return Outcome.REPORT_SHUTDOWN if grace_over else Outcome.PROPAGATE
    waiting = state in _NOT_STARTED
    if phase is P.INIT_FAILED and (waiting or state in (S.MALFORMED, S.RELEASING)):
        return Outcome.REPORT_INIT_FAILURE
    if state is S.RELEASING or (waiting and phase is P.DRAINING):
        return Outcome.RELEASE
    return Outcome.PROPAGATE


def releases_at_shutdown(state: JobState, *, gate_open: bool) -> bool:
    """Whether a shutdown releases a held job: one not started, behind a closed gate or
    waiting for a slot (a TAKEN job past an open gate runs within the grace)."""
    return state is S.WAITING_FOR_SLOT or (not gate_open and state in (S.TAKEN, S.WAITING_FOR_INIT))


def on_stuck(state: JobState) -> Outcome:
    """A job whose handler swallowed the grace's cancellation, settled on its behalf."""
    if state is S.STOPPING:
        return Outcome.STOP
    if state is S.RUNNING:
        return Outcome.REPORT_SHUTDOWN
    return Outcome.PROPAGATE  # not stuck in a handler: left to its own task


def on_delivered(
    phase: WorkerPhase, *, delivered: bool, refresh_worker: bool
) -> tuple[JobEvent, bool]:
    """The event a finished report fires, and whether the worker should now drain
    (``refresh_worker``: the first job reported ends the worker, docs/design.md §9)."""
    event = JobEvent.ACKNOWLEDGE if delivered else JobEvent.GIVE_UP
    return event, refresh_worker and phase in (P.INITIALIZING, P.READY)
