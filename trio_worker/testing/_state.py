"""The fake platform's state, with no HTTP in it: queue, jobs, stop signals, requeue.

Theory of operation
-------------------
Every job lives in ``_jobs`` from the moment it is enqueued. ``_queue`` holds the ids of
jobs waiting to be taken (plus raw take payloads, see :meth:`enqueue_raw`). Cancelling a
queued job only changes its status; a take skips queue entries whose job is no longer
``IN_QUEUE``, which keeps every operation O(1) without searching the deque. A job handed
out by a take moves to ``held`` (keyed by id, with ``taken_by``) until a terminal
job-done report, a cancel or a requeue takes it out again.

All mutation is synchronous and happens on the trio thread, so it needs no lock. Waiters
use :class:`trio.lowlevel.ParkingLot`, the primitive under ``trio.Condition``: a waiter
checks its predicate and parks with no checkpoint in between, and every mutation calls
``unpark_all`` on the matching lot. Unlike a ``Condition`` this needs no lock, so plain
sync methods such as :meth:`enqueue` can notify waiters, and a waiter never awaits an
already-set event: awaiting one does not block, so under ``MockClock(autojump_threshold=0)``
the loop never goes idle and virtual time never advances.

Requeue rule (docs/protocol.md §2.7 leaves it to the platform)
------------------------------------------------------
With ``requeue_after`` set, a job that was taken and is not finished goes back to the head
of the queue once ``requeue_after`` seconds have passed since the later of (a) its take and
(b) the last ping *from its holder* that listed its id. So a worker that keeps listing a job
keeps it for ever; a worker that dies, stops pinging, or drops the id from its pings (the
"release" of docs/design.md §9) loses it after ``requeue_after``. Choose ``requeue_after`` of a few
ping intervals: a worker's first ping after a take can come up to one interval later. The
rule is checked lazily at every request and, if :meth:`run_requeue_checker` runs, at the
exact deadline. Every requeue is recorded in :attr:`JobRecord.requeues`. ``None`` (the
default) never requeues.
"""

from __future__ import annotations

import heapq
import itertools
import json
import math
from collections import deque
from typing import TYPE_CHECKING

import trio

from ._endpoint import Retention, status_object
from ._records import (
    TERMINAL_STATUSES,
    Fault,
    JobRecord,
    PingRecord,
    PlatformStatistics,
    RecordedRequest,
    RequeueRecord,
)
from ._webhooks import WebhookSender

if TYPE_CHECKING:
    from ._endpoint import Submission

_STATUSES = ("IN_QUEUE", "IN_PROGRESS", "COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT")


class _RawTake:
    """A take answer handed out verbatim (see :meth:`PlatformState.enqueue_raw`)."""

    __slots__ = ("body", "content_type", "payload")

    def __init__(self, payload: object, body: bytes, content_type: str) -> None:
        self.payload = payload
        self.body = body
        self.content_type = content_type


class _ArmedFault:
    """An injected fault and how many more requests it applies to."""

    __slots__ = ("fault", "remaining")

    def __init__(self, fault: Fault, remaining: int) -> None:
        self.fault = fault
        self.remaining = remaining


class Handout:
    """The answer to one take: the body, and the jobs it hands to ``worker``."""

    __slots__ = ("body", "content_type", "jobs", "worker")

    def __init__(self, body: bytes, content_type: str, jobs: list[JobRecord], worker: str) -> None:
        self.body = body
        self.content_type = content_type
        self.jobs = jobs
        self.worker = worker


def _now_or_none() -> float | None:
    try:
        return trio.current_time()
    except RuntimeError:  # called before trio.run, e.g. to preload a platform
        return None


