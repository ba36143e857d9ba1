"""A worker process that receives SIGTERM while ``start()`` is still building the worker.

``python signal_at_start_app.py``: the signal is sent from a log handler on the
``worker starting`` line, which ``start()`` logs after installing its signal handlers and
before the worker exists (``trio_worker/_start.py``), so it lands in that window every
run, whatever the machine's speed.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from typing import Any

import trio_worker


class SignalOnStart(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes the worker's log to stderr; sends SIGTERM to this process on the start line."""

    def emit(self, record: logging.LogRecord) -> None:
        super().emit(record)
        if record.getMessage().startswith("worker starting"):
            print("test: sending SIGTERM while the worker is being built", file=sys.stderr)
            os.kill(os.getpid(), signal.SIGTERM)


def echo(job: dict[str, Any]) -> Any:
    return job["input"]


def main() -> None:
    # A handler already on the logger: start() keeps it instead of adding its own.
    logger = logging.getLogger("trio_worker")
    handler = SignalOnStart(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.propagate = False
    timings = trio_worker.Timings(shutdown_grace=3.0, exit_watchdog=2.0)
    trio_worker.start(echo, capture_logs="off", timings=timings)


if __name__ == "__main__":
    main()
