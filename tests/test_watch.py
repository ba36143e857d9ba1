"""The crash watchdog's parts, in process: records, ledger, causes, the tee and when it
declines to fork (docs/design.md §13)."""

from __future__ import annotations

import fcntl
import logging
import os
import resource
import select
import signal
import subprocess
import sys
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_worker._capture import OutputCapture, Redactor
from trio_worker._capture._feed import open_tee
from trio_worker._categories import classify_crash
from trio_worker._watch import ENV_VAR, say_unwatched, unwatched_reason
from trio_worker._watch import _fork_rules as fork_rules
from trio_worker._watch import _records as records
from trio_worker._watch._records import Ledger, RecordWriter
from trio_worker._watch._report import describe_exit
from trio_worker._watch._watchdog import may_restore_priority


def _drain(fd: int, ledger: Ledger) -> None:
    while True:
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        if not data:
            return
        ledger.feed(data)


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    yield r, w
    for fd in (r, w):
        try:
            os.close(fd)
        except OSError:
            pass


def test_takes_and_settles_give_the_held_jobs_in_order(pipe: tuple[int, int]) -> None:
    r, w = pipe
    writer, ledger = RecordWriter(w), Ledger()
    for job_id in ("a", "b c", 'd"\n'):
        writer.write(records.TAKE, job_id)
    writer.write(records.SETTLE, "b c")
    writer.write(records.READY, "")
    _drain(r, ledger)
    assert list(ledger.held) == ["a", 'd"\n']
    assert ledger.ready


def test_a_record_split_across_reads_is_applied_once_whole() -> None:
    ledger = Ledger()
    line = b"T " + b"job-1".hex().encode() + b"\nS " + b"job-1".hex().encode()
    line += b"\nT " + b"job-2".hex().encode() + b"\n"
    for i in range(len(line)):
        ledger.feed(line[i : i + 1])
    assert list(ledger.held) == ["job-2"]


def test_a_full_pipe_never_blocks_and_a_lost_record_fails_safe(pipe: tuple[int, int]) -> None:
    r, w = pipe
    writer, ledger = RecordWriter(w, max_buffered=256), Ledger()
    writer.write(records.TAKE, "early")
    filler = b"x" * select.PIPE_BUF
    while True:  # the watchdog stopped reading: the pipe is full
        try:
            os.write(w, filler)
        except BlockingIOError:
            break
    for i in range(50):  # more than the buffer holds: some records are dropped
        writer.write(records.SETTLE if i % 2 else records.TAKE, f"job-{i // 2}")
    ledger.feed(b"T " + b"early".hex().encode() + b"\n")
    while True:  # the watchdog reads again (the filler is not records: skip it)
        try:
            data = os.read(r, 1 << 16)
        except BlockingIOError:
            break
        ledger.feed(data.replace(b"x", b""))
    writer.write(records.TAKE, "after")
    _drain(r, ledger)
    # Jobs whose settle may be lost are forgotten (never reported twice); later ones held.
    assert ledger.lost == 1
    assert list(ledger.held) == ["after"]


def test_an_id_too_long_for_one_atomic_write_is_never_recorded(pipe: tuple[int, int]) -> None:
    r, w = pipe
    writer, ledger = RecordWriter(w), Ledger()
    huge = "j" * select.PIPE_BUF
    writer.write(records.TAKE, huge)
    writer.write(records.TAKE, "small")
    writer.write(records.SETTLE, huge)
    _drain(r, ledger)
    assert list(ledger.held) == ["small"] and ledger.lost == 0


OPS = st.lists(
    st.tuples(st.sampled_from(["take", "settle", "read", "stall"]), st.integers(0, 7)),
    max_size=80,
)


