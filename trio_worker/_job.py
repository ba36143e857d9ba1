"""Driving each held job through its states: admission, its task and scope, settlement
(docs/how-it-works.md, "The job state machine"; every decision is ``_state``'s)."""

from __future__ import annotations

import logging
from collections import OrderedDict
from functools import partial
from typing import TYPE_CHECKING, Any

import trio

from ._backends._handler_calls import is_cancellation
from ._pacing import FoldedLog
from ._scopes import at_grace_end
from ._state import (
    ADMISSION_EVENTS,
    Admission,
    JobEvent,
    JobState,
    Outcome,
    WorkerPhase,
    on_admit,
    on_cancelled,
    on_delivered,
    on_stuck,
    releases_at_shutdown,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._config import Timings
    from ._delivery import Delivery
    from ._options import Concurrency
    from ._platform._client import TakeResponse
    from ._runner import JobRunner, Report
    from ._state import HeldJob, Ledger, WorkerState

log = logging.getLogger("trio_worker")


class JobDriver:
    def __init__(
        self,
        *,
        ledger: Ledger,
        state: WorkerState,
        gate: trio.Event,
        runner: JobRunner,
        delivery: Delivery,
        timings: Timings,
        refresh: Callable[[], None] | None,
        slots: Slots,
    ) -> None:
        self.ledger = ledger
        self.state = state
        self.gate = gate
        self.runner = runner
        self.delivery = delivery
        self.scopes = delivery.plan
        self.timings = timings
        self.refresh = refresh
        self.slots = slots
        self.init_failed_body: bytes | None = None
        # Set by the supervisor: a handler raised SystemExit/KeyboardInterrupt.
        self.on_exit: Callable[[SystemExit | KeyboardInterrupt], None] | None = None
        self._scopes: dict[str, trio.CancelScope] = {}

    def __repr__(self) -> str:
        states = ", ".join(f"{job.id}: {job.state.value}" for job in self.ledger)
        return f"<JobDriver {self.state.phase.value} jobs={{{states}}} scopes={len(self._scopes)}>"

    def fire(self, job: HeldJob, event: JobEvent) -> None:
        if self.ledger.fire(job, event).terminal:
            scope = self._scopes.pop(job.id, None)
            if scope is not None:
                self.scopes.unbind(scope)

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
            self.scopes.bind(scope, at_grace_end)
            job.reason = malformed or ""
            held.append((job, malformed is not None))
        # Every job of the answer is held before any of them moves (the ledger is the take).
        for job, is_malformed in held:
            admission = on_admit(
                self.state.phase,
                gate_open=self.state.gate_open,
                stop_remembered=stop_remembered(job.id),
                malformed=is_malformed,
            )
            if admission is Admission.RUN:
                self.slots.queue(job.id)  # handler slots go in this order (Slots)
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
            if releases_at_shutdown(job.state, gate_open=self.state.gate_open):
                self.request(job, JobEvent.REQUEST_RELEASE)

    # -- one job's task -------------------------------------------------------------------

    async def job_task(self, job: HeldJob) -> None:
        try:
            await self._run_and_report(job)
        finally:
            self.slots.forget(job.id)  # stopped, released or failed before its turn
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
        if not self.state.gate_open:
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
        """One of the ``concurrency`` handler slots (docs/design.md §4 I7), for the
        handler's run only (released by the caller)."""
        if self.slots.take_nowait(job.id):
            return
        self.fire(job, JobEvent.WAIT_FOR_SLOT)
        if self.state.phase is WorkerPhase.DRAINING:
            # Delivered during a shutdown with no slot free: it would never start in time.
            self.request(job, JobEvent.REQUEST_RELEASE)
        await self._unwind_if_requested(job)
        await self.slots.take(job.id)
        if job.state is not JobState.WAITING_FOR_SLOT:
            # A stop or release in the same step as the slot freed: it wins.
            self.slots.release()
            await self._unwind_if_requested(job)

    def _outcome(self, job: HeldJob) -> Outcome:
        grace_over = self.state.grace_over(trio.current_time())
        return on_cancelled(job.state, self.state.phase, grace_over=grace_over)

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
            self.state.phase, delivered=delivered, refresh_worker=self.refresh is not None
        )
        self.fire(job, event)
        if drain and self.refresh is not None:
            self.refresh()

    async def settle_stuck(self) -> list[str]:
        """Settle the jobs whose handler swallowed the shutdown's cancellation (their tasks
        never end): a running one is reported ``worker_shutdown`` here, a stopped one is
        stopped (``on_stuck``; docs/design.md §9). Returns the ids settled."""
        stuck = [
            (job, outcome)
            for job in self.ledger
            if (outcome := on_stuck(job.state)) is not Outcome.PROPAGATE
        ]
        # No shield here: each report shields itself (Delivery.deliver) before its first
        # checkpoint, and a nursery waits for its children even when cancelled.
        async with trio.open_nursery() as nursery:
            for job, outcome in stuck:
                log.error(
                    "job %s: its handler ignored the cancellation at the end of the "
                    "shutdown grace and is still running; settling it without it",
                    job.id,
                )
                job.abandoned = True
                if outcome is Outcome.STOP:
                    self.fire(job, JobEvent.STOP)
                    continue
                self.fire(job, JobEvent.FINISH)
                report = self.runner.shutdown_report(job.id, self.timings.shutdown_grace)
                nursery.start_soon(
                    partial(self._report, job, report.body, is_stream=report.is_stream)
                )
        return [job.id for job, _ in stuck]

    async def fail_all(self, jobs: list[HeldJob]) -> None:
        """Fail *jobs* with the init failure, all at once (docs/design.md §6.4)."""
        # Unshielded on purpose, as settle_stuck: every report shields itself.
        async with trio.open_nursery() as nursery:
            for job in jobs:
                body = self._settle_now(job)
                if body is not None:
                    nursery.start_soon(partial(self._report, job, body, is_stream=False))


