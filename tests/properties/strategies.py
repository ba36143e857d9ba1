"""How the property suite draws a `Scenario` (``scenario.py``), and the network steps
drawn while it runs.

`scenarios` draws a whole example; its keyword knobs let one property focus on its part of
the space (which outcomes, how many stops and when, which routes may fault) while every
other dimension is still drawn. Times come from `quarters`, a quarter-second grid, so
independent events often tie.
"""

from __future__ import annotations

import dataclasses
import math

from hypothesis import strategies as st

import trio_worker

from .scenario import (
    BACKENDS,
    CLEANUPS,
    ERRORS,
    GENERATORS,
    HANDLERS,
    PLAIN,
    PLAIN_OUTCOMES,
    STREAM_OUTCOMES,
    SYNC_HANDLERS,
    WHENS,
    AsyncBackend,
    Batch,
    FaultPlan,
    HandlerKind,
    InitOutcome,
    InitPlan,
    JobOutcome,
    JobPlan,
    NetStep,
    Scenario,
    StopHow,
    StopPlan,
    Text,
)

__all__ = ["concurrencies", "init_plans", "job_plans", "net_steps", "quarters", "scenarios"]


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
        empty_poll_floor=draw(st.sampled_from([0.25, 0.5, 1.0])),
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
