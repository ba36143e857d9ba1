"""The core worker end to end: a real worker process against the fake platform over loopback."""

from __future__ import annotations

import itertools
import json
import signal

import pytest
import trio

from trio_worker.testing import Fault

from ..conftest import Platform
from .conftest import Spawn

pytestmark = pytest.mark.slow


@pytest.fixture(params=["trio", "asyncio"])
def backend(request: pytest.FixtureRequest) -> str:
    """The worker's async_backend: tests taking this run the same scenario on both."""
    return str(request.param)


def inner_error(body: object) -> dict[str, object]:
    """The JSON object inside ``{"error": "<JSON string>"}``."""
    assert isinstance(body, dict), body
    error = body["error"]
    assert isinstance(error, str), error
    parsed = json.loads(error)
    assert isinstance(parsed, dict)
    return parsed


async def stop_worker(worker: object) -> None:
    from .conftest import WorkerProcess

    assert isinstance(worker, WorkerProcess)
    worker.signal(signal.SIGTERM)
    assert await worker.wait() == 0, worker.output


async def test_sync_handler_completes_every_job_once(platform: Platform, spawn: Spawn) -> None:
    ids = [platform.fake.enqueue({"n": i}) for i in range(5)]
    worker = await spawn(platform.env(TW_HANDLER="echo"))
    with trio.fail_after(20):
        for n, job_id in enumerate(ids):
            record = await platform.fake.wait_for_status(job_id, "COMPLETED")
            assert record.output == {"echo": {"n": n}, "model_ready": False}
    await stop_worker(worker)
    for job_id in ids:
        assert platform.fake.job(job_id).duplicates == []
    done = [r for r in platform.fake.requests if r.route == "done"]
    assert all(r.query["isStream"] == "false" for r in done)
    takes = [r for r in platform.fake.requests if r.route == "take"]
    assert takes and all(r.headers["authorization"] == "fake-key" for r in takes)


async def test_async_handler(platform: Platform, spawn: Spawn, backend: str) -> None:
    job_id = platform.fake.enqueue("hi")
    worker = await spawn(platform.env(TW_BACKEND=backend, TW_HANDLER="async_echo"))
    with trio.fail_after(20):
        record = await platform.fake.wait_for_status(job_id, "COMPLETED")
    assert record.output == {"echo": "hi"}
    await stop_worker(worker)


@pytest.mark.parametrize("handler", ["sync_gen", "async_gen"])
@pytest.mark.parametrize("aggregate", [False, True])
async def test_generators_stream_chunks_in_order(
    platform: Platform, spawn: Spawn, handler: str, aggregate: bool, backend: str
) -> None:
    job_id = platform.fake.enqueue({})
    env = platform.env(
        TW_BACKEND=backend, TW_HANDLER=handler, TW_AGGREGATE="1" if aggregate else "0"
    )
    worker = await spawn(env)
    with trio.fail_after(20):
        record = await platform.fake.wait_for_status(job_id, "COMPLETED")
    expected = (
        [{"chunk": i} for i in range(3)]
        if handler == "sync_gen"
        else [f"token-{i}" for i in range(3)]
    )
    assert record.stream == expected
    assert record.output == (expected if aggregate else [])
    assert record.is_stream is True
    await stop_worker(worker)


async def test_handler_error_carries_type_category_and_fd_level_logs(
    platform: Platform, spawn: Spawn
) -> None:
    job_id = platform.fake.enqueue({"x": 1})
    worker = await spawn(platform.env(TW_HANDLER="raises"))
    with trio.fail_after(20):
        record = await platform.fake.wait_for_status(job_id, "FAILED")
    error = inner_error(record.done_reports[0])
    assert error["error_type"] == "ValueError"
    assert error["error_message"] == "bad input {'x': 1}"
    assert "Traceback" in str(error["error_traceback"])
    assert error["error_category"] == "unknown"
    assert error["worker_id"] == "w1"
    logs = str(error["logs"])
    for line in (
        "python stdout",
        "python stderr",
        "fd1 raw write",
        "fd2 raw write",
        "child stdout",
        "child stderr",
    ):
        assert f"{line} {job_id}" in logs, (line, logs)
    await stop_worker(worker)
    # Pass-through: the real stdout/stderr still got everything.
    assert f"child stderr {job_id}" in worker.output


async def test_generator_raising_mid_stream_fails_after_one_chunk(
    platform: Platform, spawn: Spawn, backend: str
) -> None:
    job_id = platform.fake.enqueue({})
    worker = await spawn(platform.env(TW_BACKEND=backend, TW_HANDLER="gen_raises"))
    with trio.fail_after(20):
        record = await platform.fake.wait_for_status(job_id, "FAILED")
    assert record.stream == ["first"]
    error = record.error
    assert isinstance(error, str)
    assert error.startswith("handler: decoder crashed mid-stream \ntraceback: ")
    assert "\nlogs:\n" in error and "about to fail mid-stream" in error
    await stop_worker(worker)


