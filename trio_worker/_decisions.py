"""What the supervisor does at each turn, as pure functions of (job state, worker phase).

Theory of operation
-------------------
The supervisor meets three moments with a choice to make: a take delivers a job
(:func:`on_admit`), a job's task is cancelled or its scope ends without a result
(:func:`on_cancelled`), and a terminal report comes back (:func:`on_delivered`); a
shutdown also decides which held jobs to release (:func:`releases_at_shutdown`). Each is
a function of the states in ``_lifecycle.py`` and a few plain facts (is the gate open, did
the shutdown grace run out), with no I/O and no clock, so the table tests in
``tests/test_decisions.py`` pin every row. The supervisor only carries the answer out.

Precedence, where several things are true at once: a stop the platform asked for wins
over everything (nothing is reported for a stopped job, docs/design.md §9); an init
failure wins over a malformed job or a release (every held job is failed with it,
docs/design.md §6); a malformed job is reported even during a shutdown.
"""

from __future__ import annotations

import enum

from ._lifecycle import JobEvent, JobState, WorkerPhase

S, P = JobState, WorkerPhase


class Admission(enum.Enum):
    RUN = "run"  # wait at the gate, then run the handler
    STOP = "stop"  # a stop for this id was remembered: stopped on arrival
    MALFORMED = "malformed"  # reported as not runnable
    RELEASE = "release"  # shutting down with the gate closed: released unstarted
    FAIL = "fail"  # init failed: reported with the init failure at once


# The job event each admission fires at once (RUN and FAIL leave the job TAKEN).
ADMISSION_EVENTS: dict[Admission, JobEvent] = {
    Admission.STOP: JobEvent.REQUEST_STOP,
    Admission.MALFORMED: JobEvent.MARK_MALFORMED,
    Admission.RELEASE: JobEvent.REQUEST_RELEASE,
}


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
    """How a job in *state* is settled when a cancellation reaches its task.

    *grace_over*: a shutdown started and its grace has run out. Also applied, with the
    phase ``INIT_FAILED``, to jobs that never got a task when init failed.
    """
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
    """Whether a shutdown releases a held job: only one not started, behind a closed gate
    or waiting for a handler slot (a TAKEN job past an open gate runs within the grace)."""
    if state is S.WAITING_FOR_SLOT:
        return True
    return not gate_open and state in (S.TAKEN, S.WAITING_FOR_INIT)


def on_stuck(state: JobState) -> Outcome:
    """A job whose task has not unwound well after the shutdown grace cancelled it: its
    handler swallowed the cancellation. Settled on its behalf, as the cancellation would
    have settled it (docs/design.md §9)."""
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
