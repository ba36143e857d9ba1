"""Starting the crash watchdog: the fork at ``start()``, and the exec both forms (fork and
launcher) end in, which leaves a small fresh interpreter running ``_main`` rather than a
copy of the user's process (docs/design.md §13.1).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import marshal
import os
import resource
import select
import signal
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from .._capture import flush_stdio
from .._capture._feed import Feed, Tee, adopt_feed, close_feed_ends, discard_tee, open_tee
from .._capture._pipes import close_all, grow_pipe
from . import _records
from ._fork_rules import launcher_hint, native_threads_left
from ._imports import site_flags
from ._launched import Watched, die_with
from ._oom import oom_kills

if TYPE_CHECKING:
    import mmap

    from .._config import Settings

# Blocked from before the fork (or the launcher's spawn) until the watchdog's handlers are
# in place (``_main``): what comes meanwhile waits for them.
FORWARDED = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
TAIL_BYTES = 256 * 1024  # what the watchdog keeps of the output; reports clip to 16 KiB
_CAP_SYS_NICE = 23  # the capability's bit in /proc/self/status's Cap* masks
_GO, _UNDO = b"+", b"!"  # the parent's word to a forked child: run on, or exit at once

# ``python -S -c BOOTSTRAP SPEC``: the packages on the way to ``_main`` are bare
# namespaces, so their ``__init__`` (the SDK, trio, httpx) waits for a crash
# (``_main.unstub``), as do the .pth files' import hooks (``_imports``).
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


class ForkRefused(Exception):
    """The fork at ``start()`` was undone: the message says why, and what to do."""


@dataclasses.dataclass
class WatchEnds:
    """The pipes and pages between a worker and its watchdog, made before the worker
    exists. One more fd here is one more in ``_launch`` and ``_launched``, and a new
    ``_launched.PROTOCOL``."""

    tee: Tee | None
    feed: Feed | None
    record_read: int
    record_write: int
    state_fd: int  # the records' state and the terminal bodies in flight (``_finals``)
    state: mmap.mmap
    signals_read: int  # the worker reads the stop signals the watchdog forwards
    signals_write: int

    @classmethod
    def open(cls, *, tee_output: bool) -> WatchEnds:
        tee, feed = open_tee(TAIL_BYTES) if tee_output else (None, None)
        record_read, record_write = os.pipe()
        grow_pipe(record_write)
        state_fd, state = _records.open_state()
        signals_read, signals_write = os.pipe()
        return cls(
            tee, feed, record_read, record_write, state_fd, state, signals_read, signals_write
        )

    def spec(self) -> dict[str, Any]:
        """The watchdog's part of the spec: its fds, and where it imports from."""
        return {
            "tee": None if self.tee is None else self.tee.spec(),
            "records": self.record_read,
            "state": self.state_fd,
            "signals": self.signals_write,
            "tail_bytes": TAIL_BYTES,
            "path": list(sys.path),
            "package": str(Path(__file__).resolve().parents[1]),
        }

    def close_worker_ends(self) -> None:
        """In the watchdog, once the worker has its own: ours would hide its EOFs."""
        if self.tee is not None and self.feed is not None:
            self.tee.close_child_ends()
            close_feed_ends(self.feed)
        os.close(self.record_write)
        os.close(self.signals_read)

    def discard(self) -> None:
        """Close everything: no worker will use these."""
        if self.tee is not None and self.feed is not None:
            discard_tee(self.tee, self.feed)
        close_all([self.record_read, self.record_write, self.state_fd])
        close_all([self.signals_read, self.signals_write])
        self.state.close()


