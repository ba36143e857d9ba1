"""The handler file's side of the launcher: ``TRIO_WORKER_LAUNCHED`` found and its fds
adopted at ``start()`` instead of forking (docs/design.md §13.1, "The launcher"). Imported
by the watchdog too (:func:`read_options`), so its top imports nothing more.
"""

from __future__ import annotations

import contextlib
import marshal
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .._capture._feed import Feed
    from .._config import Settings

__all__ = [
    "ENV",
    "Watched",
    "adopt_launch",
    "describe_launch",
    "die_with",
    "find_launch",
    "read_options",
]

ENV = "TRIO_WORKER_LAUNCHED"
# Bumped when the fds or records change: a file running another copy of trio_worker
# than the launcher's then forks its own watchdog.
PROTOCOL = 3
PR_SET_PDEATHSIG = 1


class Watched:
    """What a watched worker keeps, in either form: the `Feed` its output capture reads
    (None when output is not teed), and the read end of the pipe its watchdog forwards
    stop signals through (for ``_exit.ExitGuard``). A plain class: the watchdog imports
    this module, and ``dataclasses`` would weigh on its memory."""

    def __init__(self, feed: Feed | None, signals: int) -> None:
        self.feed = feed
        self.signals = signals


def describe_launch(watchdog: int, fds: dict[str, Any]) -> str:
    """The variable's value: the watchdog's pid and the fds (``_launch``)."""
    import json

    return json.dumps({"protocol": PROTOCOL, "watchdog": watchdog, **fds})


def find_launch() -> dict[str, Any] | None:
    """The launcher's fds when this process is its child, else None (the variable is
    removed either way)."""
    raw = os.environ.pop(ENV, None)
    if raw is None:
        return None
    import json
    import logging

    try:
        launch: object = json.loads(raw)
    except ValueError:
        launch = None
    if not isinstance(launch, dict) or launch.get("protocol") != PROTOCOL:
        why = "written by another version of trio_worker, or not by the launcher"
    elif launch.get("watchdog") != os.getppid():
        why = "the watchdog it names is not this process's parent"
    elif _launch_fds(launch) is None:
        why = "it does not name this process's open fds"
    else:
        return launch
    logging.getLogger("trio_worker").warning("ignoring %s (%s)", ENV, why)
    return None


def _launch_fds(launch: dict[str, Any]) -> list[int] | None:
    """Every fd *launch* names; None unless each is one of this process's open fds."""
    tee = launch.get("tee")
    fds: list[Any] = [launch.get(key) for key in ("records", "state", "options", "signals")]
    if tee is not None:
        if not isinstance(tee, dict):
            return None
        copies, upstream = tee.get("copies"), tee.get("upstream")
        if not (isinstance(copies, list) and isinstance(upstream, list)):
            return None
        if len(copies) != 2 or len(upstream) != 2:
            return None
        fds += [*copies, *upstream, tee.get("seq")]
    for fd in fds:
        if not isinstance(fd, int) or isinstance(fd, bool):
            return None
        try:
            os.fstat(fd)
        except OSError:
            return None
    return fds


def adopt_launch(
    launch: dict[str, Any],
    settings: Settings,
    *,
    crash_watch: bool,
    tee_output: bool,
    log_level: int,
) -> Watched:
    """Take over the launcher's fds: the `Feed` the output capture reads when
    *tee_output*, and the forwarded signals' pipe (read whatever *crash_watch* says: the
    watchdog forwards every stop signal there). Without *crash_watch*, no record is
    written: a death reports nothing."""
    import dataclasses

    from .._capture import flush_stdio
    from .._capture._feed import Feed
    from .._capture._pipes import close_all, map_page
    from . import _records

    die_with(launch["watchdog"])
    # What the file printed before start() reaches the watchdog now, as the fork form's
    # flush before its fork does: a crash report's tail then has it.
    flush_stdio()
    for fd in _launch_fds(launch) or ():  # nothing the worker starts may inherit them
        os.set_inheritable(fd, False)
    tee = launch["tee"]
    feed = None
    if tee is not None:
        if tee_output:
            copies, upstream = tee["copies"], tee["upstream"]
            feed = Feed((copies[0], copies[1]), (upstream[0], upstream[1]), map_page(tee["seq"]))
        else:
            close_all([*tee["copies"], *tee["upstream"]])
        os.close(tee["seq"])
    options = {
        "timings": dataclasses.asdict(settings.timings),
        "capture_logs": settings.capture_logs if tee_output else "off",
        "log_level": log_level,
    }
    with contextlib.suppress(OSError):  # a watchdog gone already: start() dies with it
        os.write(launch["options"], marshal.dumps(options))
    os.close(launch["options"])
    if crash_watch:
        state_fd = launch["state"]
        _records.install(launch["records"], state_fd, _records.map_state(state_fd))
    else:
        close_all([launch["records"], launch["state"]])
    return Watched(feed, launch["signals"])


def die_with(parent: int) -> None:
    """Be killed when *parent*, the watchdog, dies (SIGKILLed: nobody would read this
    process's output or report its jobs); exit now if it already has."""
    import ctypes
    import signal

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)  # the watchdog died before prctl took effect


def read_options(fd: int) -> dict[str, Any]:
    """In the watchdog: the options ``start()`` sent (none if it never ran)."""
    data = b""
    with contextlib.suppress(OSError):
        os.set_blocking(fd, False)
        while chunk := os.read(fd, 1 << 16):
            data += chunk
    try:
        options = marshal.loads(data)
    except (EOFError, ValueError, TypeError):
        return {}
    return options if isinstance(options, dict) else {}
