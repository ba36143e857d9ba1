"""The crash watchdog: when the worker process dies, every job it held still learns why
(docs/design.md §13; its modules: docs/how-it-works.md, "Two processes").
:func:`watch_crashes` is the one call ``start()`` makes.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from . import _records as records
from ._fork_rules import refusal_reason

if TYPE_CHECKING:
    from collections.abc import Mapping

    from .._config import Settings
    from ._launched import Watched

__all__ = ["ENV_VAR", "opted_out", "records", "say_unwatched", "unwatched_reason", "watch_crashes"]

log = logging.getLogger("trio_worker")

ENV_VAR = "TRIO_WORKER_CRASH_WATCH"
_OFF = frozenset({"0", "false", "no", "off"})


def watch_crashes(settings: Settings, *, crash_watch: bool, tee_output: bool) -> Watched | None:
    """Run the worker watched, or say in one line why not (None: no watchdog at all).

    Launched (``trio-worker run``): adopts the watchdog's pipes. Otherwise forks, and
    returns in the worker process (`Watched`: the feed its output capture reads when
    *tee_output*, and its forwarded signals); the watchdog process never returns from here.
    """
    from ._launched import adopt_launch, find_launch

    launch = find_launch()
    log_level = log.getEffectiveLevel()
    if launch is not None:
        # The output still passes through the watchdog; only the records say what to report.
        off = None if crash_watch else "start(crash_watch=False)"
        off = off or opted_out(os.environ)  # set by the file itself, after the launcher read it
        watched = adopt_launch(
            launch, settings, crash_watch=off is None, tee_output=tee_output, log_level=log_level
        )
        if off is not None:
            say_unwatched(off, logging.INFO if not crash_watch else logging.WARNING)
        return watched
    if not crash_watch:
        say_unwatched("start(crash_watch=False)", logging.INFO)
        return None
    reason = unwatched_reason(os.environ)
    if reason is not None:
        say_unwatched(reason)
        return None
    from ._watchdog import ForkRefused, fork_worker

    try:
        return fork_worker(settings, tee_output=tee_output, log_level=log_level)
    except ForkRefused as refused:
        say_unwatched(str(refused))
        return None


def opted_out(environ: Mapping[str, str]) -> str | None:
    """``TRIO_WORKER_CRASH_WATCH=0`` (or false, no, off), as the line saying so names it."""
    if environ.get(ENV_VAR, "").strip().lower() in _OFF:
        return f"{ENV_VAR}={environ[ENV_VAR]}"
    return None


def unwatched_reason(environ: Mapping[str, str]) -> str | None:
    """Why this process cannot fork a watched worker safely; None when it can."""
    return opted_out(environ) or refusal_reason(environ)


def say_unwatched(reason: str, level: int = logging.WARNING) -> None:
    """The one line saying the worker runs unwatched, shown at any ``RUNPOD_LOG_LEVEL``
    (docs/design.md §13.1): the logger's level bypassed, its handlers kept."""
    record = log.makeRecord(log.name, level, __file__, 0, "crash watch off: %s", (reason,), None)
    log.handle(record)
