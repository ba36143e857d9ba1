"""The job lifecycle: a pure, table-driven state machine and the ledger of held jobs.

Theory of operation
-------------------
A job is *held* from the moment a take response carrying it is parsed until its terminal
report is acknowledged or finally given up, or until it is stopped or released. While held,
the job's id is listed in every ping, counts against capacity, and is owed exactly one
terminal report (docs/design.md §4 I1), unless the platform stopped it or the worker released it.

Each job moves through these states; the trio tasks only *drive* the machine by firing
events, in the manner of h11's ``_state.py``. No I/O happens here, so the property suite can
check every transition::

    TAKEN ──wait_for_init──▶ WAITING_FOR_INIT ──start──▶ RUNNING ──finish──▶ REPORTING
      │                        │                           │                   │
      ├──start─────────────────┼──────────────▶ RUNNING    │          acknowledge / give_up
      ├──fail──────────────────┴──▶ REPORTING (init failure, malformed job)   ▼
      ├──stop / release ──▶ STOPPED / RELEASED             │          DONE / UNDELIVERED
      └────────────────────────────────────────── stop ────┘ (handler unwound) ─▶ STOPPED

``fail`` is the path of a job whose report is owed without the handler ever running: an init
failure, a malformed job, a job arriving during shutdown. ``UNDELIVERED`` means every retry
of the terminal report failed: the job leaves the ledger (the loss is logged loudly) so it
can no longer block capacity.

The ledger keeps a tuple snapshot of held ids, replaced (never mutated) on each change, so
the heartbeat thread can read it without a lock.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any


class JobState(enum.Enum):
    TAKEN = "taken"
    WAITING_FOR_INIT = "waiting_for_init"
    RUNNING = "running"
    REPORTING = "reporting"
    DONE = "done"
    UNDELIVERED = "undelivered"
    STOPPED = "stopped"
    RELEASED = "released"

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL


class JobEvent(enum.Enum):
    WAIT_FOR_INIT = "wait_for_init"
    START = "start"
    FINISH = "finish"
    FAIL = "fail"
    ACKNOWLEDGE = "acknowledge"
    GIVE_UP = "give_up"
    STOP = "stop"
    RELEASE = "release"


_TERMINAL = frozenset({JobState.DONE, JobState.UNDELIVERED, JobState.STOPPED, JobState.RELEASED})

S, E = JobState, JobEvent
TRANSITIONS: dict[tuple[JobState, JobEvent], JobState] = {
    (S.TAKEN, E.WAIT_FOR_INIT): S.WAITING_FOR_INIT,
    (S.TAKEN, E.START): S.RUNNING,
    (S.TAKEN, E.FAIL): S.REPORTING,
    (S.TAKEN, E.STOP): S.STOPPED,
    (S.TAKEN, E.RELEASE): S.RELEASED,
    (S.WAITING_FOR_INIT, E.START): S.RUNNING,
    (S.WAITING_FOR_INIT, E.FAIL): S.REPORTING,
    (S.WAITING_FOR_INIT, E.STOP): S.STOPPED,
    (S.WAITING_FOR_INIT, E.RELEASE): S.RELEASED,
    (S.RUNNING, E.FINISH): S.REPORTING,
    (S.RUNNING, E.STOP): S.STOPPED,
    (S.REPORTING, E.ACKNOWLEDGE): S.DONE,
    (S.REPORTING, E.GIVE_UP): S.UNDELIVERED,
}
del S, E


class IllegalTransition(RuntimeError):
    """Raised when an event is fired in a state that has no transition for it (a bug)."""

    def __init__(self, job_id: str, state: JobState, event: JobEvent) -> None:
        super().__init__(f"job {job_id}: no transition from {state.value} on {event.value}")
        self.job_id = job_id
        self.state = state
        self.event = event


@dataclass
class HeldJob:
    """One job the worker took, with its current state."""

    id: str
    payload: dict[str, Any]
    state: JobState = JobState.TAKEN
    history: list[JobState] = field(default_factory=list)

    def fire(self, event: JobEvent) -> JobState:
        """Apply *event*; raises :class:`IllegalTransition` when it does not apply."""
        try:
            new = TRANSITIONS[(self.state, event)]
        except KeyError:
            raise IllegalTransition(self.id, self.state, event) from None
        self.history.append(self.state)
        self.state = new
        return new


TransitionHook = Callable[[HeldJob, JobState, JobEvent], None]


class Ledger:
    """The single source of truth for which jobs the worker holds.

    ``on_change`` is called after every transition that changes the held set; the supervisor
    uses it to wake the take loop when a slot frees.
    """

    def __init__(self, on_change: Callable[[], None] | None = None) -> None:
        self._jobs: dict[str, HeldJob] = {}
        self._held_ids: tuple[str, ...] = ()
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
        """A snapshot, safe to read from another thread."""
        return self._held_ids

    def get(self, job_id: str) -> HeldJob | None:
        return self._jobs.get(job_id)

    def add(self, job_id: str, payload: dict[str, Any]) -> HeldJob | None:
        """Hold a newly taken job; None when that id is already held (a duplicate delivery)."""
        if job_id in self._jobs:
            return None
        job = HeldJob(job_id, payload)
        self._jobs[job_id] = job
        self.ever_held += 1
        self._changed()
        return job

    def fire(self, job: HeldJob, event: JobEvent) -> JobState:
        before = job.state
        state = job.fire(event)
        for observer in self.observers:
            observer(job, before, event)
        if state.terminal:
            del self._jobs[job.id]
            self._changed()
        return state

    def _changed(self) -> None:
        self._held_ids = tuple(self._jobs)
        if self._on_change is not None:
            self._on_change()
