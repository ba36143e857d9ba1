"""The platform's rules for the endpoint API, as the local endpoint applies them.

docs/protocol.md §4.1 lists them with their sources: what a ``/run`` or ``/runsync``
request may contain (checked in full *before* anything is queued, so a refused request
leaves no job behind), how long ``/runsync`` waits, how long and how many finished jobs
are kept, the per-job ``policy.executionTimeout`` and the ``webhook`` called with the
final status. Pure functions and small value objects; the state and the HTTP layer call
them.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from ._records import JobRecord

#: Request body limits of the endpoint API (the platform documents 10 MB and 20 MB).
RUN_BODY_LIMIT: Final = 10 * 1024 * 1024
RUNSYNC_BODY_LIMIT: Final = 20 * 1024 * 1024
#: Any other endpoint API request (status, cancel...) carries no meaningful body.
OTHER_BODY_LIMIT: Final = 64 * 1024
#: What a too-large body is still read (and dropped) to, so the client reads the 413
#: instead of a reset; past it the connection is closed.
DISCARD_LIMIT: Final = 64 * 1024 * 1024

#: How long ``/runsync`` holds the request for a result.
RUNSYNC_WAIT: Final = 90.0
#: ``?wait=`` bounds, in milliseconds.
WAIT_MS_RANGE: Final = (1000, 300_000)
#: How long finished jobs stay readable: ``/run`` jobs 30 minutes, ``/runsync`` 1 minute.
RUN_RESULT_TTL: Final = 30 * 60.0
RUNSYNC_RESULT_TTL: Final = 60.0
#: The local endpoint's cap on finished jobs kept (the oldest are forgotten first).
MAX_FINISHED: Final = 1000
#: The platform's default execution timeout (10 minutes) and the smallest per-job one.
DEFAULT_EXECUTION_TIMEOUT: Final = 600.0
MIN_EXECUTION_TIMEOUT_MS: Final = 5000
TTL_MS_RANGE: Final = (10_000, 7 * 24 * 3600 * 1000)

#: Webhook delivery: the first attempt and 2 retries, 10 s apart.
WEBHOOK_ATTEMPTS: Final = 3
WEBHOOK_RETRY_DELAY: Final = 10.0
WEBHOOK_TIMEOUT: Final = 10.0


class RequestRefused(Exception):
    """A request the platform refuses: its status and message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Submission:
    """A checked ``/run`` or ``/runsync`` request, ready to be queued."""

    input: dict[str, object]
    extra: dict[str, object]
    execution_timeout: float | None
    wait: float | None  # /runsync's hold in seconds (None: /run)
    result_ttl: float


def check_submission(body: object, query: dict[str, str], *, sync: bool) -> Submission:
    """Every check of a ``/run``/``/runsync`` request, before anything is queued.

    Raises:
        RequestRefused: 400 with the reason, for the first rule broken.
    """
    if not isinstance(body, dict) or "input" not in body:
        raise RequestRefused(400, 'the body must be a JSON object with an "input" key')
    job_input = body["input"]
    if not isinstance(job_input, dict):
        raise RequestRefused(400, f'"input" must be a JSON object, not {_kind(job_input)}')
    webhook = body.get("webhook")
    if webhook is not None and not _is_http_url(webhook):
        raise RequestRefused(400, '"webhook" must be an http:// or https:// URL')
    execution_timeout = _check_policy(body.get("policy"))
    wait = _check_wait(query) if sync else None
    ttl = RUN_RESULT_TTL
    if wait is not None:
        ttl = max(RUNSYNC_RESULT_TTL, wait) if "wait" in query else RUNSYNC_RESULT_TTL
    extra = {k: v for k, v in body.items() if k not in ("input", "id")}
    return Submission(job_input, extra, execution_timeout, wait, ttl)


def _kind(value: object) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


