"""The supervisor in virtual time: the real worker against the in-process fake platform.

These pin down orderings that loopback tests cannot hit on purpose: a take in flight at
the moment init fails, a stop for a job still queued, a concurrency callable that grows and
shrinks, a shutdown while a long-poll holds.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import trio
import trio.testing

import trio_worker
import trio_worker.testing
from trio_worker.testing import FakePlatform, Fault

Handler = Callable[[dict[str, Any]], Any]


class Harness:
    def __init__(self, platform: FakePlatform) -> None:
        self.platform = platform
        self.transport = httpx.ASGITransport(app=platform)
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
                    environ=self.environ,
                    transport=self.transport,
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
def harness() -> Harness:
    # Each test requests ``autojump_clock`` itself: pytest-trio picks the run's clock from
    # the test's own arguments, not from fixtures' dependencies.
    return Harness(FakePlatform(take_hold=5.0, stop_hold=5.0))


def error_of(platform: FakePlatform, job_id: str) -> dict[str, Any]:
    record = platform.job(job_id)
    assert len(record.done_reports) == 1, record.done_reports
    body = record.done_reports[0]
    assert isinstance(body, dict)
    parsed = json.loads(body["error"])
    assert isinstance(parsed, dict)
    return parsed


async def echo(job: dict[str, Any]) -> Any:
    await trio.sleep(float(job["input"].get("seconds", 0)))
    return job["input"]


async def test_take_in_flight_at_init_failure_gets_claim_grace_and_its_job_is_failed(
    harness: Harness, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    async def init() -> None:
        await trio.sleep(1.0)
        raise RuntimeError("engine crashed")

    await harness.start(nursery, echo, initializer=init, concurrency=2)
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


async def test_take_in_flight_is_cut_at_claim_grace(
    harness: Harness, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    async def init() -> None:
        raise RuntimeError("bad config")

    harness.platform.take_hold = 60.0
    started = trio.current_time()
    await harness.start(nursery, echo, initializer=init)
    await harness.finished.wait()
    # claim_grace=3: the worker does not wait out the 60 s long-poll.
    assert trio.current_time() - started == pytest.approx(3.0, abs=0.01)


async def test_stop_for_a_queued_job_before_it_is_taken_is_remembered(
    harness: Harness, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    handle = await harness.start(nursery, echo)
    handle.stop_job("not-yet-taken")
    harness.platform.enqueue({"seconds": 30}, job_id="not-yet-taken")
    other = harness.platform.enqueue({})
    await harness.platform.wait_for_status(other, "COMPLETED")
    assert harness.platform.job("not-yet-taken").done_reports == []
    assert "not-yet-taken" not in handle.held_ids


async def test_stop_of_a_job_waiting_at_the_gate(
    harness: Harness, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    async def init() -> None:
        await trio.sleep(100)

    handle = await harness.start(nursery, echo, initializer=init)
    job_id = harness.platform.enqueue({})
    await harness.wait_until(lambda: bool(handle.held_ids))
    assert handle.held_ids == (job_id,)
    harness.platform.request_stop(job_id)
    await harness.wait_until(lambda: not handle.held_ids)
    assert harness.platform.job(job_id).done_reports == []


async def test_a_stream_stopped_at_a_yield_runs_its_whole_cleanup_before_its_slot_is_free(
    harness: Harness, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
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
            await trio.sleep(1.0)
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


async def test_concurrency_callable_grows_without_draining(
    harness: Harness, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    seen: list[int] = []

    def grow(current: int) -> int:
        seen.append(current)
        return min(current + 1, 4)

    started = trio.current_time()
    handle = await harness.start(nursery, echo, concurrency=grow)
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


async def test_concurrency_callable_that_raises_keeps_the_current_value(
    harness: Harness, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    def broken(current: int) -> int:
        raise ValueError("oops")

    handle = await harness.start(nursery, echo, concurrency=broken)
    job_id = harness.platform.enqueue({})
    await harness.platform.wait_for_status(job_id, "COMPLETED")
    assert handle.concurrency == 1


async def test_shutdown_never_waits_on_a_long_poll(
    harness: Harness, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    harness.platform.take_hold = 60.0
    harness.platform.stop_hold = 60.0
    handle = await harness.start(nursery, echo)
    await harness.platform.wait_for_requests("take", 1)
    await harness.platform.wait_for_requests("stop", 1)
    asked = trio.current_time()
    handle.shutdown()
    await harness.finished.wait()
    # take_drain (0.5 s) is what a take in flight is given, not the 60 s hold.
    assert trio.current_time() - asked < 1.0


async def test_job_landing_from_the_drained_take_is_run_not_dropped(
    harness: Harness, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    handle = await harness.start(nursery, echo)
    await harness.platform.wait_for_requests("take", 1)
    handle.shutdown()
    job_id = harness.platform.enqueue({})  # answers the take in flight, within take_drain
    await harness.finished.wait()
    assert harness.platform.job(job_id).status == "COMPLETED"


async def test_shutdown_during_init_releases_gated_jobs(
    harness: Harness, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    async def init() -> None:
        await trio.sleep(100)

    handle = await harness.start(nursery, echo, initializer=init, concurrency=2)
    ids = [harness.platform.enqueue({}) for _ in range(2)]
    await harness.wait_until(lambda: len(handle.held_ids) == 2)
    handle.shutdown()
    await harness.finished.wait()
    assert harness.error is None
    for job_id in ids:
        assert harness.platform.job(job_id).done_reports == []


async def test_running_job_gets_shutdown_grace_then_worker_shutdown(
    harness: Harness, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    handle = await harness.start(nursery, echo, timings=trio_worker.Timings(shutdown_grace=2.0))
    quick = harness.platform.enqueue({"seconds": 1})
    await harness.platform.wait_for_requests("take", 2)
    handle.shutdown()
    await harness.platform.wait_for_status(quick, "COMPLETED")
    await harness.finished.wait()

    harness2 = Harness(harness.platform)
    handle2 = await harness2.start(nursery, echo, timings=trio_worker.Timings(shutdown_grace=2.0))
    slow = harness.platform.enqueue({"seconds": 50})
    await harness2.wait_until(lambda: slow in handle2.held_ids)
    asked = trio.current_time()
    handle2.shutdown()
    await harness2.finished.wait()
    assert trio.current_time() - asked == pytest.approx(2.0, abs=0.01)
    assert error_of(harness.platform, slow)["error_category"] == "worker_shutdown"


async def test_duplicate_delivery_of_a_held_id_is_ignored(
    harness: Harness, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    await harness.start(nursery, echo, concurrency=2)
    harness.platform.enqueue_raw([{"id": "dup", "input": {"seconds": 1}}] * 2)
    await harness.platform.wait_for_status("dup", "COMPLETED")
    await trio.sleep(5)
    assert harness.platform.job("dup").duplicates == []


async def test_rate_limited_take_pauses_for_retry_after(
    harness: Harness, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    harness.platform.inject(Fault("take", status=429, body=b"{}"))
    await harness.start(nursery, echo)
    await harness.platform.wait_for_requests("take", 2)
    takes = [r for r in harness.platform.requests if r.route == "take"]
    assert takes[1].time - takes[0].time == pytest.approx(5.0, abs=0.01)


async def test_report_given_up_after_deadline_frees_the_slot(
    harness: Harness, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    harness.platform.inject(Fault("done", status=503, times=100))
    handle = await harness.start(nursery, echo)
    job_id = harness.platform.enqueue({})
    await harness.platform.wait_for_requests("done", 2)
    await harness.wait_until(lambda: job_id not in handle.held_ids)
    assert harness.platform.job(job_id).status != "COMPLETED"


async def test_progress_update_from_a_sync_thread_is_not_lost(
    harness: Harness, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    async def handler(job: dict[str, Any]) -> Any:
        await trio.to_thread.run_sync(functools.partial(trio_worker.progress_update, job, 50))
        return "ok"

    await harness.start(nursery, handler)
    job_id = harness.platform.enqueue({})
    record = await harness.platform.wait_for_status(job_id, "COMPLETED")
    assert record.progress == [50]
    assert record.late_progress == []


async def test_remembered_stop_of_a_sync_job_frees_its_slot(
    harness: Harness, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
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


async def test_sync_handler_ignoring_stop_does_not_overrun_the_shutdown_grace(
    harness: Harness, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
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


async def test_cancelling_serve_during_shutdown_with_a_job_running_is_clean(
    harness: Harness, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.CancelScope() as outer:
        async with trio.open_nursery() as inner:
            handle = await harness.start(
                inner, echo, timings=trio_worker.Timings(shutdown_grace=30.0)
            )
            job_id = harness.platform.enqueue({"seconds": 100})
            await harness.wait_until(lambda: job_id in handle.held_ids)
            handle.shutdown()
            await trio.sleep(1)
            outer.cancel()
    assert outer.cancelled_caught
    assert harness.finished.is_set()


async def test_handler_swallowing_the_grace_cancellation_still_gets_its_report(
    harness: Harness, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
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
