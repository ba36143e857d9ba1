"""Leaving the process: flush everything, then ``os._exit``, bounded by watchdogs.

Why ``os._exit`` and not ``sys.exit``, and the bounds on leaving: docs/design.md §6.3, §9.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
import time
from typing import TYPE_CHECKING, NoReturn

import trio

from ._capture import OutputCapture, flush_stdio, install_python_stream_attribution
from ._config import DEFAULT_EXIT_FLUSH_WATCHDOG
from ._watch import watch_crashes

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import FrameType

    from ._capture._feed import Feed
    from ._config import Settings, Timings
    from ._options import WorkerOptions

log = logging.getLogger("trio_worker")

# How long the watchdog waits for the event loop to say whether reports are in flight.
_LOOP_ANSWER_BOUND = 1.0
# A signal got directly and the same one forwarded by the crash watchdog this close
# together are one delivery (docs/design.md §13.1).
TWIN_WINDOW = 1.0


class SignalCount:
    """How many separate stop signals arrived (docs/design.md §13.1); pure.

    A direct arrival and a forwarded one of the same signal within ``TWIN_WINDOW`` of each
    other count once; two of the same kind never pair (they are two deliveries).
    """

    def __init__(self, window: float = TWIN_WINDOW) -> None:
        self.window = window
        self.count = 0
        self._unpaired: list[tuple[int, bool, float]] = []

    def arrive(self, signum: int, *, forwarded: bool, now: float) -> bool:
        """Count one arrival; False when it was the twin of one already counted."""
        self._unpaired = [a for a in self._unpaired if now - a[2] <= self.window]
        for index, (other, other_forwarded, _) in enumerate(self._unpaired):
            if other == signum and other_forwarded != forwarded:
                del self._unpaired[index]
                return False
        self._unpaired.append((signum, forwarded, now))
        self.count += 1
        return True


def flush_all(capture: OutputCapture | None) -> None:
    """Flush logging handlers, Python streams, C stdio, and the capture's pipe."""
    logging.shutdown()
    flush_stdio()
    if capture is not None:
        capture.stop()


def exit_status(exc: SystemExit | KeyboardInterrupt) -> int:
    """The process's exit status for *exc*, as Python's own would be.

    ``sys.exit(n)`` exits with *n* (modulo 256), ``sys.exit()`` with 0, ``sys.exit("text")``
    with 1, ``KeyboardInterrupt`` with 130 (128 + SIGINT, as shells report it).
    """
    if isinstance(exc, KeyboardInterrupt):
        return 130
    code = exc.code
    if code is None:
        return 0
    return code & 0xFF if isinstance(code, int) else 1


def run_atexit_handlers(bound: float, capture: OutputCapture | None = None) -> None:
    """Run what the user registered with ``atexit``, within *bound* seconds (docs/design.md
    §6.3). *capture*'s own stop is taken out of them: it runs after them, in `flush_all`,
    so their output is still captured and its flush does not eat their bound.
    """
    if capture is not None:
        atexit.unregister(capture.stop)
    runner = threading.Thread(target=atexit._run_exitfuncs, name="trio_worker atexit", daemon=True)
    runner.start()
    runner.join(bound)
    if runner.is_alive():
        log.warning(
            "an atexit handler still ran after %.1fs; exiting without waiting for it", bound
        )


def exit_process(
    status: int,
    capture: OutputCapture | None = None,
    *,
    watchdog_seconds: float = DEFAULT_EXIT_FLUSH_WATCHDOG,
    farewell: str | None = None,
    farewell_level: int = logging.WARNING,
    at_exit: bool = True,
) -> NoReturn:
    """Flush, then end the process with *status* whatever threads are still running.

    A flush that hangs gets *watchdog_seconds* before the process ends anyway. *farewell*
    is logged under that watchdog too: logging takes locks, and a signal handler may have
    interrupted their holder. *at_exit*: the ``atexit`` handlers run first, within half
    that bound; an exit "at once" passes False.
    """
    watchdog = threading.Timer(watchdog_seconds, os._exit, args=(status,))
    watchdog.daemon = True
    watchdog.start()
    try:
        if farewell is not None:
            log.log(farewell_level, "%s", farewell)
        if at_exit:
            run_atexit_handlers(watchdog_seconds / 2, capture)
        flush_all(capture)
    finally:
        os._exit(status)