def _is_http_url(value: object) -> bool:
    if not isinstance(value, str):
        return False
    try:
        parts = urlsplit(value)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _integer(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not value.is_integer():
        return None
    return int(value)


def _check_policy(policy: object) -> float | None:
    """The job's execution timeout in seconds (None: the endpoint's default)."""
    if policy is None:
        return None
    if not isinstance(policy, dict):
        raise RequestRefused(400, '"policy" must be a JSON object')
    ttl = policy.get("ttl")
    if ttl is not None:
        ms = _integer(ttl)
        if ms is None or not TTL_MS_RANGE[0] <= ms <= TTL_MS_RANGE[1]:
            raise RequestRefused(400, '"policy.ttl" must be milliseconds from 10000 to 1 week')
    low = policy.get("lowPriority")
    if low is not None and not isinstance(low, bool):
        raise RequestRefused(400, '"policy.lowPriority" must be true or false')
    timeout = policy.get("executionTimeout")
    if timeout is None:
        return None
    ms = _integer(timeout)
    if ms is None or ms <= MIN_EXECUTION_TIMEOUT_MS:
        raise RequestRefused(
            400, '"policy.executionTimeout" must be a whole number of milliseconds above 5000'
        )
    return ms / 1000


def _check_wait(query: dict[str, str]) -> float:
    """``/runsync``'s hold in seconds, from ``?wait=`` milliseconds or the default."""
    raw = query.get("wait")
    if raw is None:
        return RUNSYNC_WAIT
    low, high = WAIT_MS_RANGE
    if not raw.isdigit() or not low <= int(raw) <= high:
        raise RequestRefused(400, f"wait must be a whole number of milliseconds, {low}-{high}")
    return int(raw) / 1000


def status_object(job: JobRecord) -> dict[str, object]:
    """``GET /status/{id}``'s answer, in the shape of Runpod's endpoint API.

    Also the body a job's webhook receives when it finishes.
    """
    answer: dict[str, object] = {"id": job.id, "status": job.status}
    if job.take_time is not None and job.enqueue_time is not None:
        answer["delayTime"] = round((job.take_time - job.enqueue_time) * 1000)
    if job.done_time is not None and job.take_time is not None:
        answer["executionTime"] = round((job.done_time - job.take_time) * 1000)
    if job.taken_by is not None:
        answer["workerId"] = job.taken_by
    if job.status == "COMPLETED" or (job.status == "FAILED" and job.output is not None):
        answer["output"] = job.output
    elif job.status == "IN_PROGRESS" and job.progress:
        answer["output"] = job.progress[-1]
    if job.status == "FAILED":
        answer["error"] = job.error
    return answer


class Retention:
    """Which finished jobs to forget: past their time to live, or beyond *max_count*.

    Finish order is kept in an ordered dict (the count rule drops the oldest) and expiry
    times in a heap, since ``/runsync`` jobs expire sooner than older ``/run`` jobs.
    Heap entries of jobs already forgotten are skipped when they surface.
    """

    __slots__ = ("_expiries", "_finished", "max_count")

    def __init__(self, max_count: int | None) -> None:
        self.max_count = max_count
        self._finished: OrderedDict[str, None] = OrderedDict()
        self._expiries: list[tuple[float, str]] = []

    def add(self, job_id: str, expires: float) -> list[str]:
        """Keep *job_id* until *expires*; the ids the count rule drops now."""
        self._finished[job_id] = None
        if expires < math.inf:
            heapq.heappush(self._expiries, (expires, job_id))
            if self.max_count is not None and len(self._expiries) > 2 * self.max_count + 64:
                # Entries of jobs the count rule dropped: rebuild rather than let them pile up.
                kept = [entry for entry in self._expiries if entry[1] in self._finished]
                heapq.heapify(kept)
                self._expiries = kept
        gone: list[str] = []
        if self.max_count is not None:
            while len(self._finished) > self.max_count:
                gone.append(self._finished.popitem(last=False)[0])
        return gone

    def next_expiry(self) -> float:
        return self._expiries[0][0] if self._expiries else math.inf

    def due(self, now: float) -> list[str]:
        """The ids whose time to live has run out by *now* (each once)."""
        gone: list[str] = []
        while self._expiries and self._expiries[0][0] <= now:
            _, job_id = heapq.heappop(self._expiries)
            if job_id in self._finished:
                del self._finished[job_id]
                gone.append(job_id)
        return gone
