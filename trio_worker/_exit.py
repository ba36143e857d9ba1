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

if TYPE_CHECKING:
    from ._capture import OutputCapture

FLUSH_WATCHDOG_SECONDS = 5.0


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


def exit_process(status: int, capture: OutputCapture | None = None) -> NoReturn:
    """Flush, then end the process with *status* whatever threads are still running."""
    watchdog = threading.Timer(FLUSH_WATCHDOG_SECONDS, os._exit, args=(status,))
    watchdog.daemon = True
    watchdog.start()
    try:
        flush_all(capture)
    finally:
        os._exit(status)
