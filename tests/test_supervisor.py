"""The supervisor in virtual time: the real worker against the in-process fake platform.

These pin down orderings that loopback tests cannot hit on purpose: a take in flight at
the moment init fails, a stop for a job still queued, a concurrency callable that grows and
shrinks, a shutdown while a long-poll holds.
"""

from __future__ import annotations

import asyncio
import functools
import json
import threading
from collections.abc import Awaitable, Callable
from typing import Any, cast

import pytest
import trio

import trio_worker
import trio_worker.testing
from tests.backends import ASYNCIO_ONLY, BOTH_BACKENDS, sleep_for
from trio_worker._options import AsyncBackend
from trio_worker._pacing import RATE_LIMIT_JITTER
from trio_worker.testing import FakePlatform, Fault

Handler = Callable[[dict[str, Any]], Any]


class Harness:
    """The worker on *backend* (its ``async_backend``) against *platform*, in process."""

    def __init__(self, platform: FakePlatform, backend: str = "trio") -> None:
        self.platform = platform
        self.backend = backend
        self.environ = platform.worker_env("http://platform", ping_interval_ms=1000)
        self.error: BaseException | None = None
        self.finished = trio.Event()
        self._changed = trio.Event()

    def _observe(self, job: object, before: object, event: object) -> None:
        self._changed.set()

    async def wait_until(self, condition: Callable[[], bool]) -> None:
        """Wait for *condition*, re-checked after every job transition."""
        with trio.fail_after(60):
            while not condition():
                self._changed = trio.Event()
                await self._changed.wait()

    async def start(
        self, nursery: trio.Nursery, handler: Handler, **kwargs: Any
    ) -> trio_worker.WorkerHandle:
        kwargs.setdefault(
            "timings", trio_worker.Timings(claim_grace=3.0, report_deadline=2.0, report_budget=2.0)
        )
        observers = [self._observe, *kwargs.pop("observers", ())]

        async def run(task_status: trio.TaskStatus[trio_worker.WorkerHandle]) -> None:
            try:
                await trio_worker.testing.serve(
                    handler,
                    # serve() itself refuses a name that is neither.
                    async_backend=cast("AsyncBackend", self.backend),
                    environ=self.environ,
                    app=self.platform,
                    heartbeat="task",
                    handle_signals=False,
                    capture_logs="off",
                    task_status=task_status,
                    observers=observers,
                    **kwargs,
                )
            except trio_worker.InitializationError as exc:
                self.error = exc
            finally:
                self.finished.set()

        handle: trio_worker.WorkerHandle = await nursery.start(run)
        return handle


@pytest.fixture
def harness(backend: str) -> Harness:
    # Each test requests ``virtual_clock`` itself: pytest-trio picks the run's clock from
    # the test's own arguments, not from fixtures' dependencies.
    return Harness(FakePlatform(take_hold=5.0, stop_hold=5.0), backend)


def error_of(platform: FakePlatform, job_id: str) -> dict[str, Any]:
    record = platform.job(job_id)
    assert len(record.done_reports) == 1, record.done_reports
    body = record.done_reports[0]
    assert isinstance(body, dict)
    parsed = json.loads(body["error"])
    assert isinstance(parsed, dict)
    return parsed


def echo_on(backend: str) -> Callable[[dict[str, Any]], Awaitable[Any]]:
    """An async handler in *backend*'s own code: sleeps ``input.seconds``, returns its input."""
    sleep = sleep_for(backend)

    async def echo(job: dict[str, Any]) -> Any:
        await sleep(float(job["input"].get("seconds", 0)))
        return job["input"]

    return echo


@BOTH_BACKENDS
async def test_take_in_flight_at_init_failure_gets_claim_grace_and_its_job_is_failed(
    backend: str, harness: Harness, nursery: trio.Nursery, virtual_clock: trio.abc.Clock
) -> None:
    async def init() -> None:
        await sleep_for(backend)(1.0)
        raise RuntimeError("engine crashed")

    await harness.start(nursery, echo_on(backend), initializer=init, concurrency=2)
    # The first (batch) take gets one job; the single take for the free slot long-polls
    # across the failure at t=1.
    first = harness.platform.enqueue({})
    await harness.platform.wait_for_requests("take", 1)
    await trio.sleep(1.5)  # the failure happened at t=1; the take is still in flight
    late = harness.platform.enqueue({})
    await harness.finished.wait()
    assert harness.error is not None
    for job_id in (first, late):
        assert error_of(harness.platform, job_id)["event"] == "init_failed"
    assert harness.platform.job(late).take_time is not None