@pytest.mark.parametrize(
    ("handler", "error_type", "needle"),
    [
        ("non_json", "OutputNotSerializable", "set"),
        ("huge", "OutputTooLarge", "over the platform limit"),
    ],
)
async def test_undeliverable_output_is_reported_not_dropped(
    platform: Platform, spawn: Spawn, handler: str, error_type: str, needle: str
) -> None:
    job_id = platform.fake.enqueue({})
    worker = await spawn(platform.env(TW_HANDLER=handler))
    with trio.fail_after(20):
        record = await platform.fake.wait_for_status(job_id, "FAILED")
    error = inner_error(record.done_reports[0])
    assert error["error_type"] == error_type
    assert needle in str(error["error_message"])
    await stop_worker(worker)


async def test_concurrency_batch_takes_and_never_exceeds_capacity(
    platform: Platform, spawn: Spawn, backend: str
) -> None:
    ids = [platform.fake.enqueue({"seconds": 0.2}) for _ in range(8)]
    worker = await spawn(
        platform.env(TW_BACKEND=backend, TW_HANDLER="slow_async", TW_CONCURRENCY="4")
    )
    with trio.fail_after(30):
        for job_id in ids:
            await platform.fake.wait_for_status(job_id, "COMPLETED")
    await stop_worker(worker)
    batch = [r for r in platform.fake.requests if r.route == "take_batch"]
    assert batch, "with 4 free slots the worker must use the batch route"
    assert all(1 < int(r.query["batch_size"]) <= 4 for r in batch)
    pings = [p for p in platform.fake.pings if p.job_ids]
    assert pings and max(len(p.job_ids) for p in pings) <= 4


async def test_stop_signal_cancels_running_job_and_reports_nothing(
    platform: Platform, spawn: Spawn, backend: str
) -> None:
    job_id = platform.fake.enqueue({"seconds": 60})
    worker = await spawn(platform.env(TW_BACKEND=backend, TW_HANDLER="slow_async"))
    with trio.fail_after(20):
        while platform.fake.job(job_id).taken_by is None:
            await platform.fake.wait_for_requests("ping", len(platform.fake.pings) + 1)
        platform.fake.request_stop(job_id)
        # The worker stops listing it once the handler has unwound.
        while True:
            await platform.fake.wait_for_requests("ping", len(platform.fake.pings) + 1)
            if job_id not in platform.fake.pings[-1].job_ids:
                break
    assert platform.fake.job(job_id).done_reports == []
    await stop_worker(worker)


async def test_sync_handler_stops_cooperatively_with_check_cancelled(
    platform: Platform, spawn: Spawn
) -> None:
    job_id = platform.fake.enqueue({"seconds": 60})
    follow_up = platform.fake.enqueue({"seconds": 0})
    worker = await spawn(platform.env(TW_HANDLER="slow_sync"))
    with trio.fail_after(20):
        while platform.fake.job(job_id).taken_by is None:
            await platform.fake.wait_for_requests("ping", len(platform.fake.pings) + 1)
        platform.fake.request_stop(job_id)
        # The slot frees once the thread returns, so the next job runs.
        await platform.fake.wait_for_status(follow_up, "COMPLETED")
    assert platform.fake.job(job_id).done_reports == []
    await stop_worker(worker)


async def test_job_done_5xx_and_429_are_retried_until_delivered(
    platform: Platform, spawn: Spawn
) -> None:
    platform.fake.inject(Fault("done", status=503, times=2))
    platform.fake.inject(Fault("done", status=429, times=1))
    job_id = platform.fake.enqueue("retry me")
    worker = await spawn(platform.env(TW_HANDLER="async_echo"))
    with trio.fail_after(20):
        record = await platform.fake.wait_for_status(job_id, "COMPLETED")
    assert record.output == {"echo": "retry me"}
    assert len([r for r in platform.fake.requests if r.route == "done"]) == 4
    await stop_worker(worker)


async def test_take_errors_back_off_instead_of_spinning(platform: Platform, spawn: Spawn) -> None:
    platform.fake.inject(Fault("take", status=500, times=5))
    job_id = platform.fake.enqueue("after errors")
    worker = await spawn(platform.env(TW_HANDLER="async_echo"))
    with trio.fail_after(30):
        await platform.fake.wait_for_status(job_id, "COMPLETED")
    await stop_worker(worker)
    takes = [r for r in platform.fake.requests if r.route == "take"]
    gaps = [b.time - a.time for a, b in itertools.pairwise(takes)]
    # Backoff with jitter: the reference re-polls at once (~2,400 requests/s).
    assert sum(gaps) > 0.1, gaps


