"""The crash watchdog's store of terminal bodies (``trio_worker._watch._finals``) and the
records around it: what a watchdog reads after a death decides between resending the same
body, ``WorkerCrashed`` and nothing (docs/design.md §13.2)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_worker._state import JobEvent, Ledger
from trio_worker._watch import _finals
from trio_worker._watch import _records as records
from trio_worker._watch._finals import Finals, read_finals


@pytest.fixture
def shared() -> Iterator[tuple[int, object]]:
    fd, state = records.open_state()
    yield fd, state
    state.close()
    os.close(fd)


@pytest.fixture
def watched(shared: tuple[int, object]) -> Iterator[tuple[int, records.Ledger]]:
    """A worker's records installed as a watched worker's are; the watchdog's ledger."""
    fd, state = shared
    read, write = os.pipe()
    os.set_blocking(read, False)
    records.install(write, fd, state)  # type: ignore[arg-type]
    ledger = records.Ledger()
    yield read, ledger
    records.uninstall()
    os.close(read)


def _feed(read: int, ledger: records.Ledger) -> None:
    while True:
        try:
            data = os.read(read, 1 << 16)
        except BlockingIOError:
            return
        ledger.feed(data)


def test_a_kept_body_is_read_back_whole_with_its_route(shared: tuple[int, object]) -> None:
    fd, state = shared
    finals = Finals(fd, state)  # type: ignore[arg-type]
    assert finals.keep("job-1", b'{"output": 1}', is_stream=False)
    assert finals.keep("job 2 \u00e9", b"x" * 100_000, is_stream=True)
    assert read_finals(fd, state) == {  # type: ignore[arg-type]
        "job-1": (b'{"output": 1}', False),
        "job 2 \u00e9": (b"x" * 100_000, True),
    }


def test_a_second_keep_replaces_the_body_and_a_drop_forgets_it(
    shared: tuple[int, object],
) -> None:
    fd, state = shared
    finals = Finals(fd, state)  # type: ignore[arg-type]
    finals.keep("job-1", b"y" * 50_000, is_stream=False)
    finals.keep("job-1", b'{"error": "refused"}', is_stream=False)
    finals.keep("job-2", b"{}", is_stream=False)
    assert read_finals(fd, state) == {  # type: ignore[arg-type]
        "job-1": (b'{"error": "refused"}', False),
        "job-2": (b"{}", False),
    }
    finals.drop("job-1")
    finals.drop("job-unknown")
    assert read_finals(fd, state) == {"job-2": (b"{}", False)}  # type: ignore[arg-type]
    finals.drop("job-2")
    assert read_finals(fd, state) == {}  # type: ignore[arg-type]
    assert os.fstat(fd).st_size <= _finals.STATE_BYTES + os.sysconf("SC_PAGE_SIZE")


def test_an_entry_whose_state_word_was_never_written_is_not_read(
    shared: tuple[int, object],
) -> None:
    """A death between the body's write and the state word: the body never counted."""
    fd, state = shared
    finals = Finals(fd, state)  # type: ignore[arg-type]
    finals.keep("job-1", b"body", is_stream=False)
    state[_finals._DIRECTORY : _finals._DIRECTORY + 8] = bytes(8)  # type: ignore[index]
    assert read_finals(fd, state) == {}  # type: ignore[arg-type]


