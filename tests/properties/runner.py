"""Run one drawn `Scenario` against the real worker in virtual time.

``run_scenario`` makes one ``trio.run`` under ``MockClock(autojump_threshold=0)`` (for the
drawn ``async_backend="asyncio"``: one asyncio loop hosting trio as its guest, both on one
virtual clock, ``HostLoopClock`` in ``tests/backends.py``): the fake platform (an ASGI
app) is served by the package's own h11 server over in-memory streams
(``trio_worker.testing._memory``), under the drawn network (``chaos.py``), and the real
``trio_worker.serve`` runs the scenario's user code (``usercode.py``). The driver
(`_drive`) enqueues jobs, arms platform faults and sends stops and SIGTERM at their drawn
times, then shuts the worker down once it has settled. The finished `Run` (recorder plus
the platform's own records) is what the checkers judge.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio
import trio.testing

import trio_worker
from trio_worker._capture import OutputCapture
from trio_worker._capture._redact import Redactor
from trio_worker._state import JobState
from trio_worker.testing import FakePlatform
from trio_worker.testing._memory import memory_network

from ..backends import HostLoopClock, run_on_asyncio_host
from .chaos import ChaosOpener, CrashRecordingApp, RecordingBackend
from .recorder import Recorder, StopDelivery, example_log
from .scenario import Scenario
from .threads import Baton
from .usercode import CycleConcurrency, UserCode

if TYPE_CHECKING:
    from hypothesis.strategies import DataObject


# A run that has not ended this long (virtual) after its last action has hung.
HANG_LIMIT = 400.0


# The driver shuts the worker down once idle, or at the latest this long after its last
# action when no SIGTERM was drawn.
SETTLE_LIMIT = 30.0


def text_capture(text: str, redactor: Redactor) -> OutputCapture:
    """A real OutputCapture that redirects no fd, holding *text* as the captured output.

    Its reader thread has no pipe to read and ends at once; ``stop()`` then returns at once.
    """
    capture = OutputCapture([], redactor, 1 << 20)
    capture._append(text.encode("utf-8", errors="surrogatepass"))
    capture._thread.start()
    return capture


@dataclass
class Run:
    scenario: Scenario
    rec: Recorder
    platform: FakePlatform

    def report(self) -> str:
        """Everything recorded, for a failing example's message."""
        outcome = repr(self.rec.serve_outcome)
        if len(outcome) > 300:
            outcome = f"{outcome[:200]}...[{len(outcome) - 300} chars]...{outcome[-100:]}"
        lines = [f"scenario: {self.scenario!r}", f"serve: {outcome}"]
        lines.append(f"serve ended at {self.rec.serve_end:g}; sigterm {self.rec.sigterm}")
        for t in self.rec.transitions:
            lines.append(
                f"  [{t.seq}] t={t.time:g} {t.job_id}: {t.before.value} --{t.event.value}--> "
                f"{t.after.value} held={list(t.held)} c={t.concurrency}"
            )
        for ex in self.rec.exchanges:
            if ex.route != "ping":
                lines.append(f"  [{ex.seq}] {ex!r}")
        for run in self.rec.handlers.values():
            lines.append(f"  handler {run}")
        for stop in self.rec.stops:
            lines.append(f"  stop {stop}")
        for line in self.rec.log:
            lines.append(f"  log {line if len(line) <= 300 else line[:297] + '...'}")
        return "\n".join(lines)


class RecordingStatus:
    """Hands the WorkerHandle to the recorder the moment serve() has one: the worker's
    tasks may send requests before ``nursery.start`` returns to the caller."""

    def __init__(self, inner: trio.TaskStatus[trio_worker.WorkerHandle], rec: Recorder) -> None:
        self._inner = inner
        self._rec = rec

    def started(self, value: trio_worker.WorkerHandle | None = None) -> None:
        assert value is not None
        self._rec.handle = value
        self._inner.started(value)


async def _drive(scn: Scenario, platform: FakePlatform, rec: Recorder) -> None:
    """Enqueue jobs, arm faults, send stops and SIGTERM at their drawn times."""
    assert rec.handle is not None
    handle = rec.handle
    actions: list[tuple[float, int, Callable[[], object]]] = []
    for fault in scn.faults:
        actions.append((fault.at, 0, functools.partial(platform.inject, fault.fault())))
    index = 0
    for batch in scn.batches:
        for plan in batch.jobs:
            job_id = f"j{index}"
            enqueue: Callable[[], object]
            if plan.outcome == "malformed":
                enqueue = functools.partial(platform.enqueue_raw, {"id": job_id})
            else:
                enqueue = functools.partial(platform.enqueue, {"k": index}, job_id=job_id)
            actions.append((batch.at, 1, enqueue))
            index += 1

    def stop(how: str, job_id: str) -> None:
        if how == "stop":
            platform.request_stop(job_id)
        elif how in ("stop_addressed", "ghost"):
            platform.request_stop(job_id, worker="w1")
        elif how == "cancel":
            if job_id in platform.jobs:
                platform.cancel(job_id)
        else:
            seq, now = rec.tick()
            rec.stops.append(StopDelivery(seq, now, job_id, rec.state_of(job_id)))
            handle.stop_job(job_id)

    for n, plan_ in enumerate(scn.stops):
        job_id = f"ghost{n}" if plan_.how == "ghost" else f"j{plan_.target}"
        actions.append((plan_.at, 2, functools.partial(stop, plan_.how, job_id)))

    def sigterm() -> None:
        # Recorded only when it can take effect: after an init failure it is a no-op.
        if rec.sigterm is None and not handle.statistics()["init_failed"]:
            rec.sigterm = rec.tick()
        handle.shutdown("sigterm")

    if scn.sigterm is not None:
        actions.append((scn.sigterm, 3, sigterm))
    actions.sort(key=lambda a: (a[0], a[1]))
    for at, _, act in actions:
        await trio.sleep_until(at)
        act()
        await trio.lowlevel.checkpoint()
    if scn.sigterm is None:
        settle_by = scn.last_action() + SETTLE_LIMIT
        while trio.current_time() < settle_by:
            if _settled(platform, rec) and (handle.gate_open or scn.init.outcome == "hang"):
                break
            await trio.sleep(0.5)
        sigterm()