@settings(max_examples=80, deadline=None)
@given(ops=OPS, room=st.integers(min_value=8, max_value=200), crash=st.booleans())
def test_the_watchdog_never_believes_a_settled_job_held(
    ops: list[tuple[str, int]], room: int, crash: bool
) -> None:
    """Whatever the pipe's stalls and wherever the worker dies, a job the watchdog would
    report is truly held: a lost record can cost a crash report, never send a second one
    for a job already settled; with no record lost, it reports exactly the held jobs."""
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 4096)  # one page: a few hundred records fill it
    try:
        state = records.new_state()
        writer, ledger = RecordWriter(w, max_buffered=room, state=state), Ledger()
        truth: dict[str, None] = {}
        for op, n in ops:
            job_id = f"job-{n}"
            if op == "take" and job_id not in truth:
                truth[job_id] = None
                writer.write(records.TAKE, job_id)
            elif op == "settle" and job_id in truth:
                del truth[job_id]
                writer.write(records.SETTLE, job_id)
            elif op == "read":
                _drain(r, ledger)
            elif op == "stall":  # the watchdog is slow: the pipe fills (blank lines)
                _fill(w)
        if not crash:  # the worker lives on: a later record carries what was buffered
            _drain(r, ledger)
            writer.write(records.READY, "")
        _drain(r, ledger)  # the worker is gone: the watchdog reads what the pipe holds
        trusted = ledger.trust(state)
        assert set(ledger.held) <= set(truth)
        if trusted and ledger.lost == 0:
            assert list(ledger.held) == list(truth)
    finally:
        os.close(r)
        os.close(w)


def _fill(fd: int) -> None:
    while True:
        try:
            os.write(fd, b"\n" * 512)
        except BlockingIOError:
            try:
                os.write(fd, b"\n")
            except BlockingIOError:
                return


@pytest.mark.parametrize(
    ("code", "output", "oom", "category"),
    [
        (-signal.SIGSEGV, "", False, "segfault"),
        (-signal.SIGBUS, "", False, "segfault"),
        (-signal.SIGABRT, "terminate called after throwing", False, "segfault"),
        (
            -signal.SIGSEGV,
            "RuntimeError: CUDA error: device-side assert triggered",
            False,
            "cuda_error",
        ),
        (-signal.SIGABRT, "torch.OutOfMemoryError: CUDA out of memory.", False, "out_of_memory"),
        (-signal.SIGKILL, "loading weights", True, "out_of_memory"),
        (-signal.SIGKILL, "loading weights", False, "unknown"),
        (3, "", False, "unknown"),
        (1, "ConnectionRefusedError: [Errno 111] Connection refused", False, "network"),
        # A SIGSEGV is not an out-of-memory because an old log line mentions memory.
        (-signal.SIGSEGV, "warning: cannot allocate memory for cache", False, "segfault"),
    ],
)
def test_crash_categories(code: int, output: str, oom: bool, category: str) -> None:
    assert classify_crash(code, output, oom_killed=oom) == category


def test_the_cause_names_the_signal_or_the_status() -> None:
    assert describe_exit(-11) == "killed by SIGSEGV (signal 11: a segmentation fault)"
    assert describe_exit(-6).startswith("killed by SIGABRT (signal 6")
    assert describe_exit(3) == "exited with status 3"


def test_declines_when_opted_out_by_the_environment() -> None:
    assert unwatched_reason({ENV_VAR: "0"}) == f"{ENV_VAR}=0"


def test_declines_with_python_threads_running_and_says_what_to_do() -> None:
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        reason = unwatched_reason({})
    finally:
        stop.set()
        thread.join()
    assert reason is not None and "Python thread(s) already running before start()" in reason
    assert "initializer" in reason and "trio-worker run" in reason


