"""``python handler.py`` forks at ``start()`` only where that is safe (docs/design.md §13.1).

Real worker processes, in the shapes published handlers have: a server started with
``Popen`` before ``start()`` (whose ``poll()`` must never lie), ``import numpy`` first
(OpenBLAS's pool handles fork: the worker stays watched), a native thread nothing stops
at a fork (refused after the fork, before the child runs); the watchdog's priority where
it may not raise it back; and the line saying the worker runs unwatched, at any log level.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from ..conftest import Platform
from .conftest import WorkerProcess, open_worker

pytestmark = pytest.mark.slow

APP = Path(__file__).with_name("launch_app.py")


async def run_app(
    nursery: trio.Nursery, platform: Platform, prefix: tuple[str, ...] = (), /, **env: str
) -> WorkerProcess:
    return await open_worker(nursery, [*prefix, sys.executable, str(APP)], platform.env(**env))


async def completes(platform: Platform, *inputs: dict[str, object]) -> list[object]:
    """Enqueue each input; their outputs once every job completed."""
    ids = [platform.fake.enqueue(work) for work in inputs]
    outputs = []
    with trio.fail_after(30):
        for job_id in ids:
            record = await platform.fake.wait_for_status(job_id)
            assert record.status == "COMPLETED", record
            outputs.append(record.output)
    return outputs


async def crash_is_reported(platform: Platform, worker: WorkerProcess) -> None:
    job_id = platform.fake.enqueue({"crash": True})
    assert await worker.wait() == 139, worker.output
    (body,) = platform.fake.job(job_id).done_reports
    assert isinstance(body, dict)
    assert json.loads(str(body["error"]))["error_type"] == "WorkerCrashed"


async def test_a_server_popened_before_start_is_not_forked_away_and_poll_tells_the_truth(
    platform: Platform, nursery: trio.Nursery
) -> None:
    worker = await run_app(nursery, platform, TW_BEFORE="server")
    # Forked, the server would be the watchdog's child, and poll() would say it exited.
    await completes(platform, {"seconds": 0}, {"seconds": 0})
    assert await worker.stop() == 0, worker.output
    lines = [line for line in worker.output.splitlines() if "crash watch off" in line]
    assert len(lines) == 1, worker.output
    assert "1 child process(es) started before start()" in lines[0]
    assert f"run the file with `trio-worker run {APP}`" in lines[0]


async def test_numpy_imported_first_keeps_the_worker_watched(
    platform: Platform, nursery: trio.Nursery
) -> None:
    pytest.importorskip("numpy")
    worker = await run_app(nursery, platform, TW_BEFORE="numpy")
    # OpenBLAS's threads were running before start(); its atfork handler stops them.
    outputs = await completes(platform, {"matmul": 200}, {"matmul": 3})
    assert outputs == [{"sum": 200.0**3}, {"sum": 27.0}]
    await crash_is_reported(platform, worker)
    assert "crash watch off" not in worker.output


async def test_a_native_thread_that_survives_the_fork_undoes_it(
    platform: Platform, nursery: trio.Nursery
) -> None:
    worker = await run_app(nursery, platform, TW_BEFORE="native_thread")
    await completes(platform, {"seconds": 0})
    assert await worker.stop() == 0, worker.output
    assert worker.output.count("app pid ") == 1, worker.output  # the child ran nothing
    assert (
        "crash watch off: 1 native thread(s) kept running across the fork, so a library "
        "that does not handle fork is loaded" in worker.output
    )


def _capability_dropped() -> tuple[str, ...] | None:
    """A prefix that runs a command without CAP_SYS_NICE, as Docker does by default."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return None
    prefix = (setpriv, "--inh-caps=-sys_nice", "--bounding-set=-sys_nice")
    probe = subprocess.run(
        [*prefix, sys.executable, "-c", "import os; os.setpriority(os.PRIO_PROCESS, 0, 0)"],
        capture_output=True,
        check=False,
    )
    return prefix if probe.returncode == 0 else None


def _nice(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[16])


@pytest.mark.parametrize("capability", ["dropped", "kept"])
async def test_the_watchdog_runs_at_the_workers_priority_once_waiting(
    platform: Platform, nursery: trio.Nursery, capability: str
) -> None:
    prefix = _capability_dropped()
    if prefix is None:
        pytest.skip("no setpriv here, or it cannot drop CAP_SYS_NICE")
    worker = await run_app(nursery, platform, prefix if capability == "dropped" else ())
    # Passed through by the watchdog: it is waiting, its priority restored if lowered.
    await worker.until_output("worker starting")
    await completes(platform, {"seconds": 0})
    # Lowered at its start and unable to raise it back, it would stay at nice 10 for life.
    assert _nice(worker.process.pid) == 0
    assert await worker.stop() == 0, worker.output


@pytest.mark.parametrize(
    "unwatched",
    [
        {"TRIO_WORKER_CRASH_WATCH": "0"},
        {"TW_CRASH_WATCH": "0"},
        {"TW_BEFORE": "server"},
    ],
)
async def test_the_unwatched_line_shows_at_any_log_level(
    platform: Platform, nursery: trio.Nursery, unwatched: dict[str, str]
) -> None:
    worker = await run_app(nursery, platform, RUNPOD_LOG_LEVEL="ERROR", **unwatched)
    await completes(platform, {"seconds": 0})
    assert await worker.stop() == 0, worker.output
    assert worker.output.count("crash watch off: ") == 1, worker.output
    assert "worker starting" not in worker.output  # the level holds for the other lines


TORCH_APP = """
import os, signal, sys
import torch
import trio_worker

if os.environ.get("TW_TORCH_BEFORE"):  # a parallel region: GNU OpenMP's pool starts
    torch.randn(600, 600) @ torch.randn(600, 600)


def handler(job):
    if job["input"].get("crash"):
        os.kill(os.getpid(), signal.SIGSEGV)
    return {"sum": float((torch.ones(300, 300) @ torch.ones(300, 300)).sum())}


trio_worker.start(handler)
"""


@pytest.mark.parametrize("before", ["import", "parallel region"])
async def test_torch_imported_first_is_watched_and_a_parallel_region_refuses_the_fork(
    platform: Platform, nursery: trio.Nursery, tmp_path: Path, before: str
) -> None:
    """torch's CPU build (``TRIO_WORKER_TORCH_PYTHON`` names an interpreter with torch and
    trio_worker installed; skipped without it, as torch is never a test dependency)."""
    python = _torch_python()
    app = tmp_path / "torch_app.py"
    app.write_text(TORCH_APP)
    env = platform.env(**({"TW_TORCH_BEFORE": "1"} if before == "parallel region" else {}))
    worker = await open_worker(nursery, [python, str(app)], env)
    outputs = await completes(platform, {"n": 1}, {"n": 2})
    assert outputs == [{"sum": 300.0**3}] * 2  # no hang in the worker's parallel regions
    if before == "import":
        await crash_is_reported(platform, worker)
        assert "crash watch off" not in worker.output
    else:
        assert await worker.stop() == 0, worker.output
        assert "native thread(s) kept running across the fork" in worker.output


def _torch_python() -> str:
    python = os.environ.get("TRIO_WORKER_TORCH_PYTHON")
    if not python:
        if importlib.util.find_spec("torch") is None:
            pytest.skip("set TRIO_WORKER_TORCH_PYTHON to an interpreter with torch")
        return sys.executable
    return python
