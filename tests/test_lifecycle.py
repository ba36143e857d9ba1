"""The job and phase machines, the decisions on them, and the ledger (docs/design.md §3, §4)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_worker._decisions import (
    Admission,
    Outcome,
    on_admit,
    on_cancelled,
    on_delivered,
    on_stuck,
    releases_at_shutdown,
)
from trio_worker._intake import Capacity, StopMemory
from trio_worker._lifecycle import (
    PHASE_TRANSITIONS,
    TRANSITIONS,
    HeldJob,
    IllegalTransition,
    JobEvent,
    JobState,
    Ledger,
    PhaseEvent,
    Phases,
    WorkerPhase,
    job_diagram,
    phase_diagram,
)

S = JobState
E = JobEvent
P = WorkerPhase
PE = PhaseEvent
DOCS = Path(__file__).resolve().parents[1] / "docs" / "how-it-works.md"

# A shortest event path from TAKEN to every state: each must be walkable.
PATH_TO: dict[JobState, list[JobEvent]] = {
    S.TAKEN: [],
    S.MALFORMED: [E.MARK_MALFORMED],
    S.WAITING_FOR_INIT: [E.WAIT_FOR_INIT],
    S.WAITING_FOR_SLOT: [E.WAIT_FOR_SLOT],
    S.RUNNING: [E.START],
    S.STOPPING: [E.REQUEST_STOP],
    S.RELEASING: [E.REQUEST_RELEASE],
    S.REPORTING: [E.START, E.FINISH],
    S.DONE: [E.START, E.FINISH, E.ACKNOWLEDGE],
    S.UNDELIVERED: [E.START, E.FINISH, E.GIVE_UP],
    S.STOPPED: [E.REQUEST_STOP, E.STOP],
    S.RELEASED: [E.REQUEST_RELEASE, E.RELEASE],
}


def job_in(state: JobState, job_id: str = "j") -> HeldJob:
    job = HeldJob(job_id, {"id": job_id, "input": None})
    for event in PATH_TO[state]:
        job.fire(event)
    assert job.state is state
    return job


def test_every_state_has_a_path() -> None:
    assert set(PATH_TO) == set(S)


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


@pytest.mark.parametrize(
    ("state", "event", "target"),
    [(s, e, t) for (s, e), t in TRANSITIONS.items()],
    ids=[f"{s.value}-{e.value}" for s, e in TRANSITIONS],
)
def test_legal_transition(state: JobState, event: JobEvent, target: JobState) -> None:
    job = job_in(state)
    history = list(job.history)
    assert job.can(event)
    assert job.fire(event) is target
    assert job.state is target
    assert job.history == [*history, state]


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


@pytest.mark.parametrize(
    ("state", "event", "why"), FORBIDDEN, ids=[f"{s.value}-{e.value}" for s, e, _ in FORBIDDEN]
)
def test_forbidden_transition_raises_and_changes_nothing(
    state: JobState, event: JobEvent, why: str
) -> None:
    job = job_in(state, "job-9")
    history = list(job.history)
    assert not job.can(event), why
    with pytest.raises(IllegalTransition) as info:
        job.fire(event)
    assert (info.value.who, info.value.state, info.value.event) == ("job job-9", state, event)
    assert str(info.value) == f"job job-9: no transition from {state.value} on {event.value}"
    assert job.state is state
    assert job.history == history


@given(st.lists(st.sampled_from(list(JobEvent)), max_size=30))
def test_random_event_sequences_walk_the_table(events: list[JobEvent]) -> None:
    job = HeldJob("p", {})
    for event in events:
        before = job.state
        try:
            job.fire(event)
        except IllegalTransition:
            assert job.state is before
        else:
            assert not before.terminal
    walk = [*job.history, job.state]
    assert walk[0] is S.TAKEN
    for a, b in itertools.pairwise(walk):
        assert any(s is a and t is b for (s, _), t in TRANSITIONS.items())


@given(st.lists(st.sampled_from(list(JobEvent)), max_size=30))
def test_random_sequences_through_the_ledger_keep_it_consistent(events: list[JobEvent]) -> None:
    ledger = Ledger()
    job = ledger.add("p", {})
    assert job is not None
    for event in events:
        try:
            ledger.fire(job, event)
        except IllegalTransition:
            pass
        assert ("p" in ledger) is (not job.state.terminal)
        assert ledger.held_ids == (() if job.state.terminal else ("p",))
        assert len(ledger) == (0 if job.state.terminal else 1)


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
    phases = Phases()
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
    phases = Phases()
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
    phases = Phases()
    phases.observers.append(lambda *change: seen.append(change))
    phases.fire(PE.INIT_OK)
    phases.fire(PE.DRAIN)
    assert seen == [(P.INITIALIZING, PE.INIT_OK, P.READY), (P.READY, PE.DRAIN, P.DRAINING)]


def test_every_phase_is_reachable() -> None:
    assert _reachable(PHASE_TRANSITIONS, P.INITIALIZING) == set(P)


# --- the decisions ------------------------------------------------------------------------


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


# --- the docs are drawn from the tables ---------------------------------------------------


def _generated(name: str) -> str:
    text = DOCS.read_text()
    start = f"<!-- generated: {name} (scripts/state_diagrams.py) -->\n"
    assert start in text, f"{DOCS.name} has no generated {name} block"
    body = text.split(start, 1)[1]
    return body.split("\n<!-- end generated -->", 1)[0]


def test_docs_diagrams_are_the_rendered_tables() -> None:
    assert _generated("job states") == job_diagram()
    assert _generated("worker phases") == phase_diagram()


def test_docs_table_lists_exactly_the_transitions() -> None:
    rows = re.findall(r"^\| `(\w+)` \| `(\w+)` \| `(\w+)` \|", DOCS.read_text(), re.MULTILINE)
    names = S.__members__
    documented = {(names[src], E(ev)): names[dst] for src, ev, dst in rows if src in names}
    assert documented == TRANSITIONS
    assert len([r for r in rows if r[0] in S.__members__]) == len(TRANSITIONS)


# --- stop memory and capacity -------------------------------------------------------------


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


# --- the ledger ---------------------------------------------------------------------------


def test_add_holds_the_job() -> None:
    ledger = Ledger()
    payload = {"id": "a", "input": 1}
    job = ledger.add("a", payload)
    assert job is not None
    assert job.id == "a"
    assert job.payload is payload
    assert job.state is S.TAKEN
    assert job.history == []
    assert "a" in ledger
    assert ledger.get("a") is job
    assert ledger.get("b") is None
    assert len(ledger) == 1
    assert ledger.held_ids == ("a",)
    assert list(ledger) == [job]
    assert ledger.ever_held == 1


def test_duplicate_add_returns_none_and_keeps_the_first() -> None:
    calls: list[None] = []
    ledger = Ledger(on_change=lambda: calls.append(None))
    first = ledger.add("a", {"v": 1})
    snapshot = ledger.held_ids
    assert ledger.add("a", {"v": 2}) is None
    assert ledger.get("a") is first
    assert first is not None
    assert first.payload == {"v": 1}
    assert len(ledger) == 1
    assert ledger.ever_held == 1
    assert len(calls) == 1
    assert ledger.held_ids is snapshot


def test_held_ids_is_a_tuple_replaced_on_change_never_mutated() -> None:
    ledger = Ledger()
    empty = ledger.held_ids
    assert empty == ()
    a = ledger.add("a", {})
    after_a = ledger.held_ids
    ledger.add("b", {})
    after_b = ledger.held_ids
    assert isinstance(after_b, tuple)
    assert empty == ()
    assert after_a == ("a",)
    assert after_b == ("a", "b")
    assert a is not None
    ledger.fire(a, E.RELEASE)
    assert ledger.held_ids == ("b",)
    # Earlier snapshots, which another thread may be reading, are untouched.
    assert after_a == ("a",)
    assert after_b == ("a", "b")


def test_held_ids_keep_insertion_order() -> None:
    ledger = Ledger()
    for job_id in ["c", "a", "b"]:
        ledger.add(job_id, {})
    assert ledger.held_ids == ("c", "a", "b")


def test_non_terminal_transitions_keep_the_snapshot_and_do_not_call_on_change() -> None:
    calls: list[None] = []
    ledger = Ledger(on_change=lambda: calls.append(None))
    job = ledger.add("a", {})
    assert job is not None
    snapshot = ledger.held_ids
    for event in [E.WAIT_FOR_INIT, E.START, E.FINISH]:
        ledger.fire(job, event)
        assert ledger.held_ids is snapshot
        assert "a" in ledger
    assert len(calls) == 1


@pytest.mark.parametrize("terminal", [S.DONE, S.UNDELIVERED, S.STOPPED, S.RELEASED])
def test_terminal_states_leave_the_ledger(terminal: JobState) -> None:
    calls: list[tuple[str, ...]] = []
    ledger = Ledger(on_change=lambda: calls.append(ledger.held_ids))
    job = ledger.add("a", {})
    ledger.add("b", {})
    assert job is not None
    path = PATH_TO[terminal]
    for event in path[:-1]:
        ledger.fire(job, event)
    assert "a" in ledger
    assert ledger.fire(job, path[-1]) is terminal
    assert "a" not in ledger
    assert ledger.get("a") is None
    assert ledger.held_ids == ("b",)
    assert len(ledger) == 1
    # on_change sees the new snapshot already in place.
    assert calls == [("a",), ("a", "b"), ("b",)]


def test_firing_on_a_finished_job_raises_and_leaves_the_ledger_alone() -> None:
    ledger = Ledger()
    job = ledger.add("a", {})
    ledger.add("b", {})
    assert job is not None
    ledger.fire(job, E.RELEASE)
    for event in JobEvent:
        with pytest.raises(IllegalTransition):
            ledger.fire(job, event)
    assert ledger.held_ids == ("b",)


def test_the_same_id_can_be_held_again_after_it_finished() -> None:
    ledger = Ledger()
    first = ledger.add("a", {"n": 1})
    assert first is not None
    ledger.fire(first, E.RELEASE)
    second = ledger.add("a", {"n": 2})
    assert second is not None
    assert second is not first
    assert second.state is S.TAKEN
    assert ledger.ever_held == 2


def test_ever_held_counts_every_add_never_decreases() -> None:
    ledger = Ledger()
    jobs = [ledger.add(f"j{i}", {}) for i in range(3)]
    ledger.add("j0", {})  # duplicate: not counted
    for job in jobs:
        assert job is not None
        ledger.fire(job, E.RELEASE)
    assert len(ledger) == 0
    assert ledger.ever_held == 3


def test_observers_see_job_previous_state_and_event() -> None:
    seen: list[tuple[str, JobState, JobState, JobEvent, bool]] = []
    ledger = Ledger()

    def observer(job: HeldJob, before: JobState, event: JobEvent) -> None:
        seen.append((job.id, before, job.state, event, job.id in ledger))

    other: list[JobEvent] = []
    ledger.observers.append(observer)
    ledger.observers.append(lambda job, before, event: other.append(event))
    job = ledger.add("a", {})
    assert job is not None
    for event in [E.WAIT_FOR_INIT, E.START, E.FINISH, E.ACKNOWLEDGE]:
        ledger.fire(job, event)
    assert [(s[1], s[2], s[3]) for s in seen] == [
        (S.TAKEN, S.WAITING_FOR_INIT, E.WAIT_FOR_INIT),
        (S.WAITING_FOR_INIT, S.RUNNING, E.START),
        (S.RUNNING, S.REPORTING, E.FINISH),
        (S.REPORTING, S.DONE, E.ACKNOWLEDGE),
    ]
    assert all(s[0] == "a" for s in seen)
    assert other == [E.WAIT_FOR_INIT, E.START, E.FINISH, E.ACKNOWLEDGE]


def test_observers_are_not_called_on_illegal_events() -> None:
    seen: list[JobEvent] = []
    ledger = Ledger()
    ledger.observers.append(lambda job, before, event: seen.append(event))
    job = ledger.add("a", {})
    assert job is not None
    with pytest.raises(IllegalTransition):
        ledger.fire(job, E.ACKNOWLEDGE)
    assert seen == []
    assert job.state is S.TAKEN


def test_on_change_called_on_add_and_on_leaving() -> None:
    calls: list[int] = []
    ledger = Ledger(on_change=lambda: calls.append(len(ledger)))
    a = ledger.add("a", {})
    b = ledger.add("b", {})
    assert a is not None
    assert b is not None
    ledger.fire(a, E.FAIL)
    ledger.fire(a, E.GIVE_UP)
    ledger.fire(b, E.RELEASE)
    assert calls == [1, 2, 1, 0]


def test_iterating_is_a_snapshot_safe_against_removal() -> None:
    ledger = Ledger()
    for job_id in "abc":
        ledger.add(job_id, {})
    for job in ledger:
        ledger.fire(job, E.RELEASE)
    assert len(ledger) == 0
    assert ledger.held_ids == ()


def test_ledger_without_on_change() -> None:
    ledger = Ledger()
    job = ledger.add("a", {})
    assert job is not None
    ledger.fire(job, E.RELEASE)
    assert ledger.held_ids == ()