def test_more_reports_in_flight_than_entries_are_refused_not_mixed_up(
    shared: tuple[int, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_finals, "CAPACITY", 3)
    fd, state = shared
    finals = Finals(fd, state)  # type: ignore[arg-type]
    assert [finals.keep(f"j{i}", f"b{i}".encode(), is_stream=False) for i in range(4)] == [
        True,
        True,
        True,
        False,
    ]
    finals.drop("j1")
    assert finals.keep("j4", b"b4", is_stream=False)
    assert read_finals(fd, state) == {  # type: ignore[arg-type]
        "j0": (b"b0", False),
        "j2": (b"b2", False),
        "j4": (b"b4", False),
    }


@settings(max_examples=60)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["keep", "drop"]), st.integers(0, 5), st.binary(max_size=64)),
        max_size=40,
    )
)
def test_what_is_read_is_exactly_what_was_kept_and_not_dropped(
    ops: list[tuple[str, int, bytes]],
) -> None:
    fd, state = records.open_state()
    try:
        finals = Finals(fd, state)
        model: dict[str, tuple[bytes, bool]] = {}
        for op, n, body in ops:
            job_id = f"job-{n}"
            if op == "keep":
                assert finals.keep(job_id, body, is_stream=n % 2 == 1)
                model[job_id] = (body, n % 2 == 1)
            else:
                finals.drop(job_id)
                model.pop(job_id, None)
            assert read_finals(fd, state) == model
    finally:
        state.close()
        os.close(fd)


def test_a_final_then_its_settle_leave_no_moment_with_neither(
    watched: tuple[int, records.Ledger], shared: tuple[int, object]
) -> None:
    """Kept from before the first attempt; after the settle record, gone."""
    read, ledger = watched
    fd, state = shared
    worker = records.installed()
    assert worker is not None
    worker.take("job-1")
    worker.final("job-1", b'{"output": 2}', is_stream=False)
    _feed(read, ledger)
    assert list(ledger.held) == ["job-1"]
    assert read_finals(fd, state) == {"job-1": (b'{"output": 2}', False)}  # type: ignore[arg-type]
    worker.settle("job-1")
    _feed(read, ledger)
    assert list(ledger.held) == []
    assert read_finals(fd, state) == {}  # type: ignore[arg-type]


def test_a_body_that_cannot_be_kept_is_settled_so_no_other_final_follows(
    watched: tuple[int, records.Ledger], monkeypatch: pytest.MonkeyPatch
) -> None:
    read, ledger = watched
    monkeypatch.setattr(_finals, "MAX_BODY", 10)
    worker = records.installed()
    assert worker is not None
    worker.take("job-big")
    worker.final("job-big", b"x" * 11, is_stream=False)
    _feed(read, ledger)
    assert list(ledger.held) == []  # the watchdog will send nothing for it


@pytest.mark.parametrize("event", [JobEvent.REQUEST_STOP, JobEvent.REQUEST_RELEASE])
def test_a_requested_stop_or_release_is_settled_for_the_watchdog_at_once(
    watched: tuple[int, records.Ledger], event: JobEvent
) -> None:
    """The platform expects no report for it: a death before the job's task unwinds must
    not turn it into a WorkerCrashed report."""
    read, watchdog = watched
    ledger = Ledger()
    ledger.records = records.installed()  # as the supervisor installs it, when watched
    job = ledger.add("job-1", {"id": "job-1", "input": {}})
    assert job is not None
    ledger.fire(job, JobEvent.START if event is JobEvent.REQUEST_STOP else JobEvent.WAIT_FOR_INIT)
    _feed(read, watchdog)
    assert list(watchdog.held) == ["job-1"]
    ledger.fire(job, event)
    assert "job-1" in ledger  # still held by the worker until its task unwinds
    _feed(read, watchdog)
    assert list(watchdog.held) == []


