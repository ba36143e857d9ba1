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

Every fact these tasks act on lives in ``_lifecycle.py`` (each job's state, the worker's
phase, the ledger) and every choice is a pure function in ``_decisions.py``. When and how
the worker stops is ``_shutdown_plan.py``'s: a shutdown, an init failure or a cancellation
of the whole worker changes the plan in one call, and every wait (the take, the jobs, their
reports, progress and threads, the initializer, the idle and stop long-polls) reads it. This
module keeps the four tasks and their cancel scopes; ``_driver.py`` drives each job through
admission, its own task and settlement; ``_delivery.py`` posts its reports.

On init failure every held job is failed with the same ``init_failed`` body: jobs at the
gate report it as the cancellation reaches them, a take in flight gets ``claim_grace`` and
its jobs are failed in the take task, and if no job was ever held one take bounded by the
same grace claims a request to fail (docs/design.md §6). On shutdown jobs still at the gate are
released, running jobs get ``shutdown_grace`` and are then failed with ``worker_shutdown``.
"""

from __future__ import annotations

import logging
import math
from functools import partial
from typing import TYPE_CHECKING

import trio

from ._driver import JobDriver, drain
from ._exceptions import (
    InitFailure,
    InitializationError,
    PlatformError,
    RateLimited,
    TransportError,
)
from ._grace import Grace
from ._initializer import Initializer, run_initializer
from ._intake import Backoff, Capacity, StopMemory
from ._lifecycle import Ledger, PhaseEvent, Phases, WorkerPhase
from ._payloads import JobError
from ._progress import warn_too_late
from ._shutdown_plan import ShutdownPlan
from ._tracebacks import one_line

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable

    from ._capture import OutputCapture
    from ._config import Settings
    from ._delivery import Delivery
    from ._exit import ExitGuard
    from ._handlers import ThreadWaits
    from ._lifecycle import HeldJob, TransitionHook
    from ._options import Concurrency
    from ._platform._client import PlatformClient
    from ._runner import JobRunner

__all__ = ["Supervisor"]

log = logging.getLogger("trio_worker")


class Supervisor:
    """``observers`` see every job transition; one with a ``phase_changed(before, event,
    after)`` method also sees every change of the worker's phase."""

    def __init__(
        self,
        *,
        settings: Settings,
        client: PlatformClient,
        delivery: Delivery,
        runner: JobRunner,
        waits: ThreadWaits,
        initializer: Initializer | None,
        init_timeout: float | None,
        concurrency: Concurrency,
        capture: OutputCapture | None,
        refresh_worker: bool = False,
        observers: Iterable[TransitionHook] = (),
        exit_hooks: ExitGuard | None = None,
    ) -> None:
        self.settings = settings
        self.timings = timings = settings.timings
        self.client = client
        self.runner = runner
        self.initializer = initializer
        self.init_timeout = init_timeout
        self.capture = capture
        self.exit_hooks = exit_hooks
        self.ledger = Ledger(on_change=self._wake_take)
        self.phases = Phases()
        for observer in observers:
            self.ledger.observers.append(observer)
            if (phase_changed := getattr(observer, "phase_changed", None)) is not None:
                self.phases.observers.append(phase_changed)
        self.capacity = capacity = Capacity(concurrency)
        self.stop_memory = StopMemory(timings.stop_memory, timings.stop_memory_size)
        # The one owner of stopping: every wait of the worker reads it, the thread waits
        # through this listener (docs/how-it-works.md).
        self.delivery = delivery
        self.plan = plan = delivery.plan
        plan.subscribe(lambda plan: waits.end_by(plan.grace_end))
        self.gate = trio.Event()  # wakes the jobs at the gate; the truth is self.phases
        self.driver = JobDriver(
            ledger=self.ledger,
            phases=self.phases,
            gate=self.gate,
            runner=runner,
            delivery=self.delivery,
            plan=plan,
            timings=timings,
            refresh=partial(self.request_shutdown, "refresh_worker: first job done")
            if refresh_worker
            else None,
            slots=capacity.slots,
        )
        self.grace = Grace(
            driver=self.driver,
            plan=plan,
            ledger=self.ledger,
            timings=timings,
            exit_hooks=exit_hooks,
        )
        self.failure: InitFailure | None = None
        # What a handler raised to end the process (SystemExit, KeyboardInterrupt): the
        # first one wins; serve() raises it once the shutdown it started is over.
        self.exit_request: SystemExit | KeyboardInterrupt | None = None
        self.driver.on_exit = self.request_exit
        self._slot_event = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._jobs: trio.Nursery | None = None

    def __repr__(self) -> str:
        return (
            f"<Supervisor {self.phase.value} held={len(self.ledger)} "
            f"concurrency={self.capacity.value} {self.plan!r}>"
        )

    @property
    def phase(self) -> WorkerPhase:
        return self.phases.phase

    @property
    def concurrency(self) -> int:
        return self.capacity.value

    @property
    def shutting_down(self) -> bool:
        return self.phase is WorkerPhase.DRAINING

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
            nursery.start_soon(self.grace.watch)
        if self.failure is not None:
            await self._claim_one_to_fail()
            raise InitializationError(self.failure)

    def request_shutdown(self, reason: str) -> None:
        """Stop taking, release jobs at the gate, give running jobs ``shutdown_grace``."""
        if not self.phases.can(PhaseEvent.DRAIN):
            return
        log.info("shutting down (%s); %d job(s) held", reason, len(self.ledger))
        self._enter(PhaseEvent.DRAIN)
        if self.exit_hooks is not None:
            self.exit_hooks.arm(self.timings.shutdown_grace + self.timings.exit_watchdog)
        # Every wait reads the plan: the take, the jobs, their reports and threads, the
        # initializer, the idle and stop long-polls all end by what it now says.
        self.plan.drain(reason, now=trio.current_time())
        self.driver.release_gated()
        if self._nursery is not None:
            self._nursery.start_soon(self.grace.expire, self._ledger_changed)

    def request_exit(self, exc: SystemExit | KeyboardInterrupt) -> None:
        """A handler asked the process to exit: shut down, then ``serve()`` raises *exc*."""
        if self.exit_request is None:
            self.exit_request = exc
        self.request_shutdown(f"a handler raised {exc!r}")

    def _enter(self, event: PhaseEvent) -> None:
        self.phases.fire(event)
        if self.phases.gate_open:
            self.gate.set()

    # -- init ---------------------------------------------------------------------------

    async def _init_task(self) -> None:
        if self.initializer is None:
            self._enter(PhaseEvent.INIT_OK)
            return
        with self.plan.open_scope(ShutdownPlan.when_stopping):
            failure = await run_initializer(self.initializer, self.init_timeout, self._init_logs)
            if failure is None:
                log.info("initializer finished; handlers may run")
                self._enter(PhaseEvent.INIT_OK)
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
            one_line(failure.message),
            failure.category,
            len(self.ledger),
        )
        self.failure = failure
        self.driver.init_failed_body = self.runner.payloads.error(JobError.init_failed(failure))
        self.plan.fail_init("the initializer failed", failed_at=failure.failed_at)
        self._enter(PhaseEvent.INIT_FAIL)
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel()

    # -- take ---------------------------------------------------------------------------

    def _wake_take(self) -> None:
        self._slot_event.set()

    @property
    def _taking(self) -> bool:
        return self.phase in (WorkerPhase.INITIALIZING, WorkerPhase.READY)

    async def _take_task(self, send: trio.MemorySendChannel[HeldJob]) -> None:
        # A stop ends whatever idle wait the loop is in (a wait for a slot, a backoff),
        # never a take in flight (each runs shielded, _take_once). One scope for the whole
        # loop rather than one per wait: a take at concurrency 8 waited for a slot about
        # once per two jobs, and each scope cost trio about 5 us of CPU. A drain or a failed
        # initializer also ends _taking, so the loop has nothing left to do; a worker
        # cancelled as a whole cancels the loop from outside.
        async with send:
            with self.plan.open_scope(ShutdownPlan.when_stopping):
                await self._take_loop(send)

    async def _take_loop(self, send: trio.MemorySendChannel[HeldJob]) -> None:
        backoff = Backoff("job-take", self.timings)
        while self._taking:
            # Takes run shielded, so a cancellation lands only here or in an idle wait.
            await trio.lowlevel.checkpoint_if_cancelled()
            free = self.capacity.evaluate() - len(self.ledger)
            if free <= 0:
                await self._wait_for_slot()
                continue
            started = trio.current_time()
            try:
                taken = await self._take_once(free)
            except RateLimited as exc:
                await self._pause(backoff.rate_limited(exc.retry_after))
                continue
            except (PlatformError, TransportError) as exc:
                await self._pause(backoff.failed(exc))
                continue
            backoff.succeeded()
            for job in taken:
                send.send_nowait(job)
            if not taken and trio.current_time() - started < self.timings.error_backoff_min:
                # The platform answered "empty" without holding the poll: do not spin.
                await self._pause(self.timings.error_backoff_min)

    async def _wait_for_slot(self) -> None:
        await self._idle(self._ledger_changed)

    async def _ledger_changed(self) -> None:
        self._slot_event = trio.Event()
        await self._slot_event.wait()

    async def _pause(self, seconds: float) -> None:
        await self._idle(trio.sleep, seconds)

    async def _idle(self, wait: Callable[..., Awaitable[object]], *args: object) -> None:
        # The take loop's one scope (_take_task) ends whatever idle wait it is in at a stop.
        if not self._taking:
            return
        await wait(*args)

    async def _take_once(self, count: int) -> list[HeldJob]:
        """One shielded take; returns the jobs to run (may be empty)."""
        deadline = trio.current_time() + self.timings.take_poll_bound
        held: list[HeldJob] = []
        with trio.CancelScope(shield=True, deadline=deadline) as scope:
            # A stop shortens the take in flight (take_drain, claim_grace), never cancels it.
            self.plan.bind(scope, lambda plan: plan.take_end)
            try:
                response = await self.client.take(count, in_progress=len(self.ledger) > 0)
            finally:
                self.plan.unbind(scope)
            held = self.driver.admit(response, self.stop_memory.consume)
            if self.phase is WorkerPhase.INIT_FAILED and held:
                # The nursery is cancelled: nobody else will report these.
                await self.driver.fail_all(held)
                return []
        return held

    # -- run ----------------------------------------------------------------------------

    async def _run_task(self, receive: trio.MemoryReceiveChannel[HeldJob]) -> None:
        try:
            async with trio.open_nursery() as jobs:
                self._jobs = jobs
                try:
                    async for job in receive:
                        jobs.start_soon(self.driver.job_task, job)
                except trio.Cancelled:
                    if self.phase is WorkerPhase.INIT_FAILED:
                        # Jobs still queued in the channel never got a task: fail them here.
                        await self.driver.fail_all(drain(receive))
                    raise
        finally:
            receive.close()
            self.grace.end()

    async def _claim_one_to_fail(self) -> None:
        """No job was ever held: take one, so the request that scaled us up learns why."""
        if self.ledger.ever_held or trio.current_time() >= self.plan.take_end:
            return
        if self.settings.platform.take_url is None:
            return
        wait = self.plan.take_end - trio.current_time()
        log.warning(
            "initializer failed with no job held: waiting up to %.3g s to claim a request to fail",
            wait,
        )
        try:
            await self._take_once(1)
        except (PlatformError, TransportError) as exc:
            log.error("could not claim a request to report the init failure: %s", str(exc))
            return
        claimed = self.ledger.ever_held
        done = f"claimed {claimed} and failed it with the init failure" if claimed else "none"
        log.warning("claim wait over: %s", done)

    # -- stop ---------------------------------------------------------------------------

    def stop_job(self, job_id: str) -> None:
        """Cancel the named job, wherever it is (queued, at the gate, running)."""
        if not self.driver.stop(job_id):
            self.stop_memory.remember(job_id, trio.current_time())

    async def _stop_task(self) -> None:
        if self.settings.platform.stop_url is None:
            log.warning("job-take URL has no /job-take/; the stop channel is disabled")
            return
        backoff = Backoff("job-stop", self.timings)
        with self.plan.open_scope(ShutdownPlan.when_stopping):
            while True:
                started = trio.current_time()
                ids: list[str] = []
                try:
                    with trio.move_on_after(self.timings.stop_poll_bound):
                        ids = await self.client.poll_stop()
                except RateLimited as exc:
                    await trio.sleep(backoff.rate_limited(exc.retry_after))
                    continue
                except (PlatformError, TransportError) as exc:
                    await trio.sleep(backoff.failed(exc))
                    continue
                backoff.succeeded()
                for job_id in ids:
                    self.stop_job(job_id)
                elapsed = trio.current_time() - started
                if not ids and elapsed < self.timings.empty_poll_floor:
                    await trio.sleep(self.timings.empty_poll_floor - elapsed)

    # -- progress -----------------------------------------------------------------------

    def spawn_beside_jobs(self, task: Callable[[], Awaitable[None]]) -> bool:
        """Start *task* in the jobs' nursery (work shared by several jobs, which none of
        their cancellations may cut short); False when that nursery is not open."""
        if self._jobs is None:
            return False
        try:
            self._jobs.start_soon(task)
        except RuntimeError:  # closed: the worker is past running jobs
            return False
        return True

    def spawn_progress(self, job_id: str, body: bytes) -> None:
        """Post a progress update in the background; must run on the trio thread."""
        if job_id not in self.ledger or self._jobs is None:
            if self.delivery.progress.ended(job_id):
                warn_too_late(job_id)
            else:
                log.warning("progress_update for job %s, which is not running; ignored", job_id)
            return
        self.delivery.progress.spawn(self._jobs, job_id, body)
