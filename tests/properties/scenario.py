"""What one example of the property suite is: the `Scenario` and the plans it is made of.

Every value object here is a frozen dataclass with a short, readable repr, because a failing
example is printed by Hypothesis as the repr of what was drawn: a reader must be able to
replay it by eye. Huge strings are carried as `Text` (``unit * count``) so the repr stays
one line. How they are drawn is ``strategies.py``.

Times are virtual seconds (``trio.testing.MockClock``, or ``HostLoopClock`` on the asyncio
backend) on a quarter-second grid, so independent events often land on the same instant:
ties are where races live.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import trio_worker


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
