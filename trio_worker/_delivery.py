"""Posting what the worker owes the platform for a job (docs/design.md §5).

Theory of operation
-------------------
A terminal report runs under a shield (docs/design.md §4 I5) whose deadline is the job's
delivery budget, ``report_budget`` from the moment its report starts: attempts are retried
until one is acknowledged, so a platform outage shorter than the budget loses nothing.
The job stays held meanwhile (the driver settles it only when :meth:`Delivery.deliver`
returns), so it keeps its slot and its id in every ping.

When the worker stops (an init failure, the end of ``shutdown_grace``, a cancellation of
``serve()``), :meth:`Delivery.cut` shortens every shield, as the take's deadline is: a report
then ends by the cut, but never before ``report_deadline`` after it began, so the report of
a job cut at the end of the grace still gets its chance. A loss is logged with the job id.

Progress updates share the reports' connection pool; at most one is in flight per job, a
newer one replaces one still waiting, and the final report waits for them at most
``progress_bound`` before cutting them, so an update never lands after the final result
nor holds it up.

A final report refused for good (400, 413) is answered by a small error report for the job,
so the caller still learns the outcome.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from ._errors import WorkerIdentity, encode_body, json_error_body
from ._platform._client import ReportOutcome
from ._version import __version__

if TYPE_CHECKING:
    from ._config import Settings
    from ._platform._client import PlatformClient

log = logging.getLogger("trio_worker")

# Statuses that will never accept this body, whatever the retries: say why instead.
REFUSED = {400: "bad request", 413: "payload too large"}


@dataclass
class _Progress:
    """One job's progress posts: the task posting them, and the newest update waiting."""

    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    idle: trio.Event = field(default_factory=trio.Event)
    pending: bytes | None = None


@dataclass
class _Shield:
    started: float
    scope: trio.CancelScope