def test_a_flush_waits_for_the_watchdog_to_pass_on_what_was_written_and_no_longer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A flush ends once the watchdog has handled what was written before it: forwarded
    (then it is in the ring), or dropped. A flush that waited for a wake-up the watchdog's
    move never sends sat out its whole timeout (1 s), on the event loop, once per failing
    job; here the timeout is 600 s, so such a flush hangs the test."""
    import threading

    from trio_worker._capture import OutputCapture, Redactor, _fd
    from trio_worker._capture._feed import open_tee

    monkeypatch.setattr(_fd, "_FLUSH_TIMEOUT", 600.0)
    devnull = os.open(os.devnull, os.O_WRONLY)
    tee, feed = open_tee(64, real=(devnull, devnull))
    capture = OutputCapture.install(redactor=Redactor(()), feed=feed)
    try:
        mark = capture.mark_nowait()
        os.write(tee._writes[0], b"forwarded line\n")
        flusher = threading.Thread(target=capture.flush, daemon=True)
        flusher.start()
        tee.pump(tee.reads[0])  # the watchdog, on its own time
        flusher.join(30.0)
        assert not flusher.is_alive()
        assert capture.text_since(mark, flush=False) == "forwarded line\n"
        # A copy the watchdog had to drop (the worker's pipe was full): handled all the
        # same, so the flush does not wait for bytes that will never come.
        os.write(tee._writes[0], b"dropped line\n")
        monkeypatch.setattr(tee, "_copy_out", lambda fd, data: 0)
        tee.pump(tee.reads[0])
        flusher = threading.Thread(target=capture.flush, daemon=True)
        flusher.start()
        flusher.join(30.0)
        assert not flusher.is_alive()
        assert capture.flush_timeouts == 0
    finally:
        capture.stop()
        os.close(devnull)


def test_a_flush_waits_for_what_was_written_before_it_not_for_quiet_pipes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Other jobs go on writing while one job's report flushes: the flush waits for the
    bytes written before it began (a count), not for pipes that are never empty."""
    import threading

    from trio_worker._capture import OutputCapture, Redactor, _fd
    from trio_worker._capture._feed import open_tee

    monkeypatch.setattr(_fd, "_FLUSH_TIMEOUT", 600.0)  # waiting for quiet would hang here
    devnull = os.open(os.devnull, os.O_WRONLY)
    tee, feed = open_tee(64, real=(devnull, devnull))
    capture = OutputCapture.install(redactor=Redactor(()), feed=feed)
    stop = threading.Event()

    def writer() -> None:  # another job, printing all the time (short of the ring's size)
        while not stop.wait(0.00005):
            os.write(tee._writes[0], b"x" * 100 + b"\n")

    def watchdog() -> None:
        while not stop.is_set():
            tee.pump(tee.reads[0])

    threads = [threading.Thread(target=t, daemon=True) for t in (writer, watchdog)]
    try:
        for thread in threads:
            thread.start()
        mark = capture.mark_nowait()
        os.write(tee._writes[0], b"this job's last line\n")
        flusher = threading.Thread(target=capture.flush, daemon=True)
        flusher.start()
        flusher.join(30.0)
        assert not flusher.is_alive(), "the flush waited for the pipes to be quiet"
        assert "this job's last line" in capture.text_since(mark, 1 << 20, flush=False)
    finally:
        stop.set()
        for thread in threads:
            thread.join(5.0)
        tee.drain()  # the watchdog's last look, so the capture's own last flush ends
        capture.stop()
        os.close(devnull)


def test_a_flush_that_looks_while_the_watchdog_is_mid_read_counts_those_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The watchdog has taken bytes out of the pipe but not yet counted them read: a flush
    that looks then must not take "read so far plus what the pipe holds" as everything
    written before it (those bytes are in neither), or it returns before they are in the
    ring and the job's last line is missing from its report."""
    from trio_worker._capture._feed import discard_tee, open_tee

    devnull = os.open(os.devnull, os.O_WRONLY)
    tee, feed = open_tee(64, real=(devnull, devnull))
    looks: list[int | None] = []
    real_read = os.read

    def read_then_look(fd: int, size: int) -> bytes:
        data = real_read(fd, size)
        if fd == tee.reads[0]:
            looks.append(feed.written_before_now())  # a flush in the worker, just now
        return data

    try:
        line = b"this job's last line\n"
        os.write(tee._writes[0], line)
        monkeypatch.setattr(os, "read", read_then_look)  # for the one pump below
        assert tee.pump(tee.reads[0])
        monkeypatch.undo()
        assert looks, "the look did not happen inside the read"
        # Either it knows it cannot tell yet (look again) or it counts the line.
        assert looks[0] is None or looks[0] >= len(line), looks
        assert feed.written_before_now() == len(line)
    finally:
        discard_tee(tee, feed)
        os.close(devnull)
