"""The cgroup's OOM kill count, read by the watchdog with the records (docs/design.md §13.4).
Nothing heavy imported (not even pathlib): the watchdog stays small.
"""

from __future__ import annotations

import contextlib
import os

__all__ = ["oom_kills"]


def oom_kills() -> int | None:
    """The cgroup's ``oom_kill`` count (v2 ``memory.events``, or v1), None when unreadable."""
    for path in _memory_event_files():
        with contextlib.suppress(OSError, ValueError), open(path, encoding="ascii") as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    return None


def _memory_event_files() -> list[str]:
    files: list[str] = []
    with contextlib.suppress(OSError, ValueError), open("/proc/self/cgroup") as f:
        for line in f.read().splitlines():
            hierarchy, controllers, path = line.split(":", 2)
            relative = path.lstrip("/")
            if hierarchy == "0":
                files.append(os.path.join("/sys/fs/cgroup", relative, "memory.events"))
            elif "memory" in controllers.split(","):
                base = os.path.join("/sys/fs/cgroup/memory", relative)
                files.append(os.path.join(base, "memory.oom_control"))
    files.append("/sys/fs/cgroup/memory.events")
    return files
