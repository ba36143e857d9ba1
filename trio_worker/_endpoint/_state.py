"""The platform's state above the queue: stop signals, pings, time rules, webhooks.

With no HTTP in it; :class:`~._app.EndpointApp` serves it. What the queue itself does is
in :mod:`._queue`.

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
import math
from typing import TYPE_CHECKING

import trio

from ._queue import JobQueue, encode_json, now_or_none
from ._records import PingRecord, PlatformStatistics
from ._rules import Retention, status_object
from ._webhooks import WebhookSender

if TYPE_CHECKING:
    from ._records import JobRecord, RecordedRequest


class PlatformState(JobQueue):
    """The platform's state and synchronous operations, below its HTTP routes."""

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
        if max_finished is not None and max_finished < 0:
            raise ValueError("max_finished must not be negative")
        super().__init__(execution_timeout=execution_timeout)
        self.api_key = api_key
        self.take_hold = take_hold
        self.stop_hold = stop_hold
        self.requeue_after = requeue_after
        self.endpoint_id = endpoint_id
        self.runsync_wait = runsync_wait
        self.record_requests = record_requests
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
        self._stops: dict[str, str | None] = {}  # job id -> addressee (None: its holder)
        self._route_counts: dict[str, int] = {}
        self._request_total = 0
        self._workers: dict[str, float] = {}
        self._next_requeue_check = math.inf
        self._takes_waiting = 0
        self._stops_waiting = 0
        self._duplicates = 0
        self._unknown_reports = 0
        self._late_progress = 0
        self._stops_changed = trio.lowlevel.ParkingLot()
        self._requests_changed = trio.lowlevel.ParkingLot()
        self._checker_scope: trio.CancelScope | None = None

    # -- the Python API ------------------------------------------------------------------

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
        job.done_time = now_or_none()
        self._set_status(job, "CANCELLED")
        return job

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

    def _on_finished(self, job: JobRecord) -> None:
        """Start the job's retention clock and its webhook call."""
        if self._retains:
            now = now_or_none() if self.expire_results else None
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

    def _on_taken(self, job: JobRecord, now: float) -> None:
        assert job.taken_by is not None
        self._workers[job.taken_by] = now
        if self.requeue_after is not None and now + self.requeue_after < self._next_requeue_check:
            self._next_requeue_check = now + self.requeue_after
            self._move_checker(self._next_requeue_check)
        if job.execution_timeout is not None:
            heapq.heappush(self._timeouts, (now + job.execution_timeout, job.id, job.takes))
            self._timers_changed(self._timeouts[0][0])
        if job.id in self._stops:
            self._stops_changed.unpark_all()

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
