"""The processes a user's fitness check leaves running: found, ended and reaped.

Nothing else would end them: the worker either exits at once (a failed check), and they
outlive it holding a GPU, a port or a mount, or serves beside them (docs/reference.md,
"Fitness checks"). Descendants are read from ``/proc`` (Linux, where workers run);
elsewhere none is found. One whose parent has exited belongs to init, and is not found.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from pathlib import Path

import trio

log = logging.getLogger("trio_worker")

__all__ = ["descendants", "end_left_behind"]

PROC = Path("/proc")
# How long the killed children get to be reaped: SIGKILL is final, but the kernel takes a
# moment to tear a large process down (a CUDA context). One that cannot be reaped by then
# (stuck in the driver) is left, and is reaped by no one until the worker exits.
REAP_BOUND = 2.0
REAP_POLL = 0.01


def descendants(root: int | None = None) -> set[int]:
    """The pids of every process below *root* (this process by default)."""
    root = os.getpid() if root is None else root
    children: dict[int, list[int]] = {}
    try:
        entries = list(PROC.iterdir())
    except OSError:
        return set()
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # ended meanwhile
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1 and fields[1].isdigit():
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: set[int] = set()
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


async def end_left_behind(check: str, before: set[int]) -> None:
    """End the descendants that were not there *before* the check *check* ran, and reap
    the worker's own children among them (bounded by :data:`REAP_BOUND`)."""
    left = descendants() - before
    if not left:
        return
    log.warning(
        "fitness check %s left %d process(es) running (pid %s): ended",
        check,
        len(left),
        ", ".join(str(pid) for pid in sorted(left)),
    )
    for pid in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    waiting = set(left)
    with trio.move_on_after(REAP_BOUND):
        while waiting:
            waiting = {pid for pid in waiting if not _reaped(pid)}
            if waiting:
                await trio.sleep(REAP_POLL)


def _reaped(pid: int) -> bool:
    """Whether *pid* is gone: reaped now if it is our child, else no longer there."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # not our child (a grandchild), or reaped already
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return not (PROC / str(pid)).exists() or _is_zombie(pid)
    return done == pid


def _is_zombie(pid: int) -> bool:
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return True
    return stat[stat.rfind(")") + 2 :].startswith("Z")
