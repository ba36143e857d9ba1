"""What the property suite draws: one `Scenario` per example, plus network steps in the run.

Every value object here is a frozen dataclass with a short, readable repr, because a failing
example is printed by Hypothesis as the repr of what was drawn: a reader must be able to
replay it by eye. Huge strings are carried as `Text` (``unit * count``) so the repr stays
one line.

Times are virtual seconds (``trio.testing.MockClock``, or ``HostLoopClock`` on the asyncio
backend) on a quarter-second grid, so independent events often land on the same instant:
ties are where races live.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

from hypothesis import strategies as st

import trio_worker

__all__ = [
    "BACKENDS",
    "ERRORS",
    "GENERATORS",
    "PLAIN",
    "SYNC_HANDLERS",
    "AsyncBackend",
    "Batch",
    "FaultPlan",
    "InitPlan",
    "JobPlan",
    "NetStep",
    "Scenario",
    "StopPlan",
    "Text",
    "net_steps",
    "scenarios",
]


@dataclass(frozen=True)
class Text:
    """A possibly huge string, ``unit * count``, with a one-line repr."""

    unit: str
    count: int

    def render(self) -> str:
        return self.unit * self.count

    def __len__(self) -> int:
        return len(self.unit) * self.count

    def __repr__(self) -> str:
        return f"Text({self.unit!r} * {self.count})"


# The exceptions user code raises (initializer and handler), by a readable key. The timeout
# look-alikes are the point of I4: none of them may ever be reported as category "timeout".
ERRORS: tuple[str, ...] = (
    "RuntimeError",
    "ValueError",
    "TimeoutError",
    "trio.TooSlowError",
    "asyncio.TimeoutError",
    "socket.timeout",
    "OSError(ETIMEDOUT)",
    "MemoryError",
    "SystemExit",
    "UserTimeout",
)
TIMEOUT_LOOKALIKES = frozenset(
    {
        "TimeoutError",
        "trio.TooSlowError",
        "asyncio.TimeoutError",
        "socket.timeout",
        "OSError(ETIMEDOUT)",
        "UserTimeout",
    }
)

InitOutcome = Literal["none", "success", "raise", "hang"]
JobOutcome = Literal[
    "return",
    "raise",
    "nonjson",
    "stream",
    "stream_raise",
    "stream_nonjson",
    "stream_error_chunk",
    "malformed",
]
STREAM_OUTCOMES: tuple[JobOutcome, ...] = (
    "stream",
    "stream_raise",
    "stream_nonjson",
    "stream_error_chunk",
)
PLAIN_OUTCOMES: tuple[JobOutcome, ...] = ("return", "raise", "nonjson")
StopHow = Literal["stop", "stop_addressed", "cancel", "direct", "ghost"]


@dataclass(frozen=True)
class InitPlan:
    """The initializer: what it does after ``duration`` seconds, under ``timeout``."""

    outcome: InitOutcome
    duration: float
    error: str
    message: Text
    timeout: float | None
    # A sync initializer runs in a thread (abandoned by init_timeout or SIGTERM); one that
    # ignores cancellation never calls check_cancelled() and runs on after it is abandoned.
    sync: bool = False
    ignores_cancel: bool = False
    # An async initializer on the asyncio backend: once cancelled (init_timeout, SIGTERM) it
    # awaits this long in its cleanup before re-raising, as asyncio code may.
    cleanup: float = 0.0

    def __repr__(self) -> str:
        if self.outcome == "none":
            return "InitPlan(none)"
        what = f"{self.outcome} after {self.duration:g}s"
        if self.outcome == "raise":
            what += f" with {self.error}({self.message!r})"
        elif self.outcome == "hang":
            what = "hang"
        if self.sync:
            what = f"sync{' ignoring stops' if self.ignores_cancel else ''} {what}"
        if self.cleanup:
            what += f", cleanup {self.cleanup:g}s"
        return f"InitPlan({what}, init_timeout={self.timeout!r})"


@dataclass(frozen=True)
class JobPlan:
    """One job: the handler's outcome after ``duration`` seconds (``chunks`` when it streams)."""

    outcome: JobOutcome
    duration: float
    chunks: int = 0
    error: str = "RuntimeError"
    message: Text = Text("boom", 1)
    # Sync handlers: never call check_cancelled(), so a stopped job's thread runs to its end
    # (the job keeps its slot) unless the end of the shutdown grace abandons it. An async
    # handler on the asyncio backend: swallows asyncio.CancelledError and runs to its end.
    ignores_cancel: bool = False
    # Async code on the asyncio backend: once cancelled, it awaits this long in its cleanup
    # (closing a connection) before re-raising, as asyncio code may (trio's cancellation
    # would cut such a wait at once).
    cleanup: float = 0.0
    # A streaming handler yields its chunks back to back (no wait between them), so those
    # yielded while a chunk's POST is in flight go out pipelined (docs/protocol.md §2.4).
    burst: bool = False

    @property
    def streams(self) -> bool:
        return self.outcome in STREAM_OUTCOMES

    def __repr__(self) -> str:
        if self.outcome == "malformed":
            return "JobPlan(malformed)"
        extra = (
            f", chunks={self.chunks}{' in a burst' if self.burst else ''}" if self.streams else ""
        )
        if self.outcome in ("raise", "stream_raise"):
            extra += f", {self.error}({self.message!r})"
        if self.ignores_cancel:
            extra += ", ignores stops"
        if self.cleanup:
            extra += f", cleanup {self.cleanup:g}s"
        return f"JobPlan({self.outcome}, {self.duration:g}s{extra})"