@BOTH_BACKENDS
async def test_take_in_flight_is_cut_at_claim_grace(
    backend: str, harness: Harness, nursery: trio.Nursery, virtual_clock: trio.abc.Clock
) -> None:
    async def init() -> None:
        raise RuntimeError("bad config")

    harness.platform.take_hold = 60.0
    started = trio.current_time()
    await harness.start(nursery, echo_on(backend), initializer=init)
    await harness.finished.wait()
    # claim_grace=3: the worker does not wait out the 60 s long-poll.
    assert trio.current_time() - started == pytest.approx(3.0, abs=0.01)


@BOTH_BACKENDS
async def test_stop_for_a_queued_job_before_it_is_taken_is_remembered(
    backend: str, harness: Harness, nursery: trio.Nursery, virtual_clock: trio.abc.Clock
) -> None:
    handle = await harness.start(nursery, echo_on(backend))
    handle.stop_job("not-yet-taken")
    harness.platform.enqueue({"seconds": 30}, job_id="not-yet-taken")
    other = harness.platform.enqueue({})
    await harness.platform.wait_for_status(other, "COMPLETED")
    assert harness.platform.job("not-yet-taken").done_reports == []
    assert "not-yet-taken" not in handle.held_ids


@BOTH_BACKENDS
async def test_stop_of_a_job_waiting_at_the_gate(
    backend: str, harness: Harness, nursery: trio.Nursery, virtual_clock: trio.abc.Clock
) -> None:
    async def init() -> None:
        await sleep_for(backend)(100)

    handle = await harness.start(nursery, echo_on(backend), initializer=init)
    job_id = harness.platform.enqueue({})
    await harness.wait_until(lambda: bool(handle.held_ids))
    assert handle.held_ids == (job_id,)
    harness.platform.request_stop(job_id)
    await harness.wait_until(lambda: not handle.held_ids)
    assert harness.platform.job(job_id).done_reports == []


@BOTH_BACKENDS
async def test_a_sync_initializer_runs_in_a_thread_and_holds_the_gate_until_it_returns(
    backend: str, harness: Harness, nursery: trio.Nursery, virtual_clock: trio.abc.Clock
) -> None:
    release = threading.Event()
    ran_in: list[threading.Thread] = []
    names: list[str] = []

    def init() -> None:
        ran_in.append(threading.current_thread())
        names.append(threading.current_thread().name)
        release.wait(30)  # a hang guard; the test sets it

    try:
        handle = await harness.start(nursery, echo_on(backend), initializer=init)
        job_id = harness.platform.enqueue({"n": 1})
        await harness.wait_until(lambda: job_id in handle.held_ids)
        assert harness.platform.job(job_id).status == "IN_PROGRESS"
        assert harness.platform.job(job_id).done_reports == []  # held at the gate
    finally:
        release.set()
    record = await harness.platform.wait_for_status(job_id, "COMPLETED")
    assert record.output == {"n": 1}
    [thread] = ran_in
    assert thread is not threading.main_thread()  # not the loop's thread
    assert names == ["trio_worker initializer"]  # named so a thread dump shows what hangs


@BOTH_BACKENDS
async def test_a_failing_sync_initializer_fails_the_queued_job_with_init_failed(
    backend: str, harness: Harness, nursery: trio.Nursery, virtual_clock: trio.abc.Clock
) -> None:
    def init() -> None:
        raise RuntimeError("weights missing")

    job_id = harness.platform.enqueue({})
    await harness.start(nursery, echo_on(backend), initializer=init)
    await harness.finished.wait()
    assert isinstance(harness.error, trio_worker.InitializationError)
    error = error_of(harness.platform, job_id)
    assert error["event"] == "init_failed"
    assert "weights missing" in error["error_message"]