class ExitGuard:
    """``start()``'s bound on leaving: SIGTERM and SIGINT, and the exit watchdog.

    Plain Python signal handlers, so they run even while the event loop is blocked; the
    signals the crash watchdog forwards arrive on *forwarded* (a pipe). What the first and
    a second signal do, and when the watchdog ends the process: docs/design.md §9. The
    supervisor calls :meth:`settled` once every report is out while a handler that ignored
    its cancellation still runs.
    """

    def __init__(
        self, timings: Timings, capture: OutputCapture | None, forwarded: int | None = None
    ) -> None:
        self._timings = timings
        self._capture = capture
        # The read end of the pipe the crash watchdog forwards signals through (``_watch``).
        self._forwarded = forwarded
        self._signals = SignalCount()
        self._signals_lock = threading.RLock()  # the handler (main thread) and the relay
        self._pending: str | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._shutdown: Callable[[str], None] | None = None
        self._reporting: Callable[[], bool] | None = None
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()

    def install(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)
        if self._forwarded is not None:
            relay = threading.Thread(
                target=self._relay, args=(self._forwarded,), name="trio_worker signals", daemon=True
            )
            relay.start()

    def attach(
        self,
        token: trio.lowlevel.TrioToken,
        shutdown: Callable[[str], None],
        reporting: Callable[[], bool],
    ) -> None:
        """The running worker: called on the trio thread once it is built."""
        self._token, self._shutdown, self._reporting = token, shutdown, reporting
        if self._pending is not None:
            shutdown(self._pending)

    def _arm(self, seconds: float) -> None:
        with self._lock:
            if self._timer is not None:
                return
            self._timer = threading.Timer(seconds, self._expire)
            self._timer.daemon = True
            self._timer.start()

    def settled(self) -> None:
        self.leave(0, "every report is out; exiting without the handler(s) still running")

    def leave(
        self,
        status: int,
        farewell: str | None = None,
        level: int = logging.WARNING,
        *,
        at_exit: bool = True,
    ) -> NoReturn:
        exit_process(
            status,
            self._capture,
            watchdog_seconds=self._timings.exit_flush_watchdog,
            farewell=farewell,
            farewell_level=level,
            at_exit=at_exit,
        )

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._arrive(signum, forwarded=False)

    def _relay(self, fd: int) -> None:
        """The crash watchdog's forwarded signals: one byte each, the signal's number."""
        while True:
            try:
                data = os.read(fd, 64)
            except InterruptedError:
                continue
            except OSError:
                return
            if not data:
                return  # the watchdog is gone; this process goes with it
            for signum in data:
                self._arrive(signum, forwarded=True)

    def _arrive(self, signum: int, *, forwarded: bool) -> None:
        name = signal.Signals(signum).name
        with self._signals_lock:
            if not self._signals.arrive(signum, forwarded=forwarded, now=time.monotonic()):
                return  # the same delivery, reaching this process a second way
            second = self._signals.count > 1
        if second:
            self.leave(128 + signum, f"second signal ({name}): exiting at once", at_exit=False)
        self.stop(f"{name} received")

    def stop(self, reason: str, *, on_loop: bool = False) -> None:
        """Begin the worker's shutdown and arm the exit watchdog: every shutdown of
        ``start()``'s worker comes through here. Safe from a signal handler or any thread:
        it only queues the shutdown for the loop, unless *on_loop* says the caller is a
        task of that loop (never a signal handler, which may interrupt one)."""
        self._arm(self._timings.shutdown_grace + self._timings.exit_watchdog)
        if self._token is None or self._shutdown is None:
            self._pending = reason  # the worker is still being built
            return
        if on_loop:
            # refresh_worker, a handler's sys.exit: at once, so the take loop never starts
            # another take in between.
            self._shutdown(reason)
            return
        try:
            self._token.run_sync_soon(self._shutdown, reason)
        except trio.RunFinishedError:
            pass  # the run is over: start() is already leaving

    def _expire(self) -> None:
        if self._reports_in_flight():
            self._timer = threading.Timer(self._timings.exit_watchdog, self._expire)
            self._timer.daemon = True
            self._timer.start()
            return
        self.leave(
            1,
            f"exit watchdog: still running {self._timings.exit_watchdog:.1f}s after the "
            "shutdown grace ended (a handler ignoring cancellation, or a blocked event "
            "loop); exiting",
            logging.ERROR,
            at_exit=False,
        )

    def _reports_in_flight(self) -> bool:
        """Ask the loop; a loop that does not answer within a second is blocked: False."""
        if self._token is None or self._reporting is None:
            return False
        answered = threading.Event()
        answer: list[bool] = []
        reporting = self._reporting

        def ask() -> None:
            answer.append(reporting())
            answered.set()

        try:
            self._token.run_sync_soon(ask)
        except trio.RunFinishedError:
            return False
        return answered.wait(_LOOP_ANSWER_BOUND) and answer[0]


def watched_process(
    settings: Settings, options: WorkerOptions
) -> tuple[OutputCapture | None, ExitGuard]:
    """What every serving mode of the process sets up first: the crash watchdog (only the
    worker process returns from here), the output capture, and the exit guard (installed
    by the caller when it serves)."""
    watched = watch_crashes(
        settings, crash_watch=options.crash_watch, tee_output=options.capture_logs == "on"
    )
    capture = capture_output(settings, options, None if watched is None else watched.feed)
    forwarded = None if watched is None else watched.signals
    return capture, ExitGuard(options.timings, capture, forwarded)


def capture_output(
    settings: Settings, options: WorkerOptions, feed: Feed | None = None
) -> OutputCapture | None:
    """Capture fds 1 and 2 (and attribute Python's writes to jobs) unless *options* say
    ``capture_logs="off"``; *feed*: the crash watchdog's tee."""
    if options.capture_logs != "on":
        return None
    capture = OutputCapture.install(redactor=settings.redactor, feed=feed)
    install_python_stream_attribution()
    return capture


async def watch_signals(
    request_shutdown: Callable[[str], None], shutting_down: Callable[[], bool]
) -> None:
    """``serve(handle_signals=True)``: SIGTERM and SIGINT start a graceful shutdown, a
    second SIGINT raises ``KeyboardInterrupt`` (``serve()`` cannot end the process, as
    :class:`ExitGuard` does for ``start()``)."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            if shutting_down() and signum == signal.SIGINT:
                log.warning("second SIGINT: exiting at once")
                raise KeyboardInterrupt
            request_shutdown(f"{signal.Signals(signum).name} received")
