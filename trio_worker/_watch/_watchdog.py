"""Fork at ``start()``: the child becomes the worker, the parent execs the crash watchdog.

See docs/design.md §13 and docs/how-it-works.md ("Two processes"). The process the user
started stays the one the container runs (PID 1 under ``CMD ["python", "-u",
"handler.py"]``), so it cannot be the one that dies: it forks before any thread, event loop
or GPU runtime exists, and the child runs everything else, initializer included.

The parent then replaces itself (``execv``: same PID, same children) with a fresh, small
interpreter running ``_main``. Without the exec it would keep the user's whole module
state, and every page of it the worker later touches (a reference count is a write) would
be copied: the watchdog would grow with the worker's imports, and a model loaded at
import time would be held twice. After the exec it holds only what ``_main`` imports.
What it needs crosses the exec as inherited fds (the pipes, two shared pages) and one
JSON argument.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import logging
import marshal
import os
import select
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from .._capture._feed import Feed, Tee, adopt_feed, close_feed_ends, open_tee
from .._capture._pipes import grow_pipe, shared_page
from . import _records
from ._imports import site_flags
from ._report import oom_kills

if TYPE_CHECKING:
    from .._config import Settings

FORWARDED = (signal.SIGTERM, signal.SIGINT)
TAIL_BYTES = 256 * 1024  # what the watchdog keeps of the output; reports clip to 16 KiB
_PR_SET_PDEATHSIG = 1

# Run by the exec'd watchdog (``python -S -c BOOTSTRAP SPEC``). The packages on the way to
# ``_main`` are entered as bare namespaces, so their ``__init__`` (the whole SDK, trio and
# httpx) is not imported until a crash needs it (``_main.unstub``). -S: the worker's
# sys.path is given whole, and the .pth files' import hooks wait for a crash (``_imports``).
BOOTSTRAP = """\
import marshal, os, sys, types
spec = marshal.loads(bytes.fromhex(sys.argv[1]))
sys.path[:] = spec["path"]
for name in ("trio_worker", "trio_worker._capture", "trio_worker._watch"):
    stub = types.ModuleType(name)
    stub.__path__ = [os.path.join(spec["package"], *name.split(".")[1:])]
    sys.modules[name] = stub
from trio_worker._watch._main import main
main(spec)
"""


def fork_worker(settings: Settings, *, tee_output: bool, log_level: int) -> Feed | None:
    """Fork; returns in the child (the worker), with its `Feed` when output is teed.

    The parent never returns: it becomes the watchdog, which exits with the child's status.
    """
    tee, feed = open_tee(TAIL_BYTES) if tee_output else (None, None)
    record_read, record_write = os.pipe()
    grow_pipe(record_write)
    state_fd, state = shared_page("trio_worker-records")
    # Everything the watchdog needs is ready before the fork, so that after it the parent
    # only closes fds and execs: the worker waits for that (`_await_exec`).
    spec: dict[str, Any] = {
        "tee": None if tee is None else tee.spec(),
        "records": record_read,
        "state": state_fd,
        "oom_before": oom_kills(),
        "tail_bytes": TAIL_BYTES,
        "timings": dataclasses.asdict(settings.timings),
        "capture_logs": settings.capture_logs,
        "log_level": log_level,
        "path": list(sys.path),
        "package": str(Path(__file__).resolve().parents[1]),
    }
    # Closed by the exec (O_CLOEXEC): the child waits for that before it runs on.
    exec_done, exec_pending = os.pipe()
    _flush_stdio()  # or the child would print the parent's buffered output a second time
    # Blocked until the watchdog has its handlers: a SIGTERM sent meanwhile waits for it
    # (the mask survives the exec) instead of killing the half-started watchdog.
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
        os.close(exec_pending)
        _await_exec(exec_done)
        _become_worker(parent, tee, feed, record_read)
        os.close(state_fd)
        _records.install(record_write, state)
        return feed
    if tee is not None and feed is not None:
        tee.close_child_ends()
        close_feed_ends(feed)
    os.close(record_write)
    os.close(exec_done)
    spec["child"] = pid
    _exec_watchdog(spec, exec_pending)


def _await_exec(exec_done: int) -> None:
    """Until the parent has exec'd (or 1 s): before that, every page the worker writes
    is copied, since the parent still maps it; after, a write only takes the page over."""
    with contextlib.suppress(OSError):
        select.select([exec_done], [], [], 1.0)
    os.close(exec_done)


def _exec_watchdog(spec: dict[str, Any], exec_pending: int) -> NoReturn:
    tee = spec["tee"]
    fds = [spec["records"], spec["state"]]
    if isinstance(tee, dict):
        fds += [*tee["reads"], *tee["copies"], tee["seq"]]
    for fd in fds:
        assert isinstance(fd, int)
        os.set_inheritable(fd, True)
    # The watchdog's start (an interpreter, ~30 ms of CPU) must not slow the worker's on a
    # busy machine: it starts at a low priority and restores the original once waiting
    # (when allowed: raising a priority back may need CAP_SYS_NICE).
    with contextlib.suppress(OSError):
        spec["priority"] = os.getpriority(os.PRIO_PROCESS, 0)
        os.setpriority(os.PRIO_PROCESS, 0, min(spec["priority"] + 10, 19))
    try:
        # marshal: built in, so the watchdog decodes its spec without importing json.
        argument = marshal.dumps(spec).hex()
        argv = [sys.executable, *site_flags(), "-S", "-c", BOOTSTRAP, argument]
        os.execv(sys.executable, argv)
    except OSError:
        # No interpreter to exec (a frozen app): the worker is running; wait for it
        # here instead, with this process's memory, rather than leave it unwatched.
        os.close(exec_pending)
        logging.getLogger("trio_worker").warning(
            "crash watch: cannot exec %s; watching from this process", sys.executable
        )
        from ._main import main

        main(spec)


def _become_worker(parent: int, tee: Tee | None, feed: Feed | None, record_read: int) -> None:
    # Its own process group: a terminal's Ctrl-C reaches the watchdog alone, which
    # forwards it once (the worker would take two SIGINTs as "exit at once").
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    # A worker whose watchdog was SIGKILLed has nobody reading its output or reporting
    # its jobs: it goes with it, as it would have unwatched.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)  # the watchdog died before prctl took effect
    if tee is not None and feed is not None:
        adopt_feed(tee, feed)
        os.close(tee.seq_fd)
    os.close(record_read)


def _flush_stdio() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).fflush(None)
