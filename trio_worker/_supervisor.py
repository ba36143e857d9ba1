"""The nursery that owns the worker's life: init, take, run and stop (docs/design.md §3, §6, §9).

Theory of operation
-------------------
One nursery holds the init task, one poll loop per long-poll route (take and stop, the
same loop: :meth:`Supervisor._poll`), and the jobs' nursery, into which each take answer
starts one task per job (``_job.JobDriver``). Every fact these tasks act on lives in the
pure state (``_state``: the jobs, the ledger, the worker's phase and its deadlines), and
every wait ends by what that state says, through the one deadline registry (``_scopes``).

* **init** runs the initializer under ``init_timeout``; success opens the gate, failure
  is recorded and cancels the nursery.
* **take** long-polls job-take whenever a slot is free (woken by the ledger, never by a
  sleep loop). Each take runs *shielded*, bound to the state's ``take_end``: a stop
  shortens a take in flight, never abandons it (I8), and whatever it returns is run,
  failed or released on purpose.
* **stop** long-polls job-stop and stops the named jobs wherever they are.

On init failure every held job is failed with the same ``init_failed`` body: jobs at the
gate as the cancellation reaches them, a take in flight gets ``claim_grace`` and its jobs
are failed where it returns, and if no job was ever held, one take bounded by the same
grace claims a request to fail (docs/design.md §6). On shutdown jobs at the gate are
released, running jobs get ``shutdown_grace``; at its end a handler that swallowed the
cancellation has its ``worker_shutdown`` report sent for it (:meth:`_expire_grace`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from ._exceptions import (
    InitFailure,
    InitializationError,
    PlatformError,
    RateLimited,
    TransportError,
)
from ._initializer import run_initializer
from ._job import Capacity, JobDriver, StopMemory
from ._pacing import FoldedLog, backoff_delay, rate_limit_wait
from ._payloads import JobError
from ._progress_calls import warn_too_late
from ._scopes import at_take_end, when_stopping
from ._state import Ledger, WorkerPhase

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable

    from ._capture import OutputCapture
    from ._config import Settings, Timings
    from ._delivery import Delivery
    from ._initializer import Initializer
    from ._options import Concurrency
    from ._platform._client import PlatformClient
    from ._runner import JobRunner
    from ._state import CrashRecords, HeldJob, TransitionHook

__all__ = ["Supervisor"]

log = logging.getLogger("trio_worker")

# After the grace, a handler still running this long after its cancellation swallowed it.
UNWIND_BOUND = 1.0


class Supervisor:
    """``observers`` see every job transition; one with a ``phase_changed(before, event,
    after)`` method also sees every change of the worker's phase. *shutdown_hook* is told
    of every shutdown the worker starts itself (``refresh_worker``, a handler's
    ``sys.exit``): ``start()``'s exit guard, which arms its watchdog for each."""

    def __init__(
        self,
        *,
        settings: Settings,
        client: PlatformClient,
        delivery: Delivery,
        runner: JobRunner,
        initializer: Initializer | None,
        init_timeout: float | None,
        concurrency: Concurrency,
        capture: OutputCapture | None,
        refresh_worker: bool = False,
        observers: Iterable[TransitionHook] = (),
        records: CrashRecords | None = None,
        settled: Callable[[], None] | None = None,
    ) -> None:
        self.settings = settings
        self.timings = timings = settings.timings
        self.client = client
        self.runner = runner
        self.initializer = initializer
        self.init_timeout = init_timeout
        self.capture = capture
        self.delivery = delivery
        self.scopes = scopes = delivery.plan
        self.state = state = scopes.state
        self.ledger = Ledger(on_change=self._wake_take)
        self.ledger.records = state.records = records
        for observer in observers:
            self.ledger.observers.append(observer)
            if (phase_changed := getattr(observer, "phase_changed", None)) is not None:
                state.observers.append(phase_changed)
        self.capacity = Capacity(concurrency)
        self.stop_memory = StopMemory(timings.stop_memory, timings.stop_memory_size)
        self.gate = trio.Event()  # wakes the jobs at the gate; the truth is self.state
        self.driver = JobDriver(
            ledger=self.ledger,
            state=state,
            gate=self.gate,
            runner=runner,
            delivery=delivery,
            timings=timings,
            refresh=self._refresh if refresh_worker else None,
            slots=self.capacity.slots,
        )
        self.failure: InitFailure | None = None
        # What a handler raised to end the process (SystemExit, KeyboardInterrupt): the
        # first one wins; serve() raises it once the shutdown it started is over.
        self.exit_request: SystemExit | KeyboardInterrupt | None = None
        self.driver.on_exit = self.request_exit
        self.settled = settled  # start()'s exit: every report out, a stuck handler left
        self.shutdown_hook: Callable[[str], None] | None = None
        self._slot_event = trio.Event()
        self._take_loop_over = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._jobs: trio.Nursery | None = None
        # Both end with the jobs' nursery: nothing is left for them once every job ended.
        self._grace_scope = trio.CancelScope()
        self._cut_scope = trio.CancelScope()

    def __repr__(self) -> str:
        return (
            f"<Supervisor {self.state.phase.value} held={len(self.ledger)} "
            f"concurrency={self.capacity.value} {self.scopes!r}>"
        )

    @property
    def phase(self) -> WorkerPhase:
        return self.state.phase

    @property
    def concurrency(self) -> int:
        return self.capacity.value

    @property
    def shutting_down(self) -> bool:
        return self.phase is WorkerPhase.DRAINING

    # -- the nursery ----------------------------------------------------------------------

    async def run(self) -> None:
        """Run until shutdown (returns) or init failure (raises InitializationError)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._jobs = await nursery.start(self._run_jobs)
            nursery.start_soon(self._init_task)
            nursery.start_soon(self._poll, "job-take")
            if self.settings.platform.stop_url is None:
                log.warning("job-take URL has no /job-take/; the stop channel is disabled")
            else:
                nursery.start_soon(self._poll, "job-stop")
            nursery.start_soon(self._watch_for_a_cut)
        if self.failure is not None:
            await self._claim_one_to_fail()
            raise InitializationError(self.failure)

    def request_shutdown(self, reason: str) -> None:
        """Stop taking, release jobs at the gate, give running jobs ``shutdown_grace``."""
        if not self.state.drain(reason, now=trio.current_time()):
            return
        log.info("shutting down (%s); %d job(s) held", reason, len(self.ledger))
        self.driver.release_gated()
        if self._nursery is not None:
            self._nursery.start_soon(self._expire_grace)

    def request_exit(self, exc: SystemExit | KeyboardInterrupt) -> None:
        """A handler asked the process to exit: shut down, then ``serve()`` raises *exc*."""
        if self.exit_request is None:
            self.exit_request = exc
        self._stop_from_inside(f"a handler raised {exc!r}")

    def _refresh(self) -> None:
        self._stop_from_inside("refresh_worker: first job done")

    def _stop_from_inside(self, reason: str) -> None:
        # Through start()'s exit guard when there is one: the one place a shutdown is armed.
        if self.shutdown_hook is not None:
            self.shutdown_hook(reason)
        else:
            self.request_shutdown(reason)

    # -- init -----------------------------------------------------------------------------

    async def _init_task(self) -> None:
        if self.initializer is None:
            self._open_gate()
            return
        # A stop ends the initializer (its scope catches that): the gate then stays shut.
        with self.scopes.open_scope(when_stopping):
            failure = await run_initializer(self.initializer, self.init_timeout, self._logs)
            if failure is not None:
                self._fail_init(failure)
                return
            log.info("initializer finished; handlers may run")
            self._open_gate()

    def _open_gate(self) -> None:
        self.state.init_ok()
        self.gate.set()

    def _logs(self) -> str:
        return "" if self.capture is None else self.capture.tail(self.settings.logs_tail_chars)

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
        self.driver.init_failed_body = self.runner.payloads.error(JobError.init_failed(failure))
        self.state.fail_init("the initializer failed", failed_at=failure.failed_at)
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel()

    # -- the poll loop: take and stop -------------------------------------------------------

    async def _poll(self, route: str) -> None:
        """One long-poll route, until a stop begins: a poll whose answer was empty starts
        again no sooner than ``empty_poll_floor`` after it started, on both routes; a
        failure waits its backoff, a 429 what it asked for (one rule, ``_pacing``)."""
        backoff = Backoff(route, self.timings)
        take = route == "job-take"
        try:
            await self._poll_until_stopped(take, backoff)
        finally:
            if take:
                self._take_loop_over.set()

    async def _poll_until_stopped(self, take: bool, backoff: Backoff) -> None:
        # One scope for the whole loop: a stop ends whatever idle wait it is in, never a
        # take in flight (each runs shielded, _take_once).
        with self.scopes.open_scope(when_stopping):
            while self.state.taking or not take:
                await trio.lowlevel.checkpoint_if_cancelled()
                free = self.capacity.evaluate() - len(self.ledger)
                if take and free <= 0:
                    await self._ledger_changed()
                    continue
                started = trio.current_time()
                try:
                    got = await (self._take_once(free) if take else self._stops_once())
                except RateLimited as exc:
                    await trio.sleep(backoff.rate_limited(exc.retry_after))
                    continue
                except (PlatformError, TransportError) as exc:
                    await trio.sleep(backoff.failed(exc))
                    continue
                backoff.succeeded()
                rest = started + self.timings.empty_poll_floor - trio.current_time()
                if not got and rest > 0:
                    await trio.sleep(rest)

    async def _take_once(self, count: int) -> int:
        """One shielded take; its jobs are started (or failed) here. How many it held."""
        deadline = trio.current_time() + self.timings.take_poll_bound
        held: list[HeldJob] = []  # none, when the take's own deadline ends it
        with trio.CancelScope(shield=True, deadline=deadline) as scope:
            # A stop shortens the take in flight (take_drain, claim_grace), never cancels it.
            self.scopes.bind(scope, at_take_end)
            try:
                response = await self.client.take(count, in_progress=len(self.ledger) > 0)
            finally:
                self.scopes.unbind(scope)
            held = self.driver.admit(response, self.stop_memory.consume)
            if self.phase is WorkerPhase.INIT_FAILED and held:
                # The nursery is cancelled: nobody else will report these.
                await self.driver.fail_all(held)
                return len(held)
        assert self._jobs is not None
        for job in held:
            self._jobs.start_soon(self.driver.job_task, job)
        return len(held)

    async def _stops_once(self) -> int:
        ids: list[str] = []
        with trio.move_on_after(self.timings.stop_poll_bound):
            ids = await self.client.poll_stop()
        for job_id in ids:
            self.stop_job(job_id)
        return len(ids)

    def stop_job(self, job_id: str) -> None:
        """Stop the named job, wherever it is (queued, at the gate, running)."""
        if not self.driver.stop(job_id):
            self.stop_memory.remember(job_id, trio.current_time())

    def _wake_take(self) -> None:
        self._slot_event.set()

    async def _ledger_changed(self) -> None:
        self._slot_event = trio.Event()
        await self._slot_event.wait()

    async def _claim_one_to_fail(self) -> None:
        """No job was ever held: take one, so the request that scaled us up learns why."""
        take_end = self.state.take_end
        if self.ledger.ever_held or trio.current_time() >= take_end:
            return
        if self.settings.platform.take_url is None:
            return
        log.warning(
            "initializer failed with no job held: waiting up to %.3g s to claim a request to fail",
            take_end - trio.current_time(),
        )
        try:
            await self._take_once(1)
        except (PlatformError, TransportError) as exc:
            log.error("could not claim a request to report the init failure: %s", str(exc))
            return
        claimed = self.ledger.ever_held
        done = f"claimed {claimed} and failed it with the init failure" if claimed else "none"
        log.warning("claim wait over: %s", done)

    # -- the jobs -------------------------------------------------------------------------

    async def _run_jobs(self, *, task_status: trio.TaskStatus[trio.Nursery]) -> None:
        try:
            async with trio.open_nursery() as jobs:
                task_status.started(jobs)
                # Open to new jobs until the take loop has ended: a take in flight when a
                # stop began still starts what it brings (I8).
                await self._take_loop_over.wait()
        finally:
            self._grace_scope.cancel()
            self._cut_scope.cancel()

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
            # Handed over while the job was held, it may have ended on the way here.
            if self.delivery.progress.ended(job_id):
                warn_too_late(job_id)
            else:
                log.warning("progress_update for job %s, which is not running; ignored", job_id)
            return
        self.delivery.progress.spawn(self._jobs, job_id, body)

    # -- the end of the grace, and a cancellation of the whole worker ------------------------

    async def _expire_grace(self) -> None:
        """At the grace's end, settle what cannot settle itself: a handler that swallowed
        its cancellation (docs/design.md §9); then start()'s exit learns it may go."""
        with self._grace_scope:
            await trio.sleep_until(self.state.grace_end)
            await trio.sleep(min(UNWIND_BOUND, self.timings.exit_watchdog / 2))
            stuck = await self.driver.settle_stuck()
            if not stuck:
                return  # every task is unwinding: the run ends on its own
            while len(self.ledger):
                await self._ledger_changed()  # reports in flight, each under its deadline
            if self.settled is not None:
                self.settled()
            else:
                log.error("serve() cannot return before the handler(s) of %s return", stuck)

    async def _watch_for_a_cut(self) -> None:
        """A cancellation of the whole worker (init failure, ``serve()`` cancelled, a
        second SIGINT) would wait out every shielded report's budget: the state is cut
        instead, and every report with it (docs/design.md §5)."""
        with self._cut_scope:
            try:
                await trio.sleep_forever()
            finally:
                if not self._cut_scope.cancel_called:
                    self.state.cut_now("the worker was cancelled", now=trio.current_time())


class Backoff:
    """Consecutive failures of one long-poll route, and how long to wait after each."""

    def __init__(self, route: str, timings: Timings) -> None:
        self.route = route
        self.timings = timings
        self.errors = 0
        self._folded = FoldedLog(log, clock=trio.current_time)

    def rate_limited(self, retry_after: float | None) -> float:
        """The wait after a 429 that asked for *retry_after* seconds (None: it did not
        say); a run of them logs one line a minute."""
        delay = rate_limit_wait(retry_after, self.timings)
        self._folded.log(logging.WARNING, "%s rate limited; pausing %.1fs", self.route, delay)
        return delay

    def failed(self, exc: Exception) -> float:
        """The wait after this failure, logged once here."""
        self.errors += 1
        t = self.timings
        delay = backoff_delay(self.errors, t.error_backoff_min, t.error_backoff_max)
        # Text, never the exception: a handler that keeps records (caplog, MemoryHandler)
        # would keep its traceback and the whole finished run (tests/test_log_records.py).
        log.error("%s failed: %s; retrying in %.2fs", self.route, str(exc), delay)
        return delay

    def succeeded(self) -> None:
        self.errors = 0
