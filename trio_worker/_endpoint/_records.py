"""The value objects of the endpoint's queue: what it records, and what tests read back.

Kept apart from the app so a test reading ``platform.job(id).done_reports`` can find every
field's meaning in one short file. Times are ``trio.current_time()`` values: virtual
seconds under ``MockClock``, and only meaningful as differences otherwise.

:class:`Fault` is the one value only :mod:`trio_worker.testing` sets (``FakePlatform.inject``
arms it, and notes it on the :class:`RecordedRequest` it applied to); it sits here beside
that record, so the record's type is complete without the endpoint importing the tests.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Final, Literal

__all__ = [
    "TERMINAL_STATUSES",
    "Fault",
    "JobRecord",
    "PingRecord",
    "PlatformStatistics",
    "RecordedRequest",
    "RequeueRecord",
]

#: Job statuses after which nothing changes a job's status any more.
TERMINAL_STATUSES: Final = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT"})


@dataclass
class Fault:
    """A failure to inject into the next ``times`` requests of one route.

    ``route`` is a route name as recorded in :class:`RecordedRequest` (``"take"``,
    ``"take_batch"``, ``"stop"``, ``"done"``, ``"stream"``, ``"ping"``, ``"api_run"``...),
    or ``"*"`` for any route. The request is still recorded.

    - ``delay``: seconds to wait before answering (before the route runs when
      ``when="before"``, after it when ``when="after"``).
    - ``status``: answer with this status (and ``body``, default a small JSON error)
      instead of the route's own answer.
    - ``drop``: close the connection without answering. In-process (``ASGITransport``)
      the client sees :class:`~trio_worker.testing.ConnectionDropped`, an
      ``httpx.RemoteProtocolError``, just as over a real socket.
    - ``when="after"``: apply the route's effect first (hand out the job, record the
      result) and *then* answer with the fault: the worst case for a retry, a result
      recorded while the client sees a 500.

    - ``retry_after``: with ``status``, a ``Retry-After`` header of this many seconds
      (written ``%g``: ``0``, ``-5`` and ``nan`` are sent as such).
    - ``until``: the fault applies only to requests arriving before this
      ``trio.current_time()`` (an outage of a known length: pair it with a large
      ``times``); once it has passed, the fault is forgotten.

    With neither ``status`` nor ``drop``, the fault only delays the real answer.

    Example::

        platform.inject(Fault("done", status=503, times=2))
        platform.inject(Fault("take", drop=True, when="after"))  # a job lost in transit
        platform.inject(Fault("done", status=503, times=10**9, until=now + 60))  # an outage
    """

    route: str
    status: int | None = None
    delay: float = 0.0
    drop: bool = False
    times: int = 1
    body: bytes | None = None
    when: Literal["before", "after"] = "before"
    until: float | None = None
    retry_after: float | None = None

    def __post_init__(self) -> None:
        if self.when not in ("before", "after"):
            raise ValueError(f"when must be 'before' or 'after', not {self.when!r}")
        if self.times < 1:
            raise ValueError("times must be at least 1")
        if self.delay < 0:
            raise ValueError("delay must not be negative")
        if self.drop and self.status is not None:
            raise ValueError("a fault either drops the connection or answers a status")
        # Negative and NaN values are allowed: a hostile platform sends them too.
        if self.retry_after is not None and self.status is None:
            raise ValueError("retry_after needs a status")


@dataclass
class RecordedRequest:
    """One request as the platform saw it.

    Recorded on arrival, so a long-poll in progress is visible; ``status`` and
    ``answer_time`` are filled in when it is answered and stay ``None`` if the client
    went away first or the connection was dropped (``dropped``).
    """

    time: float
    method: str
    route: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    status: int | None = None
    answer_time: float | None = None
    fault: Fault | None = None
    dropped: bool = False

    def json(self) -> object:
        """The body parsed as JSON (whatever the Content-Type said)."""
        return json.loads(self.body)


@dataclass(frozen=True)
class PingRecord:
    """One heartbeat: when, from which worker, and the job ids it listed."""

    time: float
    worker: str
    job_ids: tuple[str, ...]
    query: dict[str, str]


@dataclass(frozen=True)
class RequeueRecord:
    """A job put back in the queue: when, which worker had it, and why."""

    time: float
    worker: str | None
    reason: str


@dataclass
class JobRecord:
    """Everything the platform knows about one job.

    ``done_reports`` holds every terminal job-done body received, in order; the first
    decided the status, any further one is a duplicate (see :attr:`duplicates`).
    ``progress`` holds the ``IN_PROGRESS`` updates received while the job was open and
    ``late_progress`` those received after it finished (ignored, as docs/protocol.md §3.5 says a
    platform must).
    """

    id: str
    input: object
    extra: dict[str, object] = field(default_factory=dict)
    enqueue_time: float | None = None
    status: str = "IN_QUEUE"
    output: object = None
    error: object = None
    stream: list[object] = field(default_factory=list)
    progress: list[object] = field(default_factory=list)
    late_progress: list[object] = field(default_factory=list)
    done_reports: list[object] = field(default_factory=list)
    requeues: list[RequeueRecord] = field(default_factory=list)
    taken_by: str | None = None
    take_time: float | None = None
    takes: int = 0
    done_time: float | None = None
    done_by: str | None = None
    is_stream: bool | None = None
    stop_pod: bool = False
    stop_requested: bool = False
    stop_delivered_time: float | None = None
    stream_cursor: int = field(default=0, repr=False)
    #: Seconds a take may hold the job before it is TIMED_OUT (None: no limit).
    execution_timeout: float | None = None
    #: Seconds the job stays readable once finished, when the platform expires results.
    result_ttl: float = 30 * 60.0

    @property
    def finished(self) -> bool:
        """True once the job is COMPLETED, FAILED, CANCELLED or TIMED_OUT."""
        return self.status in TERMINAL_STATUSES

    @property
    def duplicates(self) -> list[object]:
        """Terminal reports after the first one (the worker reported twice)."""
        return self.done_reports[1:]

    def payload(self) -> dict[str, object]:
        """The job object a take hands to a worker: ``{"id", "input", **extra}``."""
        return {**self.extra, "id": self.id, "input": self.input}


@dataclass(frozen=True)
class PlatformStatistics:
    """A snapshot of the platform's counters (trio's ``statistics()`` convention)."""

    in_queue: int
    in_progress: int
    completed: int
    failed: int
    cancelled: int
    requests: int
    requests_by_route: dict[str, int]
    takes_waiting: int
    stops_waiting: int
    jobs_handed_out: int
    duplicate_reports: int
    requeues: int
    unknown_job_reports: int
    late_progress_updates: int
    pings: int
    workers: dict[str, float]
    timed_out: int = 0
    webhook_calls: int = 0