async def test_malformed_job_gets_a_clear_error_and_others_still_run(
    platform: Platform, spawn: Spawn
) -> None:
    platform.fake.enqueue_raw({"id": "no-input-job"})
    good = platform.fake.enqueue("fine")
    worker = await spawn(platform.env(TW_HANDLER="async_echo"))
    with trio.fail_after(20):
        await platform.fake.wait_for_status(good, "COMPLETED")
        while not [
            r for r in platform.fake.requests if r.route == "done" and "no-input-job" in r.path
        ]:
            await platform.fake.wait_for_requests("done", len(platform.fake.requests) + 1)
    report = next(
        r for r in platform.fake.requests if r.route == "done" and "no-input-job" in r.path
    )
    error = inner_error(report.json())
    assert error["error_type"] == "trio_worker.MalformedJob"
    assert "input" in str(error["error_message"])
    await stop_worker(worker)


async def test_heartbeat_keeps_pinging_while_handler_blocks_the_loop(
    platform: Platform, spawn: Spawn
) -> None:
    job_id = platform.fake.enqueue({"seconds": 2.0})
    worker = await spawn(platform.env(TW_HANDLER="blocks_loop"))
    with trio.fail_after(20):
        record = await platform.fake.wait_for_status(job_id, "COMPLETED")
    assert record.take_time is not None and record.done_time is not None
    # A ping in flight when the take landed may list nothing yet: skip one interval each side.
    window = (record.take_time + 0.25, record.done_time - 0.25)
    during = [p for p in platform.fake.pings if window[0] < p.time < window[1]]

    # 200 ms interval over a 2 s blocked loop: about ten pings, each listing the job; the
    # bound is loose because a loaded CI machine delays threads too.
    assert len(during) >= 3, during
    assert all(job_id in p.job_ids for p in during)
    await stop_worker(worker)


async def test_progress_updates_arrive_before_the_result(
    platform: Platform, spawn: Spawn, backend: str
) -> None:
    job_id = platform.fake.enqueue({})
    worker = await spawn(platform.env(TW_BACKEND=backend, TW_HANDLER="progress"))
    with trio.fail_after(20):
        record = await platform.fake.wait_for_status(job_id, "COMPLETED")
    assert sorted(record.progress, key=str) == [{"step": 1}, {"step": 2}]
    assert record.late_progress == []
    await stop_worker(worker)


async def test_refresh_worker_stops_after_first_job_with_stop_pod(
    platform: Platform, spawn: Spawn, backend: str
) -> None:
    first = platform.fake.enqueue("one")
    second = platform.fake.enqueue("two")
    worker = await spawn(platform.env(TW_BACKEND=backend, TW_HANDLER="async_echo", TW_REFRESH="1"))
    assert await worker.wait() == 0
    record = platform.fake.job(first)
    assert record.status == "COMPLETED" and record.stop_pod
    assert platform.fake.job(second).status == "IN_QUEUE"


async def test_sigterm_gives_running_jobs_grace_then_fails_them(
    platform: Platform, spawn: Spawn, backend: str
) -> None:
    job_id = platform.fake.enqueue({"seconds": 60})
    worker = await spawn(
        platform.env(TW_BACKEND=backend, TW_HANDLER="slow_async", TW_SHUTDOWN_GRACE="0.5")
    )
    with trio.fail_after(20):
        while platform.fake.job(job_id).taken_by is None:
            await platform.fake.wait_for_requests("ping", len(platform.fake.pings) + 1)
    worker.signal(signal.SIGTERM)
    with trio.fail_after(10):
        assert await worker.wait() == 0
    error = inner_error(platform.fake.job(job_id).done_reports[0])
    assert error["error_category"] == "worker_shutdown"


async def test_sigterm_during_long_poll_exits_promptly(
    platform: Platform, spawn: Spawn, backend: str
) -> None:
    platform.fake.take_hold = 30.0
    platform.fake.stop_hold = 30.0
    worker = await spawn(platform.env(TW_BACKEND=backend, TW_HANDLER="async_echo"))
    with trio.fail_after(20):
        await platform.fake.wait_for_requests("take", 1)
        await platform.fake.wait_for_requests("stop", 1)
    worker.signal(signal.SIGTERM)
    with trio.fail_after(5):
        assert await worker.wait() == 0


async def test_bad_configuration_fails_at_start_naming_the_variable(
    platform: Platform, spawn: Spawn
) -> None:
    worker = await spawn(platform.env(RUNPOD_PING_INTERVAL="soon"))
    assert await worker.wait() == 1
    assert "RUNPOD_PING_INTERVAL" in worker.output


async def test_second_sigint_exits_at_once(platform: Platform, spawn: Spawn, backend: str) -> None:
    job_id = platform.fake.enqueue({"seconds": 60})
    worker = await spawn(
        platform.env(TW_BACKEND=backend, TW_HANDLER="slow_async", TW_SHUTDOWN_GRACE="60")
    )
    with trio.fail_after(20):
        while platform.fake.job(job_id).taken_by is None:
            await platform.fake.wait_for_requests("ping", len(platform.fake.pings) + 1)
    worker.signal(signal.SIGINT)
    with trio.fail_after(20):
        # The first SIGINT is a graceful shutdown: the worker stops taking.
        await platform.fake.wait_for_requests("ping", len(platform.fake.pings) + 1)
    worker.signal(signal.SIGINT)
    with trio.fail_after(5):
        assert await worker.wait() == 130