class Delivery:
    def __init__(self, settings: Settings, client: PlatformClient) -> None:
        self.settings = settings
        self.timings = settings.timings
        self.client = client
        platform = settings.platform
        self.identity = WorkerIdentity(platform.worker_id, platform.hostname, __version__)
        self._stop_at = math.inf
        self._shields: dict[str, _Shield] = {}
        self._progress: dict[str, _Progress] = {}

    # -- the terminal report ---------------------------------------------------------------

    def cut(self, when: float) -> None:
        """The worker stops at *when*: every report, pending or to come, ends by then, or
        ``report_deadline`` after it began if that is later."""
        self._stop_at = min(self._stop_at, when)
        for shield in self._shields.values():
            shield.scope.deadline = self._deadline(shield.started)

    def _deadline(self, started: float) -> float:
        timings = self.timings
        floor = max(self._stop_at, started + timings.report_deadline)
        return min(started + timings.report_budget, floor)

    async def deliver(self, job_id: str, body: bytes, *, is_stream: bool) -> bool:
        """Post a terminal report, shielded, within the job's budget; False when it was
        lost (logged loudly with the job id)."""
        url = self.settings.platform.done_url(job_id, is_stream=is_stream)
        started = trio.current_time()
        outcome = ReportOutcome()
        try:
            with trio.CancelScope(shield=True, deadline=self._deadline(started)) as scope:
                self._shields[job_id] = _Shield(started, scope)
                await self._quiet_progress(job_id)
                await self._post_final(url, job_id, body, outcome)
        finally:
            self._shields.pop(job_id, None)
        if not outcome.delivered:
            log.error(
                "RESULT LOST for job %s after %d attempt(s) over %.1fs: last error %s",
                job_id,
                outcome.attempts,
                trio.current_time() - started,
                outcome.last_error or "none: the budget ended first",
            )
        return outcome.delivered

    async def _post_final(self, url: str, job_id: str, body: bytes, outcome: ReportOutcome) -> None:
        await self.client.post_report(url, body, job_id=job_id, outcome=outcome)
        status = outcome.status
        if outcome.delivered or status not in REFUSED:
            return
        log.error(
            "RESULT REFUSED for job %s: HTTP %d (%s) on a report of %d bytes; "
            "reporting the refusal instead",
            job_id,
            status,
            REFUSED[status],
            len(body),
        )
        notice = self._refusal_body(job_id, status, body)
        refusal = ReportOutcome(attempts=outcome.attempts)
        await self.client.post_report(url, notice, job_id=job_id, outcome=refusal)
        outcome.delivered, outcome.attempts = refusal.delivered, refusal.attempts
        outcome.last_error = refusal.last_error and f"{refusal.last_error} (refusal report)"

    def _refusal_body(self, job_id: str, status: int, body: bytes) -> bytes:
        message = (
            f"The platform refused the result of job {job_id} with HTTP {status} "
            f"({REFUSED[status]}): the report was {len(body)} bytes. The result is lost; "
            "for 413, return a smaller result (store large outputs elsewhere and return a "
            "reference)."
        )
        notice = json_error_body(
            error_type="ResultRefused",
            message=message,
            traceback="",
            category="unknown",
            logs="",
            identity=self.identity,
            redactor=self.settings.redactor,
        )
        if _asks_stop_pod(body):
            notice["stopPod"] = True
        return encode_body(notice)

    # -- progress updates ------------------------------------------------------------------

    def spawn_progress(self, nursery: trio.Nursery, job_id: str, body: bytes) -> None:
        """Post a progress update in *nursery*; while one is in flight the newest waits."""
        if job_id in self._shields:
            log.warning("progress_update for job %s after its final result; ignored", job_id)
            return
        progress = self._progress.get(job_id)
        if progress is not None:
            progress.pending = body  # an older update still waiting is superseded
            return
        progress = self._progress[job_id] = _Progress()
        nursery.start_soon(self._post_progress, job_id, progress, body)

    def discard(self, job_id: str) -> None:
        """The job is over: cancel whatever progress it still has in flight."""
        progress = self._progress.get(job_id)
        if progress is not None:
            progress.pending = None
            progress.scope.cancel()

    async def _post_progress(self, job_id: str, progress: _Progress, body: bytes) -> None:
        url = self.settings.platform.done_url(job_id, is_stream=False)
        update: bytes | None = body

        def superseded() -> bool:
            return progress.pending is not None

        try:
            with progress.scope:
                while update is not None:
                    outcome = ReportOutcome()
                    with trio.move_on_after(self.timings.report_budget):
                        await self.client.post_report(
                            url, update, job_id=job_id, outcome=outcome, superseded=superseded
                        )
                    if not outcome.delivered and progress.pending is None:
                        log.warning(
                            "progress update for job %s not delivered: %s",
                            job_id,
                            outcome.last_error or "no attempt made",
                        )
                    update, progress.pending = progress.pending, None
        finally:
            progress.idle.set()
            if self._progress.get(job_id) is progress:
                del self._progress[job_id]

    async def _quiet_progress(self, job_id: str) -> None:
        """Let the job's progress posts (the one in flight, and the newest waiting) go out,
        for at most ``progress_bound``; no new one is accepted meanwhile."""
        progress = self._progress.get(job_id)
        if progress is None:
            return
        bound = self.timings.progress_bound
        with trio.move_on_after(bound):
            await progress.idle.wait()
        if not progress.idle.is_set():
            log.warning(
                "progress update for job %s still in flight after %.1fs; cancelled so the "
                "final report goes",
                job_id,
                bound,
            )
            progress.pending = None
            progress.scope.cancel()
            # Unwinding closes its connection at once; bounded all the same.
            with trio.move_on_after(bound):
                await progress.idle.wait()


def _asks_stop_pod(body: bytes) -> bool:
    """Whether a refused body carried ``stopPod`` (refresh_worker): the notice keeps it."""
    if b'"stopPod"' not in body:
        return False
    try:
        parsed: Any = json.loads(body)
    except ValueError:
        return False
    return isinstance(parsed, dict) and parsed.get("stopPod") is True
