"""The user code of one scenario: initializer and handlers that only wait, and record.

Async handlers and initializers only sleep (``trio.sleep``, or ``asyncio.sleep`` as asyncio
tasks on the asyncio backend, `Waits`), and sync ones wait on the `Baton` (``threads.py``),
so nothing escapes the virtual clock and one example costs a few milliseconds of wall
time. Each reports its start, end and interruption to the `Recorder`. `make_error` builds
the drawn user exceptions (the timeout look-alikes included) that the checkers compare
with what the worker reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import math
from collections.abc import AsyncGenerator, AsyncIterator, Generator, Iterator
from typing import Any, Protocol

import trio

import trio_worker

from .recorder import HandlerRun, Recorder
from .scenario import JobPlan, Scenario
from .threads import Lane, in_worker_thread


class UserTimeout(Exception):
    """A user exception whose name says timeout."""


def make_error(name: str, message: str) -> BaseException:
    if name == "RuntimeError":
        return RuntimeError(message)
    if name == "ValueError":
        return ValueError(message)
    if name in ("TimeoutError", "asyncio.TimeoutError", "socket.timeout"):
        # asyncio.TimeoutError (3.11) and socket.timeout (3.10) are aliases of TimeoutError.
        return TimeoutError(message)
    if name == "trio.TooSlowError":
        return trio.TooSlowError(message)
    if name == "OSError(ETIMEDOUT)":
        return OSError(errno.ETIMEDOUT, message)
    if name == "MemoryError":
        return MemoryError(message)
    if name == "SystemExit":
        return SystemExit(message)
    if name == "UserTimeout":
        return UserTimeout(message)
    raise AssertionError(f"unknown error {name}")


def error_type_of(name: str) -> str:
    """``type(exc).__name__`` of :func:`make_error`'s exception (what InitFailure records)."""
    return type(make_error(name, "")).__name__


NONJSON: list[object] = [{"a": {1, 2}}, b"bytes", float("nan")]


class Waits(Protocol):
    """How async user code waits and tells time, in its own library."""

    # The errors (keys of `make_error`) this library's own timeouts raise.
    TIMEOUTS: frozenset[str]

    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...

    async def time_out(self, seconds: float) -> None:
        """Wait until the library's own timeout fires after *seconds* (a user's
        ``fail_after``/``asyncio.timeout`` around a call that never answers); its error is
        then swallowed, and the caller raises the planned one."""

    async def sleep_forever(self) -> None: ...

    async def checkpoint(self) -> None: ...


class TrioWaits:
    """The trio backend: async user code is trio code."""

    TIMEOUTS = frozenset({"trio.TooSlowError"})

    def now(self) -> float:
        return trio.current_time()

    async def sleep(self, seconds: float) -> None:
        await trio.sleep(seconds)

    async def time_out(self, seconds: float) -> None:
        try:
            with trio.fail_after(seconds):
                await trio.sleep_forever()
        except trio.TooSlowError:
            return

    async def sleep_forever(self) -> None:
        await trio.sleep_forever()

    async def checkpoint(self) -> None:
        await trio.lowlevel.checkpoint()


class AsyncioWaits:
    """The asyncio backend: async user code is asyncio code, run as asyncio tasks on the
    host loop, whose time is the example's virtual clock (``HostLoopClock``). A stop, the
    shutdown grace or ``init_timeout`` reaches it as ``asyncio.CancelledError``."""

    TIMEOUTS = frozenset({"TimeoutError", "asyncio.TimeoutError"})

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def time_out(self, seconds: float) -> None:
        # asyncio.timeout cancels the task and turns its own cancellation into
        # TimeoutError: a stop landing at the same instant must still cancel the job.
        try:
            async with asyncio.timeout(seconds):
                await asyncio.get_running_loop().create_future()
        except TimeoutError:
            return

    async def sleep_forever(self) -> None:
        await asyncio.get_running_loop().create_future()

    async def checkpoint(self) -> None:
        await asyncio.sleep(0)


