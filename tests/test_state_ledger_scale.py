"""Work per answer is linear: the ledger at scale (docs/security.md). The stop memory's bound
under a flood is in tests/test_job_intake.py.

The costs are counted, not timed: a copy of the held ids is counted where it is made.
"""

from __future__ import annotations

import threading

from trio_worker._state import JobEvent, Ledger


class _CountingDict(dict[str, object]):
    """A dict that counts the keys copied out of it by iteration."""

    copied = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        type(self).copied += len(self)
        return super().__iter__()


def _counted_ledger() -> Ledger:
    ledger = Ledger()
    _CountingDict.copied = 0
    ledger._jobs = _CountingDict()  # type: ignore[assignment]
    return ledger


def test_adding_and_finishing_jobs_copies_no_ids_until_a_ping_reads_them() -> None:
    # Before: every add and finish rebuilt the tuple of held ids, n²/2 copies for n adds
    # (20,000 adds took 2 s, 200,000 froze the loop).
    ledger = _counted_ledger()
    jobs = [ledger.add(f"job-{n}", {}) for n in range(2_000)]
    for job in jobs[:1_000]:
        assert job is not None
        ledger.fire(job, JobEvent.RELEASE)
    assert _CountingDict.copied == 0
    snapshot = ledger.held_ids
    assert snapshot == tuple(f"job-{n}" for n in range(1_000, 2_000))
    assert _CountingDict.copied == 1_000
    # Read again with nothing changed: the same object, nothing copied.
    assert ledger.held_ids is snapshot
    assert _CountingDict.copied == 1_000


def test_the_snapshot_follows_every_change() -> None:
    ledger = Ledger()
    a = ledger.add("a", {})
    seen = [ledger.held_ids]
    ledger.add("b", {})
    seen.append(ledger.held_ids)
    assert a is not None
    ledger.fire(a, JobEvent.RELEASE)
    seen.append(ledger.held_ids)
    assert ledger.add("b", {}) is None  # a duplicate changes nothing
    seen.append(ledger.held_ids)
    assert seen == [("a",), ("a", "b"), ("b",), ("b",)]


def test_a_reader_thread_always_sees_a_whole_snapshot() -> None:
    # The heartbeat thread reads held_ids while the trio thread adds and removes jobs.
    ledger = Ledger()
    done = threading.Event()
    seen: list[tuple[str, ...]] = []
    errors: list[BaseException] = []

    def read() -> None:
        try:
            while not done.is_set():
                seen.append(ledger.held_ids)
        except BaseException as exc:  # pragma: no cover - the failure being tested for
            errors.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for n in range(20_000):
            job = ledger.add(f"j{n}", {})
            assert job is not None
            if n % 2:
                ledger.fire(job, JobEvent.RELEASE)
    finally:
        done.set()
        reader.join()
    assert not errors
    assert ledger.held_ids == tuple(f"j{n}" for n in range(0, 20_000, 2))
    assert seen
    # Every snapshot is a whole one: a run of adds in order, each id once.
    for snapshot in seen[:: max(1, len(seen) // 500)]:
        numbers = [int(job_id[1:]) for job_id in snapshot]
        assert numbers == sorted(set(numbers))
