"""A SIGTERM that lands while ``start()`` builds the worker (docs/design.md §9).

``start()`` installs its signal handlers before the worker exists, so a signal can arrive
in between (a deploy scaled down while the container was still starting). It must not be
lost: the worker, once built, shuts down at once, exits 0, and holds no job it did not
report. The child (``signal_at_start_app.py``) sends the signal to itself from a log
handler on the ``worker starting`` line, inside that window every time.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import trio

from ..conftest import Platform
from .conftest import WorkerProcess, kill_all, open_worker

pytestmark = pytest.mark.slow

APP = Path(__file__).with_name("signal_at_start_app.py")


async def test_sigterm_while_the_worker_is_built_shuts_it_down_cleanly(
    platform: Platform, nursery: trio.Nursery
) -> None:
    job_id = platform.fake.enqueue({"n": 1})
    worker: WorkerProcess = await open_worker(nursery, [sys.executable, str(APP)], platform.env())
    try:
        # Lost, the signal would leave the worker taking jobs until the exit watchdog
        # ended it with status 1, shutdown_grace + exit_watchdog (5 s) after the signal.
        status = await worker.wait(timeout=30)
    finally:
        await kill_all([worker])
    output = worker.output
    assert status == 0, output
    sent = output.index("test: sending SIGTERM while the worker is being built")
    assert output.index("shutting down (SIGTERM received)") > sent, output
    assert "exit watchdog" not in output
    # Nothing lost: the job was never handed out, or it was reported once.
    record = platform.fake.job(job_id)
    assert record.taken_by is None or len(record.done_reports) == 1, (record, output)
    assert platform.fake.statistics().unknown_job_reports == 0
