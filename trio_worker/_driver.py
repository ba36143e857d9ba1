"""Driving each held job through its states: admission, its task and scope, settlement.

Theory of operation
-------------------
The supervisor's take task hands each take answer to :meth:`JobDriver.admit`, which holds
the jobs in the ledger, gives each a cancel scope, and applies ``on_admit``. The run task
starts :meth:`JobDriver.job_task` per job: inside the job's scope it reports a malformed
job, or waits at the gate and runs the handler; a cancellation is settled by
``on_cancelled`` (stopped, released, failed with the init failure, or cut by the end of the
shutdown grace); the report goes out shielded and ``on_delivered`` settles it. A stop or a
release is *requested* by firing its event and cancelling the job's scope, so the task
unwinds and settles the job itself.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING, Any

import trio

from ._decisions import (
    ADMISSION_EVENTS,
    Outcome,
    on_admit,
    on_cancelled,
    on_delivered,
    on_stuck,
    releases_at_shutdown,
)
from ._handlers import is_cancellation
from ._lifecycle import JobEvent, JobState, WorkerPhase

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._config import Timings
    from ._delivery import Delivery
    from ._lifecycle import HeldJob, Ledger, Phases
    from ._platform._wire import TakeResponse
    from ._runner import JobRunner, Report
    from ._shutdown_plan import ShutdownPlan

log = logging.getLogger("trio_worker")


def _grace_end(plan: ShutdownPlan) -> float:
    return plan.grace_end


def drain(receive: trio.MemoryReceiveChannel[HeldJob]) -> list[HeldJob]:
    """The jobs still queued in *receive*, taken without waiting."""
    jobs = []
    while True:
        try:
            jobs.append(receive.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
            return jobs


class JobDriver:
    def __init__(
        self,
        *,
        ledger: Ledger,
        phases: Phases,
        gate: trio.Event,
        runner: JobRunner,
        delivery: Delivery,
        plan: ShutdownPlan,
        timings: Timings,
        refresh: Callable[[], None] | None,
        slots: trio.CapacityLimiter,
    ) -> None:
        self.ledger = ledger
        self.phases = phases
        self.gate = gate
        self.runner = runner
        self.delivery = delivery
        self.plan = plan
        self.timings = timings
        self.refresh = refresh
        self.slots = slots
        self.init_failed_body: bytes | None = None
        # Set by the supervisor: a handler raised SystemExit/KeyboardInterrupt.
        self.on_exit: Callable[[SystemExit | KeyboardInterrupt], None] | None = None
        self._scopes: dict[str, trio.CancelScope] = {}

    def __repr__(self) -> str:
        states = ", ".join(f"{job.id}: {job.state.value}" for job in self.ledger)
        return f"<JobDriver {self.phases.phase.value} jobs={{{states}}} scopes={len(self._scopes)}>"

    def fire(self, job: HeldJob, event: JobEvent) -> None:
        if self.ledger.fire(job, event).terminal:
            scope = self._scopes.pop(job.id, None)
            if scope is not None:
                self.plan.unbind(scope)

    def request(self, job: HeldJob, event: JobEvent) -> None:
        """Fire a stop or release request and cancel the job's scope, so its task unwinds."""
        self.fire(job, event)
        self._scopes[job.id].cancel()

    # -- admission, stop, shutdown --------------------------------------------------------

    def admit(
        self, response: TakeResponse, stop_remembered: Callable[[str], bool]
    ) -> list[HeldJob]:
        if response.garbled:
            log.warning("job-take answer not understood: %s", response.garbled)
        for reason in response.unaddressable:
            log.error("job-take delivered an item that cannot be reported: %s", reason)
        held: list[tuple[HeldJob, bool]] = []
        admitted: list[tuple[str, dict[str, Any], str | None]]
        admitted = [(job["id"], job, None) for job in response.jobs]
        admitted += [(job_id, {"id": job_id}, why) for job_id, why in response.malformed]
        for job_id, payload, malformed in admitted:
            job = self.ledger.add(job_id, payload)
            if job is None:
                log.warning("job %s delivered again while held; ignoring the duplicate", job_id)
                continue
            # A job's scope ends with the shutdown's grace (docs/design.md §9).
            self._scopes[job_id] = scope = trio.CancelScope()
            self.plan.bind(scope, _grace_end)
            job.reason = malformed or ""
            held.append((job, malformed is not None))
        # Every job of the answer is held before any of them moves (the ledger is the take).
        for job, is_malformed in held:
            admission = on_admit(
                self.phases.phase,
                gate_open=self.phases.gate_open,
                stop_remembered=stop_remembered(job.id),
                malformed=is_malformed,
            )
            event = ADMISSION_EVENTS.get(admission)
            if event is JobEvent.MARK_MALFORMED:
                self.fire(job, event)
            elif event is not None:
                self.request(job, event)
        return [job for job, _ in held]

    def stop(self, job_id: str) -> bool:
        """Stop a held job wherever it is; False when *job_id* is not held."""
        job = self.ledger.get(job_id)
        if job is None:
            return False
        if job.can(JobEvent.REQUEST_STOP):
            self.request(job, JobEvent.REQUEST_STOP)
        return True

    def release_gated(self) -> None:
        """A shutdown began: release the held jobs that would not start in its grace
        (``releases_at_shutdown``); the plan gave every job's scope the grace's end."""
        for job in self.ledger:
            if job.id not in self._scopes:
                continue
            if releases_at_shutdown(job.state, gate_open=self.phases.gate_open):
                self.request(job, JobEvent.REQUEST_RELEASE)

    # -- one job's task -------------------------------------------------------------------

    async def job_task(self, job: HeldJob) -> None:
        try:
            await self._run_and_report(job)
        finally:
            # Stopped, released or reported: no progress update of the job may go on.
            self.delivery.progress.discard(job.id)

    async def _run_and_report(self, job: HeldJob) -> None:
        report: Report | None = None
        try:
            with self._scopes[job.id]:
                report = await self._prepare(job)
        except trio.Cancelled:
            # From outside the job's scope: init failed, or serve() itself was cancelled.
            await self._settle(job)
            raise
        if report is None:
            # The job's own scope caught a stop, a release or the end of the grace.
            await self._settle(job)
        else:
            if report.exit is not None and self.on_exit is not None:
                # Stop taking at once; this report still goes out (docs/design.md §9).
                self.on_exit(report.exit)
            await self._report(job, report.body, is_stream=report.is_stream)

    async def _unwind_if_requested(self, job: HeldJob) -> None:
        if job.state in (JobState.STOPPING, JobState.RELEASING):
            await trio.lowlevel.checkpoint()  # the job's scope is cancelled: this raises

    async def _prepare(self, job: HeldJob) -> Report | None:
        """Inside the job's scope: the report on a malformed job, or the handler's (None
        when the job was settled on its behalf meanwhile)."""
        await self._unwind_if_requested(job)
        if job.state is JobState.MALFORMED:
            self.fire(job, JobEvent.FAIL)
            return self.runner.malformed_report(job.id, job.reason)
        if not self.phases.gate_open:
            self.fire(job, JobEvent.WAIT_FOR_INIT)
            await self.gate.wait()
            # A stop or release in the same step as the gate opened: it wins.
            await self._unwind_if_requested(job)
        await self._take_slot(job)
        try:
            self.fire(job, JobEvent.START)
            report = await self.runner.run(job)
        except BaseException as exc:
            if not is_cancellation(exc) or self._outcome(job) is not Outcome.REPORT_SHUTDOWN:
                raise
            # The shutdown grace ran out while the handler was still running.
            report = self.runner.shutdown_report(job.id, self.timings.shutdown_grace)
        finally:
            self.slots.release()
        if job.abandoned:
            return None  # settled on its behalf after the grace (see settle_stuck)
        self.fire(job, JobEvent.FINISH)
        return report

    async def _take_slot(self, job: HeldJob) -> None:
        """One of the ``concurrency`` handler slots, for the handler's run only (released
        by the caller).

        A take may deliver more jobs than asked for: every one is held (pinged, owed a
        report), but no more than ``concurrency`` handlers run at once (docs/design.md §4 I7).
        """
        try:
            self.slots.acquire_nowait()
        except trio.WouldBlock:
            self.fire(job, JobEvent.WAIT_FOR_SLOT)
            if self.phases.phase is WorkerPhase.DRAINING:
                # Delivered during a shutdown with no slot free: it would never start in time.
                self.request(job, JobEvent.REQUEST_RELEASE)
            await self._unwind_if_requested(job)
            await self.slots.acquire()
            if job.state is not JobState.WAITING_FOR_SLOT:
                # A stop or release in the same step as the slot freed: it wins.
                self.slots.release()
                await self._unwind_if_requested(job)

    def _outcome(self, job: HeldJob) -> Outcome:
        grace_over = self.plan.grace_over(trio.current_time())
        return on_cancelled(job.state, self.phases.phase, grace_over=grace_over)

    def _settle_now(self, job: HeldJob) -> bytes | None:
        """Settle a cancelled job (``on_cancelled``); the body it is owed, if any."""
        outcome = self._outcome(job)
        if outcome is Outcome.STOP:
            log.info("job %s stopped by the platform; nothing is reported", job.id)
            self.fire(job, JobEvent.STOP)
        elif outcome is Outcome.RELEASE:
            log.info("job %s released unstarted at shutdown", job.id)
            self.fire(job, JobEvent.RELEASE)
        elif outcome is Outcome.REPORT_INIT_FAILURE:
            self.fire(job, JobEvent.FAIL)
            return self.init_failed_body
        return None

    async def _settle(self, job: HeldJob) -> None:
        body = self._settle_now(job)
        if body is not None:
            await self._report(job, body, is_stream=False)

    async def _report(self, job: HeldJob, body: bytes, *, is_stream: bool) -> None:
        delivered = await self.delivery.deliver(job.id, body, is_stream=is_stream)
        event, drain = on_delivered(
            self.phases.phase, delivered=delivered, refresh_worker=self.refresh is not None
        )
        self.fire(job, event)
        if drain and self.refresh is not None:
            self.refresh()

    async def settle_stuck(self) -> list[str]:
        """Settle the jobs whose handler swallowed the shutdown's cancellation: a running
        one is reported ``worker_shutdown`` here, a stopped one is stopped (``on_stuck``).

        Their tasks can never end, but the reports they owe go out (docs/design.md §9).
        Returns the ids settled.
        """
        stuck = [job for job in self.ledger if on_stuck(job.state) is not Outcome.PROPAGATE]
        # No shield here: each report shields itself (Delivery.deliver) before its first
        # checkpoint, and a nursery waits for its children even when cancelled.
        async with trio.open_nursery() as nursery:
            for job in stuck:
                log.error(
                    "job %s: its handler ignored the cancellation at the end of the "
                    "shutdown grace and is still running; settling it without it",
                    job.id,
                )
                job.abandoned = True
                if on_stuck(job.state) is Outcome.STOP:
                    self.fire(job, JobEvent.STOP)
                    continue
                self.fire(job, JobEvent.FINISH)
                report = self.runner.shutdown_report(job.id, self.timings.shutdown_grace)
                nursery.start_soon(
                    partial(self._report, job, report.body, is_stream=report.is_stream)
                )
        return [job.id for job in stuck]

    async def fail_all(self, jobs: list[HeldJob]) -> None:
        """Fail *jobs* with the init failure, all at once (docs/design.md §6.4)."""
        # Unshielded on purpose, as settle_stuck: every report shields itself.
        async with trio.open_nursery() as nursery:
            for job in jobs:
                body = self._settle_now(job)
                if body is not None:
                    nursery.start_soon(partial(self._report, job, body, is_stream=False))
