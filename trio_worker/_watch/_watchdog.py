"""Fork at ``start()``: the parent becomes the crash watchdog, the child the worker.

See docs/design.md §13 and docs/how-it-works.md ("Two processes"). The process the user
started stays the one the container runs (PID 1 under ``CMD ["python", "-u",
"handler.py"]``), so it cannot be the one that dies: it forks before any thread, event loop
or GPU runtime exists, and the child runs everything else, initializer included. The
parent only waits: it forwards SIGTERM and SIGINT, passes the child's output through
(``_capture._feed``), reads the take and settle records (``_records``), and when the child
dies without having reported, reports the jobs it held (``_report``). Then it exits with
the child's status (128 + the signal's number for a signal, as a shell reports it).

It never runs the user's ``atexit`` handlers (they belong to the worker, which runs them at
its clean exit: docs/design.md §6.3) and never loads a GPU runtime: it is the user's
script stopped inside ``start()``, before the initializer.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import selectors
import signal
import sys
from typing import TYPE_CHECKING, NoReturn

import trio

from .._capture._feed import Feed, Tee, adopt_feed, close_feed_ends, open_tee
from .._capture._pipes import grow_pipe
from . import _records
from ._report import crash_body, describe_exit, kernel_says_oom_killed, oom_kills, report_held

if TYPE_CHECKING:
    import mmap

    from .._config import Settings

log = logging.getLogger("trio_worker")

TAIL_BYTES = 256 * 1024  # what the watchdog keeps of the output; reports clip to 16 KiB
_PR_SET_PDEATHSIG = 1
_POLL = 1.0  # seconds: a bound on waiting, should a SIGCHLD be missed


def fork_worker(settings: Settings, *, tee_output: bool) -> Feed | None:
    """Fork; returns in the child (the worker), with its `Feed` when output is teed.

    The parent never returns: it watches the child, then exits with its status.
    """
    tee, feed = open_tee(TAIL_BYTES) if tee_output else (None, None)
    record_read, record_write = os.pipe()
    grow_pipe(record_write)
    state = _records.new_state()
    oom_before = oom_kills()
    _flush_stdio()  # or the child would print the parent's buffered output a second time
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        _become_worker(parent, tee, feed, record_read, record_write)
        _records.install(record_write, state)
        return feed
    if tee is not None and feed is not None:
        tee.close_child_ends()
        close_feed_ends(feed)
    os.close(record_write)
    _Watchdog(pid, tee, record_read, state, settings, oom_before).run()


def _become_worker(
    parent: int, tee: Tee | None, feed: Feed | None, record_read: int, record_write: int
) -> None:
    # Its own process group: a terminal's Ctrl-C reaches the watchdog alone, which
    # forwards it once (the worker would take two SIGINTs as "exit at once").
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    # A worker whose watchdog was SIGKILLed has nobody reading its output or reporting
    # its jobs: it goes with it, as it would have unwatched.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)  # the watchdog died before prctl took effect
    if tee is not None and feed is not None:
        adopt_feed(tee, feed)
    os.close(record_read)


class _Watchdog:
    def __init__(
        self,
        child: int,
        tee: Tee | None,
        records: int,
        state: mmap.mmap,
        settings: Settings,
        oom_before: int | None,
    ) -> None:
        self.child = child
        self.tee = tee
        self.records = records
        self.state = state
        self.settings = settings
        self.oom_before = oom_before
        self.ledger = _records.Ledger()
        self.signals = 0

    def run(self) -> NoReturn:
        try:
            code = self._wait()
            self._after(code)
        except BaseException:
            log.exception("crash watchdog failed; exiting with the worker's status if known")
            code = 1
        self._leave(code)

    # -- while the worker lives ----------------------------------------------------------

    def _wait(self) -> int:
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_read, False)
        os.set_blocking(wake_write, False)
        signal.set_wakeup_fd(wake_write)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._forward)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        selector = selectors.DefaultSelector()
        if self.tee is not None:
            for fd in self.tee.reads:
                selector.register(fd, selectors.EVENT_READ, "out")
        selector.register(self.records, selectors.EVENT_READ, "records")
        selector.register(wake_read, selectors.EVENT_READ, "wake")
        while True:
            waited, status = os.waitpid(self.child, os.WNOHANG)
            if waited:
                break
            for key, _ in selector.select(_POLL):
                if key.data == "out" and self.tee is not None:
                    self.tee.pump(key.fd)
                    if key.fd in self.tee.closed:
                        selector.unregister(key.fd)
                elif key.data == "records":
                    if not self._read_records():
                        selector.unregister(self.records)
                else:
                    with contextlib.suppress(OSError):
                        os.read(wake_read, 512)
        selector.close()
        signal.set_wakeup_fd(-1)  # trio.run, if reports follow, sets its own
        if self.tee is not None:
            self.tee.drain()
        while self._read_records():
            pass
        return os.waitstatus_to_exitcode(status)

    def _forward(self, signum: int, frame: object) -> None:
        self.signals += 1
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.child, signum)

    def _read_records(self) -> bool:
        try:
            data = os.read(self.records, 1 << 16)
        except BlockingIOError:
            return False
        self.ledger.feed(data)
        return bool(data)

    # -- after -----------------------------------------------------------------------------

    def _after(self, code: int) -> None:
        if code == 0:
            return
        if not self.ledger.trust(self.state):
            log.error(
                "the worker process %s; some of its take/settle records were lost, so the "
                "jobs it held are not reported (a report must never be sent twice)",
                describe_exit(code),
            )
        held = list(self.ledger.held)
        if not held:
            return
        output = self.tee.tail() if self.tee is not None else ""
        oom = False
        if code == -signal.SIGKILL:
            after = oom_kills()
            counted = self.oom_before is not None and after is not None
            oom = (counted and after > self.oom_before) or kernel_says_oom_killed(self.child)  # type: ignore[operator]
        log.error(
            "the worker process %s; reporting the %d job(s) it held: %s",
            describe_exit(code),
            len(held),
            ", ".join(held),
        )
        bodies = {
            job_id: crash_body(
                job_id,
                code,
                output,
                oom_killed=oom,
                during_init=not self.ledger.ready,
                settings=self.settings,
            )
            for job_id in held
        }
        grace = self.settings.timings.shutdown_grace
        trio.run(
            lambda: report_held(
                self.settings, bodies, grace=grace, leave_now=lambda: self._leave(code)
            )
        )

    def _leave(self, code: int) -> NoReturn:
        _flush_stdio()
        os._exit(128 - code if code < 0 else code)


def _flush_stdio() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).fflush(None)