@dataclass(frozen=True)
class Batch:
    """Jobs enqueued together at ``at`` (a batch take may hand them out in one answer)."""

    at: float
    jobs: tuple[JobPlan, ...]


@dataclass(frozen=True)
class StopPlan:
    """A stop signal at ``at`` for job ``target`` (an index into all jobs).

    ``stop``: the platform's stop signal, delivered on the holder's job-stop long-poll;
    ``stop_addressed``: the same, addressed to this worker even while the job is queued;
    ``cancel``: ``POST /cancel`` (a queued job never leaves the queue); ``direct``:
    ``WorkerHandle.stop_job``; ``ghost``: a stop for an id no job has.
    """

    at: float
    target: int
    how: StopHow


@dataclass(frozen=True)
class FaultPlan:
    """A platform fault armed at ``at`` for the next ``times`` requests of ``route``."""

    at: float
    route: str
    status: int | None
    drop: bool
    delay: float
    when: Literal["before", "after"]
    times: int

    def fault(self) -> trio_worker.testing.Fault:
        from trio_worker.testing import Fault

        return Fault(
            self.route,
            status=self.status,
            drop=self.drop,
            delay=self.delay,
            when=self.when,
            times=self.times,
        )

    def __repr__(self) -> str:
        what = "drop" if self.drop else (f"{self.status}" if self.status is not None else "slow")
        delay = f"+{self.delay:g}s" if self.delay else ""
        return f"Fault@{self.at:g}({self.route} {what}{delay} {self.when} x{self.times})"


@dataclass(frozen=True)
class NetStep:
    """What the network does to one request: checkpoints and delays before it is sent and
    after its answer, or a transport error before it reaches the platform."""

    pre_checkpoints: int = 0
    pre_delay: float = 0.0
    pre_error: Literal["", "connect", "connect_timeout"] = ""
    post_checkpoints: int = 0
    post_delay: float = 0.0

    def __repr__(self) -> str:
        parts = []
        if self.pre_checkpoints:
            parts.append(f"pre_cp={self.pre_checkpoints}")
        if self.pre_delay:
            parts.append(f"pre={self.pre_delay:g}s")
        if self.pre_error:
            parts.append(self.pre_error)
        if self.post_checkpoints:
            parts.append(f"post_cp={self.post_checkpoints}")
        if self.post_delay:
            parts.append(f"post={self.post_delay:g}s")
        return f"Net({', '.join(parts)})"


PLAIN = NetStep()
# How long asyncio user code awaits in its cleanup once cancelled; 3 s outlasts the least
# shutdown grace and report deadline drawn, so the end of the grace must cut it (the
# regression scenarios in tests/test_properties.py).
CLEANUPS = (0.0, 0.25, 0.5, 1.0, 3.0)
# The worker's async_backend: where its async user code runs (docs/design.md §2).
AsyncBackend = Literal["trio", "asyncio"]
BACKENDS: tuple[AsyncBackend, ...] = ("trio", "asyncio")
WHENS: tuple[Literal["before", "after"], ...] = ("before", "after")
HandlerKind = Literal["async", "async_generator", "sync", "sync_generator"]
# Sync kinds run in threads (each step of a sync generator too): about a third of the
# examples, since a thread round trip costs real time where virtual time costs nothing.
HANDLERS: tuple[HandlerKind, ...] = (
    "async",
    "async",
    "async",
    "async_generator",
    "async_generator",
    "sync",
    "sync_generator",
)
SYNC_HANDLERS = frozenset({"sync", "sync_generator"})
GENERATORS = frozenset({"async_generator", "sync_generator"})