def test_declines_with_a_child_process_even_one_that_exited(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fork_rules, "python_threads", lambda: 0)
    before = fork_rules.child_processes()
    child = subprocess.Popen([sys.executable, "-c", ""])
    try:
        deadline = time.monotonic() + 30
        while Path(f"/proc/{child.pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.001)
        # Exited, not yet waited for: after a fork its Popen.poll() would still lie.
        assert fork_rules.child_processes() == before + 1
        reason = unwatched_reason({})
        assert reason is not None and "child process(es) started before start()" in reason
        assert "trio-worker run" in reason
    finally:
        child.wait()
    assert fork_rules.child_processes() == before


def test_declines_when_torch_cuda_is_initialized(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fork_rules, "python_threads", lambda: 0)
    monkeypatch.setattr(fork_rules, "child_processes", lambda: 0)
    cuda = types.SimpleNamespace(is_initialized=lambda: True)
    monkeypatch.setitem(__import__("sys").modules, "torch", types.SimpleNamespace(cuda=cuda))
    reason = unwatched_reason({})
    assert reason is not None and "torch.cuda is initialized" in reason
    assert "load the model in the initializer" in reason
    cuda.is_initialized = lambda: False
    assert unwatched_reason({}) is None


def test_a_fed_capture_sees_what_the_tee_forwarded_and_the_tee_keeps_the_tail() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    tee, feed = open_tee(64, real=(devnull, devnull))
    capture = OutputCapture.install(redactor=Redactor(()), feed=feed)
    try:
        start = capture.mark_nowait()
        os.write(tee._writes[0], b"hello from fd 1\n")
        line = len(b"hello from fd 1\n")
        # Written, not yet handled by the tee: a flush has no target yet and must wait.
        assert feed.flush_target(None) == (None, line)
        pumper = threading.Thread(target=tee.drain)
        pumper.start()
        pumper.join()
        assert feed.flush_target(None) == (line, line)  # handled: the ring's target is known
        assert capture.text_since(start) == "hello from fd 1\n"
        os.write(tee._writes[1], b"x" * 100)
        tee.drain()
        assert tee.tail() == "x" * 64  # bounded
    finally:
        capture.stop()
        os.close(devnull)


def _status(effective: int, bounding: int, ambient: int) -> str:
    return f"CapEff:\t{effective:016x}\nCapBnd:\t{bounding:016x}\nCapAmb:\t{ambient:016x}\n"


# /proc/self/status as Docker's default leaves it for root (no CAP_SYS_NICE, bit 23), as a
# privileged container or a host's root has it, and with the capability ambient.
DOCKER = 0xA80425FB
WITHOUT_SYS_NICE = _status(DOCKER, DOCKER, 0)
WITH_SYS_NICE = _status(0x1FFFFFFFFFF, 0x1FFFFFFFFFF, 0)
AMBIENT_SYS_NICE = _status(1 << 23, 0x1FFFFFFFFFF, 1 << 23)


@pytest.mark.parametrize(
    ("original", "status", "nice_limit", "euid", "may"),
    [
        (0, WITHOUT_SYS_NICE, 0, 0, False),  # Docker's default: it would stay at +10
        (0, WITH_SYS_NICE, 0, 0, True),
        (0, WITH_SYS_NICE, 0, 1000, False),  # not root: lost at the exec without ambient
        (0, AMBIENT_SYS_NICE, 0, 1000, True),
        (0, WITHOUT_SYS_NICE, 20, 1000, True),  # RLIMIT_NICE 20: down to nice 0 allowed
        (-5, WITHOUT_SYS_NICE, 20, 1000, False),  # but not to -5
        (5, WITHOUT_SYS_NICE, 15, 1000, True),
        (0, WITHOUT_SYS_NICE, resource.RLIM_INFINITY, 1000, True),
        (0, "", 0, 0, False),  # no /proc/self/status lines to read
    ],
)
def test_the_watchdog_lowers_its_priority_only_where_it_may_raise_it_back(
    original: int, status: str, nice_limit: int, euid: int, may: bool
) -> None:
    assert may_restore_priority(original, status, nice_limit, euid) is may


def test_the_unwatched_line_bypasses_the_loggers_level(
    worker_log: list[logging.LogRecord],
) -> None:
    logging.getLogger("trio_worker").setLevel(logging.ERROR)  # RUNPOD_LOG_LEVEL=ERROR
    logging.getLogger("trio_worker").warning("hidden at ERROR")
    say_unwatched("TRIO_WORKER_CRASH_WATCH=0")
    say_unwatched("start(crash_watch=False)", logging.INFO)
    assert [(r.levelname, r.getMessage()) for r in worker_log] == [
        ("WARNING", "crash watch off: TRIO_WORKER_CRASH_WATCH=0"),
        ("INFO", "crash watch off: start(crash_watch=False)"),
    ]
