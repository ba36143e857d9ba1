"""A worker process that really dies still gets each job it held reported, once, with
its cause and its output (docs/design.md §13).

Each test starts a real worker against the loopback fake platform and kills it the way
native code does: a segfault (``ctypes.string_at(0)``), ``os.abort()``, SIGKILL,
``os._exit(3)``. The process the test started is the crash watchdog; the worker is its child.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from ..conftest import Platform
from .conftest import WorkerProcess, open_worker

pytestmark = pytest.mark.slow

CRASH_APP = """
import ctypes, os, signal, sys, time
import trio
import trio_worker

print(f"app pid {os.getpid()}", flush=True)
HELD = 0
if os.environ.get("THREAD_BEFORE_START"):  # a framework's thread, started at import
    import threading
    threading.Thread(target=threading.Event().wait, daemon=True).start()


def die(how):
    sys.stdout.flush()
    if how == "segv":
        ctypes.string_at(0)
    elif how == "abort":
        os.abort()
    elif how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif how == "exit3":
        os._exit(3)
    elif how == "cuda":
        os.write(2, b"RuntimeError: CUDA error: an illegal memory access was encountered\\n")
        ctypes.string_at(0)


def init():
    print("init: loading weights", flush=True)
    if os.environ.get("CRASH_IN_INIT"):
        go = os.environ["CRASH_GO"]  # the test creates it once the job is taken
        while not os.path.exists(go):
            time.sleep(0.005)
        die(os.environ["CRASH_IN_INIT"])


async def handler(job):
    global HELD
    HELD += 1
    print(f"job {job['id']} started", flush=True)
    os.write(1, f"native line for {job['id']} secret={os.environ['RUNPOD_AI_API_KEY']}\\n".encode())
    if "crash" in job["input"]:
        while HELD < job["input"].get("held", 1):  # every job meant to be held has started
            await trio.sleep(0.002)
        die(job["input"]["crash"])
    await trio.sleep(job["input"].get("seconds", 0))
    return {"ok": job["id"]}


