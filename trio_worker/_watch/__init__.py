"""The crash watchdog: when the worker process dies, every job it held still learns why.

See docs/design.md §13 and docs/how-it-works.md ("Two processes").

* ``_records``: the take and settle records the worker writes, and the watchdog's ledger
  of them. Imported by the lifecycle on every take, so it is tiny and imports nothing.
* ``_watchdog``: the fork at ``start()``, and the exec of the watchdog in the parent.
* ``_main``: the watchdog's program: signals, output, records, the worker's exit;
  ``_imports``: where it imports the reporting code from.
* ``_report``: the cause of a crash, its category, the job-done bodies and their delivery.

:func:`watch_crashes` is the one call ``start()`` makes.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from . import _records as records

if TYPE_CHECKING:
    from .._capture._feed import Feed
    from .._config import Settings

__all__ = ["ENV_VAR", "records", "unwatched_reason", "watch_crashes"]

log = logging.getLogger("trio_worker")

ENV_VAR = "TRIO_WORKER_CRASH_WATCH"
_OFF = frozenset({"0", "false", "no", "off"})
# A GPU runtime loaded in this process: forking it would leave the child a driver state it
# cannot use (CUDA is not fork-safe), and the watchdog would hold GPU memory.
_GPU_LIBRARIES = ("libcuda.so", "libamdhip64.so", "libhsa-runtime64.so", "libze_loader.so")


def watch_crashes(settings: Settings, *, crash_watch: bool, tee_output: bool) -> Feed | None:
    """Fork the worker under a crash watchdog, or say in one line why not.

    Returns in the worker process (the `Feed` its output capture reads when
    *tee_output*); the watchdog process never returns from here.
    """
    if not crash_watch:
        log.info("crash watch off: start(crash_watch=False)")
        return None
    reason = unwatched_reason(os.environ)
    if reason is not None:
        log.warning("crash watch off: %s", reason)
        return None
    from ._watchdog import fork_worker

    return fork_worker(settings, tee_output=tee_output, log_level=log.getEffectiveLevel())


def unwatched_reason(environ: dict[str, str] | os._Environ[str]) -> str | None:
    """Why this process cannot fork a watched worker safely; None when it can."""
    if environ.get(ENV_VAR, "").strip().lower() in _OFF:
        return f"{ENV_VAR}={environ[ENV_VAR]}"
    if not hasattr(os, "fork") or not sys.platform.startswith("linux"):
        return "the crash watchdog needs fork() on Linux"
    threads = _thread_count()
    if threads > 1:
        return (
            f"{threads - 1} thread(s) already running before start() (forking them is unsafe); "
            "start them in the initializer so a worker that dies still reports its jobs"
        )
    gpu = _gpu_runtime()
    if gpu is not None:
        return (
            f"a GPU runtime is already initialized before start() ({gpu}); load the model "
            "in the initializer so a worker that dies still reports its jobs"
        )
    return None


def _thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))  # native threads too, not only Python's
    except OSError:
        import threading

        return threading.active_count()


def _gpu_runtime() -> str | None:
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is not None and cuda.is_initialized():
            return "torch.cuda is initialized"
    except Exception:  # a half-imported or stubbed torch: judge by the mapped libraries
        pass
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for library in _GPU_LIBRARIES:
        if library in maps:
            return f"{library} is loaded"
    return None
