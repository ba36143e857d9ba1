"""The supervisor in virtual time at shutdown: a long-poll that holds, the take drained, the
shutdown grace and the reports still in flight at its end, handlers that ignore or
swallow their cancellation."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
import trio

import trio_worker
import trio_worker.testing
from tests.backends import ASYNCIO_ONLY, BOTH_BACKENDS, sleep_for
from tests.supervisor_harness import Harness, echo_on, error_of
from trio_worker.testing import Fault


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
