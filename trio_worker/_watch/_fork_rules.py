"""When ``python handler.py`` may fork its worker at ``start()``: not with a Python thread, a
child process or a GPU runtime already there, nor when a native thread survives the fork
(docs/design.md §13.1, "When python handler.py may fork").
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["native_threads_left", "refusal_reason"]

# GPU runtimes, which are not fork-safe.
_GPU_LIBRARIES = ("libcuda.so", "libamdhip64.so", "libhsa-runtime64.so", "libze_loader.so")


def launcher_hint() -> str:
    """How to run this file so that nothing forks: the launcher, with the file's name."""
    script = sys.argv[0] if sys.argv and sys.argv[0] not in ("", "-c") else "handler.py"
    return f"run the file with `trio-worker run {script}`, which starts the watchdog first"


def refusal_reason(environ: Mapping[str, str]) -> str | None:
    """Why this process must not fork its worker now (before the fork); None when it may."""
    if not hasattr(os, "fork") or not sys.platform.startswith("linux"):
        return "the crash watchdog needs fork() on Linux; " + launcher_hint()
    threads = python_threads()
    if threads:
        return (
            f"{threads} Python thread(s) already running before start() (a lock one of them "
            "holds would stay held in a forked worker); start them in the initializer, or "
            + launcher_hint()
        )
    children = child_processes()
    if children:
        return (
            f"{children} child process(es) started before start() would be the watchdog's "
            "after a fork, and their Popen.poll() would say they exited; " + launcher_hint()
        )
    gpu = gpu_runtime()
    if gpu is not None:
        return (
            f"a GPU runtime is already initialized before start() ({gpu}); load the model "
            "in the initializer so a worker that dies still reports its jobs"
        )
    return None


def python_threads() -> int:
    """Python threads besides the calling one (a native thread that called into Python
    counts: it runs Python code too)."""
    return len([t for t in threading.enumerate() if t is not threading.current_thread()])


def child_processes() -> int:
    """This process's children, exited ones not yet waited for included (a zombie is
    still the child its ``Popen`` polls)."""
    children: set[str] = set()
    try:
        for task in os.listdir("/proc/self/task"):
            text = Path(f"/proc/self/task/{task}/children").read_text()
            children.update(text.split())
    except OSError:  # a kernel without CONFIG_PROC_CHILDREN: look at every process
        return _children_by_scan(os.getpid())
    return len(children)


def native_threads_left() -> int:
    """Threads of this process still alive besides the calling one: right after a fork,
    in the parent, the native threads no ``pthread_atfork`` handler stopped."""
    alive = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 0
    for task in tasks:
        # Z and X: exited, only waiting to be released; []: gone meanwhile.
        if _stat_fields(f"/proc/self/task/{task}/stat")[:1] not in ([], ["Z"], ["X"]):
            alive += 1
    return max(alive - 1, 0)


def gpu_runtime() -> str | None:
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


def _children_by_scan(pid: int) -> int:
    parent = [str(pid)]  # the ppid field
    pids = [entry for entry in os.listdir("/proc") if entry.isdigit()]
    return sum(_stat_fields(f"/proc/{other}/stat")[1:2] == parent for other in pids)


def _stat_fields(path: str) -> list[str]:
    """The fields of a ``/proc`` stat file after ``(comm)``, which may hold spaces and
    parentheses (state, ppid, ...); [] when it cannot be read."""
    try:
        return Path(path).read_text().rpartition(")")[2].split()
    except OSError:
        return []