def encode_json(value: object) -> bytes:
    """Compact UTF-8 JSON, as a platform would send it."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


class PlatformState:
    """State and synchronous operations of :class:`~trio_worker.testing.FakePlatform`."""

    def __init__(
        self,
        *,
        api_key: str | None,
        take_hold: float,
        stop_hold: float,
        requeue_after: float | None,
        endpoint_id: str,
        runsync_wait: float,
        record_requests: bool,
        execution_timeout: float | None = None,
        expire_results: bool = False,
        max_finished: int | None = None,
    ) -> None:
        if take_hold < 0 or stop_hold < 0 or runsync_wait < 0:
            raise ValueError("hold times must not be negative")
        if requeue_after is not None and requeue_after <= 0:
            raise ValueError("requeue_after must be positive or None")
        if execution_timeout is not None and execution_timeout <= 0:
            raise ValueError("execution_timeout must be positive or None")
        if max_finished is not None and max_finished < 0:
            raise ValueError("max_finished must not be negative")
        self.api_key = api_key
        self.take_hold = take_hold
        self.stop_hold = stop_hold
        self.requeue_after = requeue_after
        self.endpoint_id = endpoint_id
        self.runsync_wait = runsync_wait
        self.record_requests = record_requests
        self.execution_timeout = execution_timeout
        self.expire_results = expire_results
        #: Webhook calls of finished jobs (sent while :meth:`run_webhook_sender` runs).
        self.webhooks = WebhookSender()
        self._retention = Retention(max_finished)
        self._retains = expire_results or max_finished is not None
        self._next_timer = math.inf  # earliest execution timeout or expiry
        self._timeouts: list[tuple[float, str, int]] = []  # (deadline, job id, take number)
        self._ping_total = 0
        #: Every request, in arrival order (unless ``record_requests=False``).
        self.requests: list[RecordedRequest] = []
        #: Every heartbeat received.
        self.pings: list[PingRecord] = []
        self._jobs: dict[str, JobRecord] = {}
        self._queue: deque[str | _RawTake] = deque()
        self.held: dict[str, JobRecord] = {}
        self._stops: dict[str, str | None] = {}  # job id -> addressee (None: its holder)
        self._faults: list[_ArmedFault] = []
        self._status_counts = dict.fromkeys(_STATUSES, 0)
        self._route_counts: dict[str, int] = {}
        self._request_total = 0
        self._last_listed: dict[str, float] = {}
        self._workers: dict[str, float] = {}
        self._next_requeue_check = math.inf
        self._ids = itertools.count(1)
        self._takes_waiting = 0
        self._stops_waiting = 0
        self._handed_out = 0
        self._duplicates = 0
        self._requeue_total = 0
        self._unknown_reports = 0
        self._late_progress = 0
        self._queue_changed = trio.lowlevel.ParkingLot()
        self._stops_changed = trio.lowlevel.ParkingLot()
        self.status_changed = trio.lowlevel.ParkingLot()
        self._requests_changed = trio.lowlevel.ParkingLot()
        self._checker_scope: trio.CancelScope | None = None

    # -- the Python API for tests ------------------------------------------------------

    def worker_env(
        self, base_url: str, *, worker_id: str = "w1", ping_interval_ms: int = 1000
    ) -> dict[str, str]:
        """The ``RUNPOD_*`` variables wiring a worker to this platform (docs/protocol.md §1.5).

        Without a configured ``api_key`` a placeholder key is given, because workers only
        start their heartbeat when a key is set.
        """
        base = f"{base_url.rstrip('/')}/v2/{self.endpoint_id}"
        gpu = "?gpu=fake-gpu"
        return {
            "RUNPOD_WEBHOOK_GET_JOB": f"{base}/job-take/$ID{gpu}",
            "RUNPOD_WEBHOOK_POST_OUTPUT": f"{base}/job-done/$RUNPOD_POD_ID/$ID{gpu}",
            "RUNPOD_WEBHOOK_POST_STREAM": f"{base}/job-stream/$RUNPOD_POD_ID/$ID{gpu}",
            "RUNPOD_WEBHOOK_PING": f"{base}/ping/$RUNPOD_POD_ID{gpu}",
            "RUNPOD_AI_API_KEY": self.api_key if self.api_key is not None else "fake-key",
            "RUNPOD_POD_ID": worker_id,
            "RUNPOD_PING_INTERVAL": str(ping_interval_ms),
        }

    def enqueue(
        self,
        input: object,
        *,
        job_id: str | None = None,
        extra: dict[str, object] | None = None,
        execution_timeout: float | None = None,
    ) -> str:
        """Queue a job and return its id; ``extra`` keys are added to the job object.

        *execution_timeout* (seconds, default the platform's) bounds each take of the
        job: past it the job is TIMED_OUT and its worker told to stop it.

        Raises:
            ValueError: if *job_id* is already in use.
        """
        if job_id is None:
            job_id = self._new_id()
        elif job_id in self._jobs:
            raise ValueError(f"job id {job_id!r} already exists")
        job = JobRecord(job_id, input, dict(extra or {}), enqueue_time=_now_or_none())
        job.execution_timeout = execution_timeout or self.execution_timeout
        self._add_job(job)
        self._queue.append(job_id)
        self._queue_changed.unpark_all()
        return job_id

    def submit(self, submission: Submission) -> JobRecord:
        """Queue a checked ``/run``/``/runsync`` request (docs/protocol.md §4.1)."""
        job_id = self.enqueue(
            submission.input,
            extra=submission.extra,
            execution_timeout=submission.execution_timeout,
        )
        job = self._jobs[job_id]
        job.result_ttl = submission.result_ttl
        return job

    def enqueue_raw(self, payload: object, *, content_type: str = "application/json") -> None:
        """Queue a take answer to hand out verbatim, for malformed-input tests.

        ``bytes``/``str`` are sent as they are, anything else as JSON. It is delivered
        alone, even to a batch take. Any object in it with a string ``id`` becomes a job
        held by the taker (so the worker's report for it is accepted and recorded). A raw
        answer that fails to reach the client is not put back.
        """
        if isinstance(payload, bytes):
            body = payload
        elif isinstance(payload, str):
            body = payload.encode()
        else:
            body = encode_json(payload)
        self._queue.append(_RawTake(payload, body, content_type))
        self._queue_changed.unpark_all()

    def request_stop(self, job_id: str, *, worker: str | None = None) -> None:
        """Queue a stop signal for *job_id*.

        It is delivered on the job-stop long-poll of the worker holding the job (once one
        takes it, if it is still queued), or of *worker* if given (even if that worker does
        not hold the job, or the job is unknown). A pending signal for a job that finishes
        is discarded.
        """
        self._stops[job_id] = worker
        job = self._jobs.get(job_id)
        if job is not None:
            job.stop_requested = True
        self._stops_changed.unpark_all()

    def inject(self, fault: Fault) -> None:
        """Apply *fault* to the next ``fault.times`` requests of ``fault.route``.

        Faults are matched in the order they were injected.
        """
        self._faults.append(_ArmedFault(fault, fault.times))

    def job(self, job_id: str) -> JobRecord:
        """The record of *job_id*.

        Raises:
            KeyError: if no such job exists.
        """
        return self._jobs[job_id]

    @property
    def jobs(self) -> dict[str, JobRecord]:
        """Every job, by id, in enqueue order (a live view: do not mutate)."""
        return self._jobs

    def cancel(self, job_id: str) -> JobRecord:
        """Cancel a job as ``POST /cancel/{id}`` does.

        A queued job is CANCELLED at once. A held job is CANCELLED and a stop signal is
        queued for its holder. A finished job is left as it is.

        Raises:
            KeyError: if no such job exists.
        """
        job = self._jobs[job_id]
        if job.finished:
            return job
        if job.status == "IN_PROGRESS" and job.taken_by is not None:
            self._stops[job_id] = job.taken_by
            job.stop_requested = True
            self._stops_changed.unpark_all()
        self.held.pop(job_id, None)
        job.done_time = _now_or_none()
        self._set_status(job, "CANCELLED")
        return job

    def purge_queue(self) -> int:
        """Cancel every queued job (and drop raw answers); return how many jobs."""
        removed = 0
        for entry in self._queue:
            if isinstance(entry, str):
                job = self._jobs.get(entry)
                if job is not None and job.status == "IN_QUEUE":
                    job.done_time = _now_or_none()
                    self._set_status(job, "CANCELLED")
                    removed += 1
        self._queue.clear()
        return removed

    def statistics(self) -> PlatformStatistics:
        """A snapshot of the counters."""
        counts = self._status_counts
        return PlatformStatistics(
            in_queue=counts["IN_QUEUE"],
            in_progress=counts["IN_PROGRESS"],
            completed=counts["COMPLETED"],
            failed=counts["FAILED"],
            cancelled=counts["CANCELLED"],
            timed_out=counts["TIMED_OUT"],
            webhook_calls=len(self.webhooks.calls),
            requests=self._request_total,
            requests_by_route=dict(self._route_counts),
            takes_waiting=self._takes_waiting,
            stops_waiting=self._stops_waiting,
            jobs_handed_out=self._handed_out,
            duplicate_reports=self._duplicates,
            requeues=self._requeue_total,
            unknown_job_reports=self._unknown_reports,
            late_progress_updates=self._late_progress,
            pings=self._ping_total,
            workers=dict(self._workers),
        )

    async def wait_for_status(self, job_id: str, *statuses: str) -> JobRecord:
        """Wait until *job_id* exists and has one of *statuses* (default: any terminal).

        Never times out by itself: bound it with ``trio.fail_after``.
        """
        wanted = frozenset(statuses) if statuses else TERMINAL_STATUSES
        while True:
            job = self._jobs.get(job_id)
            if job is not None and job.status in wanted:
                return job
            await self.status_changed.park()

    async def run_webhook_sender(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Send finished jobs' webhook calls (docs/protocol.md §4.1), until cancelled."""
        await self.webhooks.run(task_status=task_status)

    async def wait_for_requests(self, route: str, count: int) -> None:
        """Wait until *count* requests of *route* (``"*"``: any) have arrived in total."""
        while self._count_requests(route) < count:
            await self._requests_changed.park()

    async def run_requeue_checker(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Apply the requeue rule, execution timeouts and expiries at their exact deadlines.

        Optional: requests also check the rule. It sleeps in a cancel scope whose deadline
        is the earliest requeue deadline; a take that creates an earlier one moves that
        deadline, so the checker wakes only when something may be due: it never polls,
        and costs nothing per request (under ``MockClock``, autojump goes straight to the
        deadline). With ``requeue_after=None`` it just sleeps.
        """
        task_status.started()
        while True:
            self._check_deadlines(trio.current_time())
            with trio.CancelScope(deadline=self._next_deadline()) as scope:
                self._checker_scope = scope
                try:
                    await trio.sleep_forever()
                finally:
                    self._checker_scope = None

    # -- operations used by the HTTP layer ---------------------------------------------

    def _count_requests(self, route: str) -> int:
        return self._request_total if route == "*" else self._route_counts.get(route, 0)

    def _new_id(self) -> str:
        while True:
            job_id = f"job-{next(self._ids)}"
            if job_id not in self._jobs:
                return job_id

    def _add_job(self, job: JobRecord) -> None:
        self._jobs[job.id] = job
        self._status_counts[job.status] += 1
        self.status_changed.unpark_all()

    def _set_status(self, job: JobRecord, status: str) -> None:
        counts = self._status_counts
        counts[job.status] -= 1
        counts[status] += 1
        job.status = status
        if job.finished:
            self._on_finished(job)
        self.status_changed.unpark_all()

    def _on_finished(self, job: JobRecord) -> None:
        """Start the job's retention clock and its webhook call."""
        if self._retains:
            now = _now_or_none() if self.expire_results else None
            expires = now + job.result_ttl if now is not None else math.inf
            for job_id in self._retention.add(job.id, expires):
                self._forget(job_id)
            self._timers_changed(self._retention.next_expiry())
        if job.extra:
            webhook = job.extra.get("webhook")
            if isinstance(webhook, str):
                self.webhooks.submit(job.id, webhook, encode_json(status_object(job)))

    def _record_request(self, request: RecordedRequest) -> None:
        if self.record_requests:
            self.requests.append(request)
        self._request_total += 1
        counts = self._route_counts
        counts[request.route] = counts.get(request.route, 0) + 1
        self._requests_changed.unpark_all()

    def _take_fault(self, route: str) -> Fault | None:
        if not self._faults:
            return None
        now = trio.current_time()
        self._faults = [a for a in self._faults if a.fault.until is None or now < a.fault.until]
        for index, armed in enumerate(self._faults):
            if armed.fault.route == route or armed.fault.route == "*":
                armed.remaining -= 1
                if armed.remaining <= 0:
                    del self._faults[index]
                return armed.fault
        return None

    def _take_nowait(self, worker: str, limit: int, batch: bool) -> Handout | None:
        """Pop up to *limit* queued jobs for *worker*; None if there are none."""
        queue = self._queue
        jobs: list[JobRecord] = []
        while queue:
            head = queue[0]
            if isinstance(head, _RawTake):
                if jobs:
                    break
                queue.popleft()
                return self._hand_out_raw(head, worker)
            queue.popleft()
            job = self._jobs.get(head)
            if job is None or job.status != "IN_QUEUE":
                continue  # cancelled or finished (and maybe forgotten) while queued
            jobs.append(job)
            if len(jobs) >= limit:
                break
        if not jobs:
            return None
        now = trio.current_time()
        for job in jobs:
            self._mark_taken(job, worker, now)
        payload = [job.payload() for job in jobs] if batch else jobs[0].payload()
        return Handout(encode_json(payload), "application/json", jobs, worker)

    def _hand_out_raw(self, raw: _RawTake, worker: str) -> Handout:
        now = trio.current_time()
        items = raw.payload if isinstance(raw.payload, list) else [raw.payload]
        for item in items:
            if isinstance(item, dict) and isinstance(item.get("id"), str):
                job_id: str = item["id"]
                if job_id not in self._jobs:
                    extra = {k: v for k, v in item.items() if k not in ("id", "input")}
                    self._add_job(JobRecord(job_id, item.get("input"), extra, enqueue_time=now))
                if self._jobs[job_id].status == "IN_QUEUE":
                    self._mark_taken(self._jobs[job_id], worker, now)
        return Handout(raw.body, raw.content_type, [], worker)

    def _mark_taken(self, job: JobRecord, worker: str, now: float) -> None:
        job.taken_by = worker
        job.take_time = now
        job.takes += 1
        self._handed_out += 1
        self.held[job.id] = job
        self._workers[worker] = now
        if self.requeue_after is not None and now + self.requeue_after < self._next_requeue_check:
            self._next_requeue_check = now + self.requeue_after
            self._move_checker(self._next_requeue_check)
        if job.execution_timeout is not None:
            heapq.heappush(self._timeouts, (now + job.execution_timeout, job.id, job.takes))
            self._timers_changed(self._timeouts[0][0])
        self._set_status(job, "IN_PROGRESS")
        if job.id in self._stops:
            self._stops_changed.unpark_all()

    def _undo_handout(self, handout: Handout) -> None:
        """Put back the jobs of a take answer that never reached the client."""
        for job in reversed(handout.jobs):
            if job.status == "IN_PROGRESS" and job.taken_by == handout.worker:
                self._requeue(job, "take answer not delivered")

    def _requeue(self, job: JobRecord, reason: str) -> None:
        now = trio.current_time()
        job.requeues.append(RequeueRecord(now, job.taken_by, reason))
        self._requeue_total += 1
        self.held.pop(job.id, None)
        self._last_listed.pop(job.id, None)
        job.taken_by = None
        job.take_time = None
        self._set_status(job, "IN_QUEUE")
        self._queue.appendleft(job.id)
        self._queue_changed.unpark_all()

    def _next_deadline(self) -> float:
        """When the checker must next look: a requeue, a timeout or an expiry."""
        timeout = self._timeouts[0][0] if self._timeouts else math.inf
        return min(self._next_requeue_check, timeout, self._retention.next_expiry())

    def _timers_changed(self, deadline: float) -> None:
        """A timeout or expiry at *deadline* now exists: requests and the checker see it."""
        self._next_timer = min(self._next_timer, deadline)
        self._move_checker(deadline)

    def _move_checker(self, deadline: float) -> None:
        scope = self._checker_scope
        if scope is not None and deadline < scope.deadline:
            scope.deadline = deadline

    def _check_deadlines(self, now: float) -> None:
        """Apply every time rule that is due: requeues, execution timeouts, expiries."""
        self._check_requeue(now)
        if now < self._next_timer:
            return  # the common case: one comparison per request
        self._next_timer = math.inf
        timeouts = self._timeouts
        while timeouts and timeouts[0][0] <= now:
            _, job_id, take = heapq.heappop(timeouts)
            job = self._jobs.get(job_id)
            if job is not None and job.status == "IN_PROGRESS" and job.takes == take:
                self._time_out(job, now)
        for job_id in self._retention.due(now):
            self._forget(job_id)
        self._next_timer = min(self._next_deadline(), self._next_timer)

    def _time_out(self, job: JobRecord, now: float) -> None:
        """Fail a job past its execution timeout and tell its worker to stop it."""
        if job.taken_by is not None:
            self._stops[job.id] = job.taken_by
            job.stop_requested = True
            self._stops_changed.unpark_all()
        self.held.pop(job.id, None)
        self._last_listed.pop(job.id, None)
        job.done_time = now
        self._set_status(job, "TIMED_OUT")

    def _forget(self, job_id: str) -> None:
        """Drop a finished job past its retention: ``/status`` answers 404 from now on."""
        self._jobs.pop(job_id, None)

    def _check_requeue(self, now: float) -> None:
        """Apply the requeue rule of the module docstring (cheap when nothing is due)."""
        requeue_after = self.requeue_after
        if requeue_after is None or now < self._next_requeue_check:
            return
        next_check = math.inf
        for job in list(self.held.values()):
            assert job.take_time is not None
            due = max(job.take_time, self._last_listed.get(job.id, -math.inf)) + requeue_after
            if now >= due:
                self._requeue(job, f"not listed in pings for {requeue_after:g} s")
            else:
                next_check = min(next_check, due)
        self._next_requeue_check = next_check

    def _record_ping(self, worker: str, job_ids: tuple[str, ...], query: dict[str, str]) -> None:
        now = trio.current_time()
        self._ping_total += 1
        if self.record_requests:
            self.pings.append(PingRecord(now, worker, job_ids, query))
        self._workers[worker] = now
        for job_id in job_ids:
            job = self.held.get(job_id)
            if job is not None and job.taken_by == worker:
                self._last_listed[job_id] = now

    def _record_progress(self, job: JobRecord, output: object) -> None:
        if job.finished:
            job.late_progress.append(output)
            self._late_progress += 1
        else:
            job.progress.append(output)

    def _finish(self, job: JobRecord, body: object, pod: str, is_stream: bool) -> None:
        """Record a terminal job-done report; only the first one decides the status."""
        job.done_reports.append(body)
        if len(job.done_reports) > 1:
            self._duplicates += 1
            return
        if job.finished:
            return  # cancelled before the worker reported: keep CANCELLED
        status = "COMPLETED"
        if isinstance(body, dict):
            job.output = body.get("output")
            job.stop_pod = bool(body.get("stopPod"))
            if body.get("error"):
                job.error = body["error"]
                status = "FAILED"
        else:
            job.output = body
        job.done_time = trio.current_time()
        job.done_by = pod
        job.is_stream = is_stream
        self.held.pop(job.id, None)
        self._stops.pop(job.id, None)
        self._last_listed.pop(job.id, None)
        self._set_status(job, status)

    def _deliverable_stops(self, worker: str) -> list[str]:
        ready: list[str] = []
        for job_id, addressee in self._stops.items():
            if addressee is None:
                job = self.held.get(job_id)
                if job is None or job.taken_by != worker:
                    continue
            elif addressee != worker:
                continue
            ready.append(job_id)
        return ready

    def _mark_stops_delivered(self, job_ids: list[str]) -> dict[str, str | None]:
        """Remove delivered stop signals; return them (id -> addressee) for an undo."""
        now = trio.current_time()
        delivered: dict[str, str | None] = {}
        for job_id in job_ids:
            if job_id not in self._stops:
                continue  # the job finished while the answer was being prepared
            delivered[job_id] = self._stops.pop(job_id)
            job = self._jobs.get(job_id)
            if job is not None:
                job.stop_delivered_time = now
        return delivered

    def _restore_stops(self, delivered: dict[str, str | None]) -> None:
        """Put back stop signals whose answer never reached the worker."""
        for job_id, addressee in delivered.items():
            job = self._jobs.get(job_id)
            if addressee is None and (job is None or job.id not in self.held):
                continue  # the job finished meanwhile: nothing left to stop
            if job is not None:
                job.stop_delivered_time = None
            self._stops.setdefault(job_id, addressee)
        self._stops_changed.unpark_all()
