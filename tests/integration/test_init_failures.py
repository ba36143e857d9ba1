"""The supervised initializer end to end (docs/design.md §6).

One test per row of issue 3's table."""

from __future__ import annotations

import signal

import pytest
import trio

from ..conftest import Platform
from .conftest import Spawn, WorkerProcess
from .test_queue_worker import inner_error

pytestmark = pytest.mark.slow


async def wait_taken(platform: Platform, job_id: str) -> None:
    with trio.fail_after(20):
        while platform.fake.job(job_id).taken_by is None:
            await platform.fake.wait_for_requests("ping", len(platform.fake.pings) + 1)


async def failed_with_init(platform: Platform, job_id: str) -> dict[str, object]:
    with trio.fail_after(30):
        record = await platform.fake.wait_for_status(job_id, "FAILED")
    assert len(record.done_reports) == 1
    error = inner_error(record.done_reports[0])
    assert error["event"] == "init_failed"
    assert error["worker_id"] == "w1"
    assert "sdk_version" in error
    assert isinstance(error["elapsed_s"], float)
    return error


async def exits(worker: WorkerProcess, status: int, within: float = 20.0) -> None:
    assert await worker.wait(within) == status, worker.output


async def test_initializer_succeeds_job_taken_during_init_runs_after(
    platform: Platform, spawn: Spawn
) -> None:
    job_id = platform.fake.enqueue("warm")
    worker = await spawn(platform.env(TW_INIT="ok", TW_INIT_SECONDS="1.0"))
    with trio.fail_after(20):
        record = await platform.fake.wait_for_status(job_id, "COMPLETED")
    assert record.output == {"echo": "warm", "model_ready": True}
    assert record.take_time is not None and record.done_time is not None
    # Taken at once, while the model loaded; run only after.
    assert record.done_time - record.take_time > 0.5
    held_during_init = [p for p in platform.fake.pings if job_id in p.job_ids]
    assert held_during_init
    worker.signal(signal.SIGTERM)
    await exits(worker, 0)


async def test_initializer_raising_cuda_oom_fails_held_job_with_logs(
    platform: Platform, spawn: Spawn
) -> None:
    job_id = platform.fake.enqueue("doomed")
    worker = await spawn(platform.env(TW_INIT="oom", TW_INIT_SECONDS="1.5"))
    error = await failed_with_init(platform, job_id)
    assert error["error_type"] == "RuntimeError"
    assert str(error["error_message"]).startswith("CUDA out of memory. Tried to allocate")
    assert "Traceback" in str(error["error_traceback"])
    assert error["error_category"] == "out_of_memory"
    logs = str(error["logs"])
    for line in (
        "python stdout init",
        "python stderr init",
        "fd2 raw write init",
        "child stderr init",
    ):
        assert line in logs, (line, logs)
    await exits(worker, 1)


async def test_async_initializer_raising_at_once_claims_a_request_to_fail(
    platform: Platform, spawn: Spawn
) -> None:
    platform.fake.take_hold = 5.0
    worker = await spawn(platform.env(TW_INIT="async_raise_now", TW_HANDLER="async_echo"))
    with trio.fail_after(20):
        await platform.fake.wait_for_requests("take", 1)
    job_id = platform.fake.enqueue("the request that scaled us up")
    error = await failed_with_init(platform, job_id)
    assert error["error_type"] == "ValueError"
    assert error["error_message"] == "model config missing: set MODEL_NAME"
    await exits(worker, 1)


async def test_hanging_initializer_with_init_timeout_fails_with_the_sdk_timeout(
    platform: Platform, spawn: Spawn
) -> None:
    job_id = platform.fake.enqueue("waiting")
    worker = await spawn(platform.env(TW_INIT="hang", TW_INIT_TIMEOUT="0.5"))
    error = await failed_with_init(platform, job_id)
    assert error["error_type"] == "InitTimeout"
    assert error["error_category"] == "timeout"
    assert "init_timeout=0.5s" in str(error["error_message"])
    assert "loading weights..." in str(error["logs"])
    # The initializer's thread is still sleeping: os._exit does not wait for it.
    await exits(worker, 1, within=10)