@BOTH_BACKENDS
async def test_a_stream_stopped_at_a_yield_runs_its_whole_cleanup_before_its_slot_is_free(
    backend: str, harness: Harness, nursery: trio.Nursery, virtual_clock: trio.abc.Clock
) -> None:
    # Chunk posts hang, so the generator waits at a yield while its chunks queue up. A
    # stop then closes it there, under a shield: its finally may await (release a GPU
    # buffer, close a connection) although the job's scope is cancelled, and the slot is
    # given again only after it (docs/how-it-works.md, shields and deadlines).
    events: list[str] = []
    harness.platform.inject(Fault("stream", delay=1000.0, times=1000))

    async def handler(job: dict[str, Any]) -> Any:
        events.append(f"start {job['input']}")
        try:
            for i in range(10_000):
                yield i  # no await of its own: it is only ever suspended here
        finally:
            await sleep_for(backend)(1.0)
            events.append(f"cleanup {job['input']}")

    handle = await harness.start(nursery, handler, concurrency=1)
    first = harness.platform.enqueue(1)
    await harness.wait_until(lambda: "start 1" in events)
    await trio.sleep(5.0)  # the chunk queue fills; the generator waits at its yield
    harness.platform.enqueue(2)
    harness.platform.request_stop(first)
    await harness.wait_until(lambda: "start 2" in events)
    assert events[:3] == ["start 1", "cleanup 1", "start 2"]
    assert harness.platform.job(first).done_reports == []
    handle.shutdown()


@BOTH_BACKENDS
async def test_concurrency_callable_grows_without_draining(
    backend: str, harness: Harness, nursery: trio.Nursery, virtual_clock: trio.abc.Clock
) -> None:
    seen: list[int] = []

    def grow(current: int) -> int:
        seen.append(current)
        return min(current + 1, 4)

    started = trio.current_time()
    handle = await harness.start(nursery, echo_on(backend), concurrency=grow)
    ids = [harness.platform.enqueue({"seconds": 10}) for _ in range(4)]
    await harness.wait_until(lambda: len(handle.held_ids) == 4)
    # All four run at once: capacity grew while jobs were still running.
    assert handle.concurrency == 4
    assert trio.current_time() - started < 1.0
    with trio.fail_after(60):
        for job_id in ids:
            await harness.platform.wait_for_status(job_id, "COMPLETED")
    batch = [r for r in harness.platform.requests if r.route == "take_batch"]
    assert all(int(r.query["batch_size"]) <= 4 for r in batch)
    assert seen[:3] == [1, 2, 3]


@BOTH_BACKENDS
async def test_concurrency_callable_that_raises_keeps_the_current_value(
    backend: str, harness: Harness, nursery: trio.Nursery, virtual_clock: trio.abc.Clock
) -> None:
    def broken(current: int) -> int:
        raise ValueError("oops")

    handle = await harness.start(nursery, echo_on(backend), concurrency=broken)
    job_id = harness.platform.enqueue({})
    await harness.platform.wait_for_status(job_id, "COMPLETED")
    assert handle.concurrency == 1


@BOTH_BACKENDS
async def test_shutdown_never_waits_on_a_long_poll(
    backend: str, harness: Harness, nursery: trio.Nursery, virtual_clock: trio.abc.Clock
) -> None:
    harness.platform.take_hold = 60.0
    harness.platform.stop_hold = 60.0
    handle = await harness.start(nursery, echo_on(backend))
    await harness.platform.wait_for_requests("take", 1)
    await harness.platform.wait_for_requests("stop", 1)
    asked = trio.current_time()
    handle.shutdown()
    await harness.finished.wait()
    # take_drain (0.5 s) is what a take in flight is given, not the 60 s hold.
    assert trio.current_time() - asked < 1.0


@BOTH_BACKENDS
async def test_job_landing_from_the_drained_take_is_run_not_dropped(
    backend: str, harness: Harness, nursery: trio.Nursery, virtual_clock: trio.abc.Clock
) -> None:
    handle = await harness.start(nursery, echo_on(backend))
    await harness.platform.wait_for_requests("take", 1)
    handle.shutdown()
    job_id = harness.platform.enqueue({})  # answers the take in flight, within take_drain
    await harness.finished.wait()
    assert harness.platform.job(job_id).status == "COMPLETED"


@BOTH_BACKENDS
async def test_shutdown_during_init_releases_gated_jobs(
    backend: str, harness: Harness, nursery: trio.Nursery, virtual_clock: trio.abc.Clock
) -> None:
    async def init() -> None:
        await sleep_for(backend)(100)

    handle = await harness.start(nursery, echo_on(backend), initializer=init, concurrency=2)
    ids = [harness.platform.enqueue({}) for _ in range(2)]
    await harness.wait_until(lambda: len(handle.held_ids) == 2)
    handle.shutdown()
    await harness.finished.wait()
    assert harness.error is None
    for job_id in ids:
        assert harness.platform.job(job_id).done_reports == []


