"""All of the worker's state: the job machine, the worker phase and the ledger of held jobs.

Theory of operation
-------------------
A job is *held* from the moment a take response carrying it is parsed until its terminal
report is acknowledged or finally given up, or until it is stopped or released. While held,
the job's id is listed in every ping, counts against capacity, and is owed exactly one
terminal report (docs/design.md §4 I1), unless the platform stopped it or the worker released it.

Two synchronous, table-driven machines hold every fact the supervisor decides on, in the
manner of h11's ``_state.py``; the trio tasks only *drive* them by firing events and
cancelling scopes, and no I/O happens here, so the property suite can check every step:

* ``TRANSITIONS`` moves one job. A stop or a release is first *requested*
  (``STOPPING``, ``RELEASING``: the job's cancel scope is cancelled, the task unwinds) and
  then settled (``STOPPED``, ``RELEASED``). A job that cannot be run as delivered is
  ``MALFORMED`` from admission and goes to ``REPORTING`` with the reason. ``fail`` is the
  path of a job whose report is owed without the handler ever running (an init failure, a
  malformed job). ``WAITING_FOR_SLOT`` is a job past the gate while ``concurrency`` handlers
  already run: held (pinged, counted) but not started, so it is stopped, released or failed
  like a job at the gate (docs/design.md §4 I7). ``UNDELIVERED`` means every retry of the
  terminal report failed: the job leaves the ledger (the loss is logged loudly) so it can
  no longer block capacity.
* ``PHASE_TRANSITIONS`` moves the worker: ``INITIALIZING`` until the initializer returns,
  then ``READY`` or ``INIT_FAILED``; ``DRAINING`` once a shutdown starts. The gate is open
  once ``init_ok`` has fired, whatever the phase since: the initializer may return in the
  same step as a shutdown request, and its result still counts.

What the supervisor does on an admission, a cancellation or a delivery is a pure function
of these states (``_decisions.py``). ``docs/how-it-works.md`` draws both tables; its
diagrams are rendered by :func:`mermaid_diagram` (``scripts/state_diagrams.py``) and a test
keeps them equal.

The ledger's held ids are the keys of an insertion-ordered dict. Their tuple snapshot, which
the heartbeat thread reads, is built lazily: a change only marks it stale, and the next read
rebuilds it once. Rebuilding it on every change made a take answer of 200,000 jobs cost
O(n²) and froze the event loop for minutes (docs/security.md). A lock makes the rebuild
and the changes exclusive, so a read from the heartbeat thread never sees a dict mid-change;
each change holds it for one dict operation.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ._watch import records as crash_records


class JobState(enum.Enum):
    # Every transition hashes a (state, event) pair: by identity, in C, not by name
    # through Enum.__hash__ (equality is identity for both anyway).
    __hash__ = object.__hash__

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
    # Every transition hashes a (state, event) pair: by identity, in C, not by name
    # through Enum.__hash__ (equality is identity for both anyway).
    __hash__ = object.__hash__

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
del S, E


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
    # The initializer returned in the same step as the shutdown request.
    (P.DRAINING, PE.INIT_OK): P.DRAINING,
    (P.DRAINING, PE.INIT_FAIL): P.INIT_FAILED,
}
del P, PE


class IllegalTransition(RuntimeError):
    """Raised when an event is fired in a state that has no transition for it (a bug)."""

    def __init__(self, who: str, state: enum.Enum, event: enum.Enum) -> None:
        super().__init__(f"{who}: no transition from {state.value} on {event.value}")
        self.who = who
        self.state = state
        self.event = event


@dataclass
class HeldJob:
    """One job the worker took, with its current state."""

    id: str
    payload: dict[str, Any]
    state: JobState = JobState.TAKEN
    history: list[JobState] = field(default_factory=list)
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


PhaseHook = Callable[[WorkerPhase, PhaseEvent, WorkerPhase], None]


class Phases:
    """The worker's phase; ``observers`` are called as ``f(before, event, after)``."""

    def __init__(self) -> None:
        self.phase = WorkerPhase.INITIALIZING
        self.gate_open = False
        self.observers: list[PhaseHook] = []

    def can(self, event: PhaseEvent) -> bool:
        return (self.phase, event) in PHASE_TRANSITIONS

    def fire(self, event: PhaseEvent) -> WorkerPhase:
        """Apply *event*; raises :class:`IllegalTransition` when it does not apply."""
        before = self.phase
        try:
            self.phase = PHASE_TRANSITIONS[(before, event)]
        except KeyError:
            raise IllegalTransition("worker", before, event) from None
        self.gate_open = self.gate_open or event is PhaseEvent.INIT_OK
        if event is PhaseEvent.INIT_OK:
            crash_records.ready()  # the crash watchdog: past the initializer
        for observer in self.observers:
            observer(before, event, self.phase)
        return self.phase