def _settled(platform: FakePlatform, rec: Recorder) -> bool:
    """Nothing left to happen: no job queued, held, or handed out and still on its way
    (a job the worker stopped or gave up stays IN_PROGRESS on the platform: settled)."""
    if rec.held:
        return False
    for job in platform.jobs.values():
        if job.status == "IN_QUEUE":
            return False
        if job.status == "IN_PROGRESS" and not rec.states.get(job.id, JobState.TAKEN).terminal:
            return False
    return True


async def _main(scn: Scenario, rec: Recorder) -> FakePlatform:
    platform = FakePlatform(take_hold=scn.take_hold, stop_hold=scn.stop_hold, requeue_after=None)
    app = CrashRecordingApp(platform, rec)
    environ = platform.worker_env("http://platform", worker_id="w1", ping_interval_ms=scn.ping_ms)
    code = UserCode(scn, rec)
    concurrency: int | CycleConcurrency = (
        scn.concurrency
        if isinstance(scn.concurrency, int)
        else CycleConcurrency(scn.concurrency, rec)
    )
    capture = None
    if scn.logs is not None:
        capture = text_capture(scn.logs.render(), Redactor.from_environ(environ))
    handler: Callable[[dict[str, Any]], Any] = {
        "async": code.handler,
        "async_generator": code.generator,
        "sync": code.sync_handler,
        "sync_generator": code.sync_generator,
    }[scn.handler]
    initializer: Callable[[], Any] | None = None
    if scn.init.outcome != "none":
        initializer = code.sync_initializer if scn.init.sync else code.initializer
    serve = functools.partial(
        trio_worker.testing.serve,
        handler,
        initializer=initializer,
        init_timeout=scn.init.timeout,
        concurrency=concurrency,
        return_aggregate_stream=scn.aggregate,
        environ=environ,
        wrap_backend=functools.partial(RecordingBackend, rec=rec),
        heartbeat="task",
        handle_signals=False,
        capture_logs="off" if capture is None else "on",
        capture=capture,
        timings=scn.timings,
        observers=[rec],
        async_backend=scn.async_backend,
    )

    with trio.move_on_after(scn.last_action() + SETTLE_LIMIT + HANG_LIMIT) as guard:
        async with memory_network(app) as opener, trio.open_nursery() as nursery:
            if rec.baton is not None:
                nursery.start_soon(rec.baton.run)

            async def worker(task_status: trio.TaskStatus[trio_worker.WorkerHandle]) -> None:
                try:
                    await serve(
                        open_stream=ChaosOpener(opener, rec),
                        task_status=RecordingStatus(task_status, rec),
                    )
                except (Exception, SystemExit) as exc:
                    rec.serve_outcome = exc
                else:
                    rec.serve_outcome = "returned"
                finally:
                    rec.serve_end = trio.current_time()
                    nursery.cancel_scope.cancel()

            await nursery.start(worker)
            nursery.start_soon(_drive, scn, platform, rec)
    rec.hung = guard.cancelled_caught
    rec.over = True
    if capture is not None:
        capture.stop()
    return platform


def run_scenario(scenario: Scenario, data: DataObject | None = None) -> Run:
    """Run *scenario* (network steps drawn from *data*) in a fresh ``trio.run``, or for the
    asyncio backend in a fresh asyncio loop hosting trio as its guest, the two sharing one
    virtual clock (``tests/backends.py``)."""
    rec = Recorder(scenario, data)
    with example_log(rec.log):
        if scenario.async_backend == "asyncio":
            # With threads the baton is the autojump, as below, and also waits for the
            # host loop's timers (the asyncio user code's sleeps).
            host_clock = HostLoopClock(autojump=not scenario.threads)
            if scenario.threads:
                rec.baton = Baton(host_clock, host_timer=host_clock.next_host_timer)
            platform = run_on_asyncio_host(_main, scenario, rec, clock=host_clock)
        elif scenario.threads:
            # The baton is the autojump: it jumps only when no thread is on its way in or out.
            clock = trio.testing.MockClock()
            rec.baton = Baton(clock)
            platform = trio.run(_main, scenario, rec, clock=clock)
        else:
            platform = trio.run(
                _main, scenario, rec, clock=trio.testing.MockClock(autojump_threshold=0)
            )
    if rec.draw_error is not None:
        raise rec.draw_error
    return Run(scenario, rec, platform)


def scratch_check() -> None:
    """The mutation check sets TRIO_WORKER_EXPECT_ROOT: fail unless that copy is imported."""
    root = os.environ.get("TRIO_WORKER_EXPECT_ROOT")
    if root is not None:
        where = os.path.realpath(trio_worker.__file__)
        if not where.startswith(os.path.realpath(root) + os.sep):
            raise RuntimeError(f"trio_worker imported from {where}, expected under {root}")