@BOTH_BACKENDS
async def test_running_job_gets_shutdown_grace_then_worker_shutdown(
    backend: str, harness: Harness, nursery: trio.Nursery, virtual_clock: trio.abc.Clock
) -> None:
    handle = await harness.start(
        nursery, echo_on(backend), timings=trio_worker.Timings(shutdown_grace=2.0)
    )
    quick = harness.platform.enqueue({"seconds": 1})
    await harness.platform.wait_for_requests("take", 2)
    handle.shutdown()
    await harness.platform.wait_for_status(quick, "COMPLETED")
    await harness.finished.wait()

    harness2 = Harness(harness.platform, backend)
    handle2 = await harness2.start(
        nursery, echo_on(backend), timings=trio_worker.Timings(shutdown_grace=2.0)
    )
    slow = harness.platform.enqueue({"seconds": 50})
    await harness2.wait_until(lambda: slow in handle2.held_ids)
    asked = trio.current_time()
    handle2.shutdown()
    await harness2.finished.wait()
    assert trio.current_time() - asked == pytest.approx(2.0, abs=0.01)
    assert error_of(harness.platform, slow)["error_category"] == "worker_shutdown"


@BOTH_BACKENDS
async def test_duplicate_delivery_of_a_held_id_is_ignored(
    backend: str, harness: Harness, nursery: trio.Nursery, virtual_clock: trio.abc.Clock
) -> None:
    await harness.start(nursery, echo_on(backend), concurrency=2)
    harness.platform.enqueue_raw([{"id": "dup", "input": {"seconds": 1}}] * 2)
    await harness.platform.wait_for_status("dup", "COMPLETED")
    await trio.sleep(5)
    assert harness.platform.job("dup").duplicates == []


@BOTH_BACKENDS
async def test_rate_limited_take_pauses_for_retry_after(
    backend: str, harness: Harness, nursery: trio.Nursery, virtual_clock: trio.abc.Clock
) -> None:
    harness.platform.inject(Fault("take", status=429, body=b"{}"))
    await harness.start(nursery, echo_on(backend))
    await harness.platform.wait_for_requests("take", 2)
    takes = [r for r in harness.platform.requests if r.route == "take"]
    # The reference's 5 s debounce, stretched by the jitter of trio_worker/_pacing.py.
    assert 5.0 <= takes[1].time - takes[0].time <= 5.0 * (1 + RATE_LIMIT_JITTER) + 0.01


@BOTH_BACKENDS
async def test_shutdown_ends_the_pause_a_rate_limited_take_is_in_at_once(
    backend: str, harness: Harness, nursery: trio.Nursery, virtual_clock: trio.abc.Clock
) -> None:
    """The take loop's idle waits end as soon as a shutdown begins: a pause the platform
    asked for (here a minute) does not hold the worker's exit."""
    harness.platform.inject(Fault("take", status=429, retry_after=60))
    handle = await harness.start(nursery, echo_on(backend))
    await harness.platform.wait_for_requests("take", 1)
    await trio.sleep(1.0)  # well into the pause it asked for
    asked = trio.current_time()
    handle.shutdown()
    await harness.finished.wait()
    assert trio.current_time() - asked < 1.0
    assert len([r for r in harness.platform.requests if r.route == "take"]) == 1


@BOTH_BACKENDS
async def test_report_given_up_after_deadline_frees_the_slot(
    backend: str, harness: Harness, nursery: trio.Nursery, virtual_clock: trio.abc.Clock
) -> None:
    harness.platform.inject(Fault("done", status=503, times=100))
    handle = await harness.start(nursery, echo_on(backend))
    job_id = harness.platform.enqueue({})
    await harness.platform.wait_for_requests("done", 2)
    await harness.wait_until(lambda: job_id not in handle.held_ids)
    assert harness.platform.job(job_id).status != "COMPLETED"


@BOTH_BACKENDS
async def test_progress_update_from_a_sync_thread_is_not_lost(
    backend: str, harness: Harness, nursery: trio.Nursery, virtual_clock: trio.abc.Clock
) -> None:
    async def handler(job: dict[str, Any]) -> Any:
        update = functools.partial(trio_worker.progress_update, job, 50)
        if backend == "asyncio":
            await asyncio.to_thread(update)
        else:
            await trio.to_thread.run_sync(update)
        return "ok"

    await harness.start(nursery, handler)
    job_id = harness.platform.enqueue({})
    record = await harness.platform.wait_for_status(job_id, "COMPLETED")
    assert record.progress == [50]
    assert record.late_progress == []


