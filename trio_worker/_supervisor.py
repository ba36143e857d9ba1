"""The nursery that owns the worker's life: init, take, run and stop (docs/design.md §3, §6, §9).

Theory of operation
-------------------
Four sibling tasks share one nursery:

* **init** runs the initializer under ``init_timeout``; success opens the gate, failure is
  recorded and cancels the nursery.
* **take** long-polls job-take whenever a slot is free (woken by the ledger, never by a
  sleep loop). Each take runs *shielded*, under its own deadline: a cancellation never
  abandons a take in flight (I8); when the worker must stop taking, the deadline is
  shortened instead, and whatever the take returns is run, failed or released on purpose.
* **run** starts one task per job, each in its own cancel scope. A job waits at the gate,
  then the handler runs; its terminal report is sent under a shield with its own deadline
  (I5). A stop cancels the job's scope; nothing is reported for it.
* **stop** long-polls job-stop and cancels the named job's scope.

On init failure every held job is failed with the same ``init_failed`` body: jobs at the
gate report it as the cancellation reaches them, a take in flight gets ``claim_grace`` and
its jobs are failed in the take task, and if no job was ever held one take bounded by the
same grace claims a request to fail (docs/design.md §6). On shutdown jobs still at the gate are
released, running jobs get ``shutdown_grace`` and are then failed with ``worker_shutdown``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import trio

from ._exceptions import (
    InitFailure,
    InitializationError,
    PlatformError,
    RateLimited,
    TransportError,
)
from ._handlers import is_cancellation
from ._initializer import Initializer, init_failure_report, run_initializer
from ._lifecycle import JobEvent, JobState, Ledger, TransitionHook
from ._platform._client import backoff_delay

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable

    from ._capture import OutputCapture
    from ._config import Settings
    from ._handlers import ThreadWaits
    from ._lifecycle import HeldJob
    from ._options import Concurrency
    from ._platform._client import PlatformClient
    from ._platform._wire import TakeResponse
    from ._runner import JobRunner, Report

log = logging.getLogger("trio_worker")


def _drain(receive: trio.MemoryReceiveChannel[HeldJob]) -> list[HeldJob]:
    jobs = []
    while True:
        try:
            jobs.append(receive.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
            return jobs


_WAITING = (JobState.TAKEN, JobState.WAITING_FOR_INIT)
_STOPPABLE = (JobState.TAKEN, JobState.WAITING_FOR_INIT, JobState.RUNNING)
# A stop for an id not (yet) held is remembered this long: the take that delivers it may
# still be on the wire (the reference forgets it, docs/protocol.md §8 item 6).
STOP_MEMORY_SECONDS = 120.0
STOP_MEMORY_SIZE = 1024


@dataclass
class JobControl:
    """The supervisor's handles on one held job."""

    scope: trio.CancelScope
    stop_requested: bool = False
    release_requested: bool = False
    malformed: str | None = None
    progress_in_flight: int = 0
    progress_idle: trio.Event = field(default_factory=trio.Event)


