"""Exit is bounded (docs/design.md §9): real worker processes, real signals.

The bounds asserted are generous on purpose (no tight timing): each test gives the worker
a long reason to stay (a 60 s grace, a ping hung for an hour, a handler that never returns)
and checks it left long before that reason would have let it.
"""

from __future__ import annotations

import json
import signal

import pytest
import trio

from trio_worker.testing import Fault

from ..conftest import Platform
from .conftest import Spawn, WorkerProcess

pytestmark = pytest.mark.slow


async def until_taken(platform: Platform, job_id: str) -> None:
    with trio.fail_after(20):
        while platform.fake.job(job_id).taken_by is None:
            await platform.fake.wait_for_requests("*", len(platform.fake.requests) + 1)


async def exits_within(worker: WorkerProcess, seconds: float) -> int:
    started = trio.current_time()
    status = await worker.wait(timeout=seconds)
    assert trio.current_time() - started < seconds
    return status


async def test_handler_swallowing_cancellation_cannot_hold_the_process(
    platform: Platform, spawn: Spawn
) -> None:
    job_id = platform.fake.enqueue({})
    env = platform.env(TW_HANDLER="swallows_cancel", TW_SHUTDOWN_GRACE="1", TW_EXIT_WATCHDOG="2")
    worker = await spawn(env)
    await until_taken(platform, job_id)
    worker.signal(signal.SIGTERM)
    # grace 1 s + watchdog 2 s, plus a generous margin for a loaded machine.
    assert await exits_within(worker, 1 + 2 + 10) == 0, worker.output
    assert "handler swallowed the cancellation" in worker.output
    # The report owed for the job went out on its behalf.
    record = platform.fake.job(job_id)
    assert len(record.done_reports) == 1, worker.output
    body = record.done_reports[0]
    assert isinstance(body, dict)
    assert json.loads(body["error"])["error_category"] == "worker_shutdown"


async def test_blocked_event_loop_is_ended_by_the_watchdog(
    platform: Platform, spawn: Spawn
) -> None:
    # An async handler blocking the loop for an hour: no trio code runs, signals included.
    job_id = platform.fake.enqueue({"seconds": 3600})
    env = platform.env(TW_HANDLER="blocks_loop", TW_SHUTDOWN_GRACE="1", TW_EXIT_WATCHDOG="1")
    worker = await spawn(env)
    await until_taken(platform, job_id)
    await trio.sleep(0.3)  # the handler is now blocking the loop
    worker.signal(signal.SIGTERM)
    assert await exits_within(worker, 1 + 1 + 10) == 1, worker.output
    assert "exit watchdog" in worker.output


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
async def test_second_signal_exits_at_once(
    platform: Platform, spawn: Spawn, signum: int, status: int
) -> None:
    job_id = platform.fake.enqueue({"seconds": 600})
    worker = await spawn(platform.env(TW_HANDLER="slow_async", TW_SHUTDOWN_GRACE="60"))
    await until_taken(platform, job_id)
    worker.signal(signum)
    # Two signals sent before the process handles the first are one to the kernel (and to
    # Python's handler): the second is sent only once the worker has logged the first.
    name = signal.Signals(signum).name
    await worker.until_output(f"shutting down ({name} received)")
    with trio.fail_after(20):
        # The first signal is a graceful shutdown: the worker stops taking, keeps pinging.
        await platform.fake.wait_for_requests("ping", len(platform.fake.pings) + 1)
    worker.signal(signum)
    # Well before the 60 s grace would have ended.
    assert await exits_within(worker, 20) == status, worker.output


async def test_second_signal_exits_even_while_the_loop_is_blocked(
    platform: Platform, spawn: Spawn
) -> None:
    job_id = platform.fake.enqueue({"seconds": 3600})
    env = platform.env(TW_HANDLER="blocks_loop", TW_SHUTDOWN_GRACE="60", TW_EXIT_WATCHDOG="60")
    worker = await spawn(env)
    await until_taken(platform, job_id)
    await trio.sleep(0.3)
    worker.signal(signal.SIGTERM)
    await trio.sleep(0.3)
    worker.signal(signal.SIGTERM)
    assert await exits_within(worker, 20) == 143, worker.output


async def test_hung_ping_does_not_delay_the_exit(platform: Platform, spawn: Spawn) -> None:
    # A ping that is never answered: the ping's own timeout is 2 intervals (40 s here).
    platform.fake.inject(Fault("ping", delay=3600, times=1000))
    worker = await spawn(platform.env(TW_HANDLER="async_echo", RUNPOD_PING_INTERVAL="20000"))
    with trio.fail_after(20):
        await platform.fake.wait_for_requests("ping", 1)
        await platform.fake.wait_for_requests("take", 1)
    worker.signal(signal.SIGTERM)
    assert await exits_within(worker, 15) == 0, worker.output
