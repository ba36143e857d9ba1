"""What one example recorded: every observable step of the worker, under one sequence.

Everything observable is appended to one `Recorder` under a global sequence number, so
"before" and "after" are exact even when many things happen at the same virtual instant:

* every job state transition (an observer passed to ``serve``), with the worker's held ids;
* every HTTP exchange as the worker sees it (route, what was held and the concurrency in
  force when it was sent, how it ended, what it delivered; `chaos.RecordingBackend`);
* initializer and handler starts and ends, and whether a cancellation interrupted them
  (`usercode.UserCode`);
* what the driver did (enqueue, stop, fault, SIGTERM) and how ``serve`` ended
  (`runner`);
* the worker's log lines (`example_log`), shown with the trace of a failing example.

The recorder also draws each request's network step (`Recorder.next_step`), because the
draw happens as the request is made.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import trio

import trio_worker
from trio_worker._state import JobEvent, JobState, PhaseEvent, WorkerPhase

from .scenario import PLAIN, NetStep, Scenario
from .strategies import net_steps
from .threads import Baton

if TYPE_CHECKING:
    from hypothesis.strategies import DataObject

    from trio_worker._state import HeldJob

    from .chaos import ChaosStream


# Requests whose network step is drawn; later ones go through plainly (keeps examples short).
NET_DRAWS = 32


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
        return self.states.get(job_id, JobState.TAKEN)

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