@dataclass(frozen=True)
class Scenario:
    """Everything drawn for one example except the network steps (drawn during the run)."""

    init: InitPlan
    handler: HandlerKind
    aggregate: bool
    concurrency: int | tuple[int, ...]  # a tuple: a callable cycling through the values
    batches: tuple[Batch, ...]
    stops: tuple[StopPlan, ...]
    faults: tuple[FaultPlan, ...]
    sigterm: float | None
    timings: trio_worker.Timings
    take_hold: float
    stop_hold: float
    ping_ms: int
    logs: Text | None  # captured output the fake capture hands out; None: capture_logs="off"
    network: bool  # draw NetSteps for requests (else every request goes through plainly)
    # "asyncio": the async user code is asyncio code, run as asyncio tasks on the loop
    # hosting the worker (trio as its guest); sync code is the same on both.
    async_backend: AsyncBackend = "trio"
    # The drawn cleanups (asyncio code) run after a shutdown request too, not only after a
    # stop or init_timeout; the end of the grace must cut them.
    shutdown_cleanup: bool = False

    @property
    def jobs(self) -> tuple[JobPlan, ...]:
        return tuple(job for batch in self.batches for job in batch.jobs)

    @property
    def threads(self) -> bool:
        """User code runs in threads: a sync handler or a sync initializer."""
        return self.handler in SYNC_HANDLERS or self.init.sync

    @property
    def max_concurrency(self) -> int:
        if isinstance(self.concurrency, int):
            return self.concurrency
        return max(self.concurrency)

    def last_action(self) -> float:
        times = [b.at for b in self.batches] + [s.at for s in self.stops]
        times += [f.at for f in self.faults]
        if self.sigterm is not None:
            times.append(self.sigterm)
        return max(times, default=0.0)


# -- strategies ---------------------------------------------------------------------------


def quarters(low: float, high: float) -> st.SearchStrategy[float]:
    """Times on a quarter-second grid in [low, high]: ties between events are common."""
    return st.integers(math.ceil(low * 4), math.floor(high * 4)).map(lambda q: q / 4)


_UNITS = (
    "x",
    '"\\',  # doubled by each JSON escape
    "\x01\x1f",  # control characters: six bytes each once escaped
    "é漢🎉",  # multi-byte UTF-8
    "\ud800",  # a lone surrogate: not encodable as UTF-8
    "fake-key ",  # the worker's API key: must be redacted
)


def texts(huge: float) -> st.SearchStrategy[Text]:
    """A short message, or (with probability about *huge*) a huge one."""
    small = st.builds(Text, st.sampled_from(["boom", "timed out", "x"]), st.integers(1, 3))
    if huge <= 0:
        return small
    big = st.builds(Text, st.sampled_from(_UNITS), st.sampled_from([20_000, 70_000, 150_000]))
    return st.one_of(small, big) if huge >= 0.5 else small | small | small | big


# Weighted so that about half the examples have an initializer that succeeds (or none):
# the handler paths need an open gate as much as the failure paths need a closed one.
_INIT_WEIGHTS: dict[InitOutcome, int] = {"none": 3, "success": 4, "raise": 2, "hang": 1}


@st.composite
def init_plans(
    draw: st.DrawFn,
    outcomes: tuple[InitOutcome, ...] = ("none", "success", "raise", "hang"),
    huge: float = 0.1,
) -> InitPlan:
    weighted = [o for o in outcomes for _ in range(_INIT_WEIGHTS[o])]
    outcome = draw(st.sampled_from(weighted))
    duration = draw(quarters(0, 6))
    error = draw(st.sampled_from(ERRORS))
    message = draw(texts(huge))
    # init_timeout: mostly none or comfortably above the duration, sometimes 0, sometimes
    # a value that races the initializer (below, at or just above its duration).
    kind = draw(st.sampled_from(["none", "none", "none", "above", "above", "race", "zero"]))
    timeout: float | None = None
    if kind == "above":
        timeout = duration + draw(quarters(0.25, 6))
    elif kind == "race":
        timeout = max(0.25, duration + draw(st.sampled_from([-1.0, -0.25, 0.0, 0.25])))
    elif kind == "zero":
        timeout = 0.0
    sync = outcome != "none" and draw(st.integers(0, 2)) == 0
    ignores = sync and draw(st.booleans())
    return InitPlan(outcome, duration, error, message, timeout, sync, ignores)


