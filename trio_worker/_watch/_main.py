"""The crash watchdog's program: what PID 1 runs once the worker is forked (docs/design.md §13).

Started by ``_watchdog`` through ``execv`` (see ``BOOTSTRAP`` there), with the pipes and
shared pages as inherited fds and the rest in one JSON *spec*. While the worker lives it
does three things, and imports little (its resident memory is the overhead the worker
pays; see docs/design.md §13 for the figures):

* forwards SIGTERM and SIGINT to the worker;
* passes the worker's fds 1/2 through (``Tee``), waking only when there is output;
* reads the take and settle records every ``RECORD_POLL`` seconds, not per record, so a
  job costs it no wake-up: the record pipe holds minutes of records.

When the worker is gone it reads what is left, and if the worker died by a signal or
exited non-zero with jobs held, imports the SDK (``unstub``) and reports them (``_report``).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import sys
from typing import Any, NoReturn

from .._capture._feed import Tee
from .._capture._pipes import map_page
from . import _records

RECORD_POLL = 0.25  # seconds between reads of the record pipe while the worker lives
_LOGGED_TAIL = 16 * 1024  # of a death's output, what its log line carries


def main(spec: dict[str, Any]) -> NoReturn:
    watchdog = _Watchdog(spec)
    try:
        code = watchdog.wait()
    except BaseException as exc:  # the watchdog itself broke: say so, keep the status
        _say(f"crash watchdog failed while waiting: {type(exc).__name__}: {exc}")
        code = 1
    try:
        watchdog.after(code)
    except BaseException as exc:
        _say(f"crash watchdog failed while reporting: {type(exc).__name__}: {exc}")
    leave(code)


def leave(code: int) -> NoReturn:
    """Exit with the worker's status: 128 + the signal's number, as a shell reports it."""
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    os._exit(128 - code if code < 0 else code)


def unstub() -> None:
    """Replace the bare package namespaces of ``BOOTSTRAP`` with the real packages (the
    modules already loaded stay), so the reporting code imports as anywhere else."""
    root = sys.modules.get("trio_worker")
    if root is not None and not hasattr(root, "__file__"):
        # Under ``-S`` an editable install's import hook (a .pth file) is not there: the
        # directory holding the package is what finds it.
        holder = os.path.dirname(root.__path__[0])
        if holder not in sys.path:
            sys.path.append(holder)
    for name in ("trio_worker._watch", "trio_worker._capture", "trio_worker"):
        module = sys.modules.get(name)
        if module is not None and not hasattr(module, "__file__"):
            del sys.modules[name]
    import trio_worker  # noqa: F401


def _say(line: str) -> None:
    with contextlib.suppress(OSError):
        os.write(2, f"trio_worker: {line}\n".encode(errors="replace"))


class _Watchdog:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.child: int = spec["child"]
        tee = spec["tee"]
        self.tee = None if tee is None else Tee.from_spec(tee, spec["tail_bytes"])
        self.records: int = spec["records"]
        os.set_blocking(self.records, False)
        self.state = map_page(spec["state"])
        self.ledger = _records.Ledger()

    # -- while the worker lives ----------------------------------------------------------

    def wait(self) -> int:
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_read, False)
        os.set_blocking(wake_write, False)
        signal.set_wakeup_fd(wake_write)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._forward)
        # Blocked since before the fork (_watchdog): what came meanwhile is delivered now.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGTERM, signal.SIGINT))
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        if "priority" in self.spec:  # started low (see _watchdog._exec_watchdog)
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, 0, self.spec["priority"])
        selector = selectors.DefaultSelector()
        if self.tee is not None:
            for fd in self.tee.reads:
                selector.register(fd, selectors.EVENT_READ, "out")
        selector.register(wake_read, selectors.EVENT_READ, "wake")
        while True:
            waited, status = os.waitpid(self.child, os.WNOHANG)
            if waited:
                break
            for key, _ in selector.select(RECORD_POLL):
                if key.data == "out" and self.tee is not None:
                    self.tee.pump(key.fd)
                    if key.fd in self.tee.closed:
                        selector.unregister(key.fd)
                else:
                    with contextlib.suppress(OSError):
                        os.read(wake_read, 512)
            self._read_records()
        selector.close()
        signal.set_wakeup_fd(-1)  # trio.run, if reports follow, sets its own
        if self.tee is not None:
            self.tee.drain()
        self._read_records()
        return os.waitstatus_to_exitcode(status)

    def _forward(self, signum: int, frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.child, signum)

    def _read_records(self) -> None:
        while True:
            try:
                data = os.read(self.records, 1 << 16)
            except BlockingIOError:
                return
            if not data:
                return
            self.ledger.feed(data)

    # -- after -----------------------------------------------------------------------------

    def after(self, code: int) -> None:
        if code == 0:
            return
        trusted = self.ledger.trust(self.state)
        held = list(self.ledger.held)
        if not held and trusted:
            if code < 0:  # no Python code saw this death: say why, once
                self._log_death(code)
            return
        unstub()
        import logging

        from .._config import Settings, Timings
        from .._start import configure_logging
        from ._report import describe_exit

        configure_logging(self.spec["log_level"], os.environ)
        log = logging.getLogger("trio_worker")
        if not trusted:
            log.error(
                "the worker process %s; some of its take/settle records were lost, so the "
                "jobs it held are not reported (a report must never be sent twice)",
                describe_exit(code),
            )
            return
        log.error(
            "the worker process %s; reporting the %d job(s) it held: %s",
            describe_exit(code),
            len(held),
            ", ".join(held),
        )
        timings = Timings(**self.spec["timings"])
        settings = Settings.from_environ(
            os.environ, timings=timings, capture_logs=self.spec["capture_logs"]
        )
        self._report(code, held, settings)

    def _log_death(self, code: int) -> None:
        """A worker killed by a signal with no job held (a load-balancing worker holds
        none): the cause, its category and the redacted output tail, in the log."""
        unstub()
        import logging

        from .._capture import Redactor
        from .._categories import classify_crash
        from .._start import configure_logging
        from ._report import describe_exit

        configure_logging(self.spec["log_level"], os.environ)
        output = self.tee.tail() if self.tee is not None else ""
        oom = code == -signal.SIGKILL and self._oom_killed()
        category = classify_crash(code, output, oom_killed=oom)
        tail = Redactor.from_environ(os.environ).redact(output[-_LOGGED_TAIL:])
        logging.getLogger("trio_worker").error(
            "the worker process %s (%s)%s",
            describe_exit(code),
            category,
            f"; its last output:\n{tail}" if tail else "",
        )

    def _oom_killed(self) -> bool:
        from ._report import kernel_says_oom_killed, oom_kills

        before, after = self.spec["oom_before"], oom_kills()
        counted = before is not None and after is not None and after > before
        return counted or kernel_says_oom_killed(self.child)

    def _report(self, code: int, held: list[str], settings: Any) -> None:
        import trio

        from ._report import crash_body, report_held

        output = self.tee.tail() if self.tee is not None else ""
        oom = code == -signal.SIGKILL and self._oom_killed()
        bodies = {
            job_id: crash_body(
                job_id,
                code,
                output,
                oom_killed=oom,
                during_init=not self.ledger.ready,
                settings=settings,
            )
            for job_id in held
        }

        async def report() -> None:
            await report_held(settings, bodies, leave_now=lambda: leave(code))

        trio.run(report)
