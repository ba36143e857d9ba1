"""Posting what the worker owes the platform for a job: :meth:`Delivery.post`, the one retry
policy of every report, progress update and stream chunk sent on its own; the terminal
report under its shield; :class:`ProgressPosts` (docs/design.md §5 and I5;
docs/how-it-works.md, "Shields and deadlines")."""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from ._pacing import backoff_delay, rate_limit_wait
from ._payloads import notice
from ._platform._client import ReportOutcome, is_retryable, report_attempt_bound
from ._progress_calls import warn_too_late

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._config import Settings
    from ._payloads import Payloads
    from ._platform._client import PlatformClient
    from ._scopes import Scopes
    from ._state import WorkerState
    from ._watch._records import Records

log = logging.getLogger("trio_worker")

# Statuses that will never accept this body, whatever the retries: say why instead.
REFUSED = {400: "bad request", 413: "payload too large"}


class Delivery:
    def __init__(
        self, settings: Settings, client: PlatformClient, plan: Scopes, payloads: Payloads
    ) -> None:
        self.settings = settings
        self.timings = settings.timings
        self.client = client
        self.plan = plan
        # Where the crash watchdog reads each terminal body before its first attempt
        # (``_watch``, docs/design.md §13.2); installed by the supervisor when watched.
        self.finals: Records | None = None
        self.payloads = payloads
        self.progress = ProgressPosts(settings, plan, self)
        # The jobs whose terminal report is in flight, and when each began.
        self._reporting: dict[str, float] = {}

    def __repr__(self) -> str:
        return f"<Delivery reporting={sorted(self._reporting)} {self.progress!r} {self.plan!r}>"

    # -- the one retry policy --------------------------------------------------------------

    async def post(
        self,
        url: str,
        body: bytes,
        *,
        job_id: str,
        outcome: ReportOutcome,
        superseded: Callable[[], bool] | None = None,
    ) -> None:
        """POST one report until it is acknowledged, refused for good, or time runs out.

        Never raises for platform trouble, and has no attempt limit: the caller's cancel
        scope bounds the whole. *outcome* is filled in as attempts are made, so a caller
        whose scope ran out still knows how many were made and the last error.
        *superseded* is asked before each retry: yes (a newer progress update waits)
        abandons the report.
        """
        bound = report_attempt_bound(self.timings, len(body))
        while True:
            answers = await self.client.post([(url, body)], outcome)
            status = answers[0].status if answers else None
            if outcome.delivered or (status is not None and not is_retryable(status)):
                return
            if superseded is not None and superseded():
                outcome.last_error = f"{outcome.last_error}; superseded by a newer update"
                return
            delay = self.retry_wait(outcome.attempts, outcome.retry_after)
            # Attempts 1, 2, 4, 8...: an outage of minutes shows without a line a second.
            if outcome.attempts & (outcome.attempts - 1) == 0:
                log.warning(
                    "report for job %s failed (%s, attempt %d); retrying in %.2fs",
                    job_id,
                    outcome.last_error,
                    outcome.attempts,
                    delay,
                )
            await self.plan.wait_to_retry(trio.current_time() + delay, bound)

    def retry_wait(self, attempts: int, retry_after: float | None) -> float:
        """Seconds before the next attempt, after *attempts* failed: the backoff, or after
        a ``Retry-After`` (*retry_after*, as parsed) :func:`~trio_worker._pacing.rate_limit_wait`,
        never less than the backoff. The caller waits through :meth:`Scopes.wait_to_retry`.
        """
        timings = self.timings
        delay = backoff_delay(attempts - 1, timings.error_backoff_min, timings.report_backoff_max)
        if retry_after is None:
            return delay
        return max(rate_limit_wait(retry_after, timings), delay)

    # -- the terminal report ---------------------------------------------------------------

    async def deliver(self, job_id: str, body: bytes, *, is_stream: bool) -> bool:
        """Post a terminal report, shielded, within the job's budget; False when it was
        lost (logged loudly with the job id)."""
        url = self.client.done_url(job_id, is_stream=is_stream)
        started = trio.current_time()
        outcome = ReportOutcome()
        # Before the first attempt: should the process die from here on, the crash
        # watchdog sends this same body, never a different final (docs/design.md §13.2).
        if self.finals is not None:
            self.finals.final(job_id, body, is_stream=is_stream)
        self.progress.closed.add(job_id)
        self._reporting[job_id] = started
        try:
            deadline = self.plan.state.report_deadline(started)
            with trio.CancelScope(shield=True, deadline=deadline) as scope:
                self.plan.bind(scope, lambda state: state.report_deadline(started))
                try:
                    await self.progress.quiet(job_id)
                    await self._post_final(url, job_id, body, outcome, is_stream=is_stream)
                finally:
                    self.plan.unbind(scope)
        finally:
            del self._reporting[job_id]
            self.progress.closed.discard(job_id)
        if not outcome.delivered:
            log.error(
                "RESULT LOST for job %s after %d attempt(s) over %.1fs: last error %s",
                job_id,
                outcome.attempts,
                trio.current_time() - started,
                outcome.last_error or "none: the budget ended first",
            )
        return outcome.delivered

    async def _post_final(
        self, url: str, job_id: str, body: bytes, outcome: ReportOutcome, *, is_stream: bool
    ) -> None:
        await self.post(url, body, job_id=job_id, outcome=outcome)
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
        refused = notice(
            "ResultRefused", job_id=job_id, status=status, reason=REFUSED[status], size=len(body)
        )
        replacement = self.payloads.error(refused, stop_pod=_asks_stop_pod(body))
        # The refused body was not stored: the notice is the final the watchdog would send.
        if self.finals is not None:
            self.finals.final(job_id, replacement, is_stream=is_stream)
        refusal = ReportOutcome(attempts=outcome.attempts)
        await self.post(url, replacement, job_id=job_id, outcome=refusal)
        outcome.delivered, outcome.attempts = refusal.delivered, refusal.attempts
        outcome.last_error = refusal.last_error and f"{refusal.last_error} (refusal report)"


