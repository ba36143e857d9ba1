"""The job state machine and the ledger of held jobs (docs/design.md §3, §4 I1, I7)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_worker._lifecycle import (
    TRANSITIONS,
    HeldJob,
    IllegalTransition,
    JobEvent,
    JobState,
    Ledger,
)

S = JobState
E = JobEvent

# The table as the module docstring draws it, written out independently.
EXPECTED_TRANSITIONS: dict[tuple[JobState, JobEvent], JobState] = {
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
TERMINAL: set[JobState] = {S.DONE, S.UNDELIVERED, S.STOPPED, S.RELEASED}
ILLEGAL = [pair for pair in itertools.product(S, E) if pair not in EXPECTED_TRANSITIONS]

# A shortest event path from TAKEN to every state.
PATH_TO: dict[JobState, list[JobEvent]] = {
    S.TAKEN: [],
    S.WAITING_FOR_INIT: [E.WAIT_FOR_INIT],
    S.RUNNING: [E.START],
    S.REPORTING: [E.START, E.FINISH],
    S.DONE: [E.START, E.FINISH, E.ACKNOWLEDGE],
    S.UNDELIVERED: [E.START, E.FINISH, E.GIVE_UP],
    S.STOPPED: [E.STOP],
    S.RELEASED: [E.RELEASE],
}


def job_in(state: JobState, job_id: str = "j") -> HeldJob:
    job = HeldJob(job_id, {"id": job_id, "input": None})
    for event in PATH_TO[state]:
        job.fire(event)
    assert job.state is state
    return job


def test_the_table_is_the_documented_one() -> None:
    assert TRANSITIONS == EXPECTED_TRANSITIONS


def test_terminal_states() -> None:
    assert {state for state in S if state.terminal} == TERMINAL


def test_every_non_terminal_state_has_a_way_out_and_terminal_states_none() -> None:
    sources = {state for state, _ in TRANSITIONS}
    assert sources == set(S) - TERMINAL
    # Every state is reachable from TAKEN.
    assert {S.TAKEN, *TRANSITIONS.values()} == set(S)


@pytest.mark.parametrize(
    ("state", "event", "target"),
    [(s, e, t) for (s, e), t in EXPECTED_TRANSITIONS.items()],
    ids=[f"{s.value}-{e.value}" for s, e in EXPECTED_TRANSITIONS],
)
def test_legal_transition(state: JobState, event: JobEvent, target: JobState) -> None:
    job = job_in(state)
    history = list(job.history)
    assert job.fire(event) is target
    assert job.state is target
    assert job.history == [*history, state]


@pytest.mark.parametrize(
    ("state", "event"), ILLEGAL, ids=[f"{s.value}-{e.value}" for s, e in ILLEGAL]
)
def test_illegal_transition_raises_and_changes_nothing(state: JobState, event: JobEvent) -> None:
    job = job_in(state, "job-9")
    history = list(job.history)
    with pytest.raises(IllegalTransition) as info:
        job.fire(event)
    assert info.value.job_id == "job-9"
    assert info.value.state is state
    assert info.value.event is event
    assert "job-9" in str(info.value)
    assert state.value in str(info.value)
    assert event.value in str(info.value)
    assert job.state is state
    assert job.history == history


def test_illegal_pairs_are_all_the_other_pairs() -> None:
    assert len(ILLEGAL) + len(EXPECTED_TRANSITIONS) == len(S) * len(E)
    assert len(ILLEGAL) == 8 * 8 - 13


def test_illegal_transition_is_a_runtime_error() -> None:
    assert issubclass(IllegalTransition, RuntimeError)


# --- property: random event sequences -----------------------------------------------------


@given(st.lists(st.sampled_from(list(JobEvent)), max_size=30))
def test_random_event_sequences_stay_in_the_table(events: list[JobEvent]) -> None:
    job = HeldJob("p", {})
    for event in events:
        before = job.state
        expected = TRANSITIONS.get((before, event))
        if before.terminal:
            assert expected is None
        if expected is None:
            with pytest.raises(IllegalTransition):
                job.fire(event)
            assert job.state is before
        else:
            assert job.fire(event) is expected
        assert job.state in JobState
        # Once terminal, a job stays terminal and accepts nothing.
        if before.terminal:
            assert job.state is before
    # The history is a walk along the table.
    walk = [*job.history, job.state]
    assert walk[0] is S.TAKEN
    for a, b in itertools.pairwise(walk):
        assert b in {t for (s, _), t in TRANSITIONS.items() if s is a}


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
    ledger.fire(a, E.STOP)
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
    ledger.fire(first, E.STOP)
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
        ledger.fire(job, E.STOP)
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
        ledger.fire(job, E.STOP)
    assert len(ledger) == 0
    assert ledger.held_ids == ()


def test_ledger_without_on_change() -> None:
    ledger = Ledger()
    job = ledger.add("a", {})
    assert job is not None
    ledger.fire(job, E.STOP)
    assert ledger.held_ids == ()
