"""A clean exit runs the user's ``atexit`` handlers, bounded (docs/design.md §6.3).

The process leaves through ``os._exit`` so a leftover thread cannot keep it alive; before
that, what the user registered with ``atexit`` runs (a model cache synced to the network
volume, a telemetry flush), each exit path here, and a handler that hangs costs at most
half the exit watchdog.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest
import trio

from ..conftest import Platform
from .conftest import open_worker

pytestmark = pytest.mark.slow

ATEXIT_APP = """
import atexit, os, threading, time
import trio
import trio_worker

def at_exit():
    print("atexit handler ran", flush=True)
    with open(os.environ["ATEXIT_FILE"], "w") as f:
        f.write("synced")
    if os.environ.get("ATEXIT_HANG"):
        threading.Event().wait()

atexit.register(at_exit)

def init():
    if os.environ.get("INIT_FAILS"):
        raise RuntimeError("weights missing")

async def handler(job):
    print(f"job {job['id']} started", flush=True)
    await trio.sleep(job["input"].get("seconds", 0))
    return {"ok": True}

trio_worker.start(
    handler,
    initializer=init,
    async_backend="trio",  # the handler is trio code
    refresh_worker=bool(os.environ.get("REFRESH")),
    timings=trio_worker.Timings(shutdown_grace=0.2, exit_flush_watchdog=1.0),
)
"""


@pytest.fixture
def app(tmp_path: Path) -> Path:
    path = tmp_path / "atexit_app.py"
    path.write_text(ATEXIT_APP)
    return path


async def run_app(
    nursery: trio.Nursery, app: Path, platform: Platform, marker: Path, *args: str, **env: str
) -> tuple[int, str]:
    worker = await open_worker(
        nursery,
        [sys.executable, "-u", str(app), *args],
        platform.env(ATEXIT_FILE=str(marker), **env),
    )
    if not args and not env.get("INIT_FAILS") and not env.get("REFRESH"):
        job_id = platform.fake.enqueue({"seconds": 60})
        await worker.until_output(f"job {job_id} started")
        worker.signal(signal.SIGTERM)
    status = await worker.wait()
    return status, worker.output


async def test_after_sigterm_in_queue_mode(
    platform: Platform, app: Path, nursery: trio.Nursery, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    status, output = await run_app(nursery, app, platform, marker)
    assert status == 0, output
    assert marker.read_text() == "synced", output


async def test_after_test_input(
    platform: Platform, app: Path, nursery: trio.Nursery, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    status, output = await run_app(
        nursery, app, platform, marker, "--test_input", '{"input": {"seconds": 0}}'
    )
    assert status == 0, output
    assert marker.read_text() == "synced", output


async def test_after_an_init_failure(
    platform: Platform, app: Path, nursery: trio.Nursery, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    platform.fake.enqueue({"seconds": 0})
    status, output = await run_app(nursery, app, platform, marker, INIT_FAILS="1")
    assert status == 1, output
    assert marker.read_text() == "synced", output


async def test_after_refresh_worker(
    platform: Platform, app: Path, nursery: trio.Nursery, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    job_id = platform.fake.enqueue({"seconds": 0})
    status, output = await run_app(nursery, app, platform, marker, REFRESH="1")
    assert status == 0, output
    assert platform.fake.job(job_id).status == "COMPLETED"
    assert marker.read_text() == "synced", output


async def test_a_hanging_handler_does_not_hold_the_process(
    platform: Platform, app: Path, nursery: trio.Nursery, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    status, output = await run_app(
        nursery, app, platform, marker, "--test_input", '{"input": {}}', ATEXIT_HANG="1"
    )
    # It ran (and is still running) when the process left with the run's own status.
    assert status == 0, output
    assert marker.read_text() == "synced", output
    assert "an atexit handler still ran after 0.5s" in output