@BOTH_BACKENDS
async def test_progress_updates_from_the_threads_of_many_jobs_are_none_of_them_lost(
    backend: str, harness: Harness, nursery: trio.Nursery
) -> None:
    # A thread's update races the handler's end, which follows the thread's return at
    # once: one job shows a lost update only now and then, a hundred nearly always.
    # Real time, as in test_slots: autojump cannot see the hundred threads, and while they
    # run it would spend the hang guard's virtual hour on pings.
    async def handler(job: dict[str, Any]) -> Any:
        update = functools.partial(trio_worker.progress_update, job, job["input"]["n"])
        if backend == "asyncio":
            await asyncio.to_thread(update)
        else:
            await trio.to_thread.run_sync(update)
        return "ok"

    harness.platform.take_hold = 0.1  # real seconds: the worker's exit waits out a take
    handle = await harness.start(nursery, handler, concurrency=4)
    ids = [harness.platform.enqueue({"n": n}) for n in range(100)]
    with trio.fail_after(30):
        records = [await harness.platform.wait_for_status(i, "COMPLETED") for i in ids]
        handle.shutdown()
        await harness.finished.wait()
    assert [record.progress for record in records] == [[n] for n in range(100)]
    assert all(record.late_progress == [] for record in records)


@BOTH_BACKENDS
async def test_remembered_stop_of_a_sync_job_frees_its_slot(
    backend: str, harness: Harness, nursery: trio.Nursery, virtual_clock: trio.abc.Clock
) -> None:
    def sync_handler(job: dict[str, Any]) -> Any:
        return job["input"]

    handle = await harness.start(nursery, sync_handler)
    handle.stop_job("stopped-before-taken")
    harness.platform.enqueue({}, job_id="stopped-before-taken")
    after = harness.platform.enqueue({"n": 1})
    # The stop lands before the handler's thread exists; the slot must not stay taken.
    with trio.fail_after(3600):
        await harness.platform.wait_for_status(after, "COMPLETED")
    assert harness.platform.job("stopped-before-taken").done_reports == []


@BOTH_BACKENDS
async def test_sync_handler_ignoring_stop_does_not_overrun_the_shutdown_grace(
    backend: str, harness: Harness, nursery: trio.Nursery, virtual_clock: trio.abc.Clock
) -> None:
    import threading
    import time

    thread_done = threading.Event()

    def stubborn(job: dict[str, Any]) -> Any:
        time.sleep(1.0)  # never calls check_cancelled()
        thread_done.set()
        return "late"

    handle = await harness.start(nursery, stubborn, timings=trio_worker.Timings(shutdown_grace=2.0))
    job_id = harness.platform.enqueue({})
    await harness.wait_until(lambda: job_id in handle.held_ids)
    handle.shutdown()
    await harness.finished.wait()
    assert not thread_done.is_set(), "serve() waited for a thread past the grace"
    assert error_of(harness.platform, job_id)["error_category"] == "worker_shutdown"


@BOTH_BACKENDS
async def test_cancelling_serve_during_shutdown_with_a_job_running_is_clean(
    backend: str, harness: Harness, nursery: trio.Nursery, virtual_clock: trio.abc.Clock
) -> None:
    with trio.CancelScope() as outer:
        async with trio.open_nursery() as inner:
            handle = await harness.start(
                inner, echo_on(backend), timings=trio_worker.Timings(shutdown_grace=30.0)
            )
            job_id = harness.platform.enqueue({"seconds": 100})
            await harness.wait_until(lambda: job_id in handle.held_ids)
            handle.shutdown()
            await trio.sleep(1)
            outer.cancel()
    assert outer.cancelled_caught
    assert harness.finished.is_set()


# Trio only: the handler's trio task, shielded, keeps serve()'s nursery open. The asyncio
# counterpart (an asyncio task, which serve() does not wait for past the grace) follows.
@pytest.mark.parametrize("backend", ["trio"])
async def test_handler_swallowing_the_grace_cancellation_still_gets_its_report(
    backend: str, harness: Harness, nursery: trio.Nursery, virtual_clock: trio.abc.Clock
) -> None:
    returned = trio.Event()

    async def swallows(job: dict[str, Any]) -> Any:
        try:
            await trio.sleep(3600)
        except trio.Cancelled:
            with trio.CancelScope(shield=True):
                await trio.sleep(100)
        returned.set()
        return "too late"

    timings = trio_worker.Timings(shutdown_grace=2.0, report_deadline=2.0)
    handle = await harness.start(nursery, swallows, timings=timings)
    job_id = harness.platform.enqueue({})
    await harness.wait_until(lambda: job_id in handle.held_ids)
    handle.shutdown()
    await harness.wait_until(lambda: not handle.held_ids)
    assert error_of(harness.platform, job_id)["error_category"] == "worker_shutdown"
    assert not harness.finished.is_set()  # serve() cannot return while the handler runs
    # When the handler finally returns, its result is dropped: the job was settled.
    await returned.wait()
    await harness.finished.wait()
    assert len(harness.platform.job(job_id).done_reports) == 1