@st.composite
def job_plans(
    draw: st.DrawFn,
    outcomes: tuple[JobOutcome, ...],
    huge: float,
    max_duration: float,
    min_duration: float = 0.0,
    kind: HandlerKind = "async",
    backend: AsyncBackend = "trio",
) -> JobPlan:
    outcome = draw(st.sampled_from(outcomes))
    if outcome == "malformed":
        return JobPlan("malformed", 0.0)
    duration = draw(quarters(min_duration, max_duration))
    chunks = draw(st.integers(0, 3)) if outcome in STREAM_OUTCOMES else 0
    error = draw(st.sampled_from(ERRORS))
    message = draw(texts(huge)) if outcome in ("raise", "stream_raise") else Text("boom", 1)
    sync = kind in SYNC_HANDLERS
    on_asyncio = backend == "asyncio" and not sync
    # An async generator that swallowed its cancellation would go on yielding into a pump
    # the worker has given up on (after sync_close_bound): only plain handlers ignore it.
    plain = kind == "async" and outcome not in STREAM_OUTCOMES
    if sync:
        ignores = draw(st.integers(0, 2)) == 0
    else:
        ignores = on_asyncio and plain and draw(st.booleans())
    cleanup = draw(st.sampled_from(CLEANUPS)) if on_asyncio and not ignores else 0.0
    burst = chunks > 1 and draw(st.booleans())
    return JobPlan(outcome, duration, chunks, error, message, ignores, cleanup, burst)


ROUTES = ("take", "take_batch", "stop", "done", "stream", "ping")


@st.composite
def fault_plans(draw: st.DrawFn, routes: tuple[str, ...], horizon: float) -> FaultPlan:
    route = draw(st.sampled_from(routes))
    kind = draw(st.sampled_from(["status", "status", "drop", "slow"]))
    status = None
    if kind == "status":
        # Only statuses the worker retries: a report answered 4xx is given up on purpose.
        status = draw(st.sampled_from([500, 502, 503, 504, 429, 408]))
    delay = draw(st.sampled_from([0.0, 0.0, 0.5, 3.0, 12.0]) if kind != "slow" else quarters(1, 15))
    when = draw(st.sampled_from(WHENS))
    times = draw(st.integers(1, 4))
    return FaultPlan(draw(quarters(0, horizon)), route, status, kind == "drop", delay, when, times)


@st.composite
def timings(draw: st.DrawFn) -> trio_worker.Timings:
    return trio_worker.Timings(
        take_poll_bound=draw(st.sampled_from([1.5, 4.0, 10.0, 90.0])),
        stop_poll_bound=draw(st.sampled_from([1.5, 5.0, 90.0])),
        report_deadline=draw(st.sampled_from([1.0, 2.5, 5.0, 10.0])),
        report_budget=draw(st.sampled_from([1.0, 2.5, 10.0, 300.0])),
        report_attempt_timeout=draw(st.sampled_from([2.0, 10.0])),
        claim_grace=draw(st.sampled_from([0.0, 0.5, 2.0, 5.0, 10.0])),
        shutdown_grace=draw(st.sampled_from([0.0, 1.0, 2.5, 10.0])),
        take_drain=draw(st.sampled_from([0.0, 0.25, 0.5, 1.0])),
        rate_limit_pause=draw(st.sampled_from([0.5, 1.0, 3.0])),
        error_backoff_min=draw(st.sampled_from([0.25, 0.5])),
        error_backoff_max=draw(st.sampled_from([1.0, 4.0])),
        empty_poll_floor=draw(st.sampled_from([0.5, 1.0])),
    )


@st.composite
def concurrencies(
    draw: st.DrawFn, low: int = 1, high: int = 4, callable_p: bool = True
) -> int | tuple[int, ...]:
    """An int, or (a callable that cycles through) a tuple of values."""
    if callable_p and draw(st.booleans()):
        return tuple(draw(st.lists(st.integers(low, high), min_size=1, max_size=4)))
    return draw(st.integers(low, high))


