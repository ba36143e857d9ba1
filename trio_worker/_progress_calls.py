"""``progress_update``: from whatever thread calls it, to the worker running the job
(docs/reference.md, ``progress_update``), found by the context the call runs in, else by
its id among the running workers. The hand-over is queued by the call itself, before the
calling thread goes on, so an update made before the thread's work is handed back reaches
the worker before the job can end."""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
from typing import TYPE_CHECKING, Any

import trio

from ._payloads import ResultEncodingError, progress_body

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

log = logging.getLogger("trio_worker")

__all__ = ["ProgressTarget", "current_progress", "progress_update", "running_worker"]


class ProgressTarget:
    """One running worker, as ``progress_update`` reaches it.

    *post* runs on the worker's trio thread (the thread of *token*); from any other thread
    the call is handed over by *from_thread* (the backend's ``thread_handoff``). *holds*
    and *ended* say, from any thread, whether a job id is held by the worker, or was and
    has ended.
    """

    def __init__(
        self,
        post: Callable[[str, bytes], None],
        token: trio.lowlevel.TrioToken,
        from_thread: Callable[..., object],
        *,
        holds: Callable[[str], bool] = lambda job_id: False,
        ended: Callable[[str], bool] = lambda job_id: False,
    ) -> None:
        self.post = post
        self.token = token
        self.from_thread = from_thread
        self.holds = holds
        self.ended = ended
        self._lock = threading.Lock()
        # From other threads: each job's newest body whose hand-over is on its way.
        self._handed: dict[str, bytes] = {}

    def __repr__(self) -> str:
        return f"<ProgressTarget handing_over={sorted(self._handed)}>"

    def send(self, job_id: str, body: bytes) -> None:
        """Post *body* for *job_id*: at once on the worker's trio thread, else handed over."""
        try:
            # On the trio thread (a trio task, or an asyncio task between trio's ticks on
            # the asyncio backend) the post is registered at once, before the job can end.
            current = trio.lowlevel.current_trio_token()
        except RuntimeError:
            current = None
        if current is self.token:
            self.post(job_id, body)
            return
        with self._lock:
            on_its_way = job_id in self._handed
            self._handed[job_id] = body
        if on_its_way:
            return  # the hand-over already queued posts this newer body
        try:
            self.from_thread(self._hand_over, job_id)
        except (trio.RunFinishedError, RuntimeError):
            # A thread that outlived its worker (abandoned at the end of the shutdown
            # grace): the worker's run, or its loop, has ended.
            with self._lock:
                self._handed.pop(job_id, None)
            log.warning("progress_update for job %s after its worker ended; ignored", job_id)

    def _hand_over(self, job_id: str) -> None:
        with self._lock:
            body = self._handed.pop(job_id, None)
        if body is not None:
            self.post(job_id, body)


# Set in each job's task by JobRunner.run; a sync handler's thread sees it too, as the
# worker's threads copy the context. Two workers in one process never cross this way.
current_progress: contextvars.ContextVar[ProgressTarget | None] = contextvars.ContextVar(
    "trio_worker_progress", default=None
)

# The workers running in this process, for a call from a thread with no job context.
_running: list[ProgressTarget] = []
_running_lock = threading.Lock()


@contextlib.contextmanager
def running_worker(target: ProgressTarget) -> Iterator[None]:
    """While the block runs, *target*'s worker is found by the ids it holds."""
    with _running_lock:
        _running.append(target)
    try:
        yield
    finally:
        with _running_lock:
            _running.remove(target)


def progress_update(job: Mapping[str, Any], progress: object) -> None:
    """Send a non-terminal progress update for *job* (docs/protocol.md §3.5).

    Callable from any thread of the process: an async handler, a sync handler's thread, a
    thread or executor the handler starts, a library's callback thread. The update goes to
    the worker running *job*, found by its id (several workers in one process each get
    their own). It returns at once; the POST runs in the background. Unlike the
    reference, updates never arrive after the job's final result. Does nothing (with a
    warning) for a job no worker here is running, or when *progress* is not
    JSON-serializable.
    """
    job_id = str(job.get("id"))
    try:
        body = progress_body(progress)
    except ResultEncodingError as err:
        log.error("progress_update for job %s not sent: %s", job_id, str(err))
        return
    target = current_progress.get()
    if target is None:
        target = _holder(job_id)
    if target is not None:
        target.send(job_id, body)


def _holder(job_id: str) -> ProgressTarget | None:
    """The running worker that holds *job_id* (the one warning when none does)."""
    with _running_lock:
        targets = list(_running)
    for target in targets:
        if target.holds(job_id):
            return target
    if not targets:
        log.warning(
            "progress_update for job %s with no worker running in this process; ignored",
            job_id,
        )
    elif any(target.ended(job_id) for target in targets):
        warn_too_late(job_id)
    else:
        log.warning("progress_update for job %s, which no worker here is running; ignored", job_id)
    return None


def warn_too_late(job_id: str) -> None:
    """The one line for an update made once its job has ended (its final report under way
    or delivered, or the job stopped or released): never posted."""
    log.warning("progress_update for job %s after the job ended; ignored", job_id)
