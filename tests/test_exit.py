"""Leaving the process: a hung flush cannot keep a dead worker alive."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

HUNG_FLUSH = """
import threading
from trio_worker._exit import exit_process

class StuckCapture:
    def stop(self):
        threading.Event().wait()  # a pipe nobody reads

exit_process(3, StuckCapture(), watchdog_seconds=0.2)
"""

# A signal handler runs on whatever the main thread was doing: here, logging is stuck (a
# lock the interrupted code holds, a handler blocked on the network) when SIGTERM comes
# twice. The line saying why the process leaves must not be what keeps it alive.
STUCK_LOGGING_SECOND_SIGNAL = """
import logging, os, signal, sys, threading, time
from trio_worker._config import Timings
from trio_worker._exit import ExitGuard

class StuckHandler(logging.Handler):
    def emit(self, record):
        sys.stderr.write("stuck on: " + record.getMessage() + "\\n")
        sys.stderr.flush()
        threading.Event().wait()

logging.getLogger("trio_worker").addHandler(StuckHandler())
ExitGuard(Timings(shutdown_grace=60.0, exit_flush_watchdog=0.2), None).install()
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(0.05)  # the first signal is handled: the worker would begin its shutdown
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(60)
"""


def run_child(source: str) -> tuple[subprocess.CompletedProcess[bytes], float]:
    """*source* run by a child Python against this checkout: how it ended, and how long
    it took in seconds."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", source],
        env={},  # the installed package, as a user runs it
        capture_output=True,
        timeout=30,
        check=False,
    )
    return done, time.monotonic() - started


def test_the_exit_watchdog_ends_a_hung_flush_with_the_status() -> None:
    done, seconds = run_child(HUNG_FLUSH)
    assert done.returncode == 3, done.stderr
    assert seconds < 10  # the default watchdog (5 s) was not used


def test_a_second_signal_exits_even_when_logging_hangs() -> None:
    done, seconds = run_child(STUCK_LOGGING_SECOND_SIGNAL)
    assert done.returncode == 143, done.stderr
    assert b"stuck on: second signal (SIGTERM): exiting at once" in done.stderr
    assert seconds < 10  # not the 60 s grace, nor the 5 s default
