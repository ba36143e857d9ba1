"""Start-up, stop and init-failure figures: one worker's lifecycle, timed.

All times are wall-clock (``time.time()``), as in ``benchmarks/_figures.py``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import TYPE_CHECKING

from benchmarks._figures import Result, median, rss_dict
from benchmarks._procs import Spawned, TreeRss, kill_group, tree_rss

if TYPE_CHECKING:
    from pathlib import Path

    from benchmarks._figures import Bench
    from benchmarks._sdks import Sdk

# -- process start -> first take, idle memory, SIGTERM -> exit -------------------------------


def startup(bench: Bench, sdk: Sdk) -> Result:
    """Spawn -> first take request, spawn -> first job done, idle RSS, SIGTERM -> exit.

    One job is queued; after it is done the worker idles in its take long-poll for
    ``idle_settle`` seconds, then its RSS (plus children: the reference's ping process) is
    read. The last repeat is then sent SIGTERM and timed until it exits.
    """
    s = bench.settings
    repeats = s.reference_start_repeats if sdk.key == "reference" else s.start_repeats
    # trio_worker starts with its fitness checks as configured by default (on a CPU-only
    # host: memory, disk, a connection to the platform), so the row carries their cost; the
    # reference keeps its checks skipped (worker_env): they dial 8.8.8.8:53, which a
    # sandboxed benchmark host may not reach.
    checks = {} if sdk.key == "reference" else DEFAULT_FITNESS_CHECKS
    first_take: list[float] = []
    unchecked: list[float] = []  # spawn -> first take with the checks skipped, interleaved
    first_done: list[float] = []
    idle: list[TreeRss] = []
    term_s: float | None = None
    term_exited = False
    for repeat in range(repeats):
        bench.platform.reset(1, take_hold=5.0)
        worker = bench.start_worker(sdk, "noop", 1, **checks)
        try:
            bench.wait_first_job_done(worker)
            time.sleep(s.idle_settle)
            rss = tree_rss(worker.pid)
            if rss is not None:
                idle.append(rss)
            report = bench.platform.report()
            first_take.append(report["first_request"]["take"] - worker.spawned_at)
            first_done.append(report["jobs"][0]["done"] - worker.spawned_at)
            if repeat == repeats - 1:
                term_s, term_exited = _sigterm_exit(worker, s.term_cap)
        finally:
            kill_group(worker)
        if checks:
            unchecked.append(_first_take_unchecked(bench, sdk))
    idle.sort(key=lambda r: r.total_mib)
    return {
        "first_take_s": median(first_take),
        "first_take_samples_s": first_take,
        "first_take_without_checks_s": median(unchecked) if unchecked else None,
        "first_take_without_checks_samples_s": unchecked,
        "first_done_s": median(first_done),
        "idle_rss": rss_dict(idle[len(idle) // 2] if idle else None),
        "sigterm_exit_s": term_s,
        "sigterm_exited": term_exited,
    }


# Empty, not "true": the fitness checks run as a deployment without these variables runs them.
DEFAULT_FITNESS_CHECKS = {"RUNPOD_SKIP_AUTO_SYSTEM_CHECKS": "", "RUNPOD_SKIP_GPU_CHECK": ""}


def _first_take_unchecked(bench: Bench, sdk: Sdk) -> float:
    """Spawn -> first take with the fitness checks skipped (worker_env's setting)."""
    bench.platform.reset(1, take_hold=5.0)
    worker = bench.start_worker(sdk, "noop", 1)
    try:
        bench.wait_first_job_done(worker)
        return float(bench.platform.report()["first_request"]["take"] - worker.spawned_at)
    finally:
        kill_group(worker)


def _sigterm_exit(worker: Spawned, cap: float) -> tuple[float, bool]:
    """SIGTERM the worker process (not its group); seconds until it exited, or the cap."""
    sent = time.time()
    os.kill(worker.pid, signal.SIGTERM)
    try:
        worker.popen.wait(timeout=cap)
    except subprocess.TimeoutExpired:
        return cap, False
    return time.time() - sent, True


# -- stop signal -> handler cancelled ------------------------------------------------------


def _read_marks(path: Path) -> list[tuple[str, str, float]]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    marks = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3:
            marks.append((parts[0], parts[1], float(parts[2])))
    return marks


def _wait_mark(
    worker: Spawned, path: Path, event: str, timeout: float, exclude: frozenset[str] = frozenset()
) -> tuple[str, float] | None:
    """The first ``event`` mark whose job id is not in *exclude*; None on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for kind, job_id, at in _read_marks(path):
            if kind == event and job_id not in exclude:
                return job_id, at
        worker.check_alive()
        time.sleep(0.002)
    return None


def stop_signal(bench: Bench, sdk: Sdk) -> Result:
    """Platform delivers a stop answer -> the async handler sees its cancellation.

    The handler marks its start; the harness then cancels the job through the endpoint API
    (``POST /cancel/{id}``), which queues a stop signal for the worker's job-stop
    long-poll. The platform records when it sent the stop answer; the handler writes the
    time it was cancelled. Also recorded: cancel request -> cancelled, which for the
    reference includes the up-to-1 s gap between its stop polls.
    """
    reference = sdk.key == "reference"
    count = bench.settings.reference_stop_jobs if reference else bench.settings.stop_jobs
    bench.platform.reset(count, take_hold=5.0, stop_hold=5.0)
    marks = bench.marks_file(sdk, "stop")
    worker = bench.start_worker(sdk, "stop", 1, BENCH_MARK_FILE=str(marks))
    requested: dict[str, float] = {}
    cancelled: dict[str, float] = {}
    try:
        seen: set[str] = set()
        for _ in range(count):
            started = _wait_mark(worker, marks, "start", 60.0, frozenset(seen))
            if started is None:
                break
            job_id = started[0]
            seen.add(job_id)
            requested[job_id] = time.time()
            bench.platform.cancel(job_id)
            deadline = time.monotonic() + (15.0 if reference else 5.0)
            while job_id not in cancelled and time.monotonic() < deadline:
                for kind, mark_id, at in _read_marks(marks):
                    if kind == "cancel" and mark_id == job_id:
                        cancelled[job_id] = at
                time.sleep(0.002)
    finally:
        kill_group(worker)
    jobs = {j["id"]: j for j in bench.platform.report()["jobs"]}
    delivered_ms = [
        (at - jobs[job_id]["stop_delivered"]) * 1000
        for job_id, at in cancelled.items()
        if jobs[job_id]["stop_delivered"] is not None
    ]
    requested_ms = [(at - requested[job_id]) * 1000 for job_id, at in cancelled.items()]
    return {
        "stops_sent": len(requested),
        "cancelled": len(cancelled),
        "delivered_to_cancelled_ms": median(delivered_ms),
        "delivered_to_cancelled_samples_ms": delivered_ms,
        "request_to_cancelled_ms": median(requested_ms),
    }


# -- init failure -> every held job reported -------------------------------------------------


def init_failure(bench: Bench, sdk: Sdk, held: int = 8) -> Result:
    """An initializer that fails after the worker has taken *held* jobs at concurrency *held*.

    From the failure (the initializer writes ``time.time()`` just before it raises) to the
    last of the *held* job-done reports arriving at the platform, and to the process exit.
    """
    s = bench.settings
    reported: list[float] = []
    exited: list[float] = []
    failed_jobs: list[int] = []
    for _ in range(s.init_repeats):
        bench.platform.reset(held, take_hold=5.0)
        marks = bench.marks_file(sdk, "initfail")
        worker = bench.start_worker(
            sdk,
            "initfail",
            held,
            BENCH_MARK_FILE=str(marks),
            BENCH_INIT_SECONDS=str(s.init_seconds),
        )
        exited_at: float | None = None
        try:
            worker.popen.wait(timeout=30)
            exited_at = time.time()
        except subprocess.TimeoutExpired:
            pass
        finally:
            kill_group(worker)
        failures = [at for kind, _, at in _read_marks(marks) if kind == "init_failed"]
        if not failures:
            raise RuntimeError(f"the initializer never failed:\n{worker.log_tail()}")
        failed_at = failures[0]
        jobs = bench.platform.report()["jobs"]
        taken_before = [j for j in jobs if j["take"] is not None and j["take"] < failed_at]
        failed = [j for j in jobs if j["status"] == "FAILED" and j["done"] is not None]
        failed_jobs.append(len(failed))
        if len(taken_before) != held or len(failed) != held:
            raise RuntimeError(
                f"expected {held} jobs held and failed, got {len(taken_before)} held and "
                f"{len(failed)} failed:\n{worker.log_tail()}"
            )
        reported.append((max(j["done"] for j in failed) - failed_at) * 1000)
        if exited_at is not None:
            exited.append((exited_at - failed_at) * 1000)
    return {
        "held": held,
        "all_reported_ms": median(reported),
        "all_reported_samples_ms": reported,
        "exit_ms": median(exited),
        "failed_jobs": failed_jobs,
    }