trio_worker.start(
    handler,
    initializer=init,
    async_backend="trio",  # the handler is trio code
    concurrency=int(os.environ.get("CONCURRENCY", "1")),
    crash_watch=os.environ.get("CRASH_WATCH", "1") == "1",
    timings=trio_worker.Timings(shutdown_grace=float(os.environ.get("GRACE", "5"))),
)
"""


@pytest.fixture
def crash_app(tmp_path: Path) -> Path:
    app = tmp_path / "crash_app.py"
    app.write_text(CRASH_APP)
    return app


async def start_worker(
    nursery: trio.Nursery, app: Path, platform: Platform, argv0: list[str] | None = None, **env: str
) -> WorkerProcess:
    argv = [*(argv0 or []), sys.executable, "-u", str(app)]
    return await open_worker(nursery, argv, platform.env(**env))


def crash_error(platform: Platform, job_id: str) -> dict[str, object]:
    record = platform.fake.job(job_id)
    assert len(record.done_reports) == 1, record.done_reports
    body = record.done_reports[0]
    assert isinstance(body, dict), body
    error = json.loads(str(body["error"]))
    assert isinstance(error, dict)
    return error


@pytest.mark.parametrize(
    ("how", "status", "cause", "category"),
    [
        ("segv", 139, "killed by SIGSEGV (signal 11", "segfault"),
        ("abort", 134, "killed by SIGABRT (signal 6", "segfault"),
        ("kill", 137, "killed by SIGKILL (signal 9", None),
        ("exit3", 3, "exited with status 3", "unknown"),
        ("cuda", 139, "killed by SIGSEGV (signal 11", "cuda_error"),
    ],
)
async def test_a_worker_that_dies_reports_its_job_once_with_cause_and_output(
    platform: Platform,
    crash_app: Path,
    nursery: trio.Nursery,
    how: str,
    status: int,
    cause: str,
    category: str | None,
) -> None:
    job_id = platform.fake.enqueue({"crash": how})
    worker = await start_worker(nursery, crash_app, platform)
    assert await worker.wait() == status, worker.output
    error = crash_error(platform, job_id)
    assert platform.fake.job(job_id).status == "FAILED"
    assert error["error_type"] == "WorkerCrashed"
    assert cause in str(error["error_message"])
    assert job_id in str(error["error_message"])
    if category is None:  # SIGKILL: out_of_memory only when the kernel counted an OOM kill
        assert error["error_category"] in ("unknown", "out_of_memory")
    else:
        assert error["error_category"] == category
    logs = str(error["logs"])
    # The last lines, written by native code just before dying, are there; the secret not.
    assert f"native line for {job_id}" in logs
    assert "init: loading weights" in logs
    assert platform.fake.worker_env(platform.url)["RUNPOD_AI_API_KEY"] not in logs
    if how == "cuda":
        assert "CUDA error: an illegal memory access" in logs
    # The container log still received every line, and the watchdog said what happened.
    assert f"job {job_id} started" in worker.output
    assert "the worker process " in worker.output
    assert "Warning" not in worker.output and "Traceback" not in worker.output


async def test_three_held_jobs_are_each_reported_once(
    platform: Platform, crash_app: Path, nursery: trio.Nursery
) -> None:
    sleepers = [platform.fake.enqueue({"seconds": 60, "held": 3}) for _ in range(2)]
    crasher = platform.fake.enqueue({"crash": "segv", "held": 3})
    worker = await start_worker(nursery, crash_app, platform, CONCURRENCY="3")
    assert await worker.wait() == 139, worker.output
    for job_id in [*sleepers, crasher]:
        error = crash_error(platform, job_id)
        assert error["error_type"] == "WorkerCrashed"
        assert error["error_category"] == "segfault"


async def test_jobs_already_reported_are_never_reported_again(
    platform: Platform, crash_app: Path, nursery: trio.Nursery
) -> None:
    done = [platform.fake.enqueue({"seconds": 0}) for _ in range(4)]
    worker = await start_worker(nursery, crash_app, platform)
    with trio.fail_after(30):
        for job_id in done:
            await platform.fake.wait_for_status(job_id, "COMPLETED")
    crasher = platform.fake.enqueue({"crash": "abort"})
    assert await worker.wait() == 134, worker.output
    for job_id in done:
        record = platform.fake.job(job_id)
        assert record.status == "COMPLETED"
        assert len(record.done_reports) == 1, record.done_reports
    assert crash_error(platform, crasher)["error_type"] == "WorkerCrashed"


async def test_a_crash_in_the_initializer_reports_the_jobs_at_the_gate(
    platform: Platform, crash_app: Path, nursery: trio.Nursery, tmp_path: Path
) -> None:
    job_id = platform.fake.enqueue({"seconds": 0})
    go = tmp_path / "go"
    worker = await start_worker(
        nursery, crash_app, platform, CRASH_IN_INIT="segv", CRASH_GO=str(go)
    )
    # A ping listing the job: the worker holds it (taken is not yet held).
    with trio.fail_after(30):
        while not any(job_id in ping.job_ids for ping in platform.fake.pings):
            await platform.fake.wait_for_requests("ping", len(platform.fake.pings) + 1)
    go.touch()
    assert await worker.wait() == 139, worker.output
    error = crash_error(platform, job_id)
    assert error["error_type"] == "WorkerCrashed"
    assert "while its initializer was running" in str(error["error_message"])
    assert "init: loading weights" in str(error["logs"])
    assert error["error_category"] == "segfault"


async def test_sigterm_to_the_watchdog_drains_the_busy_worker_as_before(
    platform: Platform, crash_app: Path, nursery: trio.Nursery
) -> None:
    job_id = platform.fake.enqueue({"seconds": 60})
    worker = await start_worker(nursery, crash_app, platform, GRACE="0.2")
    await worker.until_output(f"job {job_id} started")
    worker.signal(signal.SIGTERM)
    assert await worker.wait() == 0, worker.output
    record = platform.fake.job(job_id)
    assert len(record.done_reports) == 1, record.done_reports
    error = crash_error(platform, job_id)
    # The worker's own shutdown report, not the watchdog's: it exited cleanly.
    assert error["error_type"] == "WorkerShutdown"
    assert "SIGTERM received" in worker.output


async def test_unwatched_when_opted_out_the_job_is_lost_as_before(
    platform: Platform, crash_app: Path, nursery: trio.Nursery
) -> None:
    job_id = platform.fake.enqueue({"crash": "segv"})
    worker = await start_worker(nursery, crash_app, platform, TRIO_WORKER_CRASH_WATCH="0")
    assert await worker.wait() == -signal.SIGSEGV, worker.output
    assert platform.fake.job(job_id).done_reports == []
    assert "crash watch off: TRIO_WORKER_CRASH_WATCH=0" in worker.output


async def test_with_a_thread_running_before_start_it_runs_unwatched_and_says_why(
    platform: Platform, crash_app: Path, nursery: trio.Nursery
) -> None:
    job_id = platform.fake.enqueue({"seconds": 0})
    worker = await start_worker(nursery, crash_app, platform, THREAD_BEFORE_START="1")
    with trio.fail_after(30):
        await platform.fake.wait_for_status(job_id, "COMPLETED")
    assert await worker.stop() == 0, worker.output
    assert (
        "crash watch off: 1 Python thread(s) already running before start() (a lock one of "
        "them holds would stay held in a forked worker); start them in the initializer, or "
        f"run the file with `trio-worker run {crash_app}`" in worker.output
    )


def _can_unshare() -> str | None:
    if shutil.which("unshare") is None:
        return "no unshare(1) on this machine"
    probe = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, check=False
    )
    if probe.returncode != 0:
        return f"unshare --pid refused here: {probe.stderr.decode(errors='replace').strip()}"
    return None


async def test_as_pid_1_of_its_own_namespace_the_watchdog_still_reports(
    platform: Platform, crash_app: Path, nursery: trio.Nursery
) -> None:
    reason = _can_unshare()
    if reason is not None:
        pytest.skip(reason)
    job_id = platform.fake.enqueue({"crash": "segv"})
    # --mount-proc: /proc shows the new namespace, where the watchdog is PID 1.
    argv0 = ["unshare", "--pid", "--fork", "--mount-proc"]
    worker = await start_worker(nursery, crash_app, platform, argv0=argv0)
    assert await worker.wait() == 139, worker.output
    assert "app pid 1\n" in worker.output  # the watchdog is the namespace's init
    assert crash_error(platform, job_id)["error_category"] == "segfault"