class UserCode:
    """The initializer and the handler of one scenario, recording what they do.

    Async code only sleeps, in its backend's library (`Waits`: ``trio.sleep``, or
    ``asyncio.sleep`` on the asyncio backend). Sync code (handlers, generators, the
    initializer) runs in the worker's threads on both backends and waits on the `Baton` in
    virtual time (``threads.py``); a cooperative one calls ``trio_worker.check_cancelled()``
    after each wait, one drawn ``ignores_cancel`` never does.
    """

    def __init__(self, scenario: Scenario, rec: Recorder) -> None:
        self.scenario = scenario
        self.rec = rec
        self.plans: dict[str, JobPlan] = {f"j{k}": plan for k, plan in enumerate(scenario.jobs)}
        self.lanes: dict[str, Lane] = {}
        self.waits: Waits = AsyncioWaits() if scenario.async_backend == "asyncio" else TrioWaits()

    async def initializer(self) -> None:
        plan = self.scenario.init
        rec = self.rec
        waits = self.waits
        rec.init_start = waits.now()
        try:
            if plan.outcome == "hang":
                await waits.sleep_forever()
            if plan.outcome == "raise" and plan.error in waits.TIMEOUTS:
                await waits.time_out(plan.duration)
            else:
                await waits.sleep(plan.duration)
        except BaseException:
            rec.init_interrupted = waits.now()
            if plan.cleanup and self._cleans_up():
                # Drawn for asyncio code only: its cancellation is delivered once, so its
                # cleanup may await (releasing a model), and the worker waits for it.
                await asyncio.sleep(plan.cleanup)
            raise
        self._init_outcome(waits.now())

    def sync_initializer(self) -> None:
        plan = self.scenario.init
        rec = self.rec
        assert rec.baton is not None
        lane = Lane(rec.baton, "init", cooperative=not plan.ignores_cancel)
        rec.init_start = lane.enter()
        try:
            try:
                lane.nap(math.inf if plan.outcome == "hang" else plan.duration)
            except BaseException:
                if not rec.baton.closed:
                    rec.init_interrupted = lane.now
                raise
            if not in_worker_thread() or not _hosted():
                # Abandoned by init_timeout or SIGTERM, and ran on: nobody hears of it.
                rec.init_abandoned_end = lane.now
                return
            self._init_outcome(lane.now)
        finally:
            lane.leave()

    def _init_outcome(self, at: float) -> None:
        plan = self.scenario.init
        if plan.outcome == "raise":
            self.rec.init_raised = self.rec.tick(at)
            raise make_error(plan.error, plan.message.render())
        self.rec.init_end = self.rec.tick(at)

    def _start(self, job_id: str, plan: JobPlan, at: float, *, thread: bool) -> HandlerRun:
        seq, now = self.rec.tick(at)
        on_asyncio = not thread and self.scenario.async_backend == "asyncio"
        run = HandlerRun(job_id, seq, now, now + plan.duration, thread=thread, task=on_asyncio)
        self.rec.handlers[job_id] = run
        return run

    def _end(self, run: HandlerRun, *, interrupted: bool, at: float) -> None:
        if self.rec.over or (self.rec.baton is not None and self.rec.baton.closed):
            # The run is over (RunOver in a thread; the host loop cancelling the tasks left
            # on it): the code was abandoned, it never ended.
            return
        run.end_seq, run.end_time = self.rec.tick(at)
        run.interrupted = interrupted

    def _cleans_up(self) -> bool:
        """Whether a cancelled plan awaits its drawn cleanup now: after a stop or
        init_timeout, and after a shutdown request only if the scenario says so."""
        return self.rec.sigterm is None or self.scenario.shutdown_cleanup

    async def _nap(self, seconds: float, plan: JobPlan) -> bool:
        """Wait *seconds* as the plan says; True when it swallowed a cancellation.

        On the asyncio backend a plan may await its cleanup once cancelled, or ignore the
        cancellation and run on to its end (the strategies draw neither for trio code:
        trio's cancellation is level-triggered, every later await would raise again).
        """
        waits = self.waits
        # A handler raising its library's own timeout error gets it from that timeout.
        wait = waits.time_out if plan.outcome == "raise" and plan.error in waits.TIMEOUTS else None
        if not (plan.ignores_cancel or plan.cleanup):
            await (wait or waits.sleep)(seconds)
            return False
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        swallowed = False
        while True:
            try:
                await (wait or asyncio.sleep)(max(0.0, end - loop.time()))
                return swallowed
            except asyncio.CancelledError:
                if plan.ignores_cancel:
                    swallowed = True
                    continue
                if self._cleans_up():
                    await asyncio.sleep(plan.cleanup)
                raise

    def _result(self, job_id: str, plan: JobPlan) -> Any:
        if plan.outcome == "raise":
            raise make_error(plan.error, plan.message.render())
        if plan.outcome == "nonjson":
            return {"k": job_id, "bad": NONJSON[len(job_id) % len(NONJSON)]}
        return {"k": job_id, "n": plan.duration}

    async def handler(self, job: dict[str, Any]) -> Any:
        plan = self.plans[job["id"]]
        if plan.streams:
            return self._stream(job["id"], plan)
        waits = self.waits
        run = self._start(job["id"], plan, waits.now(), thread=False)
        try:
            swallowed = await self._nap(plan.duration, plan)
        except BaseException:
            self._end(run, interrupted=True, at=waits.now())
            raise
        self._end(run, interrupted=swallowed, at=waits.now())
        return self._result(job["id"], plan)

    async def generator(self, job: dict[str, Any]) -> AsyncIterator[Any]:
        """The async generator function handler (``handler_kind`` ASYNC_GENERATOR)."""
        async with contextlib.aclosing(self._stream(job["id"], self.plans[job["id"]])) as chunks:
            async for chunk in chunks:
                yield chunk

    async def _stream(self, job_id: str, plan: JobPlan) -> AsyncGenerator[Any, None]:
        waits = self.waits
        run = self._start(job_id, plan, waits.now(), thread=False)
        for kind, value in script(job_id, plan):
            if kind == "sleep":
                try:
                    await self._nap(value, plan)
                except BaseException:
                    self._end(run, interrupted=True, at=waits.now())
                    raise
            elif kind == "end":
                self._end(run, interrupted=False, at=waits.now())
            elif kind == "raise":
                raise make_error(plan.error, plan.message.render())
            else:
                run.at_yield, run.yielded_at = True, waits.now()
                try:
                    yield value
                except GeneratorExit:
                    run.at_yield = False
                    if run.end_seq < 0:
                        self._end(run, interrupted=True, at=waits.now())
                    try:
                        # Cleanup that awaits (closing a connection): it must not be cut.
                        await waits.checkpoint()
                    except BaseException:
                        run.closed = "interrupted"
                        raise
                    run.closed = "worker"
                    raise
                run.at_yield = False

    def _lane(self, job_id: str, plan: JobPlan) -> Lane:
        assert self.rec.baton is not None
        if job_id not in self.lanes:
            self.lanes[job_id] = Lane(self.rec.baton, job_id, cooperative=not plan.ignores_cancel)
        return self.lanes[job_id]

    def sync_handler(self, job: dict[str, Any]) -> Any:
        """A sync handler (in a thread); for a streaming plan it returns a sync generator."""
        job_id = job["id"]
        plan = self.plans[job_id]
        lane = self._lane(job_id, plan)
        now = lane.enter()
        try:
            if plan.streams:
                return self._sync_stream(job_id, plan)
            run = self._start(job_id, plan, now, thread=True)
            try:
                lane.nap(plan.duration)
            except BaseException:
                self._end(run, interrupted=True, at=lane.now)
                raise
            self._end(run, interrupted=False, at=lane.now)
            return self._result(job_id, plan)
        finally:
            lane.leave()

    def sync_generator(self, job: dict[str, Any]) -> Iterator[Any]:
        """The sync generator function handler: each step runs in its own thread."""
        plan = self.plans[job["id"]]
        self._lane(job["id"], plan).enter()
        yield from self._sync_stream(job["id"], plan)

    def _sync_stream(self, job_id: str, plan: JobPlan) -> Generator[Any, None, None]:
        """The chunks of *plan*; entered in the thread of the step that first runs it."""
        lane = self._lane(job_id, plan)
        if lane._me is None:  # created by sync_handler: this is the first step's thread
            lane.enter()
        run = self._start(job_id, plan, lane.now, thread=True)
        try:
            for kind, value in script(job_id, plan):
                if kind == "sleep":
                    try:
                        lane.nap(value)
                    except BaseException:
                        self._end(run, interrupted=True, at=lane.now)
                        raise
                elif kind == "end":
                    self._end(run, interrupted=False, at=lane.now)
                elif kind == "raise":
                    raise make_error(plan.error, plan.message.render())
                else:
                    lane.leave()
                    run.at_yield, run.yielded_at = True, lane.now
                    try:
                        yield value
                    except GeneratorExit:
                        run.at_yield = False
                        self._sync_close(run, lane)
                        raise
                    run.at_yield = False
                    lane.enter()  # the next step runs in a new thread
        finally:
            lane.leave()

    def _sync_close(self, run: HandlerRun, lane: Lane) -> None:
        if not in_worker_thread():
            run.closed = "gc"  # on the trio thread, or after the run: the worker never closed it
            return
        lane.enter()
        if run.end_seq < 0:
            self._end(run, interrupted=True, at=lane.now)
        run.closed = "worker"


