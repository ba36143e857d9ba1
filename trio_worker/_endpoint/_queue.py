"""The job queue of the local endpoint and the fake platform: jobs, queue, takes, requeues.

Theory of operation
-------------------
Every job lives in ``_jobs`` from the moment it is enqueued. ``_queue`` holds the ids of
jobs waiting to be taken (plus raw take payloads, see :meth:`JobQueue.enqueue_raw`).
Cancelling a queued job only changes its status; a take skips queue entries whose job is
no longer ``IN_QUEUE``, which keeps every operation O(1) without searching the deque. A
job handed out by a take moves to ``held`` (keyed by id, with ``taken_by``) until a
terminal job-done report, a cancel or a requeue takes it out again.

All mutation is synchronous and happens on the trio thread, so it needs no lock. Waiters
use :class:`trio.lowlevel.ParkingLot`, the primitive under ``trio.Condition``: a waiter
checks its predicate and parks with no checkpoint in between, and every mutation calls
``unpark_all`` on the matching lot. Unlike a ``Condition`` this needs no lock, so plain
sync methods such as :meth:`JobQueue.enqueue` can notify waiters, and a waiter never
awaits an already-set event: awaiting one does not block, so under
``MockClock(autojump_threshold=0)`` the loop never goes idle and virtual time never
advances.

The time rules (requeue, execution timeouts, expiry), stop signals and pings sit above
this class, in :class:`~._state.PlatformState`; it hears of takes and finished jobs
through :meth:`JobQueue._on_taken` and :meth:`JobQueue._on_finished`.
"""

from __future__ import annotations

import itertools
import json
from collections import deque
from typing import TYPE_CHECKING

import trio

from ._records import TERMINAL_STATUSES, JobRecord, RequeueRecord

if TYPE_CHECKING:
    from ._rules import Submission

__all__ = ["Handout", "JobQueue", "encode_json", "now_or_none"]

_STATUSES = ("IN_QUEUE", "IN_PROGRESS", "COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT")


class _RawTake:
    """A take answer handed out verbatim (see :meth:`JobQueue.enqueue_raw`)."""

    __slots__ = ("body", "content_type", "payload")

    def __init__(self, payload: object, body: bytes, content_type: str) -> None:
        self.payload = payload
        self.body = body
        self.content_type = content_type


class Handout:
    """The answer to one take: the body, and the jobs it hands to ``worker``."""

    __slots__ = ("body", "content_type", "jobs", "worker")

    def __init__(self, body: bytes, content_type: str, jobs: list[JobRecord], worker: str) -> None:
        self.body = body
        self.content_type = content_type
        self.jobs = jobs
        self.worker = worker


def now_or_none() -> float | None:
    try:
        return trio.current_time()
    except RuntimeError:  # called before trio.run, e.g. to preload a platform
        return None


def encode_json(value: object) -> bytes:
    """Compact UTF-8 JSON, as a platform would send it."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


class JobQueue:
    """Jobs by id, the queue of those waiting, and the ones each worker holds."""

    def __init__(self, *, execution_timeout: float | None) -> None:
        if execution_timeout is not None and execution_timeout <= 0:
            raise ValueError("execution_timeout must be positive or None")
        self.execution_timeout = execution_timeout
        self._jobs: dict[str, JobRecord] = {}
        self._queue: deque[str | _RawTake] = deque()
        self.held: dict[str, JobRecord] = {}
        #: When each held job was last listed by its holder's ping (the requeue rule).
        self._last_listed: dict[str, float] = {}
        self._status_counts = dict.fromkeys(_STATUSES, 0)
        self._ids = itertools.count(1)
        self._handed_out = 0
        self._requeue_total = 0
        self._queue_changed = trio.lowlevel.ParkingLot()
        self.status_changed = trio.lowlevel.ParkingLot()

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
        job = JobRecord(job_id, input, dict(extra or {}), enqueue_time=now_or_none())
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

    def purge_queue(self) -> int:
        """Cancel every queued job (and drop raw answers); return how many jobs."""
        removed = 0
        for entry in self._queue:
            if isinstance(entry, str):
                job = self._jobs.get(entry)
                if job is not None and job.status == "IN_QUEUE":
                    job.done_time = now_or_none()
                    self._set_status(job, "CANCELLED")
                    removed += 1
        self._queue.clear()
        return removed

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

    # -- hooks for the layer above ------------------------------------------------------

    def _on_taken(self, job: JobRecord, now: float) -> None:
        """*job* was just handed to ``job.taken_by`` (its status is still IN_QUEUE)."""

    def _on_finished(self, job: JobRecord) -> None:
        """*job* has just reached a terminal status."""

    # -- operations --------------------------------------------------------------------

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
        self._on_taken(job, now)
        self._set_status(job, "IN_PROGRESS")

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
