"""The job machine and the worker phase, walked by hand (docs/design.md §3, §4).

In the manner of h11's ``test_state.py``: each test drives one job (or the worker) through
a life written out event by event, checks the state after every step, and checks at the
points where it matters that the events that must not apply there raise and change
nothing. The cases are not generated from ``TRANSITIONS``: the table is what is under
test. ``test_the_walks_cover_every_row`` only checks that every row of the table is walked
by some life below, so a new row comes with its story.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from trio_worker import Timings
from trio_worker._state import (
    PHASE_TRANSITIONS,
    TRANSITIONS,
    HeldJob,
    IllegalTransition,
    JobEvent,
    JobState,
    PhaseEvent,
    WorkerPhase,
    WorkerState,
)

S = JobState
E = JobEvent
P = WorkerPhase
PE = PhaseEvent
DOCS = Path(__file__).resolve().parents[1] / "docs" / "how-it-works.md"
_SPEC = importlib.util.spec_from_file_location(
    "state_diagrams", DOCS.parents[1] / "scripts" / "state_diagrams.py"
)
assert _SPEC is not None and _SPEC.loader is not None
diagrams = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(diagrams)

# Every (state, event) a walk below fired successfully.
WALKED: set[tuple[JobState, JobEvent]] = set()


class Walk:
    """One job driven by hand: each step names the event and the state it must lead to."""

    def __init__(self, job_id: str = "j") -> None:
        self.job = HeldJob(job_id, {"id": job_id, "input": None})

    @property
    def state(self) -> JobState:
        return self.job.state

    def then(self, event: JobEvent, expected: JobState) -> Walk:
        before, history = self.job.state, list(self.job.history)
        assert self.job.can(event)
        assert self.job.fire(event) is expected
        assert self.job.state is expected
        assert self.job.history == [*history, before]
        WALKED.add((before, event))
        return self

    def refuses(self, *events: JobEvent) -> Walk:
        """Each of *events* raises here and leaves the job as it was."""
        for event in events:
            state, history = self.job.state, list(self.job.history)
            assert not self.job.can(event)
            with pytest.raises(IllegalTransition):
                self.job.fire(event)
            assert (self.job.state, self.job.history) == (state, history)
        return self

    def ends(self, expected: JobState) -> None:
        assert self.job.state is expected
        assert expected.terminal
        self.refuses(*E)


# --- lives of a job -----------------------------------------------------------------------


def test_a_job_behind_the_gate_runs_and_is_acknowledged() -> None:
    walk = Walk()
    assert walk.state is S.TAKEN and walk.job.history == []
    walk.then(E.WAIT_FOR_INIT, S.WAITING_FOR_INIT)
    walk.refuses(E.FINISH, E.ACKNOWLEDGE, E.STOP, E.WAIT_FOR_INIT)
    walk.then(E.START, S.RUNNING)
    # A started job is never released, never failed by the init, never started twice.
    walk.refuses(E.REQUEST_RELEASE, E.RELEASE, E.FAIL, E.START, E.WAIT_FOR_SLOT)
    walk.then(E.FINISH, S.REPORTING)
    # A report in flight is not cancelled by a stop, nor released.
    walk.refuses(E.REQUEST_STOP, E.STOP, E.REQUEST_RELEASE, E.FINISH)
    walk.then(E.ACKNOWLEDGE, S.DONE)
    walk.ends(S.DONE)
    assert walk.job.history == [S.TAKEN, S.WAITING_FOR_INIT, S.RUNNING, S.REPORTING]


def test_a_job_past_an_open_gate_starts_at_once_and_its_report_can_be_lost() -> None:
    walk = Walk().then(E.START, S.RUNNING).then(E.FINISH, S.REPORTING)
    walk.then(E.GIVE_UP, S.UNDELIVERED)
    walk.ends(S.UNDELIVERED)


def test_a_job_waits_for_a_handler_slot_then_runs() -> None:
    # Straight from the take (gate open) ...
    walk = Walk().then(E.WAIT_FOR_SLOT, S.WAITING_FOR_SLOT)
    # ... only a started handler finishes, and the gate comes before the slot.
    walk.refuses(E.FINISH, E.WAIT_FOR_INIT, E.WAIT_FOR_SLOT, E.ACKNOWLEDGE)
    walk.then(E.START, S.RUNNING).then(E.FINISH, S.REPORTING).then(E.ACKNOWLEDGE, S.DONE)
    # ... or after the gate opened with every slot taken.
    walk = Walk().then(E.WAIT_FOR_INIT, S.WAITING_FOR_INIT)
    walk.then(E.WAIT_FOR_SLOT, S.WAITING_FOR_SLOT).then(E.START, S.RUNNING)
    walk.refuses(E.WAIT_FOR_SLOT)


def test_a_stop_reaches_a_running_handler() -> None:
    walk = Walk().then(E.START, S.RUNNING).then(E.REQUEST_STOP, S.STOPPING)
    # A stopped job never starts again, and the init failure does not win over the stop.
    walk.refuses(E.START, E.FAIL, E.REQUEST_STOP, E.REQUEST_RELEASE, E.ACKNOWLEDGE)
    walk.then(E.STOP, S.STOPPED)
    walk.ends(S.STOPPED)


def test_a_handler_that_returns_before_its_stop_lands_is_reported() -> None:
    walk = Walk().then(E.START, S.RUNNING).then(E.REQUEST_STOP, S.STOPPING)
    walk.then(E.FINISH, S.REPORTING).then(E.ACKNOWLEDGE, S.DONE)


def test_a_stop_reaches_a_job_that_never_started() -> None:
    # A stop is requested first, then settled: never straight to STOPPED.
    Walk().refuses(E.STOP).then(E.REQUEST_STOP, S.STOPPING).then(E.STOP, S.STOPPED)
    walk = Walk().then(E.WAIT_FOR_INIT, S.WAITING_FOR_INIT)
    walk.then(E.REQUEST_STOP, S.STOPPING).refuses(E.START).then(E.STOP, S.STOPPED)
    walk = Walk().then(E.WAIT_FOR_SLOT, S.WAITING_FOR_SLOT)
    walk.then(E.REQUEST_STOP, S.STOPPING).then(E.STOP, S.STOPPED)
    walk = Walk().then(E.MARK_MALFORMED, S.MALFORMED)
    walk.then(E.REQUEST_STOP, S.STOPPING).then(E.STOP, S.STOPPED)


def test_a_malformed_job_is_reported_never_run_never_released() -> None:
    walk = Walk().then(E.MARK_MALFORMED, S.MALFORMED)
    walk.refuses(E.START, E.WAIT_FOR_INIT, E.WAIT_FOR_SLOT, E.REQUEST_RELEASE, E.RELEASE)
    walk.refuses(E.MARK_MALFORMED, E.FINISH)
    walk.then(E.FAIL, S.REPORTING).then(E.ACKNOWLEDGE, S.DONE)


def test_an_init_failure_fails_every_job_not_started() -> None:
    Walk().then(E.FAIL, S.REPORTING).then(E.ACKNOWLEDGE, S.DONE)
    walk = Walk().then(E.WAIT_FOR_INIT, S.WAITING_FOR_INIT).then(E.FAIL, S.REPORTING)
    walk.then(E.GIVE_UP, S.UNDELIVERED)
    Walk().then(E.WAIT_FOR_SLOT, S.WAITING_FOR_SLOT).then(E.FAIL, S.REPORTING)
    # A running job is past the init: the failure never reaches it.
    Walk().then(E.START, S.RUNNING).refuses(E.FAIL)


def test_a_shutdown_releases_jobs_that_never_started() -> None:
    # Requested, then settled once the job's task unwound.
    walk = Walk().then(E.REQUEST_RELEASE, S.RELEASING)
    walk.refuses(E.START, E.WAIT_FOR_INIT, E.WAIT_FOR_SLOT, E.FINISH, E.REQUEST_RELEASE)
    walk.then(E.RELEASE, S.RELEASED)
    walk.ends(S.RELEASED)
    Walk().then(E.WAIT_FOR_INIT, S.WAITING_FOR_INIT).then(E.REQUEST_RELEASE, S.RELEASING)
    Walk().then(E.WAIT_FOR_SLOT, S.WAITING_FOR_SLOT).then(E.REQUEST_RELEASE, S.RELEASING)
    # Cancelled from outside during the shutdown, with no request first.
    Walk().then(E.RELEASE, S.RELEASED)
    Walk().then(E.WAIT_FOR_INIT, S.WAITING_FOR_INIT).then(E.RELEASE, S.RELEASED)
    Walk().then(E.WAIT_FOR_SLOT, S.WAITING_FOR_SLOT).then(E.RELEASE, S.RELEASED)


def test_a_release_gives_way_to_a_stop_or_to_the_init_failure() -> None:
    walk = Walk().then(E.REQUEST_RELEASE, S.RELEASING).then(E.REQUEST_STOP, S.STOPPING)
    walk.then(E.STOP, S.STOPPED)
    # The initializer failed in the same step as the shutdown request: the job is owed
    # the init failure's report.
    walk = Walk().then(E.WAIT_FOR_INIT, S.WAITING_FOR_INIT).then(E.REQUEST_RELEASE, S.RELEASING)
    walk.then(E.FAIL, S.REPORTING).then(E.ACKNOWLEDGE, S.DONE)


LIVES: list[Callable[[], None]] = [
    test_a_job_behind_the_gate_runs_and_is_acknowledged,
    test_a_job_past_an_open_gate_starts_at_once_and_its_report_can_be_lost,
    test_a_job_waits_for_a_handler_slot_then_runs,
    test_a_stop_reaches_a_running_handler,
    test_a_handler_that_returns_before_its_stop_lands_is_reported,
    test_a_stop_reaches_a_job_that_never_started,
    test_a_malformed_job_is_reported_never_run_never_released,
    test_an_init_failure_fails_every_job_not_started,
    test_a_shutdown_releases_jobs_that_never_started,
    test_a_release_gives_way_to_a_stop_or_to_the_init_failure,
]


def test_the_walks_cover_every_row() -> None:
    WALKED.clear()
    for life in LIVES:
        life()
    unwalked = set(TRANSITIONS) - WALKED
    assert not unwalked, f"rows no life above walks (add one): {sorted(map(str, unwalked))}"


# --- what must never be a row -------------------------------------------------------------

# Transitions that must never exist, each for a reason of its own.
FORBIDDEN = [
    (S.STOPPING, E.START, "a job the platform stopped never starts"),
    (S.RELEASING, E.START, "a released job never starts"),
    (S.MALFORMED, E.START, "a malformed job never runs"),
    (S.MALFORMED, E.REQUEST_RELEASE, "a malformed job is reported even at shutdown"),
    (S.RUNNING, E.RELEASE, "a started job is never released"),
    (S.RUNNING, E.REQUEST_RELEASE, "a started job is never released"),
    (S.RUNNING, E.FAIL, "an init failure never reaches a running job"),
    (S.STOPPING, E.FAIL, "a stop wins over the init failure"),
    (S.REPORTING, E.REQUEST_STOP, "a stop never cancels a report in flight"),
    (S.TAKEN, E.STOP, "a stop is requested first, then settled"),
    (S.TAKEN, E.ACKNOWLEDGE, "nothing is acknowledged before it is reported"),
    (S.WAITING_FOR_INIT, E.FINISH, "only a started handler finishes"),
    (S.WAITING_FOR_SLOT, E.FINISH, "only a started handler finishes"),
    (S.WAITING_FOR_SLOT, E.WAIT_FOR_INIT, "the gate comes before the slot"),
    (S.RUNNING, E.WAIT_FOR_SLOT, "a running handler already has its slot"),
    *[(t, e, "a terminal state accepts nothing") for t in S if t.terminal for e in E],
]

# A hand-written way to each state, for the forbidden events above.
WAY_TO: dict[JobState, tuple[JobEvent, ...]] = {
    S.TAKEN: (),
    S.MALFORMED: (E.MARK_MALFORMED,),
    S.WAITING_FOR_INIT: (E.WAIT_FOR_INIT,),
    S.WAITING_FOR_SLOT: (E.WAIT_FOR_SLOT,),
    S.RUNNING: (E.START,),
    S.STOPPING: (E.REQUEST_STOP,),
    S.RELEASING: (E.REQUEST_RELEASE,),
    S.REPORTING: (E.START, E.FINISH),
    S.DONE: (E.START, E.FINISH, E.ACKNOWLEDGE),
    S.UNDELIVERED: (E.START, E.FINISH, E.GIVE_UP),
    S.STOPPED: (E.REQUEST_STOP, E.STOP),
    S.RELEASED: (E.REQUEST_RELEASE, E.RELEASE),
}


@pytest.mark.parametrize(
    ("state", "event", "why"), FORBIDDEN, ids=[f"{s.value}-{e.value}" for s, e, _ in FORBIDDEN]
)
def test_forbidden_transition_raises_and_changes_nothing(
    state: JobState, event: JobEvent, why: str
) -> None:
    job = HeldJob("job-9", {})
    for step in WAY_TO[state]:
        job.fire(step)
    assert job.state is state
    history = list(job.history)
    assert not job.can(event), why
    with pytest.raises(IllegalTransition) as info:
        job.fire(event)
    assert (info.value.who, info.value.state, info.value.event) == ("job job-9", state, event)
    assert str(info.value) == f"job job-9: no transition from {state.value} on {event.value}"
    assert job.state is state
    assert job.history == history


# --- the shape of the tables --------------------------------------------------------------


def test_terminal_states_are_exactly_those_without_a_way_out() -> None:
    sources = {state for state, _ in TRANSITIONS}
    assert {state for state in S if state.terminal} == set(S) - sources
    assert {state for state in S if state.terminal} == {
        S.DONE,
        S.UNDELIVERED,
        S.STOPPED,
        S.RELEASED,
    }


def _reachable(table: Mapping[tuple[Any, Any], Any], start: Any) -> set[Any]:
    seen, todo = {start}, [start]
    while todo:
        here = todo.pop()
        for (a, _), b in table.items():
            if a is here and b not in seen:
                seen.add(b)
                todo.append(b)
    return seen


def test_every_job_state_is_reachable_and_every_one_can_end() -> None:
    assert _reachable(TRANSITIONS, S.TAKEN) == set(S)
    for state in S:
        assert any(s.terminal for s in _reachable(TRANSITIONS, state)), state


# --- the worker phase ---------------------------------------------------------------------


PHASE_PATHS: list[tuple[list[PhaseEvent], WorkerPhase, bool]] = [
    ([], P.INITIALIZING, False),
    ([PE.INIT_OK], P.READY, True),
    ([PE.INIT_FAIL], P.INIT_FAILED, False),
    ([PE.DRAIN], P.DRAINING, False),
    ([PE.INIT_OK, PE.DRAIN], P.DRAINING, True),
    ([PE.DRAIN, PE.INIT_OK], P.DRAINING, True),
    ([PE.DRAIN, PE.INIT_FAIL], P.INIT_FAILED, False),
]


@pytest.mark.parametrize(("events", "phase", "gate_open"), PHASE_PATHS)
def test_phase_paths_and_the_gate(
    events: list[PhaseEvent], phase: WorkerPhase, gate_open: bool
) -> None:
    phases = WorkerState(Timings())
    for event in events:
        phases.fire(event)
    assert (phases.phase, phases.gate_open) == (phase, gate_open)


@pytest.mark.parametrize(
    ("events", "event"),
    [
        ([PE.INIT_FAIL], PE.DRAIN),  # a shutdown after an init failure does nothing
        ([PE.INIT_FAIL], PE.INIT_OK),
        ([PE.INIT_OK], PE.INIT_OK),
        ([PE.INIT_OK], PE.INIT_FAIL),  # a READY worker cannot fail its init any more
        ([PE.DRAIN], PE.DRAIN),
    ],
)
def test_illegal_phase_events(events: list[PhaseEvent], event: PhaseEvent) -> None:
    seen: list[object] = []
    phases = WorkerState(Timings())
    for e in events:
        phases.fire(e)
    phases.observers.append(lambda *change: seen.append(change))
    before = phases.phase, phases.gate_open
    assert not phases.can(event)
    with pytest.raises(IllegalTransition, match=f"worker: no transition from {before[0].value}"):
        phases.fire(event)
    assert (phases.phase, phases.gate_open) == before
    assert seen == []


def test_phase_observers_see_before_event_after() -> None:
    seen: list[tuple[WorkerPhase, PhaseEvent, WorkerPhase]] = []
    phases = WorkerState(Timings())
    phases.observers.append(lambda *change: seen.append(change))
    phases.fire(PE.INIT_OK)
    phases.fire(PE.DRAIN)
    assert seen == [(P.INITIALIZING, PE.INIT_OK, P.READY), (P.READY, PE.DRAIN, P.DRAINING)]


def test_every_phase_is_reachable() -> None:
    assert _reachable(PHASE_TRANSITIONS, P.INITIALIZING) == set(P)


# --- the docs are drawn from the tables ---------------------------------------------------


def _generated(name: str) -> str:
    text = DOCS.read_text()
    start = f"<!-- generated: {name} (scripts/state_diagrams.py) -->\n"
    assert start in text, f"{DOCS.name} has no generated {name} block"
    body = text.split(start, 1)[1]
    return body.split("\n<!-- end generated -->", 1)[0]


def test_docs_diagrams_are_the_rendered_tables() -> None:
    assert _generated("job states") == diagrams.job_diagram()
    assert _generated("worker phases") == diagrams.phase_diagram()


def test_docs_table_lists_exactly_the_transitions() -> None:
    rows = re.findall(r"^\| `(\w+)` \| `(\w+)` \| `(\w+)` \|", DOCS.read_text(), re.MULTILINE)
    names = S.__members__
    documented = {(names[src], E(ev)): names[dst] for src, ev, dst in rows if src in names}
    assert documented == TRANSITIONS
    assert len([r for r in rows if r[0] in S.__members__]) == len(TRANSITIONS)
