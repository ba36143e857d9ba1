"""The ledger of held jobs: what it holds, its snapshot for the heartbeat thread, its hooks
(docs/design.md §4 I1, docs/how-it-works.md)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_worker._state import HeldJob, IllegalTransition, JobEvent, JobState, Ledger

S = JobState
E = JobEvent
# A way from TAKEN to each terminal state.
ENDINGS: dict[JobState, list[JobEvent]] = {
    S.DONE: [E.START, E.FINISH, E.ACKNOWLEDGE],
    S.UNDELIVERED: [E.START, E.FINISH, E.GIVE_UP],
    S.STOPPED: [E.REQUEST_STOP, E.STOP],
    S.RELEASED: [E.REQUEST_RELEASE, E.RELEASE],
}


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
    path = ENDINGS[terminal]
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


@given(st.lists(st.sampled_from(list(JobEvent)), max_size=30))
def test_random_sequences_through_the_ledger_keep_it_consistent(events: list[JobEvent]) -> None:
    ledger = Ledger()
    job = ledger.add("p", {})
    assert job is not None
    for event in events:
        before, history = job.state, list(job.history)
        try:
            ledger.fire(job, event)
        except IllegalTransition:
            assert (job.state, job.history) == (before, history)
        else:
            assert not before.terminal
            assert job.history == [*history, before]
        assert ("p" in ledger) is (not job.state.terminal)
        assert ledger.held_ids == (() if job.state.terminal else ("p",))
        assert len(ledger) == (0 if job.state.terminal else 1)
