"""Paths no other test reaches: each one a corner of docs/design.md §5, §6 and §9.

* jobs a batch take delivered that are still queued inside the worker (no task yet) when
  the initializer fails are failed with the init failure, not dropped (docs/design.md §6);
* a job a take delivers during a shutdown, while the gate is still closed, is released at
  once rather than held until the shutdown grace ends (docs/design.md §9);
* a handler that prints a CUDA line and then raises a generic exception is categorised from
  the captured output (docs/design.md §7, §8), through the real fd capture of a worker
  process;
* an error body built at the 64 KiB bound still carries ``"stopPod": true`` and stays
  within the bound (docs/design.md I6).

The in-process tests run the production HTTP client over :func:`memory_network` in virtual
time. This file is also the worker process of the capture test:
``python test_uncovered_paths.py`` runs :func:`cuda_line_then_generic_error` under
``trio_worker.start``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import pytest
import trio

import trio_worker
import trio_worker.testing
from trio_worker._state import JobEvent, JobState
from trio_worker.testing import FakePlatform, memory_network

if TYPE_CHECKING:
    import trio.testing

    from trio_worker._state import HeldJob

    from ..conftest import Platform

CUDA_LINE = "CUDA error: an illegal memory access was encountered"
MAX_ERROR_BODY_BYTES = 64 * 1024


class Transitions:
    """An observer for ``testing.serve``: every job's events, in order."""

    def __init__(self) -> None:
        self.events: dict[str, list[JobEvent]] = {}
        self.first = trio.Event()

    def __call__(self, job: HeldJob, before: JobState, event: JobEvent) -> None:
        self.events.setdefault(job.id, []).append(event)
        self.first.set()


def inner_error(body: object) -> dict[str, Any]:
    assert isinstance(body, dict), body
    parsed = json.loads(body["error"])
    assert isinstance(parsed, dict)
    return parsed


async def serve_in_memory(
    platform: FakePlatform, handler: Any, **options: Any
) -> trio_worker.InitializationError | None:
    """Run a worker on *platform* until it returns; the init failure it raised, if any."""
    async with memory_network(platform) as opener:
        try:
            await trio_worker.testing.serve(
                handler,
                environ=platform.worker_env("http://platform"),
                open_stream=opener,
                heartbeat="task",
                handle_signals=False,
                capture_logs="off",
                **options,
            )
        except trio_worker.InitializationError as exc:
            return exc
    return None


async def test_jobs_just_taken_when_init_fails_are_failed_with_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    platform = FakePlatform(take_hold=5.0)
    ids = [platform.enqueue({"n": i}) for i in range(16)]
    seen = Transitions()

    async def fails_once_jobs_are_in() -> None:
        # The batch take has answered and its jobs' tasks are starting: failing now finds
        # some of them before they reach the gate.
        await seen.first.wait()
        raise RuntimeError("the model failed to load")

    with trio.fail_after(60):
        failure = await serve_in_memory(
            platform,
            lambda job: "never runs",
            initializer=fails_once_jobs_are_in,
            concurrency=16,
            observers=[seen],
        )
    assert failure is not None
    assert platform.statistics().requests_by_route.get("take_batch") == 1
    # Jobs whose task had not reached the gate yet are failed as the cancellation reaches
    # them, as those at the gate are.
    never_waited = [i for i in ids if JobEvent.WAIT_FOR_INIT not in seen.events[i]]
    assert all(seen.events[i] == [JobEvent.FAIL, JobEvent.ACKNOWLEDGE] for i in never_waited)
    for job_id in ids:
        record = platform.job(job_id)
        assert record.status == "FAILED", (job_id, record)
        assert len(record.done_reports) == 1
        assert inner_error(record.done_reports[0])["event"] == "init_failed"


