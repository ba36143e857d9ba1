"""Progress updates: posted in the background, one at a time per job, never after the result.

A handler's ``progress_update`` lands here (``Supervisor.spawn_progress``, on the trio
thread). Updates share the reports' connection pool and their retry policy
(:meth:`~trio_worker._delivery.Delivery.post`); at most one is in flight per job, and a newer
one replaces one still waiting. Each post ends within ``report_budget`` and by the shutdown
state's deadline. Before a job's final report goes, :meth:`ProgressPosts.quiet` lets its
updates out for at most ``progress_bound``, then cuts them, so an update never lands after
the final result nor holds it up (docs/design.md §5).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import trio

from ._platform._client import ReportOutcome

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._config import Settings
    from ._scopes import Scopes
    from ._state import WorkerState

log = logging.getLogger("trio_worker")

# Ended jobs remembered, so an update that comes too late is told apart from one for a job
# never held; the oldest are forgotten.
ENDED_KEPT = 4096


class Post(Protocol):
    """The delivery's retry policy (:meth:`~trio_worker._delivery.Delivery.post`)."""

    async def __call__(
        self,
        url: str,
        body: bytes,
        *,
        job_id: str,
        outcome: ReportOutcome,
        superseded: Callable[[], bool] | None = None,
    ) -> None: ...


@dataclass
class _Progress:
    """One job's progress posts: the task posting them, and the newest update waiting."""

    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    idle: trio.Event = field(default_factory=trio.Event)
    pending: bytes | None = None


class ProgressPosts:
    def __init__(self, settings: Settings, plan: Scopes, post: Post) -> None:
        self.settings = settings
        self.timings = settings.timings
        self.plan = plan
        self._post = post
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
        url = self.settings.platform.done_url(job_id, is_stream=False)
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
                        await self._post(
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


def warn_too_late(job_id: str) -> None:
    """The one line for an update made once its job has ended (its final report under way
    or delivered, or the job stopped or released): never posted."""
    log.warning("progress_update for job %s after the job ended; ignored", job_id)


def _progress_end(ends: float, state: WorkerState) -> float:
    """A progress post ends within its budget, and by the state's deadline."""
    return min(ends, state.deadline)
