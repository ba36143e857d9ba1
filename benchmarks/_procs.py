"""Processes: spawning workers in their own session, stopping them, reading /proc.

Every worker runs in a new session (its own process group), so the reference SDK's ping
process, a child of the worker, is found by walking ``/proc`` and is killed with it.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

_TICKS = os.sysconf("SC_CLK_TCK")


class WorkerDied(RuntimeError):
    """A worker process exited while the benchmark still needed it."""


@dataclass
class Spawned:
    """A process started by :func:`spawn`, with the wall-clock time just before the spawn."""

    popen: subprocess.Popen[bytes]
    spawned_at: float
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def check_alive(self) -> None:
        """Raises WorkerDied (with the end of its log) if the process has exited."""
        code = self.popen.poll()
        if code is not None:
            raise WorkerDied(f"worker exited with status {code}; log tail:\n{self.log_tail()}")


def spawn(argv: Sequence[str], env: Mapping[str, str], log_path: Path, cwd: Path) -> Spawned:
    """Start *argv* in a new session with stdout and stderr to *log_path*."""
    log = log_path.open("wb")
    try:
        spawned_at = time.time()
        popen = subprocess.Popen(
            list(argv),
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        log.close()
    return Spawned(popen, spawned_at, log_path)


def kill_group(spawned: Spawned, grace: float = 0.0) -> None:
    """SIGTERM the process group (if *grace*), then SIGKILL whatever is left; reap it."""
    popen = spawned.popen
    if grace > 0 and popen.poll() is None:
        _signal_group(popen.pid, signal.SIGTERM)
        try:
            popen.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    _signal_group(popen.pid, signal.SIGKILL)
    popen.wait()


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass


def _parents() -> dict[int, list[int]]:
    """{parent pid: [child pids]} of every live process."""
    parents: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        # The command name may contain spaces and parentheses: split after the last ")".
        fields = stat[stat.rindex(")") + 2 :].split()
        parents.setdefault(int(fields[1]), []).append(int(entry.name))
    return parents


def descendants(pid: int, parents: dict[int, list[int]] | None = None) -> list[int]:
    """Every live descendant of *pid* (children, grandchildren...)."""
    if parents is None:
        parents = _parents()
    found: list[int] = []
    stack = [pid]
    while stack:
        for child in parents.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def rss_kib(pid: int) -> int | None:
    """VmRSS of *pid* in KiB; None if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


@dataclass(frozen=True)
class TreeRss:
    """Resident memory of a process and its descendants, in MiB."""

    main_mib: float
    children_mib: float
    children: int

    @property
    def total_mib(self) -> float:
        return self.main_mib + self.children_mib


def tree_rss(pid: int) -> TreeRss | None:
    """VmRSS of *pid* plus its descendants; None if *pid* is gone."""
    main = rss_kib(pid)
    if main is None:
        return None
    children = [kib for child in descendants(pid) if (kib := rss_kib(child)) is not None]
    return TreeRss(main / 1024, sum(children) / 1024, len(children))


def cpu_split(pid: int) -> tuple[float, float] | None:
    """(user, system) CPU seconds of *pid* (not its children); None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    # fields[0] is field 3 (state): utime and stime are fields 14 and 15.
    return int(fields[11]) / _TICKS, int(fields[12]) / _TICKS


def tree_cpu_split(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of *pid* plus its live descendants."""
    user = system = 0.0
    for each in (pid, *descendants(pid)):
        split = cpu_split(each)
        if split is not None:
            user, system = user + split[0], system + split[1]
    return user, system


def worker_process(pid: int) -> int:
    """The pid running the worker's event loop, spawned as *pid*.

    trio_worker's crash watch forks at start: the spawned process execs the watchdog and
    its child goes on as the worker. Without the watch (or for the reference) it is *pid*.
    """
    children = descendants(pid)
    exec_watchdog = b"\x00-S\x00-c\x00" in _cmdline(pid)  # see trio_worker/_watch/_watchdog.py
    return children[0] if children and exec_watchdog else pid


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of *pid* (not its children) in seconds; None if it is gone."""
    split = cpu_split(pid)
    return None if split is None else split[0] + split[1]


def tree_cpu_seconds(pid: int) -> float | None:
    """CPU time of *pid* plus its live descendants."""
    main = cpu_seconds(pid)
    if main is None:
        return None
    return main + sum(c for child in descendants(pid) if (c := cpu_seconds(child)) is not None)


def busy_ticks() -> tuple[int, int] | None:
    """(total, busy) CPU ticks of the whole machine, from /proc/stat."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields), sum(fields) - idle