async def test_a_job_delivered_during_shutdown_behind_a_closed_gate_is_released_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    platform = FakePlatform(take_hold=30.0)
    seen = Transitions()
    grace = 20.0

    async def loads_for_ever() -> None:
        await trio.sleep_forever()

    ended = trio.Event()

    async def worker(task_status: trio.TaskStatus[trio_worker.WorkerHandle]) -> None:
        async with memory_network(platform) as opener:
            await trio_worker.testing.serve(
                lambda job: "never runs",
                initializer=loads_for_ever,
                environ=platform.worker_env("http://platform"),
                open_stream=opener,
                heartbeat="task",
                handle_signals=False,
                capture_logs="off",
                timings=trio_worker.Timings(shutdown_grace=grace),
                observers=[seen],
                task_status=task_status,
            )
        ended.set()

    async with trio.open_nursery() as nursery:
        handle: trio_worker.WorkerHandle = await nursery.start(worker)
        await platform.wait_for_requests("take", 1)
        assert not handle.gate_open
        started = trio.current_time()
        handle.shutdown("test")
        # The take in flight is answered during the drain: the job arrives behind the gate.
        job_id = platform.enqueue({"late": True})
        with trio.fail_after(60):
            await ended.wait()
        exited_after = trio.current_time() - started
    record = platform.job(job_id)
    assert record.takes == 1 and record.done_reports == []
    assert seen.events[job_id] == [JobEvent.REQUEST_RELEASE, JobEvent.RELEASE]
    # At once: the worker did not hold it until the shutdown grace ran out (virtual time).
    assert exited_after < grace / 2


async def test_an_error_body_with_stop_pod_at_the_64_kib_edge(
    autojump_clock: trio.testing.MockClock,
) -> None:
    platform = FakePlatform(take_hold=5.0)
    job_id = platform.enqueue({})

    # Async: a handler in a thread would let the autojumping clock run ahead of it (trio
    # sees only blocked tasks), and a slow first call could outlast the 60 s below.
    async def raises_a_huge_quoted_message(job: dict[str, Any]) -> None:
        # Quotes cost 3 bytes each once the inner JSON is escaped twice: far over the bound.
        raise ValueError('"' * 40_000)

    with trio.fail_after(60):
        await serve_in_memory(platform, raises_a_huge_quoted_message, refresh_worker=True)
    record = platform.job(job_id)
    assert record.status == "FAILED"
    [request] = [r for r in platform.requests if r.route == "done"]
    assert MAX_ERROR_BODY_BYTES - 1024 < len(request.body) <= MAX_ERROR_BODY_BYTES
    body = request.json()
    assert isinstance(body, dict) and body["stopPod"] is True
    error = inner_error(body)
    assert error["error_type"] == "ValueError"
    assert "truncated" in error["error_message"]


@pytest.mark.slow
async def test_a_cuda_line_printed_before_a_generic_error_sets_its_category(
    platform: Platform,
) -> None:
    job_id = platform.fake.enqueue({})
    env = platform.env()
    worker = await trio.lowlevel.open_process(
        [sys.executable, __file__],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        with trio.fail_after(30):
            record = await platform.fake.wait_for_status(job_id)
    finally:
        worker.send_signal(signal.SIGTERM)
        with trio.move_on_after(20):
            await worker.wait()
        if worker.returncode is None:
            os.killpg(worker.pid, signal.SIGKILL)
            await worker.wait()
    assert record.status == "FAILED"
    error = inner_error(record.done_reports[0])
    assert error["error_type"] == "RuntimeError"
    assert error["error_message"] == "engine step failed"
    assert CUDA_LINE in error["logs"]
    assert error["error_category"] == "cuda_error"


def cuda_line_then_generic_error(job: dict[str, Any]) -> None:
    # As native code does: straight to fd 2, past sys.stderr; then an error that says nothing.
    os.write(2, f"{CUDA_LINE}\n".encode())
    raise RuntimeError("engine step failed")


if __name__ == "__main__":
    trio_worker.start(cuda_line_then_generic_error)
