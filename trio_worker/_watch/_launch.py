"""The launcher: ``trio-worker run handler.py [args]``, ``python -m trio_worker handler.py``.
The watchdog starts first and runs the file as its child, so nothing forks after user
code; where there is nothing to watch, the file replaces it (docs/design.md §13.1, "The
launcher").
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from typing import TYPE_CHECKING, NoReturn

from . import opted_out

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

__all__ = ["launch", "plain_reason"]


def launch(handler_file: str, args: Sequence[str]) -> NoReturn:
    """Run *handler_file* with *args* under the watchdog, or in its place.

    Raises:
        OSError: when the interpreter cannot be started.
    """
    argv = [sys.executable, *interpreter_flags(), handler_file, *args]
    if plain_reason(args, os.environ) is not None:
        os.execv(sys.executable, argv)
    from ._launched import ENV, describe_launch
    from ._watchdog import FORWARDED, WatchEnds, exec_watchdog

    ends = WatchEnds.open(tee_output=True)
    tee, feed = ends.tee, ends.feed
    assert tee is not None
    assert feed is not None
    options_read, options_write = os.pipe()
    fds = {
        "records": ends.record_write,
        "state": ends.state_fd,
        "options": options_write,
        "signals": ends.signals_read,
        "tee": {"copies": list(feed.copies), "upstream": list(tee.reads), "seq": tee.seq_fd},
    }
    worker_fds = (ends.record_write, ends.state_fd, ends.signals_read, options_write)
    for fd in (*worker_fds, *feed.copies, *tee.reads):
        os.set_inheritable(fd, True)
    os.set_inheritable(tee.seq_fd, True)
    environ = {**os.environ, ENV: describe_launch(os.getpid(), fds)}
    # Blocked until the watchdog has its handlers (the mask survives the exec); the child
    # starts with the mask this process had.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    out, err = tee.worker_ends()
    child = os.posix_spawn(
        sys.executable,
        argv,
        environ,
        file_actions=[
            (os.POSIX_SPAWN_DUP2, out, 1),
            (os.POSIX_SPAWN_DUP2, err, 2),
            (os.POSIX_SPAWN_CLOSE, out),
            (os.POSIX_SPAWN_CLOSE, err),
        ],
        # Its own process group: a terminal's Ctrl-C reaches it once, through the watchdog.
        setpgroup=0,
        setsigmask=mask,
    )
    ends.close_worker_ends()
    os.close(options_write)
    spec = ends.spec()
    spec.update(child=child, options=options_read)
    # Until start() sends its own (_launched.read_options): what a worker has by default.
    # The OOM count is the watchdog's own first reading, taken as soon as it waits.
    spec.update(timings={}, capture_logs="on", log_level=logging.INFO, oom_before=None)
    exec_watchdog(spec)


def plain_reason(args: Sequence[str], environ: Mapping[str, str]) -> str | None:
    """Why the handler file should run in the launcher's place, unwatched; None when the
    watchdog should start first. The same rules as ``start()``'s choice of mode."""
    from .._flags import UsageError, reference_flags

    off = opted_out(environ)
    if off is not None:
        return off
    if not sys.platform.startswith("linux"):
        return "the crash watchdog needs Linux"
    try:
        known, _ = reference_flags().parse_known_args(list(args))
    except UsageError:
        return "a mistake in the flags, which start() explains"
    if known.help or known.test_input is not None or known.rp_serve_api:
        return "a local mode"
    if not environ.get("RUNPOD_WEBHOOK_GET_JOB"):
        return "local mode: no RUNPOD_WEBHOOK_GET_JOB"
    return None


def interpreter_flags() -> list[str]:
    """The flags this interpreter runs with that the handler file's should run with too
    (``python -O -m trio_worker handler.py``)."""
    from ._imports import site_flags

    flags = site_flags()
    flags += ["-" + "O" * sys.flags.optimize] if sys.flags.optimize else []
    flags += ["-B"] if sys.flags.dont_write_bytecode else []
    flags += [f"-W{option}" for option in sys.warnoptions]
    return flags