class Supervisor:
    def __init__(
        self,
        *,
        settings: Settings,
        client: PlatformClient,
        runner: JobRunner,
        waits: ThreadWaits,
        initializer: Initializer | None,
        init_timeout: float | None,
        concurrency: Concurrency,
        capture: OutputCapture | None,
        refresh_worker: bool = False,
        observers: Iterable[TransitionHook] = (),
    ) -> None:
        self.settings = settings
        self.timings = settings.timings
        self.client = client
        self.runner = runner
        self.waits = waits
        self.initializer = initializer
        self.init_timeout = init_timeout
        self.capture = capture
        self.refresh_worker = refresh_worker
        self.ledger = Ledger(on_change=self._wake_take)
        self.ledger.observers.extend(observers)
        self._concurrency_fn = concurrency if callable(concurrency) else None
        self.concurrency = 1 if callable(concurrency) else concurrency
        self.gate = trio.Event()
        self.failure: InitFailure | None = None
        self.shutting_down = False
        self._shutdown_deadline = math.inf
        self._claim_deadline = math.inf
        self._controls: dict[str, JobControl] = {}
        self._recent_stops: dict[str, float] = {}
        self._slot_event = trio.Event()
        self._take_scope: trio.CancelScope | None = None
        self._idle_scope = trio.CancelScope()
        self._stop_scope = trio.CancelScope()
        self._init_scope = trio.CancelScope()
        self._grace_scope = trio.CancelScope()
        self._nursery: trio.Nursery | None = None
        self._jobs: trio.Nursery | None = None
        self._init_failed_body: bytes | None = None

    # -- the nursery --------------------------------------------------------------------

    async def run(self) -> None:
        """Run until shutdown (returns) or init failure (raises InitializationError)."""
        send, receive = trio.open_memory_channel["HeldJob"](math.inf)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._init_task)
            nursery.start_soon(self._take_task, send)
            nursery.start_soon(self._run_task, receive)
            nursery.start_soon(self._stop_task)
        if self.failure is not None:
            await self._claim_one_to_fail()
            raise InitializationError(self.failure)

    def request_shutdown(self, reason: str) -> None:
        """Stop taking, release jobs at the gate, give running jobs ``shutdown_grace``."""
        if self.shutting_down or self.failure is not None:
            return
        log.info("shutting down (%s); %d job(s) held", reason, len(self.ledger))
        self.shutting_down = True
        now = trio.current_time()
        self._shutdown_deadline = now + self.timings.shutdown_grace
        self._shorten_take(now + min(self.timings.take_drain, self.timings.shutdown_grace))
        self._idle_scope.cancel()
        self._stop_scope.cancel()
        self._init_scope.cancel()
        for job in self.ledger:
            control = self._controls.get(job.id)
            if control is None:
                continue
            control.scope.deadline = self._shutdown_deadline
            if job.state in _WAITING and not self.gate.is_set():
                control.release_requested = True
                control.scope.cancel()
        if self._nursery is not None:
            self._nursery.start_soon(self._expire_grace)

    def statistics(self) -> dict[str, object]:
        return {
            "held": len(self.ledger),
            "ever_held": self.ledger.ever_held,
            "concurrency": self.concurrency,
            "gate_open": self.gate.is_set(),
            "shutting_down": self.shutting_down,
            "init_failed": self.failure is not None,
        }

    # -- init ---------------------------------------------------------------------------

    async def _init_task(self) -> None:
        if self.initializer is None:
            self.gate.set()
            return
        with self._init_scope:
            failure = await run_initializer(self.initializer, self.init_timeout, self._init_logs)
            if failure is None:
                log.info("initializer finished; handlers may run")
                self.gate.set()
                return
            self._fail_init(failure)

    def _init_logs(self) -> str:
        if self.capture is None:
            return ""
        return self.capture.tail(self.settings.logs_tail_chars)

    def _fail_init(self, failure: InitFailure) -> None:
        log.error(
            "initializer failed after %.2fs: %s: %s (category %s); failing %d held job(s)",
            failure.elapsed,
            failure.error_type,
            failure.message,
            failure.category,
            len(self.ledger),
        )
        self.failure = failure
        self._init_failed_body = init_failure_report(
            failure, self.runner.identity, self.settings.redactor
        )
        self._claim_deadline = failure.failed_at + self.timings.claim_grace
        self._shorten_take(self._claim_deadline)
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel()

    # -- take ---------------------------------------------------------------------------

    def _wake_take(self) -> None:
        self._slot_event.set()

    def _capacity(self) -> int:
        if self._concurrency_fn is not None:
            try:
                wanted = self._concurrency_fn(self.concurrency)
            except Exception:
                log.exception("concurrency callable raised; keeping %d", self.concurrency)
            else:
                if isinstance(wanted, int) and not isinstance(wanted, bool) and wanted >= 1:
                    self.concurrency = wanted
                else:
                    log.error(
                        "concurrency callable returned %r; keeping %d", wanted, self.concurrency
                    )
        return self.concurrency

    def _shorten_take(self, deadline: float) -> None:
        if self._take_scope is not None:
            self._take_scope.deadline = min(self._take_scope.deadline, deadline)

    @property
    def _taking(self) -> bool:
        return not self.shutting_down and self.failure is None

    async def _take_task(self, send: trio.MemorySendChannel[HeldJob]) -> None:
        errors = 0
        async with send:
            while self._taking:
                # Takes run shielded, so a cancellation from outside lands only here.
                await trio.lowlevel.checkpoint_if_cancelled()
                free = self._capacity() - len(self.ledger)
                if free <= 0:
                    await self._wait_for_slot()
                    continue
                started = trio.current_time()
                try:
                    taken = await self._take_once(free)
                except RateLimited as exc:
                    log.warning("job-take rate limited; pausing %.1fs", exc.retry_after)
                    await self._pause(exc.retry_after)
                    continue
                except (PlatformError, TransportError) as exc:
                    errors += 1
                    await self._pause(self._error_backoff("job-take", exc, errors))
                    continue
                errors = 0
                for job in taken:
                    send.send_nowait(job)
                if not taken and trio.current_time() - started < self.timings.error_backoff_min:
                    # The platform answered "empty" without holding the poll: do not spin.
                    await self._pause(self.timings.error_backoff_min)

    def _error_backoff(self, route: str, exc: Exception, errors: int) -> float:
        """How long to wait after the *errors*-th failure in a row, logged once here."""
        timings = self.timings
        delay = backoff_delay(errors, timings.error_backoff_min, timings.error_backoff_max)
        log.error("%s failed: %s; retrying in %.2fs", route, exc, delay)
        return delay

    async def _wait_for_slot(self) -> None:
        self._slot_event = trio.Event()
        await self._idle(self._slot_event.wait)

    async def _pause(self, seconds: float) -> None:
        await self._idle(trio.sleep, seconds)

    async def _idle(self, wait: Callable[..., Awaitable[object]], *args: object) -> None:
        # Shutdown cancels whatever idle wait the take loop is in, never a take in flight.
        if not self._taking:
            return
        with trio.CancelScope() as self._idle_scope:
            await wait(*args)

    async def _take_once(self, count: int) -> list[HeldJob]:
        """One shielded take; returns the jobs to run (may be empty)."""
        deadline = trio.current_time() + self.timings.take_poll_bound
        held: list[HeldJob] = []
        with trio.CancelScope(shield=True, deadline=min(deadline, self._claim_deadline)) as scope:
            if self.shutting_down:
                scope.deadline = min(scope.deadline, self._shutdown_deadline)
            self._take_scope = scope
            try:
                response = await self.client.take(count, in_progress=len(self.ledger) > 0)
            finally:
                self._take_scope = None
            held = self._admit(response)
            if self.failure is not None and held:
                # The nursery is cancelled: nobody else will report these.
                await self._fail_all(held)
                return []
        return held

    def _admit(self, response: TakeResponse) -> list[HeldJob]:
        if response.garbled:
            log.warning("job-take answer not understood: %s", response.garbled)
        for reason in response.unaddressable:
            log.error("job-take delivered an item that cannot be reported: %s", reason)
        held = []
        admitted: list[tuple[str, dict[str, Any], str | None]]
        admitted = [(job["id"], job, None) for job in response.jobs]
        admitted += [(job_id, {"id": job_id}, why) for job_id, why in response.malformed]
        for job_id, payload, malformed in admitted:
            job = self.ledger.add(job_id, payload)
            if job is None:
                log.warning("job %s delivered again while held; ignoring the duplicate", job_id)
                continue
            control = JobControl(trio.CancelScope(deadline=self._shutdown_deadline))
            control.malformed = malformed
            self._controls[job_id] = control
            if self._recent_stops.pop(job_id, None) is not None:
                control.stop_requested = True
                control.scope.cancel()
            elif self.shutting_down and not self.gate.is_set():
                control.release_requested = True
                control.scope.cancel()
            held.append(job)
        return held

    # -- run ----------------------------------------------------------------------------

    async def _run_task(self, receive: trio.MemoryReceiveChannel[HeldJob]) -> None:
        try:
            async with trio.open_nursery() as jobs:
                self._jobs = jobs
                try:
                    async for job in receive:
                        jobs.start_soon(self._job_task, job)
                except trio.Cancelled:
                    if self.failure is not None:
                        # Jobs still queued in the channel never got a task: fail them here.
                        await self._fail_all(_drain(receive))
                    raise
        finally:
            receive.close()
            self._grace_scope.cancel()

    async def _job_task(self, job: HeldJob) -> None:
        control = self._controls[job.id]
        report: Report | None = None
        try:
            with control.scope:
                if control.stop_requested:
                    await trio.lowlevel.checkpoint()  # the scope is cancelled: lands here
                if control.malformed is not None:
                    report = self.runner.malformed_report(job.id, control.malformed)
                    self.ledger.fire(job, JobEvent.FAIL)
                else:
                    report = await self._gate_then_run(job)
        except trio.Cancelled:
            if self.failure is not None and job.state in _WAITING and not control.stop_requested:
                self.ledger.fire(job, JobEvent.FAIL)
                assert self._init_failed_body is not None
                await self._deliver(job, self._init_failed_body, is_stream=False)
            raise
        finally:
            self._finish_unreported(job, control)
        if job.state is JobState.REPORTING:
            assert report is not None
            await self._deliver(job, report.body, is_stream=report.is_stream)
            if self.refresh_worker:
                self.request_shutdown("refresh_worker: first job done")

    async def _gate_then_run(self, job: HeldJob) -> Report | None:
        if not self.gate.is_set():
            self.ledger.fire(job, JobEvent.WAIT_FOR_INIT)
            await self.gate.wait()
        self.ledger.fire(job, JobEvent.START)
        try:
            report = await self.runner.run(job)
        except BaseException as exc:
            if not is_cancellation(exc):
                raise
            grace_over = self.shutting_down and trio.current_time() >= self._shutdown_deadline
            if self._controls[job.id].stop_requested or not grace_over:
                raise
            # The shutdown grace ran out while the handler was still running.
            report = self.runner.shutdown_report(job.id, self.timings.shutdown_grace)
            self.ledger.fire(job, JobEvent.FINISH)
            return report
        self.ledger.fire(job, JobEvent.FINISH)
        return report

    def _finish_unreported(self, job: HeldJob, control: JobControl) -> None:
        """Settle a job whose scope ended without a report owed: stopped or released."""
        if job.state in _STOPPABLE and job.id in self.ledger:
            if control.stop_requested:
                log.info("job %s stopped by the platform; nothing is reported", job.id)
                self.ledger.fire(job, JobEvent.STOP)
            elif job.state in _WAITING and (control.release_requested or self.shutting_down):
                log.info("job %s released unstarted at shutdown", job.id)
                self.ledger.fire(job, JobEvent.RELEASE)
        if job.state.terminal:
            self._controls.pop(job.id, None)

    async def _deliver(self, job: HeldJob, body: bytes, *, is_stream: bool) -> None:
        """Post a terminal report, shielded under its own deadline (I5)."""
        control = self._controls.get(job.id)
        url = self.settings.platform.done_url(job.id, is_stream=is_stream)
        delivered, why = False, "report deadline passed"
        with trio.move_on_after(self.timings.report_deadline, shield=True):
            if control is not None and control.progress_in_flight:
                # Progress updates never land after the final result (docs/protocol.md §3.5).
                await control.progress_idle.wait()
            outcome = await self.client.post_report(url, body, job_id=job.id)
            delivered, why = outcome.delivered, outcome.last_error or ""
        if delivered:
            self.ledger.fire(job, JobEvent.ACKNOWLEDGE)
        else:
            log.error("RESULT LOST for job %s: job-done not delivered (%s)", job.id, why)
            self.ledger.fire(job, JobEvent.GIVE_UP)
        self._controls.pop(job.id, None)

    async def _fail_all(self, jobs: list[HeldJob]) -> None:
        """Fail *jobs* with the init failure, all at once (docs/design.md §6.4)."""
        body = self._init_failed_body
        assert body is not None
        with trio.CancelScope(shield=True):
            async with trio.open_nursery() as nursery:
                for job in jobs:
                    control = self._controls.get(job.id)
                    if control is not None and control.stop_requested:
                        # The platform already stopped it: nothing is reported (docs/design.md §9).
                        self.ledger.fire(job, JobEvent.STOP)
                        self._controls.pop(job.id, None)
                        continue
                    self.ledger.fire(job, JobEvent.FAIL)
                    nursery.start_soon(partial(self._deliver, job, body, is_stream=False))

    async def _claim_one_to_fail(self) -> None:
        """No job was ever held: take one, so the request that scaled us up learns why."""
        if self.ledger.ever_held or trio.current_time() >= self._claim_deadline:
            return
        if self.settings.platform.take_url is None:
            return
        try:
            await self._take_once(1)
        except (PlatformError, TransportError) as exc:
            log.error("could not claim a request to report the init failure: %s", exc)

    async def _expire_grace(self) -> None:
        with self._grace_scope:
            await trio.sleep_until(self._shutdown_deadline)
            # Threads that ignore check_cancelled() no longer hold the exit up.
            self.waits.cancel_all()

    # -- stop ---------------------------------------------------------------------------

    def stop_job(self, job_id: str) -> None:
        """Cancel the named job, wherever it is (queued, at the gate, running)."""
        control = self._controls.get(job_id)
        job = self.ledger.get(job_id)
        if control is None or job is None:
            now = trio.current_time()
            self._recent_stops[job_id] = now
            if len(self._recent_stops) > STOP_MEMORY_SIZE:
                self._recent_stops = {
                    k: t for k, t in self._recent_stops.items() if now - t < STOP_MEMORY_SECONDS
                }
            return
        if job.state in _STOPPABLE:
            control.stop_requested = True
            control.scope.cancel()

    async def _stop_task(self) -> None:
        if self.settings.platform.stop_url is None:
            log.warning("job-take URL has no /job-take/; the stop channel is disabled")
            return
        errors = 0
        with self._stop_scope:
            while True:
                started = trio.current_time()
                ids: list[str] = []
                try:
                    with trio.move_on_after(self.timings.stop_poll_bound):
                        ids = await self.client.poll_stop()
                except RateLimited as exc:
                    await trio.sleep(exc.retry_after)
                    continue
                except (PlatformError, TransportError) as exc:
                    errors += 1
                    await trio.sleep(self._error_backoff("job-stop", exc, errors))
                    continue
                errors = 0
                for job_id in ids:
                    self.stop_job(job_id)
                elapsed = trio.current_time() - started
                if not ids and elapsed < self.timings.empty_poll_floor:
                    await trio.sleep(self.timings.empty_poll_floor - elapsed)

    # -- progress -----------------------------------------------------------------------

    def spawn_progress(self, job_id: str, body: bytes) -> None:
        """Post a progress update in the background; must run on the trio thread."""
        control = self._controls.get(job_id)
        if control is None or self._jobs is None:
            log.warning("progress_update for job %s, which is not running; ignored", job_id)
            return
        if control.progress_in_flight == 0:
            control.progress_idle = trio.Event()
        control.progress_in_flight += 1
        self._jobs.start_soon(self._post_progress, job_id, control, body)

    async def _post_progress(self, job_id: str, control: JobControl, body: bytes) -> None:
        url = self.settings.platform.done_url(job_id, is_stream=False)
        try:
            with trio.move_on_after(self.timings.report_deadline):
                await self.client.post_report(url, body, job_id=job_id)
        finally:
            control.progress_in_flight -= 1
            if control.progress_in_flight == 0:
                control.progress_idle.set()