def _hosted() -> bool:
    """In a worker thread: its host task still waits for it (it was not abandoned)."""
    try:
        trio_worker.check_cancelled()
    except trio.Cancelled:
        return False
    return True


def script(job_id: str, plan: JobPlan) -> list[tuple[str, Any]]:
    """What a streaming handler does: sleep, yield chunks, end, then its outcome."""
    step = plan.duration / (plan.chunks + 1)
    steps: list[tuple[str, Any]] = []
    for i in range(plan.chunks):
        if not plan.burst or i == 0:
            steps.append(("sleep", plan.duration / 2 if plan.burst else step))
        steps.append(("yield", {"chunk": i, "k": job_id}))
    steps += [("sleep", plan.duration / 2 if plan.burst else step), ("end", None)]
    if plan.outcome == "stream_raise":
        steps.append(("raise", None))
    elif plan.outcome == "stream_nonjson":
        steps.append(("yield", {"chunk": {1, 2}}))
    elif plan.outcome == "stream_error_chunk":
        steps.append(("yield", {"error": "chunk error"}))
    return steps


class CycleConcurrency:
    """``concurrency=f(current)``: cycles through the drawn values, one per call."""

    def __init__(self, values: tuple[int, ...], rec: Recorder) -> None:
        self.values = values
        self.rec = rec

    def __call__(self, current: int) -> int:
        value = self.values[self.rec.concurrency_calls % len(self.values)]
        self.rec.concurrency_calls += 1
        return value
