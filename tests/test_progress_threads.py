"""``progress_update`` from the threads a handler starts (not only the worker's own).

A handler reports progress from a ``threading.Thread`` it starts, a
``ThreadPoolExecutor``, or a library's callback thread (a trainer's, a diffusers
pipeline's step callback). None of these carries the job's context, so the worker finds the
job by its id. The rules hold whatever the thread: never after the job's final result, one
post at a time per job with the newest waiting, and a bounded hand-over to the loop (its
own test is in tests/test_progress_calls.py).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import pytest
import trio
import trio.testing

import trio_worker
import trio_worker.testing
from tests.conftest import serve_in_process
from trio_worker.testing import FakePlatform, JobRecord

from .backends import BOTH_BACKENDS

STEPS = 20


class FakePipeline:
    """A diffusion pipeline's shape: the denoising loop runs on a thread of the library's
    own, which calls ``callback_on_step_end(step)`` after each step."""

    def __call__(self, steps: int, callback_on_step_end: Callable[[int], None]) -> str:
        def denoise() -> None:
            for step in range(1, steps + 1):
                callback_on_step_end(step)

        worker = threading.Thread(target=denoise, name="pipeline")
        worker.start()
        worker.join()
        return "image"


def report_steps(job: dict[str, Any]) -> None:
    for step in range(1, STEPS + 1):
        trio_worker.progress_update(job, {"step": step})


def in_a_thread(job: dict[str, Any]) -> None:
    thread = threading.Thread(target=report_steps, args=(job,))
    thread.start()
    thread.join()


def in_an_executor(job: dict[str, Any]) -> None:
    with ThreadPoolExecutor(max_workers=2) as pool:
        pool.submit(report_steps, job).result()


def in_a_pipeline_callback(job: dict[str, Any]) -> None:
    FakePipeline()(STEPS, lambda step: trio_worker.progress_update(job, {"step": step}))


SHAPES = {
    "threading.Thread": in_a_thread,
    "ThreadPoolExecutor": in_an_executor,
    "pipeline callback": in_a_pipeline_callback,
}


def handler_for(kind: str, backend: str, work: Callable[[dict[str, Any]], None]) -> Any:
    """A handler that runs *work* (which starts threads of its own) and waits for it."""
    if kind == "sync":

        def sync_handler(job: dict[str, Any]) -> str:
            work(job)
            return "done"

        return sync_handler

    async def async_handler(job: dict[str, Any]) -> str:
        # Waiting in a thread keeps the loop free; *work*'s own threads do the updates.
        if backend == "asyncio":
            await asyncio.to_thread(work, job)
        else:
            await trio.to_thread.run_sync(work, job)
        return "done"

    return async_handler


async def start_worker(
    nursery: trio.Nursery, platform: FakePlatform, handler: Any, backend: str, worker_id: str = "w"
) -> trio_worker.WorkerHandle:
    handle: trio_worker.WorkerHandle = await nursery.start(
        serve_in_process(platform, handler, backend=backend, worker_id=worker_id)
    )
    return handle


async def completed(platform: FakePlatform, job_id: str) -> JobRecord:
    # A hang guard, not a timing claim: autojump is blind to the handler's threads.
    with trio.fail_after(3600):
        return await platform.wait_for_status(job_id, "COMPLETED")


def assert_steps_delivered(record: JobRecord) -> None:
    """The newest update always arrives; older ones may be superseded while one is in
    flight, but those that arrive do so in order, and none after the result."""
    steps = [cast("dict[str, int]", update)["step"] for update in record.progress]
    assert steps, "no progress update was delivered"
    assert steps[-1] == STEPS
    assert steps == sorted(set(steps))
    assert record.late_progress == []


@BOTH_BACKENDS
@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("shape", list(SHAPES))
async def test_updates_from_threads_the_handler_starts_reach_the_job(
    backend: str,
    kind: str,
    shape: str,
    nursery: trio.Nursery,
    virtual_clock: trio.abc.Clock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="trio_worker")
    platform = FakePlatform(take_hold=5.0)
    await start_worker(nursery, platform, handler_for(kind, backend, SHAPES[shape]), backend)
    record = await completed(platform, platform.enqueue({}))
    assert_steps_delivered(record)
    assert "progress_update" not in caplog.text
    nursery.cancel_scope.cancel()


@BOTH_BACKENDS
async def test_two_workers_each_get_the_updates_of_their_own_jobs_from_plain_threads(
    backend: str, nursery: trio.Nursery, virtual_clock: trio.abc.Clock
) -> None:
    first, second = FakePlatform(take_hold=5.0), FakePlatform(take_hold=5.0)
    handler = handler_for("sync", backend, in_a_thread)
    await start_worker(nursery, first, handler, backend, "w1")
    await start_worker(nursery, second, handler, backend, "w2")
    # Job ids are the platform's, unique across workers; found by id, not by context.
    one, two = first.enqueue({}, job_id="job-of-w1"), second.enqueue({}, job_id="job-of-w2")
    assert_steps_delivered(await completed(first, one))
    assert_steps_delivered(await completed(second, two))
    nursery.cancel_scope.cancel()


@BOTH_BACKENDS
@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_an_update_after_the_result_was_sent_is_ignored_with_a_clear_line(
    backend: str,
    kind: str,
    nursery: trio.Nursery,
    virtual_clock: trio.abc.Clock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="trio_worker")
    release = threading.Event()
    threads: list[threading.Thread] = []

    def late_update(job: dict[str, Any]) -> None:
        release.wait(10)
        trio_worker.progress_update(job, "too late")

    def start_a_thread_and_return(job: dict[str, Any]) -> None:
        thread = threading.Thread(target=late_update, args=(job,))
        threads.append(thread)
        thread.start()  # not joined: it outlives the job

    platform = FakePlatform(take_hold=5.0)
    handler = handler_for(kind, backend, start_a_thread_and_return)
    await start_worker(nursery, platform, handler, backend)
    job_id = platform.enqueue({})
    record = await completed(platform, job_id)
    release.set()
    await trio.to_thread.run_sync(threads[0].join)
    await trio.testing.wait_all_tasks_blocked()
    assert f"progress_update for job {job_id} after the job ended; ignored" in caplog.text
    assert record.progress == []
    assert record.late_progress == []
    assert platform.statistics().requests_by_route.get("done") == 1  # the result alone
    nursery.cancel_scope.cancel()
