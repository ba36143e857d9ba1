"""Run one drawn `Scenario` against the real worker in virtual time, then check invariants.

Theory of operation
-------------------
``run_scenario`` makes one ``trio.run`` under ``MockClock(autojump_threshold=0)`` (for the
drawn ``async_backend="asyncio"``: one asyncio loop hosting trio as its guest, both on one
virtual clock, ``HostLoopClock`` in ``tests/backends.py``): the fake platform (an ASGI
app) is served by the package's own h11 server over in-memory streams
(``trio_worker.testing._memory``), and the worker's own production HTTP client talks to it:
its keep-alive pool, response parsing, stale-connection retry, cancellation and error
mapping are what run under the properties. `RecordingBackend` wraps the client at its
request boundary to record each exchange and draw its network step (with ``data.draw``, as
the requests happen); `ChaosOpener` and `ChaosStream` apply the step below the client:
checkpoints and delays before a request leaves and after its answer arrives, a refused or
hanging connect (a kept-alive connection breaks first, so the client's own retry reaches
the failing connect). The real ``trio_worker.serve`` runs with async handlers and
initializers that only sleep (``trio.sleep``, or ``asyncio.sleep`` as asyncio tasks on the
asyncio backend), and sync ones that wait on the `Baton` (``threads.py``), so nothing
escapes the virtual clock and one example costs a few milliseconds of wall time.

Everything observable is appended to one `Recorder` under a global sequence number, so
"before" and "after" are exact even when many things happen at the same virtual instant:

* every job state transition (an observer passed to ``serve``), with the worker's held ids;
* every HTTP exchange as the worker sees it (route, what was held and the concurrency in
  force when it was sent, how it ended, what it delivered);
* initializer and handler starts and ends (and whether a cancellation interrupted them);
* what the driver did (enqueue, stop, fault, SIGTERM) and how ``serve`` ended;
* the worker's log lines (see `example_log`), shown with the trace of a failing example.

The checkers are pure functions of the finished `Run` (recorder plus the platform's own
records); each returns a list of violations, so one failing example reports everything it
broke. The mutation check (``scripts/mutation_check.py``) proves each can fail.

Terms used by the checkers:

* *delivered*: a take answered 2xx whose body reached the worker (the client returned it
  to the worker); the worker admits its jobs right there, with no checkpoint in between.
* *acknowledged*: a terminal job-done POST the platform answered 2xx. A POST answered with
  an injected fault and then retried is not a duplicate; a second acknowledged one is.
* *legitimate cut*: a take abandoned no earlier than its own deadline: ``take_poll_bound``
  after it was sent, ``claim_grace`` after an init failure, ``take_drain`` (capped by
  ``shutdown_grace``) after a shutdown request (docs/design.md I8).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import itertools
import json
import logging
import math
import os
import time
import traceback
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol
from urllib.parse import parse_qs, unquote, urlsplit

import trio
import trio.testing

import trio_worker
from trio_worker._capture import OutputCapture
from trio_worker._capture._redact import Redactor
from trio_worker._config import MAX_ANSWER_BYTES
from trio_worker._lifecycle import (
    PHASE_TRANSITIONS,
    TRANSITIONS,
    JobEvent,
    JobState,
    PhaseEvent,
    WorkerPhase,
)
from trio_worker._platform._http import PipeliningBackend
from trio_worker.testing import FakePlatform
from trio_worker.testing._http_server import AbortConnection, ClientDisconnected
from trio_worker.testing._memory import memory_network

from ..backends import HostLoopClock, run_on_asyncio_host
from .strategies import PLAIN, TIMEOUT_LOOKALIKES, JobPlan, NetStep, Scenario, net_steps
from .threads import Baton, Lane, in_worker_thread

if TYPE_CHECKING:
    from hypothesis.strategies import DataObject

    from trio_worker._lifecycle import HeldJob
    from trio_worker._platform._http import HttpBackend, HttpResponse, StreamOpener
    from trio_worker.testing import RecordedRequest

__all__ = ["CHECKS", "Run", "check_all", "describe", "drop_frames", "run_scenario"]

EPS = 1e-6
MAX_ERROR_BODY = 64 * 1024
# Requests whose network step is drawn; later ones go through plainly (keeps examples short).
NET_DRAWS = 32
# A run that has not ended this long (virtual) after its last action has hung.
HANG_LIMIT = 400.0
# Wall-clock guard against a busy loop inside one example: a hang guard, not a timing
# assertion. An example takes milliseconds; only a loop that never yields reaches this,
# however loaded the machine.
WALL_LIMIT = 300.0
# The driver shuts the worker down once idle, or at the latest this long after its last
# action when no SIGTERM was drawn.
SETTLE_LIMIT = 30.0


S = JobState
E = JobEvent
# Not started: a stop reaching the job now must end it STOPPED.
WAITING = (S.TAKEN, S.WAITING_FOR_INIT, S.WAITING_FOR_SLOT, S.RELEASING, S.MALFORMED)

# -- what is recorded --------------------------------------------------------------------


@dataclass
class Transition:
    seq: int
    time: float
    job_id: str
    before: JobState
    event: JobEvent
    after: JobState
    held: tuple[str, ...]  # the worker's held ids at the observer call (job still in it)
    concurrency: int


@dataclass
class Exchange:
    """One HTTP request as the worker made it, and how it ended for the worker."""

    index: int
    route: str
    job_id: str | None
    batch: int
    body: bytes
    seq: int
    time: float
    held: tuple[str, ...]
    concurrency: int
    ping_ids: tuple[str, ...] | None
    net: NetStep
    outcome: Literal["pending", "ok", "error", "cancelled"] = "pending"
    error: str = ""
    status: int | None = None
    answer: bytes = b""
    end_seq: int = -1
    end_time: float = math.nan
    delivered_ids: tuple[str, ...] = ()  # take: job ids in a 2xx answer; stop: jobsToStop

    def __repr__(self) -> str:
        how = self.outcome if self.status is None else f"{self.outcome} {self.status}"
        extra = f" job={self.job_id}" if self.job_id else ""
        if self.delivered_ids:
            extra += f" ids={list(self.delivered_ids)}"
        return (
            f"<#{self.index} {self.route}{extra} sent@{self.time:g} "
            f"ended@{self.end_time:g} {how}{' ' + self.error if self.error else ''} {self.net!r}>"
        )


@dataclass
class HandlerRun:
    job_id: str
    start_seq: int
    start_time: float
    planned_end: float
    end_seq: int = -1  # -1: its code never finished within the run (abandoned, or running)
    end_time: float = math.nan
    interrupted: bool = False
    thread: bool = False  # sync code, run in the worker's threads
    task: bool = False  # async code on the asyncio backend, run as an asyncio task
    at_yield: bool = False  # a generator suspended at a yield (the worker holds its chunk)
    yielded_at: float = math.nan  # when it last yielded
    # Who closed a generator left at a yield: "worker" (its cleanup ran to the end),
    # "interrupted" (the cleanup was cancelled), "gc" (left for the garbage collector).
    closed: str = ""


@dataclass
class StopDelivery:
    """A stop that reached the worker (a job-stop answer, or ``WorkerHandle.stop_job``)."""

    seq: int
    time: float
    job_id: str
    state: JobState | None  # the job's state then; None when it was not held


@dataclass
class PhaseChange:
    seq: int
    time: float
    before: WorkerPhase
    event: PhaseEvent
    after: WorkerPhase


@dataclass
class Recorder:
    scenario: Scenario
    data: DataObject | None
    seq: itertools.count[int] = field(default_factory=itertools.count)
    handle: trio_worker.WorkerHandle | None = None
    transitions: list[Transition] = field(default_factory=list)
    exchanges: list[Exchange] = field(default_factory=list)
    handlers: dict[str, HandlerRun] = field(default_factory=dict)
    stops: list[StopDelivery] = field(default_factory=list)
    states: dict[str, JobState] = field(default_factory=dict)  # as the observer saw them
    init_start: float | None = None
    init_end: tuple[int, float] | None = None  # success only
    init_raised: tuple[int, float] | None = None
    init_interrupted: float | None = None
    init_abandoned_end: float | None = None  # a sync initializer that ran on, abandoned
    baton: Baton | None = None  # drives the threads of sync user code (threads.py)
    over: bool = False  # the trio run has ended: user code still running then never ends
    sigterm: tuple[int, float] | None = None
    serve_outcome: BaseException | str = "running"
    serve_end: float = math.nan
    hung: bool = False
    app_errors: list[tuple[float, str, BaseException]] = field(default_factory=list)
    net_draws: int = 0
    draw_error: BaseException | None = None
    wall_start: float = field(default_factory=time.monotonic)
    concurrency_calls: int = 0
    connections: list[ChaosStream] = field(default_factory=list)  # the client's, as opened
    log: list[str] = field(default_factory=list)  # the worker's log lines, see example_log
    phases: list[PhaseChange] = field(default_factory=list)

    def tick(self, at: float | None = None) -> tuple[int, float]:
        """A sequence number and the virtual time (*at*: given by a thread in lock-step)."""
        return next(self.seq), trio.current_time() if at is None else at

    @property
    def held(self) -> tuple[str, ...]:
        return self.handle.held_ids if self.handle is not None else ()

    @property
    def concurrency(self) -> int:
        return self.handle.concurrency if self.handle is not None else 0

    # -- observer ----------------------------------------------------------------------

    def observe(self, job: HeldJob, before: JobState, event: JobEvent) -> None:
        seq, now = self.tick()
        self.states[job.id] = job.state
        self.transitions.append(
            Transition(seq, now, job.id, before, event, job.state, self.held, self.concurrency)
        )

    def __call__(self, job: HeldJob, before: JobState, event: JobEvent) -> None:
        self.observe(job, before, event)

    def phase_changed(self, before: WorkerPhase, event: PhaseEvent, after: WorkerPhase) -> None:
        """Called by the worker on every phase change (an observer with this method)."""
        seq, now = self.tick()
        self.phases.append(PhaseChange(seq, now, before, event, after))
        if event is PhaseEvent.DRAIN and self.sigterm is None:
            # Not a SIGTERM: a handler's SystemExit, which shuts the worker down the same
            # way from this moment (docs/design.md §9).
            self.sigterm = (seq, now)

    def state_of(self, job_id: str) -> JobState | None:
        """The state of a held job right now (TAKEN if admitted but not yet moved)."""
        if job_id not in self.held:
            return None
        return self.states.get(job_id, S.TAKEN)

    # -- network -----------------------------------------------------------------------

    def next_step(self, route: str, index: int) -> NetStep:
        """The network step of request *index*, drawn now (the interleaving depends on
        what the run did so far).

        A draw may raise Hypothesis's own control flow (``StopTest`` when the example's
        data runs out, then ``Frozen``), BaseExceptions the worker must never see: the first
        is kept, the rest of the run goes through plainly, and ``run_scenario`` re-raises it.
        """
        if not self.scenario.network or self.data is None or self.net_draws >= NET_DRAWS:
            return PLAIN
        if self.draw_error is not None:
            return PLAIN
        self.net_draws += 1
        try:
            return self.data.draw(net_steps(), label=f"net #{index} {route}")
        except BaseException as exc:
            self.draw_error = exc
            return PLAIN


# -- the network under the real client ------------------------------------------------------

_ROUTES = {
    "job-take": "take",
    "job-take-batch": "take_batch",
    "job-stop": "stop",
    "job-done": "done",
    "job-stream": "stream",
    "ping": "ping",
}


def route_of(url: str) -> tuple[str, str | None]:
    parts = urlsplit(url).path.strip("/").split("/")
    route = _ROUTES.get(parts[2], "other") if len(parts) > 2 else "other"
    job_id = unquote(parts[4]) if route in ("done", "stream") and len(parts) > 4 else None
    return route, job_id


def ids_in_take(body: bytes) -> tuple[str, ...]:
    try:
        data = json.loads(body) if body else None
    except ValueError:
        return ()
    items = data if isinstance(data, list) else [data]
    return tuple(i["id"] for i in items if isinstance(i, dict) and isinstance(i.get("id"), str))


def ids_in_stop(body: bytes) -> tuple[str, ...]:
    try:
        data = json.loads(body) if body else None
    except ValueError:
        return ()
    if not isinstance(data, dict) or not isinstance(data.get("jobsToStop"), list):
        return ()
    return tuple(i for i in data["jobsToStop"] if isinstance(i, str))


def only_cancelled(exc: BaseException) -> bool:
    """True for trio.Cancelled, or a group of nothing but (the platform's hold nursery)."""
    if isinstance(exc, BaseExceptionGroup):
        _, rest = exc.split(trio.Cancelled)
        return rest is None
    return isinstance(exc, trio.Cancelled)


@dataclass
class Chaos:
    """What the network does to the request in flight (its drawn `NetStep`), applied by
    `ChaosOpener` and `ChaosStream` below the real client: the checkpoints and delay
    before the request leaves, once, at its connect or its first write; the connect
    failure; the checkpoints and delay after its answer, once, at its first read."""

    step: NetStep
    pre_done: bool = False
    post_done: bool = False

    async def before_send(self) -> None:
        if self.pre_done:
            return
        self.pre_done = True
        for _ in range(self.step.pre_checkpoints):
            await trio.lowlevel.checkpoint()
        if self.step.pre_delay:
            await trio.sleep(self.step.pre_delay)

    async def after_answer(self) -> None:
        if self.post_done:
            return
        self.post_done = True
        for _ in range(self.step.post_checkpoints):
            await trio.lowlevel.checkpoint()
        if self.step.post_delay:
            await trio.sleep(self.step.post_delay)


# Set by `RecordingBackend` for the duration of one request, in the requesting task: the
# client's connects, writes and reads for that request all happen in that task.
_CHAOS: ContextVar[Chaos | None] = ContextVar("chaos", default=None)


class ChaosStream(trio.abc.Stream):
    """One client connection of the in-memory network, under the request's `Chaos`."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self._inner = inner
        self.closed = False

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        chaos = _CHAOS.get()
        if chaos is not None:
            await chaos.before_send()
            if chaos.step.pre_error:
                # The kept-alive connection broke while idle: the real client retries on
                # a fresh connection, whose connect then fails as drawn.
                raise trio.BrokenResourceError("injected: connection broken")
        await self._inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        data = await self._inner.receive_some(max_bytes)
        chaos = _CHAOS.get()
        if chaos is not None and data:
            await chaos.after_answer()
        return data

    async def aclose(self) -> None:
        self.closed = True
        await self._inner.aclose()


class ChaosOpener:
    """The in-memory network's connect, failing or hanging as the request's step says."""

    def __init__(self, inner: StreamOpener, rec: Recorder) -> None:
        self._inner = inner
        self._rec = rec

    async def __call__(self, host: str, port: int, tls: bool) -> trio.abc.Stream:
        chaos = _CHAOS.get()
        if chaos is not None:
            await chaos.before_send()
            if chaos.step.pre_error == "connect":
                raise ConnectionRefusedError(errno.ECONNREFUSED, "injected: connection refused")
            if chaos.step.pre_error == "connect_timeout":
                await trio.sleep_forever()  # the client's connect_timeout ends it
        stream = ChaosStream(await self._inner(host, port, tls))
        self._rec.connections.append(stream)
        return stream


class RecordingBackend:
    """Wraps each of the worker's real HTTP clients: records every request as the worker
    made it and how it ended for the worker, and draws its network step. The step itself
    is applied below the client (`ChaosOpener`, `ChaosStream`), so the real client's
    keep-alive, stale-connection retry, cancellation and error mapping all run under it.
    Never loses an answer the platform gave (except when the worker's own deadline cuts
    the delay after it)."""

    def __init__(self, inner: HttpBackend, rec: Recorder) -> None:
        self._inner = inner
        self._rec = rec

    async def request(
        self, method: str, url: str, body: bytes = b"", *, max_body: int = MAX_ANSWER_BYTES
    ) -> HttpResponse:
        rec = self._rec
        if time.monotonic() - rec.wall_start > WALL_LIMIT:
            raise RuntimeError(f"example exceeded {WALL_LIMIT}s of wall time (busy loop?)")
        route, job_id = route_of(url)
        query = parse_qs(urlsplit(url).query)
        batch = int(query.get("batch_size", ["1"])[0]) if route in ("take", "take_batch") else 0
        ping_ids = None
        if route == "ping":
            raw = query.get("job_id", [""])[0]
            ping_ids = tuple(i for i in raw.split(",") if i)
        seq, now = rec.tick()
        index = len(rec.exchanges)
        sent = body if route in ("done", "stream") else b""
        ex = Exchange(
            index, route, job_id, batch, sent, seq, now, rec.held, rec.concurrency, ping_ids, PLAIN
        )
        rec.exchanges.append(ex)
        ex.net = step = rec.next_step(route, index)
        token = _CHAOS.set(Chaos(step))
        try:
            response = await self._inner.request(method, url, body, max_body=max_body)
        except BaseException as exc:
            ex.end_seq, ex.end_time = rec.tick()
            ex.outcome = "cancelled" if only_cancelled(exc) else "error"
            ex.error = type(exc).__name__
            raise
        finally:
            _CHAOS.reset(token)
        ex.end_seq, ex.end_time = rec.tick()
        ex.outcome, ex.status, ex.answer = "ok", response.status, response.body
        if 200 <= response.status < 300:
            if route in ("take", "take_batch"):
                ex.delivered_ids = ids_in_take(response.body)
            elif route == "stop":
                ex.delivered_ids = ids_in_stop(response.body)
                for stop_id in ex.delivered_ids:
                    rec.stops.append(
                        StopDelivery(ex.end_seq, ex.end_time, stop_id, rec.state_of(stop_id))
                    )
        return response

    async def pipeline(
        self,
        method: str,
        requests: list[tuple[str, bytes]],
        answers: list[HttpResponse],
        *,
        max_body: int = MAX_ANSWER_BYTES,
    ) -> None:
        """Stream chunks written at once (of one job or several): one exchange per chunk,
        one network step for the batch (one write, its answers read back together)."""
        inner = self._inner
        assert isinstance(inner, PipeliningBackend)
        rec = self._rec
        seq, now = rec.tick()
        first = len(rec.exchanges)
        step = rec.next_step(route_of(requests[0][0])[0], first)
        batch = [
            Exchange(
                first + n, *route_of(url), 0, body, seq, now, rec.held, rec.concurrency, None, step
            )
            for n, (url, body) in enumerate(requests)
        ]
        rec.exchanges += batch
        token = _CHAOS.set(Chaos(step))
        failure: BaseException | None = None
        try:
            await inner.pipeline(method, requests, answers, max_body=max_body)
        except BaseException as exc:
            failure = exc
            raise
        finally:
            _CHAOS.reset(token)
            end_seq, end_time = rec.tick()
            for ex in batch:
                ex.end_seq, ex.end_time = end_seq, end_time
            for ex, answer in zip(batch, answers, strict=False):
                ex.outcome, ex.status, ex.answer = "ok", answer.status, answer.body
            if failure is not None:  # then some went unanswered
                for ex in batch[len(answers) :]:
                    ex.outcome = "cancelled" if only_cancelled(failure) else "error"
                    ex.error = type(failure).__name__

    async def aclose(self) -> None:
        await self._inner.aclose()


class CrashRecordingApp:
    """The fake platform, recording any exception escaping it (the platform must never
    crash); the server then answers 500, as any ASGI server would."""

    def __init__(self, app: FakePlatform, rec: Recorder) -> None:
        self._app = app
        self._rec = rec

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await self._app(scope, receive, send)
        except Exception as exc:
            # An injected drop (ConnectionDropped), or send() telling the app the worker hung
            # up (the ASGI way): the server handles both, neither is a crash.
            if isinstance(exc, (AbortConnection, ClientDisconnected)):
                raise
            self._rec.app_errors.append((trio.current_time(), str(scope.get("path")), exc))
            raise


def text_capture(text: str, redactor: Redactor) -> OutputCapture:
    """A real OutputCapture that redirects no fd, holding *text* as the captured output.

    Its reader thread has no pipe to read and ends at once; ``stop()`` then returns at once.
    """
    capture = OutputCapture([], redactor, 1 << 20)
    capture._append(text.encode("utf-8", errors="surrogatepass"))
    capture._thread.start()
    return capture


# -- user code ------------------------------------------------------------------------------


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
        lane = Lane(rec.baton, "init", cooperative=not plan.ignores_cancel, kind="direct")
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
            self.lanes[job_id] = Lane(
                self.rec.baton, job_id, cooperative=not plan.ignores_cancel, kind="handler"
            )
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
        lane.enter("direct")
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


# -- the run ----------------------------------------------------------------------------


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
        if job.status == "IN_PROGRESS" and not rec.states.get(job.id, S.TAKEN).terminal:
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


class _LineHandler(logging.Handler):
    """Formats each record as it is emitted and keeps only the text."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__()
        self.lines = lines
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(self.format(record))
        except Exception:
            self.handleError(record)


@contextlib.contextmanager
def example_log(lines: list[str]) -> Iterator[None]:
    """Keep the ``trio_worker`` log of one example to that example, as text in *lines*.

    Without this the records propagate to pytest's log capture, which keeps every record of
    a test's call phase (the ``caplog`` list and the report section), and a Hypothesis test
    is one call phase for all of its examples. The worker logs the exception it handled as
    an argument (``"ping failed: %s: %s"``), and that exception's traceback holds the frames
    of the finished run: its supervisor, client, transport, this `Recorder` and the fake
    platform's records. Under the soak profile a third of the examples stayed alive that way,
    about 400 MB a minute.
    """
    logger = logging.getLogger("trio_worker")
    handler = _LineHandler(lines)
    propagate = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


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


# -- derived views ----------------------------------------------------------------------


@dataclass
class JobView:
    id: str
    plan: JobPlan | None
    transitions: list[Transition] = field(default_factory=list)
    delivered: list[Exchange] = field(default_factory=list)  # takes that brought it
    reports: list[Exchange] = field(default_factory=list)  # terminal job-done POSTs
    acked: list[RecordedRequest] = field(default_factory=list)  # ... answered 2xx

    @property
    def final(self) -> JobState | None:
        return self.transitions[-1].after if self.transitions else None

    def time_of(self, state: JobState) -> float | None:
        for t in self.transitions:
            if t.after is state:
                return t.time
        return None

    def events(self) -> list[JobEvent]:
        return [t.event for t in self.transitions]


def views(run: Run) -> dict[str, JobView]:
    rec = run.rec
    plans = {f"j{k}": p for k, p in enumerate(run.scenario.jobs)}
    jobs: dict[str, JobView] = {job_id: JobView(job_id, plan) for job_id, plan in plans.items()}

    def view(job_id: str) -> JobView:
        return jobs.setdefault(job_id, JobView(job_id, None))

    for t in rec.transitions:
        view(t.job_id).transitions.append(t)
    for ex in rec.exchanges:
        if ex.route in ("take", "take_batch"):
            for job_id in ex.delivered_ids:
                view(job_id).delivered.append(ex)
        elif ex.route == "done" and ex.job_id is not None:
            view(ex.job_id).reports.append(ex)
    for req in run.platform.requests:
        if req.route == "done" and req.status is not None and 200 <= req.status < 300:
            body = _json(req.body)
            if not (isinstance(body, dict) and body.get("status") == "IN_PROGRESS"):
                view(req.path.rstrip("/").split("/")[-1]).acked.append(req)
    return jobs


def _json(raw: bytes | str) -> object:
    try:
        return json.loads(raw)
    except ValueError:
        return None


@dataclass(frozen=True)
class Report:
    """What one terminal job-done body says."""

    kind: Literal["output", "json_error", "init_failed", "plain_error", "garbled"]
    error_type: str = ""
    category: str = ""
    inner: dict[str, Any] | None = None

    def __repr__(self) -> str:
        message = str((self.inner or {}).get("error_message", ""))[:80]
        return f"Report({self.kind} {self.error_type} category={self.category} {message!r})"


def parse_report(raw: bytes) -> Report:
    body = _json(raw)
    if not isinstance(body, dict):
        return Report("garbled")
    if "error" not in body:
        return Report("output")
    error = body["error"]
    inner = _json(error) if isinstance(error, str) else None
    if not isinstance(inner, dict):
        return Report("plain_error")
    kind: Literal["init_failed", "json_error"] = (
        "init_failed" if inner.get("event") == "init_failed" else "json_error"
    )
    return Report(kind, str(inner.get("error_type")), str(inner.get("error_category")), inner)


@dataclass(frozen=True)
class InitExpectation:
    """When (if ever) the initializer fails, by the drawn plan; ``either`` on ties."""

    fails_at: float | None  # None: never fails
    timeout: bool
    either: bool  # a tie: success/other outcome is also allowed
    # A tie on the asyncio backend between init_timeout and an initializer with a cleanup:
    # if the initializer had returned already, nothing is left to wait for.
    or_at: float | None = None


# How long the worker waits for a cancelled asyncio initializer (await_on_asyncio's
# cancel_bound in trio_worker/_asyncio_host.py) before giving up on it.
ASYNCIO_INIT_CANCEL_BOUND = 5.0


def expected_init(run: Run) -> InitExpectation:
    plan = run.scenario.init
    sigterm = run.rec.sigterm[1] if run.rec.sigterm is not None else None
    if plan.outcome == "none":
        return InitExpectation(None, False, False)
    limit = plan.timeout
    end = math.inf if plan.outcome == "hang" else plan.duration
    # An asyncio initializer cut by init_timeout: the failure comes once its cleanup is over.
    cleanup = min(plan.cleanup, ASYNCIO_INIT_CANCEL_BOUND)
    or_at = None
    if limit is not None and limit == 0:
        fails_at, timeout, tie = 0.0, True, False  # cut before it is even called
    elif limit is not None and limit < end:
        fails_at, timeout, tie = limit + cleanup, True, False
    elif limit is not None and limit == end:
        fails_at, timeout, tie = limit + cleanup, True, True
        or_at = limit if cleanup else None
    elif plan.outcome == "raise":
        fails_at, timeout, tie = end, False, False
    else:
        return InitExpectation(None, False, False)
    if sigterm is not None and sigterm <= fails_at:
        # SIGTERM cancels the initializer: not a failure (a tie may go either way).
        tied = sigterm == fails_at or (or_at is not None and sigterm >= or_at)
        return InitExpectation(None, False, tied)
    return InitExpectation(fails_at, timeout, tie, or_at)


def failure_of(run: Run) -> Any:
    outcome = run.rec.serve_outcome
    if isinstance(outcome, trio_worker.InitializationError):
        return outcome.failure
    return None


def held_model(run: Run) -> Callable[[int], set[str]]:
    """held(seq): the ids delivered by takes before *seq*, minus those terminal before it."""
    events: list[tuple[int, str, bool]] = []
    for ex in run.rec.exchanges:
        if ex.route in ("take", "take_batch") and ex.outcome == "ok":
            events += [(ex.end_seq, job_id, True) for job_id in ex.delivered_ids]
    for t in run.rec.transitions:
        if t.after.terminal:
            events.append((t.seq, t.job_id, False))
    events.sort()

    def held(seq: int) -> set[str]:
        ids: set[str] = set()
        for at, job_id, add in events:
            if at >= seq:
                break
            if add:
                ids.add(job_id)
            else:
                ids.discard(job_id)
        return ids

    return held


def cut_limit(run: Run, ex: Exchange) -> float:
    """The earliest time a take sent as *ex* may legitimately be abandoned (docs/design.md I8)."""
    timings = run.scenario.timings
    limit = ex.time + timings.take_poll_bound
    failure = failure_of(run)
    if failure is not None and failure.failed_at <= ex.end_time + EPS:
        limit = min(limit, failure.failed_at + timings.claim_grace)
    if run.rec.sigterm is not None and run.rec.sigterm[0] < ex.end_seq:
        drain = min(timings.take_drain, timings.shutdown_grace)
        limit = min(limit, run.rec.sigterm[1] + drain)
    return limit


# -- the checkers -----------------------------------------------------------------------


def check_run_ended(run: Run) -> list[str]:
    """serve() ends: returns after shutdown, raises InitializationError, or raises
    SystemExit iff a handler's SystemExit was reported (docs/design.md §9); never hangs,
    never raises anything else (WorkerInternalError: an illegal transition, a crash)."""
    rec = run.rec
    out = []
    if rec.hung:
        out.append(f"serve() did not return: hung until {HANG_LIMIT}s after the last action")
    exit_reported = any(ex.route == "done" and EXIT_REPORTED in ex.body for ex in rec.exchanges)
    if isinstance(rec.serve_outcome, SystemExit) != exit_reported:
        out.append(f"serve() ended with {rec.serve_outcome!r}, exit reported: {exit_reported}")
    elif not (
        rec.serve_outcome == "returned"
        or failure_of(run) is not None
        or isinstance(rec.serve_outcome, SystemExit)
    ):
        out.append(f"serve() ended with {rec.serve_outcome!r}")
    if rec.handle is not None and rec.handle.held_ids:
        out.append(f"serve() ended still holding {rec.handle.held_ids}")
    return out


# What every report of a handler's SystemExit says (inside the escaped error text too).
EXIT_REPORTED = b"handler called sys.exit("


def check_platform(run: Run) -> list[str]:
    """The fake platform itself never crashed while serving the worker."""
    return [
        f"platform crashed at t={at:g} on {path}: {exc!r}" for at, path, exc in run.rec.app_errors
    ]


def check_transitions(run: Run) -> list[str]:
    """Every job's history replays against TRANSITIONS, from TAKEN, and ends terminal."""
    out = []
    for job in views(run).values():
        state = S.TAKEN
        for t in job.transitions:
            if t.before is not state:
                out.append(f"{job.id}: observer said before={t.before}, replay says {state}")
            expected = TRANSITIONS.get((t.before, t.event))
            if expected is None or expected is not t.after:
                out.append(f"{job.id}: illegal {t.before} --{t.event}--> {t.after}")
            state = t.after
        if job.delivered and not state.terminal:
            out.append(f"{job.id}: stuck in {state} (taken, never settled)")
    return out


def check_exactly_once(run: Run) -> list[str]:
    """I1: one acknowledged terminal report per taken job, none for stopped or released
    jobs, none for jobs the worker never took.

    An attempt the worker cut by its own timeout (``report_attempt_timeout``) is an answer
    lost in transit, like a dropped one: the platform may have acknowledged it while the
    worker went on to retry, so each such attempt may account for one extra acknowledgement
    on the platform's side (the platform keeps the first report, docs/protocol.md §2.3)."""
    out = []
    for job in views(run).values():
        seen = [ex for ex in job.reports if ex.outcome == "ok" and ex.status in range(200, 300)]
        cut = len([ex for ex in job.reports if ex.outcome == "cancelled"])
        final = job.final
        if final is S.DONE:
            if not 1 <= len(job.acked) <= 1 + cut or len(seen) != 1:
                out.append(
                    f"I1 {job.id}: DONE with {len(job.acked)} acknowledged reports "
                    f"({len(seen)} seen by the worker): {job.reports}"
                )
        elif final is S.UNDELIVERED:
            if seen or len(job.acked) > max(cut, 1):
                out.append(
                    f"I1 {job.id}: UNDELIVERED but {len(seen)} acknowledgements seen, "
                    f"{len(job.acked)} given: {job.reports}"
                )
        elif final in (S.STOPPED, S.RELEASED) or final is None:
            if job.reports or job.acked:
                out.append(f"I1 {job.id}: {final} yet reported: {job.reports}")
        if len(job.acked) > max(1, cut + (final is S.DONE)):
            out.append(f"I1 {job.id}: {len(job.acked)} acknowledged terminal reports")
    unknown = run.platform.statistics().unknown_job_reports
    if unknown:
        out.append(f"I1: {unknown} reports for jobs the platform does not know")
    return out


def check_gate(run: Run) -> list[str]:
    """I2: no handler starts before the initializer returned successfully, none after an
    init failure (or while it hangs)."""
    rec = run.rec
    if run.scenario.init.outcome == "none":
        return []
    out = []
    for job_id, handler in rec.handlers.items():
        if rec.init_end is None:
            out.append(
                f"I2 {job_id}: handler started at {handler.start_time:g}, init never succeeded"
            )
        elif handler.start_seq < rec.init_end[0]:
            out.append(
                f"I2 {job_id}: handler started at {handler.start_time:g}, before init "
                f"returned at {rec.init_end[1]:g}"
            )
    return out


def check_init_failure(run: Run) -> list[str]:
    """I3: on init failure every held job (running intake included) is failed with it, and
    serve() raises InitializationError within report_deadline + claim_grace."""
    rec = run.rec
    expect = expected_init(run)
    failure = failure_of(run)
    timings = run.scenario.timings
    out = []
    if failure is None:
        if expect.fails_at is not None and not expect.either:
            out.append(f"I3: init should fail at {expect.fails_at:g}; serve: {rec.serve_outcome!r}")
        for job in views(run).values():
            for ex in job.reports:
                if parse_report(ex.body).kind == "init_failed":
                    out.append(f"I3 {job.id}: init_failed reported with no init failure")
        return out
    if expect.fails_at is None and not expect.either:
        out.append(f"I3: init failed ({failure.error_type}) but the plan says it cannot")
    elif expect.fails_at is not None and all(
        abs(failure.failed_at - at) > EPS
        for at in (expect.fails_at, expect.or_at)
        if at is not None
    ):
        out.append(f"I3: init failed at {failure.failed_at:g}, expected {expect.fails_at:g}")
    bound = failure.failed_at + timings.report_deadline + timings.claim_grace
    if rec.serve_end > bound + EPS:
        out.append(
            f"I3: serve() raised at {rec.serve_end:g}, after failure at {failure.failed_at:g} "
            f"+ report_deadline + claim_grace = {bound:g}"
        )
    stopped = {s.job_id for s in rec.stops}
    for job in views(run).values():
        if not job.delivered or (job.plan is not None and job.plan.outcome == "malformed"):
            continue
        fails = [t for t in job.transitions if t.event is E.FAIL]
        held_then = job.delivered[0].end_time <= failure.failed_at + EPS
        if fails and held_then and fails[0].time > failure.failed_at + 1.0 + EPS:
            out.append(f"§6.4 {job.id}: held at the failure, failed only at {fails[0].time:g}")
        final = job.final
        if final is S.STOPPED and job.id in stopped:
            continue
        if E.FAIL not in job.events():
            out.append(f"I3 {job.id}: held at init failure but not failed: {job.events()}")
        for ex in job.reports:
            if parse_report(ex.body).kind != "init_failed":
                out.append(f"I3 {job.id}: reported {parse_report(ex.body)} instead of init_failed")
        if final not in (S.DONE, S.UNDELIVERED):
            out.append(f"I3 {job.id}: ended {final} after the init failure")
    return out


def check_claim(run: Run) -> list[str]:
    """§6.2: after an init failure no new take starts, except one claim take when no job was
    ever delivered, bounded by claim_grace (its cut is checked by I8)."""
    failure = failure_of(run)
    if failure is None:
        return []
    takes = [ex for ex in run.rec.exchanges if ex.route in ("take", "take_batch")]
    after = [ex for ex in takes if ex.time > failure.failed_at + EPS]
    delivered_before = any(ex.delivered_ids and ex.end_time <= failure.failed_at for ex in takes)
    out = []
    if len(after) > 1:
        out.append(f"§6.2: {len(after)} takes started after the init failure: {after}")
    if after and delivered_before:
        out.append(f"§6.2: a claim take although jobs had been held: {after}")
    for ex in after:
        if ex.batch != 1:
            out.append(f"§6.2: the claim take asked for {ex.batch} jobs")
    return out


def check_timeouts(run: Run) -> list[str]:
    """I4: only the SDK's own deadline yields InitTimeout / category "timeout"; a user
    TimeoutError, TooSlowError, asyncio/socket timeout keeps its own type."""
    out = []
    expect = expected_init(run)
    failure = failure_of(run)
    plan = run.scenario.init
    if failure is not None:
        sdk = failure.error_type == "InitTimeout"
        if sdk != (failure.category == "timeout"):
            out.append(f"I4: error_type {failure.error_type} with category {failure.category}")
        if not expect.either and sdk != expect.timeout:
            out.append(f"I4: expected timeout={expect.timeout}, got {failure.error_type}")
        if not sdk and failure.error_type != error_type_of(plan.error):
            out.append(f"I4: user {plan.error} recorded as {failure.error_type}")
        if not sdk and plan.error in TIMEOUT_LOOKALIKES and failure.category == "timeout":
            out.append(f"I4: user {plan.error} categorised as the SDK timeout")
        for job in views(run).values():
            for ex in job.reports:
                report = parse_report(ex.body)
                if report.kind == "init_failed" and (
                    report.error_type != failure.error_type or report.category != failure.category
                ):
                    out.append(f"I4 {job.id}: init_failed body says {report}, serve says {failure}")
    for job in views(run).values():
        for ex in job.reports:
            report = parse_report(ex.body)
            if report.kind == "json_error" and report.category == "timeout":
                out.append(f"I4 {job.id}: a job error categorised as the SDK timeout: {report}")
    return out


def check_shielded_reports(run: Run) -> list[str]:
    """I5: every job that reached REPORTING ends DONE or UNDELIVERED within its delivery
    budget (report_budget; cut when the worker stops, but never below report_deadline), and
    UNDELIVERED only when no attempt was acknowledged in a window of at least
    min(report_budget, report_deadline)."""
    timings = run.scenario.timings
    floor = min(timings.report_budget, timings.report_deadline)
    out = []
    for job in views(run).values():
        start = job.time_of(S.REPORTING)
        if start is None:
            continue
        final = job.final
        if final not in (S.DONE, S.UNDELIVERED):
            out.append(f"I5 {job.id}: reached REPORTING at {start:g} and ended {final}")
            continue
        end = job.transitions[-1].time
        if end - start > timings.report_budget + EPS:
            out.append(f"I5 {job.id}: report took {end - start:g}s > {timings.report_budget:g}")
        if final is S.UNDELIVERED:
            ok = [ex for ex in job.reports if ex.outcome == "ok" and ex.status in range(200, 300)]
            if ok or end - start < floor - EPS:
                out.append(
                    f"I5 {job.id}: UNDELIVERED after {end - start:g}s (window at least "
                    f"{floor:g}s), platform not faulted throughout: {job.reports}"
                )
    return out


def check_bounded_bodies(run: Run) -> list[str]:
    """I6: every job-done body is at most 64 KiB and is JSON with a string error, if any."""
    out = []
    for ex in run.rec.exchanges:
        if ex.route not in ("done", "stream"):
            continue
        if len(ex.body) > MAX_ERROR_BODY:
            out.append(f"I6 {ex.job_id}: {ex.route} body of {len(ex.body)} bytes > 64 KiB")
        body = _json(ex.body)
        if not isinstance(body, dict):
            out.append(f"I6 {ex.job_id}: {ex.route} body is not a JSON object: {ex.body[:200]!r}")
        elif "error" in body and not isinstance(body["error"], str):
            out.append(f"I6 {ex.job_id}: error is not a string: {body['error']!r:.200}")
    return out


def check_capacity(run: Run) -> list[str]:
    """I7: held + requested batch <= concurrency at every take; held <= the concurrency in
    force (that of the latest take) at every transition."""
    out = []
    events: list[tuple[int, int, str]] = []
    for ex in run.rec.exchanges:
        if ex.route in ("take", "take_batch"):
            if ex.batch < 1 or len(ex.held) + ex.batch > ex.concurrency:
                out.append(
                    f"I7: take of {ex.batch} sent at {ex.time:g} holding {len(ex.held)} "
                    f"with concurrency {ex.concurrency}"
                )
            events.append((ex.seq, ex.concurrency, "take"))
    for t in run.rec.transitions:
        events.append((t.seq, len(t.held), t.job_id))
    events.sort()
    limit = 0
    for _, value, what in events:
        if what == "take":
            limit = value
        elif value > limit:
            out.append(f"I7: {value} jobs held (at a transition of {what}), concurrency {limit}")
    return out


def check_in_transit(run: Run) -> list[str]:
    """I8: a take in flight is abandoned only by its own deadline; every job a delivered
    take carried reaches a terminal state; every job the platform handed out was
    delivered, or went out in a take the platform faulted or the worker legitimately cut."""
    out = []
    rec = run.rec
    cuts: list[Exchange] = []
    faulted: list[RecordedRequest] = []
    for ex in rec.exchanges:
        if ex.route not in ("take", "take_batch"):
            continue
        if ex.outcome == "cancelled":
            limit = cut_limit(run, ex)
            if ex.end_time < limit - EPS:
                out.append(
                    f"I8: take #{ex.index} sent at {ex.time:g} abandoned at {ex.end_time:g}, "
                    f"before its deadline {limit:g}"
                )
            cuts.append(ex)
    # Takes the platform answered only after the worker had legitimately cut them (an
    # injected delay before the route): the answer went into a closed connection, a loss
    # in transit on the platform's side that its requeue rule covers, as a cut's is.
    late: list[float] = []
    for req in run.platform.requests:
        if req.route in ("take", "take_batch") and req.fault is not None:
            if req.fault.when == "after" and (req.fault.drop or req.fault.status is not None):
                faulted.append(req)
            answered = req.time + req.fault.delay
            if req.fault.when == "before" and any(
                abs(ex.time - req.time) <= EPS and ex.end_time < answered - EPS for ex in cuts
            ):
                late.append(answered)
    jobs = views(run)
    for job in jobs.values():
        if job.delivered and (job.final is None or not job.final.terminal):
            out.append(f"I8 {job.id}: delivered by a take, then dropped ({job.final})")
    for record in run.platform.jobs.values():
        # Handed out and still held by the worker as far as the platform knows (a handout
        # whose answer never left the platform was put back in the queue: not a loss).
        if record.status != "IN_PROGRESS" or record.taken_by != "w1" or record.take_time is None:
            continue
        view = jobs.get(record.id)
        if view is not None and view.delivered:
            continue
        take_time = record.take_time
        explained = (
            any(ex.time - EPS <= take_time <= ex.end_time + EPS for ex in cuts)
            or any(
                req.time - EPS <= take_time <= (req.answer_time or math.inf) + EPS
                for req in faulted
            )
            or any(abs(take_time - answered) <= EPS for answered in late)
        )
        if not explained:
            out.append(f"I8 {record.id}: handed out at {take_time:g}, never reached the worker")
    return out


def check_held_and_pings(run: Run) -> list[str]:
    """The ledger holds exactly the jobs delivered and not yet settled, at every transition;
    every ping lists exactly those ids at the instant it is sent."""
    held = held_model(run)
    out = []
    for t in run.rec.transitions:
        expected = held(t.seq)
        if set(t.held) != expected or len(t.held) != len(set(t.held)):
            out.append(
                f"held ids at t={t.time:g} ({t.job_id} {t.event.value}): worker "
                f"{sorted(t.held)}, delivered and unsettled {sorted(expected)}"
            )
    for ex in run.rec.exchanges:
        if ex.route != "ping" or ex.ping_ids is None:
            continue
        expected = held(ex.seq)
        if set(ex.ping_ids) != expected or len(ex.ping_ids) != len(set(ex.ping_ids)):
            out.append(f"ping at t={ex.time:g} listed {list(ex.ping_ids)}, held {sorted(expected)}")
    return out


def check_stops(run: Run) -> list[str]:
    """A stop that reached the worker while the job could still be stopped ends the job
    STOPPED with nothing reported: at the gate or queued in the worker, running with work
    left, or not yet held (the worker remembers it for the take that brings the job)."""
    out = []
    jobs = views(run)
    failure = failure_of(run)
    for stop in run.rec.stops:
        job = jobs.get(stop.job_id)
        if job is None or not job.delivered:
            continue
        if failure is not None and stop.time >= failure.failed_at - EPS:
            continue  # the stop channel is gone once init failed
        handler = run.rec.handlers.get(stop.job_id)
        must_stop = False
        if stop.state is None:
            # Not held yet: the take that brings the job must find the stop remembered.
            must_stop = all(ex.end_seq > stop.seq for ex in job.delivered)
        elif stop.state in WAITING:
            must_stop = True
        elif stop.state is S.RUNNING:
            must_stop = handler is not None and handler.planned_end > stop.time + EPS
        if must_stop and job.final is not S.STOPPED:
            out.append(
                f"stop {stop.job_id} at t={stop.time:g} in state {stop.state}: ended "
                f"{job.final}, reports {job.reports}"
            )
    return out


def check_results(run: Run) -> list[str]:
    """What a DONE job reported matches what happened to it: the handler's own result or
    error (non-JSON output and a generator failing mid-stream included), init_failed,
    malformed, or worker_shutdown only for a job still running when the grace ran out."""
    out = []
    scn = run.scenario
    grace_end = math.inf
    if run.rec.sigterm is not None:
        grace_end = run.rec.sigterm[1] + scn.timings.shutdown_grace
    for job in views(run).values():
        if job.final is not S.DONE or not job.reports or job.plan is None:
            continue
        report = parse_report(job.reports[-1].body)
        plan = job.plan
        events = job.events()
        handler = run.rec.handlers.get(job.id)
        start = job.time_of(S.REPORTING)
        if report.category == "worker_shutdown":
            if start is None or start < grace_end - EPS:
                out.append(
                    f"{job.id}: reported worker_shutdown at {start}, grace ends {grace_end:g}"
                )
            continue
        if E.FAIL in events:
            # A malformed job says so; after an init failure it may carry that instead.
            want = {"init_failed"} if failure_of(run) is not None else set()
            if plan.outcome == "malformed":
                want.add("json_error")
            if report.kind not in want:
                out.append(f"{job.id}: failed without running, reported {report}, wanted {want}")
            continue
        if handler is None or handler.interrupted:
            out.append(f"{job.id}: handler interrupted or never ran, reported {report}")
            continue
        want_kind, want_type = {
            "return": ("output", ""),
            "raise": ("json_error", error_type_of(plan.error)),
            "nonjson": ("json_error", "OutputNotSerializable"),
            "stream": ("output", ""),
            "stream_raise": ("plain_error", ""),
            "stream_nonjson": ("json_error", "OutputNotSerializable"),
            "stream_error_chunk": ("plain_error", ""),
        }[plan.outcome]
        if report.kind != want_kind or (want_type and not report.error_type.endswith(want_type)):
            out.append(f"{job.id}: {plan!r} reported {report}")
        if report.category == "timeout":
            out.append(f"{job.id}: a handler error categorised timeout")
    return out


def check_stream_chunks(run: Run) -> list[str]:
    """A stream that ended well lost no chunk silently: each chunk its generator yielded
    reached the platform or is named in the final report's ``undelivered_chunks``, and the
    platform got no chunk the generator did not yield (docs/protocol.md §2.4)."""
    out = []
    for job in views(run).values():
        plan = job.plan
        if job.final is not S.DONE or not job.reports or plan is None or plan.outcome != "stream":
            continue
        body = _json(job.reports[-1].body)
        if not isinstance(body, dict) or "error" in body:
            continue  # stopped, shut down, failed: check_results judges those
        chunks = run.platform.job(job.id).stream
        arrived = {c.get("chunk") for c in chunks if isinstance(c, dict) and c.get("k") == job.id}
        named = set(body.get("undelivered_chunks", []))
        yielded = set(range(plan.chunks))
        if len(arrived) != len(chunks) - _duplicates(chunks) or not arrived <= yielded:
            out.append(f"{job.id}: the platform got chunks not yielded: {chunks}")
        if yielded - arrived - named:
            out.append(
                f"{job.id}: chunks {sorted(yielded - arrived - named)} neither arrived nor "
                f"named (arrived {chunks}, report {body})"
            )
    return out


def _duplicates(chunks: list[Any]) -> int:
    """Chunks that arrived twice: a chunk whose answer was lost is sent again, so the
    platform may hold it twice (at least once, as without pipelining)."""
    keys = [json.dumps(c, sort_keys=True) for c in chunks]
    return len(keys) - len(set(keys))


def check_shutdown(run: Run) -> list[str]:
    """§9: after SIGTERM serve() returns within shutdown_grace + report_deadline; only jobs
    never started are released, and only after a shutdown request with the gate closed (or
    while waiting for a handler slot)."""
    rec = run.rec
    scn = run.scenario
    out = []
    if rec.sigterm is not None and failure_of(run) is None:
        bound = rec.sigterm[1] + scn.timings.shutdown_grace + scn.timings.report_deadline
        if rec.serve_end > bound + EPS:
            out.append(f"§9: serve() returned at {rec.serve_end:g}, bound {bound:g}")
    # The gate is the worker's: it opens when the worker has seen the initializer return.
    # On trio that is the same step; on the asyncio backend the initializer's task ends on
    # the loop first, and a SIGTERM in between may still find the gate closed (the
    # `phases` checker holds the gate to opening only after the return).
    opened = next((c for c in rec.phases if c.event is PhaseEvent.INIT_OK), None)
    for job in views(run).values():
        if job.final is not S.RELEASED:
            continue
        release = job.transitions[-1]
        if rec.sigterm is None or release.seq < rec.sigterm[0]:
            out.append(f"§9 {job.id}: released without a shutdown request")
        # A job waiting for a handler slot (§4 I7) is released like one at the gate.
        waited = any(t.after is S.WAITING_FOR_SLOT for t in job.transitions)
        if opened is not None and opened.seq < release.seq and not waited:
            out.append(f"§9 {job.id}: released although the gate opened at {opened.time:g}")
        if job.id in rec.handlers:
            out.append(f"§9 {job.id}: released after its handler started")
    return out


def check_connections(run: Run) -> list[str]:
    """The worker's HTTP client closed every connection it opened by the time ``serve``
    returned: a cancelled or failed request closes its own, the pool the idle ones."""
    left = [c for c in run.rec.connections if not c.closed]
    if not left:
        return []
    return [f"{len(left)} of {len(run.rec.connections)} connections left open by the client"]


def check_phases(run: Run) -> list[str]:
    """The worker phase replays against PHASE_TRANSITIONS and agrees with what happened:
    the gate opens only after the initializer returned, INIT_FAILED iff serve() raised it,
    DRAINING at the SIGTERM; a job starts only behind an open gate, is released only while
    draining, and is failed without running only after the init failure (or as malformed)."""
    rec = run.rec
    out = []
    phase = WorkerPhase.INITIALIZING
    for change in rec.phases:
        if change.before is not phase or PHASE_TRANSITIONS.get((phase, change.event)) is not (
            change.after
        ):
            out.append(f"phase: illegal {change.before} --{change.event}--> {change.after}")
        phase = change.after
    if (phase is WorkerPhase.INIT_FAILED) != (failure_of(run) is not None):
        out.append(f"phase: ended {phase}, serve: {rec.serve_outcome!r}")
    opened = next((c for c in rec.phases if c.event is PhaseEvent.INIT_OK), None)
    if opened is not None and run.scenario.init.outcome != "none":
        if rec.init_end is None or opened.seq < rec.init_end[0]:
            out.append(f"phase: gate opened at {opened.time:g}, init returned {rec.init_end}")
    drains = [c for c in rec.phases if c.event is PhaseEvent.DRAIN]
    if (rec.sigterm is None) != (not drains) or len(drains) > 1:
        out.append(f"phase: drained {len(drains)} time(s), SIGTERM {rec.sigterm}")

    def phase_at(seq: int) -> tuple[WorkerPhase, bool]:
        before = [c for c in rec.phases if c.seq < seq]
        gate = any(c.event is PhaseEvent.INIT_OK for c in before)
        return (before[-1].after if before else WorkerPhase.INITIALIZING), gate

    for t in rec.transitions:
        now, gate = phase_at(t.seq)
        failed_early = t.event is E.FAIL and t.before is not S.MALFORMED
        bad = (
            (t.event is E.START and not gate)
            or (t.event in (E.RELEASE, E.REQUEST_RELEASE) and now is not WorkerPhase.DRAINING)
            or (failed_early and now is not WorkerPhase.INIT_FAILED)
        )
        if bad:
            out.append(f"phase: {t.job_id} {t.event.value} at {t.time:g} in {now}, gate {gate}")
    return out


def check_thread_slots(run: Run) -> list[str]:
    """§9 for code outside trio: a stopped job keeps its slot until its thread (or, on the
    asyncio backend, its asyncio task) returns, so at every handler start the handlers
    still running fit the concurrency in force; serve() never returns while a handler
    thread or task runs, unless the end of the shutdown grace abandoned it."""
    rec = run.rec
    out = []
    events: list[tuple[int, str, int]] = []
    for ex in rec.exchanges:
        if ex.route in ("take", "take_batch"):
            events.append((ex.seq, "take", ex.concurrency))
    for h in rec.handlers.values():
        events.append((h.start_seq, "start", 0))
        if h.end_seq >= 0:
            events.append((h.end_seq, "end", 0))
    events.sort()
    limit, live = 0, 0
    for seq, what, value in events:
        if what == "take":
            limit = value
        elif what == "end":
            live -= 1
        else:
            live += 1
            if live > limit:
                running = [h.job_id for h in rec.handlers.values() if h.start_seq <= seq]
                out.append(
                    f"threads: {live} handlers running at [{seq}], concurrency {limit}: {running}"
                )
    grace_end = math.inf
    if rec.sigterm is not None:
        grace_end = rec.sigterm[1] + run.scenario.timings.shutdown_grace
    for h in rec.handlers.values():
        if (h.thread or h.task) and h.end_seq < 0 and rec.serve_end < grace_end - EPS:
            where = "thread" if h.thread else "asyncio task"
            out.append(
                f"threads {h.job_id}: serve() returned at {rec.serve_end:g} with its handler "
                f"{where} running, before the shutdown grace ended ({grace_end:g})"
            )
    return out


def check_generators_closed(run: Run) -> list[str]:
    """A generator the worker stopped consuming at a yield (an error or non-JSON chunk, a
    stop, the shutdown grace) is closed by the worker, its cleanup run to the end: in a
    worker thread for a sync generator, never left to the garbage collector."""
    rec = run.rec
    grace_end = math.inf
    if rec.sigterm is not None:
        grace_end = rec.sigterm[1] + run.scenario.timings.shutdown_grace
    out = []
    for h in rec.handlers.values():
        if h.yielded_at >= grace_end - EPS:
            # A step still running in its thread at the end of the grace was abandoned; a
            # running generator cannot be closed, it yields into the void.
            continue
        if h.at_yield:
            out.append(f"generator {h.job_id}: left suspended at a yield, never closed")
        elif h.closed not in ("", "worker"):
            out.append(f"generator {h.job_id}: closed by {h.closed!r}, not by the worker")
    return out


CHECKS: dict[str, Callable[[Run], list[str]]] = {
    "ended": check_run_ended,
    "platform": check_platform,
    "transitions": check_transitions,
    "I1": check_exactly_once,
    "I2": check_gate,
    "I3": check_init_failure,
    "claim": check_claim,
    "I4": check_timeouts,
    "I5": check_shielded_reports,
    "I6": check_bounded_bodies,
    "I7": check_capacity,
    "I8": check_in_transit,
    "pings": check_held_and_pings,
    "stops": check_stops,
    "results": check_results,
    "chunks": check_stream_chunks,
    "shutdown": check_shutdown,
    "connections": check_connections,
    "phases": check_phases,
    "threads": check_thread_slots,
    "closed": check_generators_closed,
}


def describe(run: Run) -> list[str]:
    """Coverage labels for ``hypothesis.event``: which paths an example exercised (see
    ``pytest --hypothesis-show-statistics``)."""
    rec = run.rec
    labels = [f"{run.scenario.async_backend} backend"]
    failure = failure_of(run)
    if failure is not None:
        held = sum(1 for t in rec.transitions if t.event is E.FAIL)
        labels.append(f"init failed ({'timeout' if failure.category == 'timeout' else 'raise'})")
        labels.append(f"init failure failed {min(held, 3)}{'+' if held > 3 else ''} job(s)")
    elif run.scenario.init.outcome != "none":
        labels.append("init succeeded" if rec.init_end is not None else "init cancelled/hung")
    finals = {job.final for job in views(run).values() if job.final is not None}
    labels += [f"a job ended {state.value}" for state in sorted(finals, key=lambda s: s.value)]
    states = {stop.state.value if stop.state else "unheld" for stop in rec.stops}
    labels += [f"stop reached a {state} job" for state in sorted(states)]
    if any(ex.outcome == "cancelled" for ex in rec.exchanges if ex.route.startswith("take")):
        labels.append("a take in flight was cut")
    if any(ex.net != PLAIN for ex in rec.exchanges):
        labels.append("network steps injected")
    if any(req.fault is not None for req in run.platform.requests):
        labels.append("platform faults hit")
    if any(len(t.held) > 1 for t in rec.transitions):
        labels.append("several jobs held at once")
    if run.scenario.threads:
        labels.append(f"sync code ({run.scenario.handler} handler)")
    if any(h.thread and h.end_seq < 0 for h in rec.handlers.values()):
        labels.append("a handler thread was abandoned")
    if rec.init_abandoned_end is not None or (run.scenario.init.sync and rec.init_interrupted):
        labels.append("a sync initializer was abandoned")
    if any(h.closed == "worker" for h in rec.handlers.values()):
        labels.append("a generator left at a yield was closed")
    plans = {f"j{k}": p for k, p in enumerate(run.scenario.jobs)}
    cut = [(h, plans[h.job_id]) for h in rec.handlers.values() if h.task and h.interrupted]
    if any(plan.cleanup for _, plan in cut) or (
        run.scenario.init.cleanup and rec.init_interrupted is not None
    ):
        labels.append("asyncio code awaited its cleanup once cancelled")
    if any(plan.ignores_cancel for _, plan in cut):
        labels.append("an asyncio handler swallowed its cancellation")
    # The chunks of one pipelined write are recorded together, at one seq.
    batches = [ex.seq for ex in rec.exchanges if ex.route == "stream"]
    if len(batches) != len(set(batches)):
        labels.append("stream chunks went out pipelined")
    return labels


def check_all(run: Run) -> None:
    """Run every checker; raise AssertionError listing every violation and the trace."""
    violations = [v for name, check in CHECKS.items() for v in check(run)]
    if violations:
        listing = "\n".join(f"- {v}" for v in violations[:40])
        raise AssertionError(f"{len(violations)} violation(s):\n{listing}\n\n{run.report()}")


def drop_frames(exc: BaseException) -> None:
    """Clear the locals of the finished frames *exc* (and its causes, contexts and group
    members) passed through, so the exception no longer keeps the example's run alive.

    Hypothesis keeps the exception of every failing example it runs (``expected_exception``
    of each cached result, up to 10,000 a test, until the test ends), and its traceback holds
    the frames of ``run_and_check`` and ``check_all``, whose ``run`` holds the whole
    `Recorder`, the fake platform's records and the worker's state: about 520 KiB an
    example. While a failure shrinks (thousands of failing examples) that was about 1 GiB.
    The traceback's text (file, line, code) is kept; only ``--showlocals`` loses anything.
    Frames still executing (the caller's) are skipped by ``traceback.clear_frames``.
    """
    seen: set[int] = set()
    stack: list[BaseException] = [exc]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        traceback.clear_frames(current.__traceback__)
        stack += [e for e in (current.__cause__, current.__context__) if e is not None]
        if isinstance(current, BaseExceptionGroup):
            stack += current.exceptions


def scratch_check() -> None:
    """The mutation check sets TRIO_WORKER_EXPECT_ROOT: fail unless that copy is imported."""
    root = os.environ.get("TRIO_WORKER_EXPECT_ROOT")
    if root is not None:
        where = os.path.realpath(trio_worker.__file__)
        if not where.startswith(os.path.realpath(root) + os.sep):
            raise RuntimeError(f"trio_worker imported from {where}, expected under {root}")
