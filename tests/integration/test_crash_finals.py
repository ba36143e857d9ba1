"""A watched worker that dies never leaves a job with two different finals, and a signal
delivered to both processes counts once (docs/design.md §13.2, §13.4).

Each test starts ``watched_app.py`` (the process started is the crash watchdog, the worker
its child) against the loopback fake platform, with the installed package: no PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest
import trio

from trio_worker.testing import Fault

from ..conftest import Platform
from .conftest import WorkerProcess, open_worker

pytestmark = pytest.mark.slow

APP = Path(__file__).with_name("watched_app.py")


def installed_env(platform: Platform, **overrides: str) -> dict[str, str]:
    """The worker's environment, finding trio_worker where it is installed."""
    env = platform.env(**overrides)
    env.pop("PYTHONPATH", None)
    return env


async def start(nursery: trio.Nursery, platform: Platform, **env: str) -> WorkerProcess:
    return await open_worker(
        nursery, [sys.executable, "-u", str(APP)], installed_env(platform, **env)
    )


async def worker_pid(worker: WorkerProcess) -> int:
    # The whole line: a pid read before its last digits arrived names another process.
    match = await worker.until_match(r"worker pid (\d+)\r?\n")
    return int(match.group(1))


def error_of(report: object) -> dict[str, object]:
    assert isinstance(report, dict), report
    error = json.loads(str(report["error"]))
    assert isinstance(error, dict)
    return error


async def test_a_result_in_flight_at_the_death_is_sent_again_never_replaced(
    platform: Platform, nursery: trio.Nursery
) -> None:
    """The platform stores the result, answers 1.5 s late, and the worker dies meanwhile:
    the watchdog sends the same body again, not a WorkerCrashed for a job that has its
    result."""
    fake = platform.fake
    fake.inject(Fault("done", delay=1.5, when="after", times=3))
    worker = await start(nursery, platform, CONCURRENCY="3")
    pid = await worker_pid(worker)
    jobs = [fake.enqueue({"n": n}) for n in range(3)]
    with trio.fail_after(30):
        for job_id in jobs:  # stored; the answers are on their way
            await fake.wait_for_status(job_id, "COMPLETED")
    os.kill(pid, signal.SIGKILL)
    assert await worker.wait() == 137, worker.output
    for job_id in jobs:
        record = fake.job(job_id)
        assert record.status == "COMPLETED", record.done_reports
        assert len(record.done_reports) == 2, record.done_reports
        assert record.done_reports[0] == record.done_reports[1]
    assert "sending the same report(s) again" in worker.output
    assert "WorkerCrashed" not in json.dumps([fake.job(j).done_reports for j in jobs])


async def test_a_job_the_platform_stopped_gets_nothing_when_the_worker_then_dies(
    platform: Platform, nursery: trio.Nursery
) -> None:
    fake = platform.fake
    worker = await start(nursery, platform)
    pid = await worker_pid(worker)
    job_id = fake.enqueue({"sync_seconds": 30})
    await worker.until_output(f"job {job_id} started")
    fake.request_stop(job_id)
    with trio.fail_after(20):
        # The platform has no event for a stop's delivery: look every 10 ms.
        while fake.job(job_id).stop_delivered_time is None:  # noqa: ASYNC110
            await trio.sleep(0.01)
    # The stop reached the worker; its sync handler cannot be interrupted, so the job is
    # still held when the worker dies.
    await trio.sleep(0.2)
    os.kill(pid, signal.SIGKILL)
    assert await worker.wait() == 137, worker.output
    assert fake.job(job_id).done_reports == []
    assert "it held no jobs" in worker.output


async def test_a_native_exit_0_with_a_job_held_is_a_death(
    platform: Platform, nursery: trio.Nursery
) -> None:
    fake = platform.fake
    job_id = fake.enqueue({"exit": 0})
    worker = await start(nursery, platform)
    assert await worker.wait() == 0, worker.output
    (report,) = fake.job(job_id).done_reports
    error = error_of(report)
    assert error["error_type"] == "WorkerCrashed"
    assert "exited with status 0" in str(error["error_message"])


