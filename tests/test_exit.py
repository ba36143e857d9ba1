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


def test_the_exit_watchdog_ends_a_hung_flush_with_the_status() -> None:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", HUNG_FLUSH],
        env={"PYTHONPATH": str(REPO)},
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 3, done.stderr
    assert time.monotonic() - started < 10  # the default watchdog (5 s) was not used