@ASYNCIO_ONLY
async def test_asyncio_handler_swallowing_the_grace_cancellation_still_gets_its_report(
    backend: str, harness: Harness, nursery: trio.Nursery, virtual_clock: trio.abc.Clock
) -> None:
    # An asyncio task that swallows its cancellation holds its slot as a sync handler's
    # thread does, until the end of the grace (docs/how-it-works.md, the asyncio backend):
    # the job is reported for it, and serve() returns without waiting for the task.
    returned = trio.Event()

    async def swallows(job: dict[str, Any]) -> Any:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await asyncio.sleep(100)
        returned.set()
        return "too late"

    timings = trio_worker.Timings(shutdown_grace=2.0, report_deadline=2.0)
    handle = await harness.start(nursery, swallows, timings=timings)
    job_id = harness.platform.enqueue({})
    await harness.wait_until(lambda: job_id in handle.held_ids)
    asked = trio.current_time()
    handle.shutdown()
    await harness.finished.wait()
    assert error_of(harness.platform, job_id)["error_category"] == "worker_shutdown"
    assert not returned.is_set()  # serve() did not wait for the task
    assert trio.current_time() - asked < 100
    # When the handler finally returns, its result is dropped: the job was settled.
    await returned.wait()
    await trio.sleep(5)
    assert len(harness.platform.job(job_id).done_reports) == 1


@pytest.mark.parametrize("backend", ["trio"])
async def test_reports_in_flight_at_the_grace_end_beside_a_stuck_thread_keep_their_floor(
    backend: str, harness: Harness, nursery: trio.Nursery, virtual_clock: trio.abc.Clock
) -> None:
    # At the end of the grace one handler is stuck in its thread (it never looks at
    # check_cancelled()) and another job's result is still being retried. The stuck job
    # is reported worker_shutdown; the result in flight keeps its report_deadline floor
    # past the grace's end (docs/reliability.md), and is delivered inside it.
    release = threading.Event()

    def handler(job: dict[str, Any]) -> Any:
        if job["input"].get("stuck"):
            release.wait(30)
        return job["input"]

    timings = trio_worker.Timings(
        shutdown_grace=2.0, report_deadline=6.0, report_budget=300.0, report_backoff_max=0.25
    )
    try:
        handle = await harness.start(nursery, handler, timings=timings, concurrency=2)
        stuck = harness.platform.enqueue({"stuck": True})
        await harness.wait_until(lambda: stuck in handle.held_ids)
        harness.platform.inject(Fault("done", status=503))
        late = harness.platform.enqueue({"n": 1})
        with trio.fail_after(60):
            await harness.platform.wait_for_requests("done", 1)
        reported = trio.current_time()
        # Refused until 3.5 s into the report: past the grace's end (2 s), inside its
        # report_deadline floor (6 s).
        harness.platform.inject(Fault("done", status=503, times=10**9, until=reported + 3.5))
        handle.shutdown("SIGTERM")
        await harness.finished.wait()
    finally:
        release.set()
    record = harness.platform.job(late)
    assert record.status == "COMPLETED"
    assert record.done_time is not None
    assert reported + 3.5 <= record.done_time <= reported + 6.0
    assert error_of(harness.platform, stuck)["error_category"] == "worker_shutdown"


@pytest.mark.parametrize("backend", ["trio"])
async def test_the_reprs_show_the_state_of_each_layer(
    backend: str, harness: Harness, nursery: trio.Nursery, virtual_clock: trio.abc.Clock
) -> None:
    handle = await harness.start(nursery, echo_on(backend))
    job_id = harness.platform.enqueue({"seconds": 100})
    await harness.wait_until(lambda: job_id in handle.held_ids)
    supervisor = handle._supervisor
    assert repr(supervisor).startswith("<Supervisor ready held=1 concurrency=1 <Scopes")
    assert f"{job_id}: running" in repr(supervisor.driver)
    handle.shutdown("SIGTERM")
    assert "draining reason='SIGTERM'" in repr(supervisor.scopes)
    assert "reporting=[]" in repr(supervisor.delivery)
    await harness.finished.wait()
