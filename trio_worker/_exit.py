"""Leaving the process: flush everything, then ``os._exit`` (docs/design.md §6.3).

``sys.exit`` joins every non-daemon thread, so a framework's leftover thread (a dataloader,
an executor, an abandoned initializer) can keep a dead worker alive for ever. ``os._exit``
cannot hang, but it drops whatever is still buffered (it skips cleanup handlers and stdio
flushing: https://docs.python.org/3/library/os.html#os._exit), so the flush sequence runs
first, under a watchdog that exits anyway if a flush hangs.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading
from typing import TYPE_CHECKING, NoReturn

from ._config import DEFAULT_EXIT_FLUSH_WATCHDOG

if TYPE_CHECKING:
    from ._capture import OutputCapture


def _flush_c_stdio() -> None:
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):  # no libc (unusual platforms): nothing to flush
        pass


def flush_all(capture: OutputCapture | None) -> None:
    """Flush logging handlers, Python streams, C stdio, and the capture's pipe."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or broken stream: nothing more to save
            pass
    _flush_c_stdio()
    if capture is not None:
        capture.stop()


def exit_process(
    status: int,
    capture: OutputCapture | None = None,
    *,
    watchdog_seconds: float = DEFAULT_EXIT_FLUSH_WATCHDOG,
) -> NoReturn:
    """Flush, then end the process with *status* whatever threads are still running.

    A flush that hangs (a stuck pipe, a logging handler blocked on the network) gets
    *watchdog_seconds* (``Timings.exit_flush_watchdog``) before the process ends anyway.
    """
    watchdog = threading.Timer(watchdog_seconds, os._exit, args=(status,))
    watchdog.daemon = True
    watchdog.start()
    try:
        flush_all(capture)
    finally:
        os._exit(status)