TransitionHook = Callable[[HeldJob, JobState, JobEvent], None]


class Ledger:
    """The single source of truth for which jobs the worker holds.

    ``on_change`` is called after every transition that changes the held set; the supervisor
    uses it to wake the take loop when a slot frees.
    """

    def __init__(self, on_change: Callable[[], None] | None = None) -> None:
        self._jobs: dict[str, HeldJob] = {}
        self._lock = threading.Lock()
        self._snapshot: tuple[str, ...] | None = ()  # None: stale, rebuilt on the next read
        self._on_change = on_change
        self.observers: list[TransitionHook] = []
        self.ever_held = 0

    def __len__(self) -> int:
        return len(self._jobs)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._jobs

    def __iter__(self) -> Iterator[HeldJob]:
        return iter(list(self._jobs.values()))

    @property
    def held_ids(self) -> tuple[str, ...]:
        """A snapshot, safe to read from another thread; O(n) once per change, not per add."""
        snapshot = self._snapshot
        if snapshot is None:
            with self._lock:
                snapshot = self._snapshot
                if snapshot is None:
                    snapshot = self._snapshot = tuple(self._jobs)
        return snapshot

    def reporting(self) -> bool:
        """Whether a terminal report is being delivered (each bounded by its own deadline)."""
        return any(job.state is JobState.REPORTING for job in self._jobs.values())

    def get(self, job_id: str) -> HeldJob | None:
        return self._jobs.get(job_id)

    def add(self, job_id: str, payload: dict[str, Any]) -> HeldJob | None:
        """Hold a newly taken job; None when that id is already held (a duplicate delivery)."""
        if job_id in self._jobs:
            return None
        job = HeldJob(job_id, payload)
        with self._lock:
            self._jobs[job_id] = job
            self._snapshot = None
        crash_records.take(job_id)  # the crash watchdog's view of the ledger
        self.ever_held += 1
        self._changed()
        return job

    def fire(self, job: HeldJob, event: JobEvent) -> JobState:
        before = job.state
        state = job.fire(event)
        for observer in self.observers:
            observer(job, before, event)
        if event in _NOTHING_OWED:
            # The crash watchdog must not report it either, should the worker die now.
            crash_records.settle(job.id)
        if state.terminal:
            with self._lock:
                del self._jobs[job.id]
                self._snapshot = None
            crash_records.settle(job.id)
            self._changed()
        return state

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()


def mermaid_diagram(
    table: Mapping[tuple[Any, Any], enum.Enum],
    *,
    start: enum.Enum,
    ends: Iterable[enum.Enum],
    entry: str,
) -> str:
    """*table* as a Mermaid state diagram, one arrow per row, in the table's order."""
    lines = ["```mermaid", "stateDiagram-v2", f"    [*] --> {start.name} : {entry}"]
    lines += [f"    {a.name} --> {b.name} : {e.value}" for (a, e), b in table.items()]
    lines += [f"    {state.name} --> [*]" for state in ends]
    return "\n".join([*lines, "```"])


def job_diagram() -> str:
    ends = [state for state in JobState if state.terminal]
    return mermaid_diagram(TRANSITIONS, start=JobState.TAKEN, ends=ends, entry="take answer parsed")


def phase_diagram() -> str:
    ends = [WorkerPhase.INIT_FAILED, WorkerPhase.DRAINING]
    return mermaid_diagram(
        PHASE_TRANSITIONS, start=WorkerPhase.INITIALIZING, ends=ends, entry="serve() starts"
    )
