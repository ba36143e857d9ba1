"""Views the checkers derive from a finished `Run`: per job, per report, per instant.

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

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import trio_worker
from trio_worker._state import JobEvent, JobState

from .recorder import Exchange, Transition
from .scenario import JobPlan

if TYPE_CHECKING:
    from trio_worker.testing import RecordedRequest

    from .runner import Run


EPS = 1e-6


S = JobState


E = JobEvent


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
            body = loads_or_none(req.body)
            if not (isinstance(body, dict) and body.get("status") == "IN_PROGRESS"):
                view(req.path.rstrip("/").split("/")[-1]).acked.append(req)
    return jobs


def loads_or_none(raw: bytes | str) -> object:
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
    body = loads_or_none(raw)
    if not isinstance(body, dict):
        return Report("garbled")
    if "error" not in body:
        return Report("output")
    error = body["error"]
    inner = loads_or_none(error) if isinstance(error, str) else None
    if not isinstance(inner, dict):
        return Report("plain_error")
    kind: Literal["init_failed", "json_error"] = (
        "init_failed" if inner.get("event") == "init_failed" else "json_error"
    )
    return Report(kind, str(inner.get("error_type")), str(inner.get("error_category")), inner)


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