def fork_worker(settings: Settings, *, tee_output: bool, log_level: int) -> Watched:
    """Fork; returns in the child (the worker). The parent never returns: it becomes the
    watchdog, which exits with the child's status.

    Raises:
        ForkRefused: in this process, the only one left, when a native thread survived
            the fork (``_fork_rules``): the child exited before running anything.
    """
    ends = WatchEnds.open(tee_output=tee_output)
    # Ready before the fork: after it the parent only closes fds and execs, which the
    # worker waits for (`_await_exec`).
    spec = ends.spec()
    spec.update(
        oom_before=oom_kills(),
        timings=dataclasses.asdict(settings.timings),
        capture_logs=settings.capture_logs,
        log_level=log_level,
    )
    exec_done, exec_pending = os.pipe()  # closed by the exec (O_CLOEXEC)
    flush_stdio()  # or the child would print the parent's buffered output a second time
    # Blocked until the watchdog has its handlers: a SIGTERM sent meanwhile waits for it
    # (the mask survives the exec) instead of killing the half-started watchdog.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    parent = os.getpid()
    with warnings.catch_warnings():
        # Python 3.12+ warns at any fork with native threads running (OpenBLAS's pool):
        # whether those threads make this fork unsafe is what is checked right after it.
        warnings.filterwarnings("ignore", "This process .*is multi-threaded", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.close(exec_pending)
        _await_exec(exec_done)
        _become_worker(parent, ends)
        return Watched(ends.feed, ends.signals_read)
    os.close(exec_done)
    left = _native_threads_after_fork()
    if left:
        os.write(exec_pending, _UNDO)
        os.close(exec_pending)
        os.waitpid(pid, 0)
        ends.discard()
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        raise ForkRefused(
            f"{left} native thread(s) kept running across the fork, so a library that does "
            "not handle fork is loaded (GNU OpenMP once torch ran a parallel operation, "
            f"for one) and the worker could hang in it; {launcher_hint()}"
        )
    os.write(exec_pending, _GO)
    ends.close_worker_ends()
    spec["child"] = pid
    exec_watchdog(spec, exec_pending)


def _native_threads_after_fork() -> int:
    # A pool stopped by its atfork handler may take a moment to leave /proc after its join.
    left = native_threads_left()
    for _ in range(10):
        if not left:
            break
        time.sleep(0.001)
        left = native_threads_left()
    return left


def _await_exec(exec_done: int) -> None:
    """The parent's word (run on, or exit: the fork is undone), then its exec, or 1 s:
    before the exec every page the worker writes is copied, since the parent still maps
    it; after, a write only takes the page over."""
    word = b""
    with contextlib.suppress(OSError):
        word = os.read(exec_done, 1)
    if word != _GO:  # undone, or the parent died: run nothing
        os._exit(0)
    with contextlib.suppress(OSError):
        select.select([exec_done], [], [], 1.0)
    os.close(exec_done)


def exec_watchdog(spec: dict[str, Any], exec_pending: int | None = None) -> NoReturn:
    """Become the watchdog: a fresh ``python -S`` running ``_main`` with *spec*.

    *spec* names the fds to keep (each made inheritable here) and ``child``, the worker.
    """
    tee = spec["tee"]
    fds = [spec["records"], spec["state"], spec["signals"]]
    fds += [spec["options"]] if "options" in spec else []
    if isinstance(tee, dict):
        fds += [*tee["reads"], *tee["copies"], tee["seq"]]
    for fd in fds:
        assert isinstance(fd, int)
        os.set_inheritable(fd, True)
    _start_at_low_priority(spec)
    try:
        # marshal: built in, so the watchdog decodes its spec without importing json.
        argument = marshal.dumps(spec).hex()
        argv = [sys.executable, *site_flags(), "-S", "-c", BOOTSTRAP, argument]
        os.execv(sys.executable, argv)
    except OSError:
        # No interpreter to exec (a frozen app): the worker is running; wait for it
        # here instead, with this process's memory, rather than leave it unwatched.
        if exec_pending is not None:
            os.close(exec_pending)
        logging.getLogger("trio_worker").warning(
            "crash watch: cannot exec %s; watching from this process", sys.executable
        )
        from ._main import main

        main(spec)


def _start_at_low_priority(spec: dict[str, Any]) -> None:
    # Starts at nice +10 and restores its priority once waiting (_main), only where it
    # may (docs/design.md §13.1, "Its start does not slow the worker's").
    try:
        original = os.getpriority(os.PRIO_PROCESS, 0)
        status = Path("/proc/self/status").read_text()
        nice_limit = resource.getrlimit(resource.RLIMIT_NICE)[0]
    except (OSError, ValueError):
        return
    if may_restore_priority(original, status, nice_limit, os.geteuid()):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, min(original + 10, 19))
            spec["priority"] = original


def may_restore_priority(original: int, status: str, nice_limit: int, euid: int) -> bool:
    """Whether a process with this ``/proc/self/status`` and soft ``RLIMIT_NICE`` may, after
    an exec, set its nice value back to *original* once it raised it: RLIMIT_NICE allows
    down to ``20 - limit``; CAP_SYS_NICE anywhere, if it survives the exec (root's bounding
    set, another user's ambient set)."""
    if nice_limit == resource.RLIM_INFINITY or 20 - nice_limit <= original:
        return True
    masks: dict[str, int] = {}
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key in ("CapEff", "CapBnd", "CapAmb"):
            with contextlib.suppress(ValueError):
                masks[key] = int(value.strip(), 16)
    bit = 1 << _CAP_SYS_NICE
    if not masks.get("CapEff", 0) & bit:
        return False
    kept = masks.get("CapBnd", 0) if euid == 0 else masks.get("CapAmb", 0)
    return bool(kept & bit)


def _become_worker(parent: int, ends: WatchEnds) -> None:
    # Its own process group: a terminal's Ctrl-C reaches it once, through the watchdog.
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    die_with(parent)
    if ends.tee is not None and ends.feed is not None:
        adopt_feed(ends.tee, ends.feed)
        os.close(ends.tee.seq_fd)
    os.close(ends.record_read)
    os.close(ends.signals_write)
    _records.install(ends.record_write, ends.state_fd, ends.state)
