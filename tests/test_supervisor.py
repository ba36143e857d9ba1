"""The supervisor in virtual time: the real worker against the in-process fake platform.

These pin down orderings that loopback tests cannot hit on purpose: a stop for a job still
queued, a concurrency callable that grows and shrinks, a duplicate delivery, a rate-limited
take, progress from many threads. Around the initializer: tests/test_supervisor_init.py;
at shutdown: tests/test_supervisor_shutdown.py.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import pytest
import trio

import trio_worker
import trio_worker.testing
from tests.backends import BOTH_BACKENDS, sleep_for
from tests.supervisor_harness import Harness, echo_on
from trio_worker._pacing import RATE_LIMIT_JITTER
from trio_worker.testing import Fault


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
    # Real time, as in test_job_slots: autojump cannot see the hundred threads, and while they
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