async def test_hanging_initializer_without_timeout_holds_the_job_by_design(
    platform: Platform, spawn: Spawn
) -> None:
    job_id = platform.fake.enqueue("held")
    worker = await spawn(platform.env(TW_INIT="hang"))
    await wait_taken(platform, job_id)
    with trio.fail_after(20):
        await platform.fake.wait_for_requests("ping", len(platform.fake.pings) + 5)
    assert all(job_id in p.job_ids for p in platform.fake.pings[-4:])
    assert platform.fake.job(job_id).done_reports == []
    assert platform.fake.job(job_id).status == "IN_PROGRESS"
    # SIGTERM during init: the gated job is released (not reported), exit 0.
    worker.signal(signal.SIGTERM)
    await exits(worker, 0)
    assert platform.fake.job(job_id).done_reports == []


async def test_cuda_fault_during_init_is_a_cuda_error(platform: Platform, spawn: Spawn) -> None:
    job_id = platform.fake.enqueue("x")
    worker = await spawn(platform.env(TW_INIT="cuda_fault"))
    error = await failed_with_init(platform, job_id)
    assert error["error_category"] == "cuda_error"
    assert "Compile with TORCH_USE_CUDA_DSA" in str(error["logs"])
    await exits(worker, 1)


async def test_concurrency_3_all_three_failed_with_the_same_reason_within_a_second(
    platform: Platform, spawn: Spawn
) -> None:
    ids = [platform.fake.enqueue(i) for i in range(3)]
    worker = await spawn(platform.env(TW_INIT="oom", TW_INIT_SECONDS="1.0", TW_CONCURRENCY="3"))
    errors = [await failed_with_init(platform, job_id) for job_id in ids]
    assert len({(e["error_type"], e["error_message"]) for e in errors}) == 1
    done_times = [platform.fake.job(i).done_time for i in ids]
    assert all(t is not None for t in done_times)
    assert max(done_times) - min(done_times) < 1.0  # type: ignore[type-var,operator]
    assert all(platform.fake.job(i).requeues == [] for i in ids)
    await exits(worker, 1)


async def test_user_timeout_error_is_the_users_error_not_the_sdk_timeout(
    platform: Platform, spawn: Spawn
) -> None:
    job_id = platform.fake.enqueue("x")
    worker = await spawn(platform.env(TW_INIT="user_timeout", TW_INIT_TIMEOUT="30"))
    error = await failed_with_init(platform, job_id)
    assert error["error_type"] == "TimeoutError"
    assert error["error_category"] != "timeout"
    await exits(worker, 1)


async def test_init_timeout_zero_times_out_at_once(platform: Platform, spawn: Spawn) -> None:
    job_id = platform.fake.enqueue("x")
    worker = await spawn(platform.env(TW_INIT="ok", TW_INIT_TIMEOUT="0"))
    error = await failed_with_init(platform, job_id)
    assert error["error_type"] == "InitTimeout"
    await exits(worker, 1)


async def test_threads_left_behind_do_not_keep_the_process_alive(
    platform: Platform, spawn: Spawn
) -> None:
    job_id = platform.fake.enqueue("x")
    worker = await spawn(platform.env(TW_INIT="leaves_thread"))
    await failed_with_init(platform, job_id)
    await exits(worker, 1, within=10)


async def test_stop_signal_for_a_job_waiting_at_the_gate(platform: Platform, spawn: Spawn) -> None:
    job_id = platform.fake.enqueue("stop me")
    worker = await spawn(platform.env(TW_INIT="hang"))
    await wait_taken(platform, job_id)
    platform.fake.request_stop(job_id)
    with trio.fail_after(20):
        while True:
            await platform.fake.wait_for_requests("ping", len(platform.fake.pings) + 1)
            if job_id not in platform.fake.pings[-1].job_ids:
                break
    assert platform.fake.job(job_id).done_reports == []
    worker.signal(signal.SIGTERM)
    await exits(worker, 0)


async def test_exit_is_bounded_by_claim_grace_plus_report_deadline(
    platform: Platform, spawn: Spawn
) -> None:
    platform.fake.take_hold = 30.0
    worker = await spawn(
        platform.env(TW_INIT="async_raise_now", TW_CLAIM_GRACE="0.5", TW_REPORT_DEADLINE="0.5")
    )
    # Nothing is queued: the claim take long-polls, its grace cuts it, and the worker exits.
    await exits(worker, 1, within=10)
