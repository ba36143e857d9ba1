"""A handler that calls sys.exit() (or raises KeyboardInterrupt) ends the worker process,
as the reference's would, after its job is reported failed (docs/design.md §9)."""

from __future__ import annotations

import json

import pytest
import trio

from ..conftest import Platform
from .conftest import Spawn

pytestmark = pytest.mark.slow


def inner_error(body: object) -> dict[str, object]:
    assert isinstance(body, dict), body
    parsed = json.loads(body["error"])
    assert isinstance(parsed, dict)
    return parsed


@pytest.mark.parametrize(("handler", "backend"), [("exits", "trio"), ("async_exits", "asyncio")])
async def test_sys_exit_fails_the_job_then_the_process_exits_with_its_status(
    platform: Platform, spawn: Spawn, handler: str, backend: str
) -> None:
    job_id = platform.fake.enqueue({"code": 3})
    later = platform.fake.enqueue({"code": 4})
    worker = await spawn(platform.env(TW_HANDLER=handler, TW_BACKEND=backend))
    status = await worker.wait()
    assert status == 3, worker.output
    record = platform.fake.job(job_id)
    assert record.status == "FAILED"
    error = inner_error(record.done_reports[0])
    assert error["error_type"] == "SystemExit"
    assert error["error_message"] == (
        "handler called sys.exit(3): the worker exits with status 3 once this report is delivered"
    )
    # The worker stopped taking: the next job waits for a healthy worker.
    assert platform.fake.job(later).status == "IN_QUEUE"
    assert f"job {job_id} failed: SystemExit: handler called sys.exit(3)" in worker.output
    assert "worker crashed" not in worker.output


async def test_keyboard_interrupt_in_a_handler_exits_130(platform: Platform, spawn: Spawn) -> None:
    job_id = platform.fake.enqueue({"interrupt": True})
    worker = await spawn(platform.env(TW_HANDLER="exits"))
    assert await worker.wait() == 130, worker.output
    error = inner_error(platform.fake.job(job_id).done_reports[0])
    assert error["error_type"] == "KeyboardInterrupt"
    assert "status 130" in str(error["error_message"])


async def test_other_running_jobs_get_the_shutdown_grace_then_fail(
    platform: Platform, spawn: Spawn
) -> None:
    slow = platform.fake.enqueue({"seconds": 60})
    worker = await spawn(
        platform.env(TW_HANDLER="exits", TW_CONCURRENCY="2", TW_SHUTDOWN_GRACE="0.5")
    )
    with trio.fail_after(20):
        await platform.fake.wait_for_status(slow, "IN_PROGRESS")
    exiting = platform.fake.enqueue({"code": 5})
    assert await worker.wait() == 5, worker.output
    assert inner_error(platform.fake.job(exiting).done_reports[0])["error_type"] == "SystemExit"
    cut = inner_error(platform.fake.job(slow).done_reports[0])
    assert cut["error_type"] == "WorkerShutdown"
    assert cut["error_category"] == "worker_shutdown"
