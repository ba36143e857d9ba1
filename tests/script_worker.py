"""A worker script run as its own process against the fake platform, for the tests that
need a fresh interpreter (what it imports, which backend its code lands on)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import trio
import trio.lowlevel

from trio_worker.testing import FakePlatform, JobRecord, run_platform_server

REPO = Path(__file__).resolve().parents[1]
WAIT = 30.0  # a safety bound on each wait; never reached when the code is right


async def run_script_job(script: Path, job_input: dict[str, object]) -> tuple[JobRecord, int]:
    """Run *script* (a file calling ``trio_worker.start``) as a queue worker until the
    platform has the report of one job of *job_input*; the job's record and the exit
    status after a SIGTERM. The environment drops ``RUNPOD_*`` and proxy variables."""
    platform = FakePlatform(take_hold=1.0, stop_hold=1.0)
    async with run_platform_server(platform) as url:
        job_id = platform.enqueue(job_input)
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("RUNPOD_") and not k.upper().endswith("_PROXY")
        }
        env.update(platform.worker_env(url, ping_interval_ms=200))
        env.pop("PYTHONPATH", None)  # the installed package, as a user runs it
        worker = await trio.lowlevel.open_process(
            [sys.executable, str(script)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            with trio.fail_after(WAIT):
                record = await platform.wait_for_status(job_id)
        finally:
            worker.send_signal(signal.SIGTERM)
            with trio.move_on_after(WAIT):
                await worker.wait()
            if worker.returncode is None:
                os.killpg(worker.pid, signal.SIGKILL)
                await worker.wait()
    assert worker.returncode is not None
    return record, worker.returncode
