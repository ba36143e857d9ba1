"""The launcher, ``trio-worker run handler.py`` and ``python -m trio_worker handler.py``: the
watchdog starts first and the file runs as its child (docs/design.md §13.1).

Real processes against the loopback fake platform: the worker crashes and its job is
reported; signals reach it once; as PID 1 the launcher reaps orphans; its status is the
worker's; where there is nothing to watch, the file runs in the launcher's place.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest
import trio

from ..conftest import Platform
from .conftest import WorkerProcess, open_worker
from .test_crash import _can_unshare

pytestmark = pytest.mark.slow

APP = Path(__file__).with_name("launch_app.py")
BIN = Path(sys.executable).parent
LAUNCHERS = {
    "trio-worker run": [str(BIN / "trio-worker"), "run"],
    "python -m trio_worker": [sys.executable, "-m", "trio_worker"],
}


@pytest.fixture(params=sorted(LAUNCHERS))
def launcher(request: pytest.FixtureRequest) -> list[str]:
    return LAUNCHERS[request.param]


async def launch(
    nursery: trio.Nursery,
    platform: Platform,
    launcher: list[str],
    *args: str,
    prefix: tuple[str, ...] = (),
    **env: str,
) -> WorkerProcess:
    argv = [*prefix, *launcher, str(APP), *args]
    return await open_worker(nursery, argv, platform.env(**env))


def pid_of_app(worker: WorkerProcess) -> int:
    line = next(line for line in worker.output.splitlines() if line.startswith("app pid "))
    return int(line.removeprefix("app pid "))


def error_of(platform: Platform, job_id: str) -> dict[str, object]:
    (body,) = platform.fake.job(job_id).done_reports
    assert isinstance(body, dict), body
    error = json.loads(str(body["error"]))
    assert isinstance(error, dict)
    return error


async def test_a_crash_is_reported_and_the_status_is_the_workers(
    platform: Platform, nursery: trio.Nursery, launcher: list[str]
) -> None:
    failing = platform.fake.enqueue({"fail": "printed before the error"})
    crashing = platform.fake.enqueue({"crash": True})
    worker = await launch(nursery, platform, launcher, TW_GRACE="1")
    assert await worker.wait() == 139, worker.output
    assert pid_of_app(worker) != worker.process.pid  # the file ran as the launcher's child
    error = error_of(platform, crashing)
    assert error["error_type"] == "WorkerCrashed"
    assert error["error_category"] == "segfault"
    assert f"job {crashing} started" in str(error["logs"])  # the watchdog's tail
    # The worker's own capture reads the copy the watchdog forwards: a job's own lines.
    handled = error_of(platform, failing)
    assert handled["error_type"] == "ValueError"
    assert "printed before the error" in str(handled["logs"])
    assert f"job {crashing} started" in worker.output  # passed through


async def test_capture_logs_off_keeps_the_output_out_of_the_report(
    platform: Platform, nursery: trio.Nursery
) -> None:
    crashing = platform.fake.enqueue({"crash": True})
    worker = await launch(nursery, platform, LAUNCHERS["trio-worker run"], TW_CAPTURE="off")
    assert await worker.wait() == 139, worker.output
    error = error_of(platform, crashing)
    assert error["error_type"] == "WorkerCrashed"
    assert error["logs"] == ""
    assert f"job {crashing} started" in worker.output  # still passed through


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
async def test_a_signal_to_the_launchers_group_reaches_the_worker_once(
    platform: Platform, nursery: trio.Nursery, signum: signal.Signals
) -> None:
    job_id = platform.fake.enqueue({"seconds": 60})
    worker = await launch(nursery, platform, LAUNCHERS["trio-worker run"], TW_GRACE="0.3")
    await worker.until_output(f"job {job_id} started")
    # A terminal's Ctrl-C, or a kill of the whole group: the worker is in a group of its
    # own, and hears it from the watchdog, once: twice would be "exit at once" (130/143).
    os.killpg(worker.process.pid, signum)
    assert await worker.wait() == 0, worker.output
    assert error_of(platform, job_id)["error_type"] == "WorkerShutdown"
    assert worker.output.count(f"shutting down ({signum.name} received)") == 1


@pytest.mark.parametrize("form", ["launcher", "fork"])
async def test_as_pid_1_orphans_are_reaped_and_the_status_is_the_workers(
    platform: Platform, nursery: trio.Nursery, form: str
) -> None:
    reason = _can_unshare()
    if reason is not None:
        pytest.skip(reason)
    orphan = platform.fake.enqueue({"orphan": True})
    # --mount-proc: /proc shows the new namespace, where the watchdog is PID 1.
    prefix = ("unshare", "--pid", "--fork", "--mount-proc")
    launcher = LAUNCHERS["trio-worker run"] if form == "launcher" else [sys.executable]
    worker = await launch(nursery, platform, launcher, prefix=prefix)
    with trio.fail_after(30):
        record = await platform.fake.wait_for_status(orphan, "COMPLETED")
    assert isinstance(record.output, dict), record.output
    reaped = platform.fake.enqueue({"reaped": record.output["orphan"]})
    with trio.fail_after(30):
        record = await platform.fake.wait_for_status(reaped, "COMPLETED")
    assert record.output == {"state": "gone"}, worker.output  # not a zombie for ever
    crashing = platform.fake.enqueue({"crash": True})
    assert await worker.wait() == 139, worker.output
    assert error_of(platform, crashing)["error_type"] == "WorkerCrashed"


async def test_a_server_started_before_start_stays_the_workers_child_and_is_watched(
    platform: Platform, nursery: trio.Nursery
) -> None:
    jobs = [platform.fake.enqueue({"seconds": 0}) for _ in range(2)]
    launcher = LAUNCHERS["python -m trio_worker"]
    worker = await launch(nursery, platform, launcher, TW_BEFORE="server,native_thread")
    with trio.fail_after(30):
        for job_id in jobs:
            await platform.fake.wait_for_status(job_id, "COMPLETED")
    crashing = platform.fake.enqueue({"crash": True})
    assert await worker.wait() == 139, worker.output
    assert error_of(platform, crashing)["error_type"] == "WorkerCrashed"
    assert "crash watch off" not in worker.output


async def test_opted_out_the_file_runs_in_the_launchers_place(
    platform: Platform, nursery: trio.Nursery, launcher: list[str]
) -> None:
    crashing = platform.fake.enqueue({"crash": True})
    worker = await launch(nursery, platform, launcher, TRIO_WORKER_CRASH_WATCH="0")
    assert await worker.wait() == -signal.SIGSEGV, worker.output
    assert pid_of_app(worker) == worker.process.pid  # exec'd: the same process
    assert platform.fake.job(crashing).done_reports == []
    assert "crash watch off: TRIO_WORKER_CRASH_WATCH=0" in worker.output


@pytest.mark.parametrize(
    ("env", "line"),
    [
        ({"TW_CRASH_WATCH": "0"}, "crash watch off: start(crash_watch=False)"),
        ({"TW_BEFORE": "opt_out"}, "crash watch off: TRIO_WORKER_CRASH_WATCH=0"),
    ],
)
async def test_opted_out_inside_the_file_a_death_reports_nothing(
    platform: Platform, nursery: trio.Nursery, env: dict[str, str], line: str
) -> None:
    crashing = platform.fake.enqueue({"crash": True})
    argv = [*LAUNCHERS["trio-worker run"], str(APP)]
    worker = await open_worker(nursery, argv, platform.env(**env))
    assert await worker.wait() == 139, worker.output  # still the worker's status
    assert platform.fake.job(crashing).done_reports == []
    # The watchdog's line on the death repeats the last output after "its last output:".
    said = worker.output.split("its last output:")[0]
    assert said.count("crash watch off: ") == 1
    assert line in said


async def test_a_local_run_is_the_file_in_the_launchers_place(
    platform: Platform, nursery: trio.Nursery, launcher: list[str]
) -> None:
    job = json.dumps({"input": {"seconds": 0}})
    worker = await launch(nursery, platform, launcher, "--test_input", job)
    assert await worker.wait() == 0, worker.output
    assert pid_of_app(worker) == worker.process.pid
    assert '"output": {"ok": true}' in worker.output


async def test_without_a_queue_it_is_local_mode_in_the_launchers_place(
    platform: Platform, nursery: trio.Nursery, tmp_path: Path
) -> None:
    env = {k: v for k, v in platform.env().items() if not k.startswith("RUNPOD_WEBHOOK")}
    argv = [*LAUNCHERS["trio-worker run"], str(APP)]
    worker = await open_worker(nursery, argv, env, cwd=tmp_path)
    assert await worker.wait() == 1, worker.output  # no --test_input, no test_input.json
    assert pid_of_app(worker) == worker.process.pid
    assert "no --test_input and no test_input.json here" in worker.output


async def test_a_file_that_never_calls_start_exits_with_its_own_status(
    platform: Platform, nursery: trio.Nursery, tmp_path: Path
) -> None:
    script = tmp_path / "no_start.py"
    script.write_text(
        "import os, sys\n"
        "print(f'no start, pid {os.getpid()}', flush=True)\n"
        "os.kill(os.getpid(), int(sys.argv[1])) if sys.argv[1:] else sys.exit(5)\n"
    )
    argv = [*LAUNCHERS["trio-worker run"], str(script)]
    worker = await open_worker(nursery, argv, platform.env())
    assert await worker.wait() == 5, worker.output
    assert f"no start, pid {worker.process.pid}" not in worker.output  # a child: watched
    worker = await open_worker(nursery, [*argv, str(int(signal.SIGABRT))], platform.env())
    assert await worker.wait() == 128 + signal.SIGABRT, worker.output
