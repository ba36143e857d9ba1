"""A watched worker for the crash tests of the fourth wave (tests/integration/test_crash_*).

Run as ``python -u watched_app.py`` with the fake platform's environment; the process the
test starts is the crash watchdog, the worker its child. The worker prints ``worker pid N``
from its initializer, so a test can signal it directly.

Job inputs: ``seconds`` (sleep, on trio), ``sync_seconds`` (a sync sleep in a thread, which
a stop cannot interrupt), ``exit`` (``os._exit`` with that status while held), ``die``
with ``after`` and ``held`` (a thread that waits until ``held`` jobs have started, then
kills the worker ``after`` seconds later: ``kill``, ``segv``, ``exit0`` or ``exit3``).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from typing import Any

import trio

import trio_worker


def die(how: str) -> None:
    sys.stdout.flush()
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif how == "segv":
        ctypes.string_at(0)
    elif how == "exit0":
        os._exit(0)
    else:
        os._exit(3)


STARTED = 0


def die_later(how: str, after: float, held: int) -> None:
    def run() -> None:
        while STARTED < held:
            time.sleep(0.001)
        time.sleep(after)
        die(how)

    threading.Thread(target=run, daemon=True).start()


def init() -> None:
    print(f"worker pid {os.getpid()}", flush=True)


async def handler(job: dict[str, Any]) -> dict[str, Any]:
    global STARTED
    spec = job["input"]
    STARTED += 1
    print(f"job {job['id']} started", flush=True)
    if "die" in spec:
        die_later(spec["die"], spec["after"], spec.get("held", 1))
    if "exit" in spec:
        os._exit(spec["exit"])
    if "sync_seconds" in spec:
        await trio.to_thread.run_sync(time.sleep, spec["sync_seconds"])
    await trio.sleep(spec.get("seconds", 0))
    return {"n": spec.get("n"), "pid": os.getpid()}


if __name__ == "__main__":
    trio_worker.start(
        handler,
        initializer=init,
        async_backend="trio",
        concurrency=int(os.environ.get("CONCURRENCY", "1")),
        timings=trio_worker.Timings(
            shutdown_grace=float(os.environ.get("GRACE", "5")),
            report_deadline=float(os.environ.get("REPORT_DEADLINE", "10")),
        ),
    )