class Slots:
    """The ``concurrency`` handler slots, handed out in the order the jobs were admitted: a
    take answer's jobs start in the order the platform sent them, oldest first, whichever
    of their tasks runs first. A slot freed goes to the oldest job waiting for one."""

    def __init__(self, total: int) -> None:
        self._total = total
        self.used = 0
        self._admitted = 0
        # In admission order: each job's number, and its wake-up once it waits (None: its
        # task has not asked yet, and a slot may be kept for it). An OrderedDict: its first
        # item is O(1) after any number of pops from the front (a plain dict's is not).
        self._queue: OrderedDict[str, list[Any]] = OrderedDict()

    @property
    def total(self) -> int:
        return self._total

    @total.setter
    def total(self, value: int) -> None:
        self._total = value
        self._grant()

    def queue(self, job_id: str) -> None:
        """A job was admitted: its turn for a slot comes after every job admitted before."""
        self._queue[job_id] = [self._admitted, None]
        self._admitted += 1

    def take_nowait(self, job_id: str) -> bool:
        """Take a slot now if enough are free for it and every job queued before it (the
        count of those is at most the difference of their numbers: O(1))."""
        turn = self._queue.get(job_id)
        if turn is None:
            return False
        first = next(iter(self._queue.values()))[0]
        if turn[0] - first >= self._total - self.used:
            return False
        del self._queue[job_id]
        self.used += 1
        if turn[0] == first:
            # A later job may be waiting behind this one only because the bound above
            # counted it: its turn may have come.
            self._grant()
        return True

    async def take(self, job_id: str) -> None:
        """Wait for this job's turn and a free slot."""
        granted = self._queue[job_id][1] = trio.Event()
        self._grant()
        try:
            await granted.wait()
        except BaseException:
            if granted.is_set():  # granted as the cancellation came: give it back
                self.release()
            raise
        finally:
            self.forget(job_id)

    def release(self) -> None:
        self.used -= 1
        self._grant()

    def forget(self, job_id: str) -> None:
        """The job needs no slot any more (stopped, released, failed, or it has one)."""
        if self._queue.pop(job_id, None) is not None:
            self._grant()

    def _grant(self) -> None:
        while self.used < self._total and self._queue:
            job_id, (_, waiting) = next(iter(self._queue.items()))
            if waiting is None:
                return  # its task has not asked yet: the slot is kept for it
            del self._queue[job_id]
            self.used += 1
            waiting.set()


class Capacity:
    """The concurrency in force: a fixed int, or ``f(current) -> int`` asked before every
    take (a bad answer or an exception keeps the current value). ``slots`` admits that many
    handlers at once, whatever a take delivered; its total follows every evaluation."""

    def __init__(self, concurrency: Concurrency) -> None:
        self._fn = concurrency if callable(concurrency) else None
        self.value = 1 if callable(concurrency) else concurrency
        self.slots = Slots(self.value)
        # It is asked before every take: a broken one would write a line per take.
        self._complaints = FoldedLog(log)

    def evaluate(self) -> int:
        if self._fn is None:
            return self.value
        try:
            wanted = self._fn(self.value)
        except Exception:
            message = "concurrency callable raised; keeping %d"
            self._complaints.log(logging.ERROR, message, self.value, exc_info=True)
            return self.value
        if isinstance(wanted, int) and not isinstance(wanted, bool) and wanted >= 1:
            self.value = self.slots.total = wanted
        else:
            message = "concurrency callable returned %r; keeping %d"
            self._complaints.log(logging.ERROR, message, wanted, self.value)
        return self.value


class StopMemory:
    """Stops for ids not (yet) held: the take that delivers the job may still be on the
    wire (docs/protocol.md §8 item 6; the bound: docs/security.md).

    At most *size* ids are kept: past it, those older than *seconds* go, then the oldest.
    Kept in arrival order (the clock never goes back), so forgetting pops from the front.
    """

    def __init__(self, seconds: float, size: int) -> None:
        self.seconds = seconds
        self.size = size
        self._stops: OrderedDict[str, float] = OrderedDict()
        self.forgotten_early = 0  # recent stops dropped because of the size bound

    def __len__(self) -> int:
        return len(self._stops)

    def remember(self, job_id: str, now: float) -> None:
        stops = self._stops
        stops[job_id] = now
        stops.move_to_end(job_id)  # a repeated stop goes to the back, with its new time
        if len(stops) <= self.size:
            return
        while stops:
            oldest = next(iter(stops))
            if now - stops[oldest] < self.seconds:
                if len(stops) <= self.size:
                    return
                self.forgotten_early += 1
            del stops[oldest]

    def consume(self, job_id: str) -> bool:
        """Whether a stop for *job_id* was remembered; it is forgotten either way."""
        return self._stops.pop(job_id, None) is not None
