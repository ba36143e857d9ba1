"""Walk one plain job and one streamed job through the worker: which modules they enter.

Runs the real worker (trio_worker.testing.serve) against the in-process fake platform,
warms it up with one job, then records every call into a trio_worker module (the fake
platform's own modules excluded) from the moment the measured job is queued until the
platform has its terminal report. Prints the modules in order of first entry, and the
number of calls that cross from one module into another (a figure that varies by a few
between runs: a take may or may not be re-issued inside the window).

    python scripts/module_walk.py   (with the package installed, as tox installs it)
"""

from __future__ import annotations

import sys
import threading
from functools import partial
from typing import Any

import trio

from trio_worker import testing


def plain(job: dict[str, Any]) -> dict[str, Any]:
    return {"ok": job["input"]}


async def streamed(job: dict[str, Any]) -> Any:
    for i in range(3):
        yield {"token": i}


# The fake platform runs in the same process: its modules are not the worker's path.
PLATFORM_SIDE = ("trio_worker.testing", "trio_worker._endpoint")


class Recorder:
    def __init__(self) -> None:
        self.order: list[str] = []
        self.crossings = 0
        self.on = False

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if not self.on or event != "call":
            return
        mod = frame.f_globals.get("__name__", "")
        if not mod.startswith("trio_worker") or mod.startswith(PLATFORM_SIDE):
            return
        caller = frame.f_back.f_globals.get("__name__", "") if frame.f_back else ""
        if caller != mod:
            self.crossings += 1
        if mod not in self.order:
            self.order.append(mod)


async def walk(handler: Any, *, stream: bool) -> Recorder:
    del stream  # the handler's kind decides the path
    platform = testing.FakePlatform(take_hold=0.5)
    rec = Recorder()
    sys.setprofile(rec)
    threading.setprofile(rec)
    async with testing.memory_network(platform) as opener:
        env = platform.worker_env("http://platform.test")
        async with trio.open_nursery() as nursery:
            handle = await nursery.start(
                lambda task_status: testing.serve(
                    handler,
                    environ=env,
                    open_stream=opener,
                    heartbeat="off",
                    handle_signals=False,
                    capture_logs="on",  # the default: a job's output is captured
                    task_status=task_status,
                )
            )
            first = platform.enqueue({"n": 0})
            await platform.wait_for_status(first)
            await trio.sleep(0.05)
            rec.on = True
            job = platform.enqueue({"n": 1})
            await platform.wait_for_status(job)
            rec.on = False
            handle.shutdown()
    sys.setprofile(None)
    threading.setprofile(None)
    return rec


def main() -> None:
    for name, handler, stream in (("plain", plain, False), ("streamed", streamed, True)):
        rec = trio.run(partial(walk, handler, stream=stream))
        print(f"{name}: {len(rec.order)} modules, {rec.crossings} cross-module calls")
        for m in rec.order:
            print("   ", m)


if __name__ == "__main__":
    main()