async def test_a_death_with_no_job_held_is_said_once(
    platform: Platform, nursery: trio.Nursery
) -> None:
    worker = await start(nursery, platform)
    pid = await worker_pid(worker)
    os.kill(pid, signal.SIGSEGV)
    assert await worker.wait() == 139, worker.output
    assert worker.output.count("it held no jobs: nothing to report") == 1
    assert "killed by SIGSEGV" in worker.output


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_one_signal_delivered_to_both_processes_drains_once(
    platform: Platform, nursery: trio.Nursery, signum: int
) -> None:
    """systemd's control-group kill, `kill` on both pids, pkill: the running job is
    drained and delivered, and the worker exits 0, not at once as for a second signal."""
    fake = platform.fake
    worker = await start(nursery, platform)
    pid = await worker_pid(worker)
    job_id = fake.enqueue({"seconds": 1.0})
    await worker.until_output(f"job {job_id} started")
    os.kill(pid, signum)
    worker.signal(signum)
    assert await worker.wait() == 0, worker.output
    record = fake.job(job_id)
    assert record.status == "COMPLETED", record.done_reports
    assert len(record.done_reports) == 1
    assert "second signal" not in worker.output


async def test_a_second_later_signal_still_exits_at_once(
    platform: Platform, nursery: trio.Nursery
) -> None:
    fake = platform.fake
    worker = await start(nursery, platform, GRACE="30")
    await worker_pid(worker)
    job_id = fake.enqueue({"seconds": 60})
    await worker.until_output(f"job {job_id} started")
    worker.signal(signal.SIGTERM)
    await worker.until_output("SIGTERM received")
    await trio.sleep(1.2)  # past the window in which a signal could be the same delivery
    worker.signal(signal.SIGTERM)
    assert await worker.wait() == 143, worker.output
    assert "second signal (SIGTERM): exiting at once" in worker.output


async def test_sighup_to_the_watchdog_drains_the_worker_instead_of_losing_its_jobs(
    platform: Platform, nursery: trio.Nursery
) -> None:
    fake = platform.fake
    worker = await start(nursery, platform)
    await worker_pid(worker)
    job_id = fake.enqueue({"seconds": 0.5})
    await worker.until_output(f"job {job_id} started")
    worker.signal(signal.SIGHUP)
    assert await worker.wait() == 0, worker.output
    assert fake.job(job_id).status == "COMPLETED"
    assert "SIGHUP received; draining the worker" in worker.output


@pytest.mark.parametrize("signals", [1, 2])
async def test_a_signal_while_the_watchdog_reports_cuts_the_reports_a_second_ends_them(
    platform: Platform, nursery: trio.Nursery, signals: int
) -> None:
    """The platform holds every job-done for a minute; the watchdog's reports would take
    the whole shutdown grace (60 s). One SIGTERM cuts them to their report_deadline (1 s);
    a second one exits at once, with the worker's status either way."""
    fake = platform.fake
    worker = await start(nursery, platform, GRACE="60", REPORT_DEADLINE="1")
    pid = await worker_pid(worker)
    job_id = fake.enqueue({"seconds": 60})
    await worker.until_output(f"job {job_id} started")
    fake.inject(Fault("done", delay=60.0, times=100))
    os.kill(pid, signal.SIGKILL)
    await worker.until_output("reporting the 1 job(s) it held")
    with trio.fail_after(20):  # not the 60 s grace: the reports were cut
        for _ in range(signals):
            worker.signal(signal.SIGTERM)
            await worker.until_output("SIGTERM while reporting")
            await trio.sleep(0.1)
        assert await worker.wait() == 137, worker.output
    if signals == 1:
        assert "RESULT LOST for job" in worker.output  # its deadline came first
