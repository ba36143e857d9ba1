"""Delivery end to end: a real worker process whose platform fails for real, over loopback.

The virtual-time suite (tests/test_delivery.py) covers minutes of outage; these keep to a
second or two of wall time and check the same promises across a real socket and process
(docs/design.md §5).
"""

from __future__ import annotations

import json
import os
import signal

import pytest
import trio

from trio_worker.testing import FakePlatform, Fault, run_platform_server

from ..conftest import Platform
from .conftest import Spawn

pytestmark = pytest.mark.slow


async def test_a_503_outage_of_a_second_loses_nothing(platform: Platform, spawn: Spawn) -> None:
    """Five 503 answers in a row (about a second of backoff): the result still lands.

    The outage is counted in answers, not in seconds from the test's start: a worker that
    starts slowly on a loaded machine would otherwise miss a timed outage altogether."""
    fake = platform.fake
    fake.inject(Fault("done", status=503, times=5))
    job_id = fake.enqueue({"n": 1})
    worker = await spawn(platform.env(TW_HANDLER="async_echo"))
    with trio.fail_after(20):
        record = await fake.wait_for_status(job_id, "COMPLETED")
    assert record.output == {"echo": {"n": 1}}
    done = [r for r in fake.requests if r.route == "done"]
    # The last answer's status is recorded as it is sent, a moment after the job is stored.
    assert len(done) == 6
    assert [r.status for r in done[:5]] == [503] * 5
    worker.signal(signal.SIGTERM)
    assert await worker.wait() == 0, worker.output


async def test_a_platform_gone_for_a_while_gets_the_result_when_back(
    spawn: Spawn, nursery: trio.Nursery
) -> None:
    """The platform's server goes away (connections refused) while the job runs, and comes
    back on the same port 3 s later: the result is delivered, not lost."""
    fake = FakePlatform(take_hold=1.0, stop_hold=1.0)
    back = trio.Event()
    gone = trio.Event()

    async def serve_twice(task_status: trio.TaskStatus[str]) -> None:
        async with run_platform_server(fake) as url:
            task_status.started(url)
            await fake.wait_for_status(job_id, "IN_PROGRESS")
        gone.set()
        # Longer than the old retry window (six attempts, about 1.5 s): a real outage.
        await trio.sleep(3.0)
        port = int(url.rsplit(":", 1)[1])
        async with run_platform_server(fake, port=port):
            back.set()
            await trio.sleep_forever()

    job_id = fake.enqueue({"seconds": 0.5})
    url = await nursery.start(serve_twice)
    env = fake.worker_env(url, ping_interval_ms=200)
    worker = await spawn({**_clean_env(), **env, "TW_HANDLER": "slow_async"})
    with trio.fail_after(30):
        await gone.wait()
        record = await fake.wait_for_status(job_id, "COMPLETED")
    assert back.is_set()
    assert record.output == {"slept": True}
    worker.signal(signal.SIGTERM)
    assert await worker.wait() == 0, worker.output
    nursery.cancel_scope.cancel()


@pytest.mark.parametrize("status", [400, 413])
async def test_a_refused_result_reaches_the_caller_as_result_refused(
    status: int, platform: Platform, spawn: Spawn
) -> None:
    fake = platform.fake
    fake.inject(Fault("done", status=status))
    job_id = fake.enqueue({"n": 1})
    worker = await spawn(platform.env(TW_HANDLER="async_echo"))
    with trio.fail_after(20):
        record = await fake.wait_for_status(job_id, "FAILED")
    assert isinstance(record.error, str)
    error = json.loads(record.error)
    assert error["error_type"] == "ResultRefused"
    assert f"HTTP {status}" in error["error_message"]
    worker.signal(signal.SIGTERM)
    assert await worker.wait() == 0, worker.output
    assert f"RESULT REFUSED for job {job_id}" in worker.output


async def test_at_shutdown_a_pending_result_is_retried_through_the_grace_then_logged(
    platform: Platform, spawn: Spawn
) -> None:
    fake = platform.fake
    fake.inject(Fault("done", status=503, times=10**6))
    job_id = fake.enqueue({"n": 1})
    worker = await spawn(
        platform.env(TW_HANDLER="async_echo", TW_SHUTDOWN_GRACE="1.5", TW_REPORT_DEADLINE="0.5")
    )
    with trio.fail_after(20):
        await fake.wait_for_requests("done", 2)
    worker.signal(signal.SIGTERM)
    assert await worker.wait() == 0, worker.output
    assert fake.job(job_id).status == "IN_PROGRESS"
    assert f"RESULT LOST for job {job_id}" in worker.output


def _clean_env() -> dict[str, str]:
    not_ours = ("RUNPOD_", "TW_", "PYTHONPATH")  # the installed package, as a user runs it
    return {k: v for k, v in os.environ.items() if not k.startswith(not_ours)}
