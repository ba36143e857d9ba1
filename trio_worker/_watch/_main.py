"""The crash watchdog's program: what PID 1 runs once the worker is started (docs/design.md §13).

Started by ``_watchdog`` through ``execv`` (see ``BOOTSTRAP`` there), with the pipes and
shared pages as inherited fds and the rest in one marshalled *spec*; ``spec["child"]`` is
the worker, forked at ``start()`` or spawned by the launcher (``_launch``). While the
worker lives it does four things, and imports little (its resident memory is the
overhead the worker pays; see docs/design.md §13 for the figures):

* forwards SIGTERM and SIGINT to the worker;
* passes the worker's fds 1/2 through (``Tee``), waking only when there is output;
* reads the take and settle records every ``RECORD_POLL`` seconds, not per record, so a
  job costs it no wake-up: the record pipe holds minutes of records;
* reaps every child that exits, the worker's orphans included: as PID 1 it is their
  parent, and a zombie nobody waits for stays in the process table (as tini does).

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
from ._imports import load_package
from ._launched import read_options

RECORD_POLL = 0.25  # seconds between reads of the record pipe while the worker lives


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
            self._read_records()
        selector.close()
        signal.set_wakeup_fd(-1)  # trio.run, if reports follow, sets its own
        if self.tee is not None:
            self.tee.drain()
        self._read_records()
        self._take_worker_options()
        return os.waitstatus_to_exitcode(status)

    def _reap(self) -> int | None:
        """Wait for every child that has exited; the worker's wait status once it has."""
        while True:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return None
            if pid == self.child:
                return status

    def _take_worker_options(self) -> None:
        # Launched, the options only start() knew come now (the fork form had them).
        if "options" in self.spec:
            self.spec.update(read_options(self.spec["options"]))
            if self.spec["capture_logs"] != "on" and self.tee is not None:
                self.tee.drop_tail()

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

    def _report(self, code: int, held: list[str], settings: Any) -> None:
        import trio

        from ._report import crash_body, kernel_says_oom_killed, oom_kills, report_held

        output = self.tee.tail() if self.tee is not None else ""
        oom = False
        if code == -signal.SIGKILL:
            before, after = self.spec["oom_before"], oom_kills()
            counted = before is not None and after is not None and after > before
            oom = counted or kernel_says_oom_killed(self.child)
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