def _tick_count(pid: int) -> int | None:
    split = cpu_split(pid)
    return None if split is None else round((split[0] + split[1]) * _TICKS)


class LoadMonitor(threading.Thread):
    """Samples how much CPU processes *outside* this process tree use.

    Machine-wide busy ticks (``/proc/stat``) minus this process tree's: this process, its
    live descendants (the platform, the workers) and every child already reaped
    (``RUSAGE_CHILDREN``), so a process that starts and ends between two samples is still
    ours. A grandchild reaped by an orphaning parent is missed (counted as "others").
    """

    def __init__(self, interval: float = 0.5) -> None:
        super().__init__(name="load-monitor", daemon=True)
        self.interval = interval
        self.samples: list[tuple[float, float]] = []  # (monotonic time, % of all CPUs)
        self._stop_event = threading.Event()

    @staticmethod
    def _ours() -> tuple[dict[int, tuple[int, bool]], float]:
        """{pid: (ticks, is a direct child)} of the live tree, and reaped children's ticks."""
        me = os.getpid()
        parents = _parents()
        children = set(parents.get(me, []))
        live = {}
        for pid in [me, *descendants(me, parents)]:
            count = _tick_count(pid)
            if count is not None:
                live[pid] = (count, pid in children)
        reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
        return live, (reaped.ru_utime + reaped.ru_stime) * _TICKS

    @staticmethod
    def _our_delta(
        before: tuple[dict[int, tuple[int, bool]], float],
        after: tuple[dict[int, tuple[int, bool]], float],
    ) -> float:
        (old, old_reaped), (new, new_reaped) = before, after
        delta = new_reaped - old_reaped
        delta += sum(ticks - old.get(pid, (0, False))[0] for pid, (ticks, _) in new.items())
        # A child we reaped since: its whole total moved into RUSAGE_CHILDREN, so take out
        # what was already counted. A grandchild reaped by someone else just vanishes.
        delta -= sum(ticks for pid, (ticks, direct) in old.items() if direct and pid not in new)
        return delta

    def run(self) -> None:
        machine, ours = busy_ticks(), self._ours()
        while not self._stop_event.wait(self.interval):
            now_machine, now_ours = busy_ticks(), self._ours()
            if machine is None or now_machine is None or now_machine[0] == machine[0]:
                continue
            mine = self._our_delta(ours, now_ours)
            others = max(0.0, (now_machine[1] - machine[1]) - mine)
            self.samples.append((time.monotonic(), 100 * others / (now_machine[0] - machine[0])))
            machine, ours = now_machine, now_ours

    def summary(self, start: float = 0.0, end: float = float("inf")) -> dict[str, float | None]:
        """Mean and max of the samples whose half-second window overlaps *start* to *end*
        (monotonic): a figure shorter than one window still has the sample covering it."""
        interval = self.interval
        values = [pct for at, pct in self.samples if at > start and at - interval < end]
        if not values:
            return {"mean_pct": None, "max_pct": None}
        return {
            "mean_pct": round(sum(values) / len(values), 1),
            "max_pct": round(max(values), 1),
        }

    def stop(self) -> dict[str, float | None]:
        self._stop_event.set()
        self.join(timeout=5)
        return self.summary()


def cpu_busy(seconds: float = 1.0) -> float | None:
    """Percent of all CPUs busy over *seconds* (from /proc/stat)."""
    first = busy_ticks()
    time.sleep(seconds)
    second = busy_ticks()
    if first is None or second is None or second[0] == first[0]:
        return None
    return round(100 * (second[1] - first[1]) / (second[0] - first[0]), 1)


def wait_quiet(timeout: float, say: Callable[[str], None], limit: float = 10.0) -> float | None:
    """Wait up to *timeout* s for the machine to be under *limit* % busy; the last reading."""
    busy = cpu_busy()
    deadline = time.monotonic() + timeout
    while busy is not None and busy >= limit and time.monotonic() < deadline:
        say(f"waiting for a quiet machine ({busy}% busy) ...")
        busy = cpu_busy(2.0)
    if busy is not None and busy > 15:
        say(f"warning: the machine is {busy}% busy; figures will be noisy")
    return busy