@st.composite
def scenarios(
    draw: st.DrawFn,
    *,
    init: st.SearchStrategy[InitPlan] | None = None,
    max_jobs: int = 6,
    min_jobs: int = 0,
    outcomes: tuple[JobOutcome, ...] | None = None,
    max_duration: float = 6.0,
    min_duration: float = 0.0,
    horizon: float = 12.0,
    concurrency: st.SearchStrategy[int | tuple[int, ...]] | None = None,
    stops: int = 3,
    stop_kinds: tuple[StopHow, ...] = ("stop", "stop_addressed", "cancel", "direct", "ghost"),
    stop_window: tuple[float, float] | None = None,
    faults: int = 2,
    fault_routes: tuple[str, ...] = ROUTES,
    sigterm_p: float = 0.5,
    huge: float = 0.05,
    network: bool | None = None,
    backends: tuple[AsyncBackend, ...] = BACKENDS,
) -> Scenario:
    """A whole example. The knobs focus a property on its part of the space; every other
    dimension is still drawn."""
    backend = draw(st.sampled_from(backends))
    init_plan = draw(init if init is not None else init_plans(huge=huge))
    if backend == "asyncio" and init_plan.outcome != "none" and not init_plan.sync:
        init_plan = dataclasses.replace(init_plan, cleanup=draw(st.sampled_from(CLEANUPS)))
    if outcomes is None:
        outcomes = (*PLAIN_OUTCOMES, *STREAM_OUTCOMES, "malformed")
    streams = any(o in STREAM_OUTCOMES for o in outcomes)
    # A generator function streams every job: only when streams are allowed.
    kinds = HANDLERS if streams else tuple(k for k in HANDLERS if k not in GENERATORS)
    handler: HandlerKind = draw(st.sampled_from(kinds))
    if handler in GENERATORS:
        outcomes = tuple(o for o in outcomes if o in STREAM_OUTCOMES or o == "malformed")
    job = job_plans(outcomes, huge, max_duration, min_duration, handler, backend)
    batches: list[Batch] = []
    remaining = draw(st.integers(min_jobs, max_jobs))
    while remaining > 0:
        size = draw(st.integers(1, min(remaining, 4)))
        batches.append(Batch(draw(quarters(0, horizon)), tuple(draw(job) for _ in range(size))))
        remaining -= size
    batches.sort(key=lambda b: b.at)
    n_jobs = sum(len(b.jobs) for b in batches)
    arrivals = [b.at for b in batches for _ in b.jobs]
    stop_plans: list[StopPlan] = []
    if stops and stop_kinds:
        for _ in range(draw(st.integers(0, stops))):
            how = draw(st.sampled_from(stop_kinds))
            if n_jobs == 0 and how != "ghost":
                how = "ghost"
            target = draw(st.integers(0, max(n_jobs - 1, 0)))
            if how != "ghost" and draw(st.integers(0, 3)):
                # Mostly relative to the target's arrival, so stops find it queued, at the
                # gate, running or reporting, not only long finished.
                arrival = arrivals[target]
                low, high = stop_window or (-1, max_duration + 1)
                at = max(0.0, arrival + draw(quarters(low, high)))
            else:
                at = draw(quarters(0, horizon + max_duration))
            stop_plans.append(StopPlan(at, target, how))
    fault_list = [
        draw(fault_plans(fault_routes, horizon)) for _ in range(draw(st.integers(0, faults)))
    ]
    sigterm = None
    if sigterm_p > 0 and draw(st.floats(0, 1)) < sigterm_p:
        sigterm = draw(quarters(0, horizon + max_duration))
    take_hold = draw(st.sampled_from([0.5, 2.0, 5.0, 20.0]))
    return Scenario(
        init=init_plan,
        handler=handler,
        aggregate=draw(st.booleans()),
        concurrency=draw(concurrency if concurrency is not None else concurrencies()),
        batches=tuple(batches),
        stops=tuple(stop_plans),
        faults=tuple(fault_list),
        sigterm=sigterm,
        timings=draw(timings()),
        take_hold=take_hold,
        stop_hold=draw(st.sampled_from([0.5, 2.0, 5.0, 20.0])),
        ping_ms=draw(st.sampled_from([500, 1000, 2500])),
        logs=draw(st.one_of(st.none(), texts(huge))),
        network=draw(st.booleans()) if network is None else network,
        async_backend=backend,
        shutdown_cleanup=backend == "asyncio" and sigterm is not None and draw(st.booleans()),
    )


def net_steps() -> st.SearchStrategy[NetStep]:
    """One request's network behaviour; plain most of the time."""
    delays = st.sampled_from([0.0, 0.0, 0.0, 0.25, 1.0, 3.0])
    full = st.builds(
        NetStep,
        pre_checkpoints=st.integers(0, 2),
        pre_delay=delays,
        pre_error=st.sampled_from(["", "", "", "", "connect", "connect_timeout"]),
        post_checkpoints=st.integers(0, 2),
        post_delay=delays,
    )
    return st.one_of(st.just(PLAIN), full)
