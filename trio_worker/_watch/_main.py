"""The crash watchdog's program, exec'd by ``_watchdog`` with one marshalled *spec*
(``spec["child"]``: the worker). While the worker lives it forwards signals, passes the
output through, reads the records and reaps; after a death it reports
(docs/design.md §13.1, §13.4). It imports little: its memory is the worker's overhead.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import sys
import time
from typing import TYPE_CHECKING, Any, NoReturn

from .._capture._feed import Tee
from . import _records
from ._imports import load_package
from ._launched import read_options
from ._oom import oom_kills

if TYPE_CHECKING:
    from .._payloads import JobError

RECORD_POLL = 0.25  # seconds between reads of the record pipe while the worker lives
# Asked to stop: the worker drains (SIGHUP too, which would otherwise kill the watchdog).
_DRAIN = {
    signal.SIGTERM: signal.SIGTERM,
    signal.SIGINT: signal.SIGINT,
    signal.SIGHUP: signal.SIGTERM,
}
# Passed on as they are: they are the worker's to handle (or to die of, then reported).
_PASS_ON = (signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
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
    modules already loaded stay), loaded from where the worker loaded them
    (``_imports``), so the reporting code imports as anywhere else."""
    package = sys.modules.get("trio_worker")
    if package is None or hasattr(package, "__file__"):  # watching without the exec
        import trio_worker  # noqa: F401

        return
    for name in ("trio_worker._watch", "trio_worker._capture", "trio_worker"):
        module = sys.modules.get(name)
        if module is not None and not hasattr(module, "__file__"):
            del sys.modules[name]
    load_package(package.__path__[0])


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
        self.state = _records.map_state(spec["state"])
        self.ledger = _records.Ledger()
        # The write end of the worker's forwarded-signal pipe (``_exit.ExitGuard``).
        self.signals: int | None = spec.get("signals")
        self.oom_count: int | None = spec["oom_before"]  # the last reading before a death
        self.early_signals: list[int] = []  # stop signals between the death and the reports
        self._exited = True  # a SIGCHLD came: reap (and look once at the start)

    # -- while the worker lives ----------------------------------------------------------

    def wait(self) -> int:
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_read, False)
        os.set_blocking(wake_write, False)
        signal.set_wakeup_fd(wake_write)
        for signum in _DRAIN:
            signal.signal(signum, self._forward)
        for signum in _PASS_ON:
            signal.signal(signum, self._pass_on)
        # Blocked since before the fork (_watchdog): what came meanwhile is delivered now.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, (*_DRAIN, *_PASS_ON))
        signal.signal(signal.SIGCHLD, self._child_exited)
        if "priority" in self.spec:  # started low (_watchdog._start_at_low_priority)
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, 0, self.spec["priority"])
        selector = selectors.DefaultSelector()
        if self.tee is not None:
            for fd in self.tee.reads:
                selector.register(fd, selectors.EVENT_READ, "out")
        selector.register(wake_read, selectors.EVENT_READ, "wake")
        next_poll = 0.0
        while True:
            # Only when a child exited (or at each poll, in case a SIGCHLD was merged with
            # another): a waitpid per chunk of output is a syscall on the output's path.
            if self._exited or time.monotonic() >= next_poll:
                self._exited = False
                status = self._reap()
                if status is not None:
                    break
            for key, _ in selector.select(RECORD_POLL):
                if key.data == "out" and self.tee is not None:
                    self.tee.pump(key.fd)
                    if key.fd in self.tee.closed:
                        selector.unregister(key.fd)
                else:
                    with contextlib.suppress(OSError):
                        os.read(wake_read, 512)
            now = time.monotonic()
            if now >= next_poll:
                next_poll = now + RECORD_POLL
                self._read_records()
                self.oom_count = oom_kills()
        selector.close()
        signal.set_wakeup_fd(-1)  # trio.run, if reports follow, sets its own
        # Until the reports' own receiver is up: forwarded to a dead worker, it would be lost.
        for signum in _DRAIN:
            signal.signal(signum, self._keep_signal)
        if self.tee is not None:
            self.tee.drain()
        self._read_records()
        self._take_worker_options()
        return os.waitstatus_to_exitcode(status)

    def _child_exited(self, signum: int, frame: object) -> None:
        self._exited = True

    def _reap(self) -> int | None:
        """Wait for every child that has exited; the worker's wait status once it has."""
        while True:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return None
            if pid == self.child:
                return status

    def _take_worker_options(self) -> None:
        # Launched, what only start() knew comes now (the fork form had it).
        if "options" in self.spec:
            self.spec.update(read_options(self.spec["options"]))
            if self.spec["capture_logs"] != "on" and self.tee is not None:
                self.tee.drop_tail()

    def _forward(self, signum: int, frame: object) -> None:
        sent = _DRAIN.get(signal.Signals(signum), signal.SIGTERM)
        if signum == signal.SIGHUP:
            _say("crash watch: SIGHUP received; draining the worker as for SIGTERM")
        if self.signals is not None:
            try:
                os.write(self.signals, bytes([sent]))
                return
            except OSError:  # a worker that never read its pipe: the signal itself
                pass
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.child, sent)

    def _keep_signal(self, signum: int, frame: object) -> None:
        self.early_signals.append(signum)

    def _pass_on(self, signum: int, frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.child, signum)

    def _read_records(self) -> None:
        lost = self.ledger.lost
        while True:
            try:
                data = os.read(self.records, 1 << 16)
            except BlockingIOError:
                break
            if not data:
                break
            self.ledger.feed(data)
        if self.ledger.lost > lost:
            _say(
                "crash watch: the worker's take/settle records overflowed (it wrote them "
                "faster than they were read); the jobs it held until then will not be "
                "reported should it die, since a report must never be a second, different one"
            )

    # -- after -----------------------------------------------------------------------------

    def after(self, code: int) -> None:
        from ._finals import read_finals

        finals = read_finals(self.spec["state"], self.state)
        trusted = self.ledger.trust(self.state)
        crashed = [job_id for job_id in self.ledger.held if job_id not in finals]
        if code == 0 and trusted and not finals and not crashed:
            return  # a clean exit
        log, describe_exit = _reporting_log(self.spec["log_level"])

        how = describe_exit(code)
        if not trusted or self.ledger.lost:
            log.error(
                "the worker process %s; some of its take/settle records were lost, so the "
                "jobs it held without a report in flight are not reported (a job must never "
                "get a second, different final)",
                how,
            )
        if not finals and not crashed:
            self._log_death(log, code, how)
            return
        if finals:
            log.error(
                "the worker process %s with %d terminal report(s) in flight; sending the "
                "same report(s) again: %s",
                how,
                len(finals),
                ", ".join(finals),
            )
        if crashed:
            log.error(
                "the worker process %s; reporting the %d job(s) it held: %s",
                how,
                len(crashed),
                ", ".join(crashed),
            )
        self._report(code, crashed, finals)

    def _log_death(self, log: Any, code: int, how: str) -> None:
        """A death with no job held: the log says why, once (for a signal, which no Python
        code saw, with its category and the redacted output tail)."""
        import logging

        if code >= 0:
            log.warning("the worker process %s; it held no jobs: nothing to report", how)
            return
        from .._capture import Redactor
        from .._categories import classify_crash

        output = self.tee.tail() if self.tee is not None else ""
        category = classify_crash(code, output, oom_killed=self._oom_killed(code))
        tail = Redactor.from_environ(os.environ).redact(output[-_LOGGED_TAIL:])
        log.log(
            logging.ERROR,
            "the worker process %s (%s); it held no jobs: nothing to report%s",
            how,
            category,
            f"; its last output:\n{tail}" if tail else "",
        )

    def _oom_killed(self, code: int) -> bool:
        """Whether the kernel's OOM killer took the worker (docs/design.md §13.4)."""
        if code != -signal.SIGKILL:
            return False
        from ._report import kernel_says_oom_killed

        before, after = self.oom_count, oom_kills()
        counted = before is not None and after is not None and after > before
        return counted or kernel_says_oom_killed(self.child)

    def _report(self, code: int, crashed: list[str], finals: dict[str, tuple[bytes, bool]]) -> None:
        import trio

        from .._config import Settings, Timings
        from ._report import crash_error, report_held

        timings = Timings(**self.spec["timings"])
        settings = Settings.from_environ(
            os.environ, timings=timings, capture_logs=self.spec["capture_logs"]
        )
        output = self.tee.tail() if self.tee is not None else ""
        oom = self._oom_killed(code)
        during_init = not self.ledger.ready

        def crashed_error(job_id: str) -> JobError:
            return crash_error(job_id, code, output, oom_killed=oom, during_init=during_init)

        async def report() -> None:
            await report_held(
                settings,
                finals,
                crashed,
                crashed_error,
                leave_now=lambda: leave(code),
                early_signals=self.early_signals,
            )

        trio.run(report)


def _reporting_log(level: int) -> tuple[Any, Any]:
    """The SDK's logger, configured as the worker's was, and ``describe_exit``."""
    unstub()
    import logging

    from .._flags import configure_logging
    from ._report import describe_exit

    configure_logging(level, os.environ)
    return logging.getLogger("trio_worker"), describe_exit