def _asks_stop_pod(body: bytes) -> bool:
    """Whether a refused body carried ``stopPod`` (refresh_worker): the notice keeps it."""
    if b'"stopPod"' not in body:
        return False
    try:
        parsed: Any = json.loads(body)
    except ValueError:
        return False
    return isinstance(parsed, dict) and parsed.get("stopPod") is True


# Ended jobs remembered, so an update that comes too late is told apart from one for a job
# never held; the oldest are forgotten.
ENDED_KEPT = 4096


@dataclass
class _Progress:
    """One job's progress posts: the task posting them, and the newest update waiting."""

    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    idle: trio.Event = field(default_factory=trio.Event)
    pending: bytes | None = None


class ProgressPosts:
    def __init__(self, settings: Settings, plan: Scopes, delivery: Delivery) -> None:
        self.settings = settings
        self.timings = settings.timings
        self.plan = plan
        self._delivery = delivery  # its post(): the one retry policy
        self._progress: dict[str, _Progress] = {}
        # Jobs whose final report has started: no update is accepted for them any more.
        self.closed: set[str] = set()
        # Jobs that have ended (reported, stopped or released), newest last; read from
        # any thread (progress_update's), written on the trio thread.
        self._ended: dict[str, None] = {}

    def __repr__(self) -> str:
        return f"<ProgressPosts in_flight={sorted(self._progress)}>"

    def spawn(self, nursery: trio.Nursery, job_id: str, body: bytes) -> None:
        """Post an update in *nursery*; while one is in flight the newest waits."""
        if job_id in self.closed:
            warn_too_late(job_id)
            return
        progress = self._progress.get(job_id)
        if progress is not None:
            progress.pending = body  # an older update still waiting is superseded
            return
        progress = self._progress[job_id] = _Progress()
        nursery.start_soon(self._run, job_id, progress, body)

    def ended(self, job_id: str) -> bool:
        """Whether *job_id* was held and has ended (among the last ``ENDED_KEPT``)."""
        return job_id in self._ended

    def discard(self, job_id: str) -> None:
        """The job is over: cancel whatever progress it still has in flight."""
        self._ended[job_id] = None
        if len(self._ended) > ENDED_KEPT:
            del self._ended[next(iter(self._ended))]
        progress = self._progress.get(job_id)
        if progress is not None:
            progress.pending = None
            progress.scope.cancel()

    async def _run(self, job_id: str, progress: _Progress, body: bytes) -> None:
        url = self._delivery.client.done_url(job_id, is_stream=False)
        update: bytes | None = body
        budget = self.timings.report_budget

        def superseded() -> bool:
            return progress.pending is not None

        try:
            with progress.scope:
                while update is not None:
                    outcome = ReportOutcome()
                    rule = functools.partial(_progress_end, trio.current_time() + budget)
                    with self.plan.open_scope(rule):
                        await self._delivery.post(
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

    async def quiet(self, job_id: str) -> None:
        """Let the job's updates (the one in flight, and the newest waiting) go out, for at
        most ``progress_bound``; no new one is accepted meanwhile."""
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


def _progress_end(ends: float, state: WorkerState) -> float:
    """A progress post ends within its budget, and by the state's deadline."""
    return min(ends, state.deadline)
