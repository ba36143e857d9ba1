"""The measurements. Each runs worker processes against the platform and returns a dict.

All times are wall-clock (``time.time()``): the harness's own readings (spawn, signals,
exits) and the platform's, which ``platform_server.py`` converts to wall-clock inside its
own process. Worker marks (cancel and init-failure times) are ``time.time()`` in the worker.
"""

from __future__ import annotations

import math
import os
import signal
import statistics
import subprocess
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from benchmarks._procs import (
    Spawned,
    TreeRss,
    kill_group,
    spawn,
    tree_cpu_seconds,
    tree_rss,
)
from benchmarks._sdks import worker_env

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from benchmarks._platform import PlatformProcess
    from benchmarks._sdks import Sdk

Result = dict[str, Any]


@dataclass(frozen=True)
class Settings:
    """Sizes and caps of one run (``--quick`` shrinks them)."""

    quick: bool
    jobs: int  # trio_worker throughput run, per concurrency
    concurrencies: tuple[int, ...] = (1, 8, 64)
    reference_seconds: float = 12.0  # wall-clock cap of a reference throughput run
    reference_jobs_per_slot: int = 20
    start_repeats: int = 3
    reference_start_repeats: int = 2
    idle_settle: float = 1.0
    term_cap: float = 10.0
    stop_jobs: int = 5
    reference_stop_jobs: int = 3
    init_repeats: int = 3
    init_seconds: float = 0.5
    stream_jobs: int = 3
    reference_stream_jobs: int = 2
    stream_chunks: int = 1000
    import_repeats: int = 3
    streams: int = 64  # concurrent streams (one job each, concurrency 64)
    streams_chunks: int = 300  # per stream, no gap between chunks
    paced_chunks: int = 150  # per stream at 50 chunks/s: 3 s
    paced_interval: float = 0.02
    backend_rounds: int = 3  # alternating trio/asyncio pairs of throughput runs

    @classmethod
    def for_run(cls, quick: bool, jobs: int | None) -> Settings:
        if not quick:
            return cls(quick=False, jobs=jobs or 3000)
        return cls(
            quick=True,
            jobs=jobs or 400,
            reference_seconds=3.0,
            reference_jobs_per_slot=5,
            start_repeats=1,
            reference_start_repeats=1,
            idle_settle=0.5,
            term_cap=2.0,
            stop_jobs=2,
            reference_stop_jobs=1,
            init_repeats=1,
            init_seconds=0.3,
            stream_jobs=1,
            reference_stream_jobs=1,
            stream_chunks=200,
            import_repeats=1,
            streams_chunks=50,
            paced_chunks=25,
            backend_rounds=1,
        )


def quantile(values: list[float], q: float) -> float | None:
    """Nearest-rank quantile (the platform's ``/_stats`` uses the same rule)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _rss_dict(rss: TreeRss | None) -> Result | None:
    if rss is None:
        return None
    return {
        "total_mib": round(rss.total_mib, 2),
        "main_mib": round(rss.main_mib, 2),
        "children_mib": round(rss.children_mib, 2),
        "children": rss.children,
    }


class Bench:
    """What every measurement needs: the platform, a scratch folder, the settings."""

    def __init__(
        self,
        platform: PlatformProcess,
        workdir: Path,
        settings: Settings,
        say: Callable[[str], None],
    ) -> None:
        self.platform = platform
        self.workdir = workdir
        self.settings = settings
        self.say = say
        self.home = workdir / "home"  # an empty HOME: no ~/.runpod/config.toml
        self.home.mkdir(exist_ok=True)
        self.pycache = workdir / "pycache"
        self._platform_env = platform.worker_env()
        self._spawns = 0

    def start_worker(self, sdk: Sdk, scenario: str, concurrency: int, **extra: str) -> Spawned:
        self._spawns += 1
        scenario_env = {
            "BENCH_SCENARIO": scenario,
            "BENCH_CONCURRENCY": str(concurrency),
            **extra,
        }
        env = worker_env(self._platform_env, self.home, self.pycache, scenario_env)
        log = self.workdir / f"{self._spawns:03d}-{sdk.key}-{scenario}-c{concurrency}.log"
        return spawn([sdk.python, str(sdk.script)], env, log, self.workdir)

    def env(self) -> dict[str, str]:
        """A worker's environment with no scenario (for import-time runs)."""
        return worker_env(self._platform_env, self.home, self.pycache, {})

    def warm_up(self, sdk: Sdk) -> None:
        """Compile the SDK's bytecode into the private pycache (see ``worker_env``)."""
        module = "runpod" if sdk.key == "reference" else "trio_worker"
        subprocess.run(
            [sdk.python, "-c", f"import {module}"],
            env=self.env(),
            capture_output=True,
            timeout=300,
            check=True,
        )

    def marks_file(self, sdk: Sdk, scenario: str) -> Path:
        path = self.workdir / f"marks-{sdk.key}-{scenario}-{self._spawns + 1:03d}.txt"
        path.unlink(missing_ok=True)
        return path

    def wait_first_job_done(self, worker: Spawned) -> None:
        """Until the platform has the first job's report (at most 60 s; the worker must
        stay alive meanwhile)."""
        deadline = time.monotonic() + 60
        while self.platform.progress()["finished"] < 1:
            worker.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"first job not done in 60 s:\n{worker.log_tail()}")
            time.sleep(0.01)

    def wait_until_taken(self, worker: Spawned, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while self.platform.progress()["handed_out"] == 0:
            worker.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"no take within {timeout:g} s:\n{worker.log_tail()}")
            time.sleep(0.01)


# -- throughput and take->done overhead ------------------------------------------------------


def throughput(bench: Bench, sdk: Sdk, concurrency: int, backend: str = "trio") -> Result:
    """No-op jobs through one worker at *concurrency*, from a preloaded queue.

    jobs/s = finished jobs / (last done - first take answer sent). Overhead = per job, done
    arrived - take answer sent. The reference runs for a wall-clock cap instead of a count.
    """
    s = bench.settings
    reference = sdk.key == "reference"
    jobs = s.reference_jobs_per_slot * concurrency if reference else s.jobs
    cap = s.reference_seconds if reference else 300.0
    bench.platform.reset(jobs, take_hold=2.0)
    worker = bench.start_worker(sdk, "noop", concurrency, BENCH_BACKEND=backend)
    peak: TreeRss | None = None
    try:
        bench.wait_until_taken(worker)
        platform_cpu_start = bench.platform.cpu_seconds()
        worker_cpu_start = tree_cpu_seconds(worker.pid) or 0.0
        end = time.monotonic() + cap
        while True:
            # Sampled before the finish check: a short run may be done at the first look.
            rss = tree_rss(worker.pid)
            if rss is not None and (peak is None or rss.total_mib > peak.total_mib):
                peak = rss
            finished = bench.platform.progress()["finished"]
            if finished >= jobs or time.monotonic() >= end:
                break
            worker.check_alive()
            time.sleep(0.2)
        worker_cpu = (tree_cpu_seconds(worker.pid) or 0.0) - worker_cpu_start
        platform_cpu = bench.platform.cpu_seconds() - platform_cpu_start
    finally:
        kill_group(worker)
    report = bench.platform.report()
    done = [j for j in report["jobs"] if j["status"] == "COMPLETED" and j["done"] is not None]
    if not done:
        raise RuntimeError(f"no job finished:\n{worker.log_tail()}")
    sent = [j["sent"] if j["sent"] is not None else j["take"] for j in done]
    span = max(j["done"] for j in done) - min(sent)
    overhead = [(j["done"] - t) * 1000 for j, t in zip(done, sent, strict=True)]
    routes: dict[str, int] = report["requests_by_route"]
    takes = routes.get("take", 0) + routes.get("take_batch", 0)
    return {
        "concurrency": concurrency,
        "jobs": len(done),
        "preloaded": jobs,
        "seconds": round(span, 4),
        "jobs_per_s": len(done) / span if span > 0 else None,
        "overhead_ms": {
            "p50": quantile(overhead, 0.50),
            "p90": quantile(overhead, 0.90),
            "p99": quantile(overhead, 0.99),
            "max": max(overhead),
            "mean": statistics.fmean(overhead),
        },
        "take_requests_per_job": takes / len(done),
        "worker_cpu_ms_per_job": worker_cpu * 1000 / len(done),
        "platform_cpu_ms_per_job": platform_cpu * 1000 / len(done),
        "peak_rss": _rss_dict(peak),
        "duplicate_reports": report["duplicate_reports"],
    }


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
        "idle_rss": _rss_dict(idle[len(idle) // 2] if idle else None),
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


# -- streaming ----------------------------------------------------------------------------------


def streaming(bench: Bench, sdk: Sdk) -> Result:
    """An async generator yielding small chunks: chunks/s from take answer sent to done."""
    s = bench.settings
    jobs = s.reference_stream_jobs if sdk.key == "reference" else s.stream_jobs
    bench.platform.reset(jobs, take_hold=5.0)
    worker = bench.start_worker(sdk, "stream", 1, BENCH_CHUNKS=str(s.stream_chunks))
    try:
        bench.wait_until_taken(worker)
        cpu_start = tree_cpu_seconds(worker.pid) or 0.0
        deadline = time.monotonic() + 120
        while bench.platform.progress()["finished"] < jobs:
            worker.check_alive()
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
        cpu = (tree_cpu_seconds(worker.pid) or 0.0) - cpu_start
    finally:
        kill_group(worker)
    done = [j for j in bench.platform.report()["jobs"] if j["status"] == "COMPLETED"]
    if not done:
        raise RuntimeError(f"no streaming job finished:\n{worker.log_tail()}")
    chunks = sum(j["stream"] for j in done)
    seconds = sum(j["done"] - (j["sent"] or j["take"]) for j in done)
    return {
        "jobs": len(done),
        "chunks_per_job": s.stream_chunks,
        "chunks_received": chunks,
        "complete": all(j["stream"] == s.stream_chunks for j in done),
        "chunks_per_s": chunks / seconds if seconds > 0 else None,
        "worker_cpu_ms_per_chunk": cpu * 1000 / chunks if chunks else None,
    }


# -- many concurrent streams ----------------------------------------------------------------


def _run_streams(bench: Bench, sdk: Sdk, scenario: str, chunks: int, **extra: str) -> Result:
    """``streams`` jobs at once, one stream each; the platform's report once all are done."""
    s = bench.settings
    bench.platform.reset(s.streams, take_hold=5.0)
    worker = bench.start_worker(sdk, scenario, s.streams, BENCH_CHUNKS=str(chunks), **extra)
    try:
        bench.wait_until_taken(worker)
        deadline = time.monotonic() + 120
        while bench.platform.progress()["finished"] < s.streams:
            worker.check_alive()
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
    finally:
        kill_group(worker)
    report: Result = bench.platform.report()
    if not any(j["status"] == "COMPLETED" for j in report["jobs"]):
        raise RuntimeError(f"no streaming job finished:\n{worker.log_tail()}")
    return report


def backend_pair(bench: Bench, sdk: Sdk, concurrency: int) -> Result:
    """No-op jobs at *concurrency* on the trio and the asyncio backend, in alternating
    runs (trio, asyncio, trio, ...): the run with the median jobs/s of each backend.

    The asyncio target is a ratio of the two (docs/design.md §11). Measured minutes apart,
    one run each, the ratio moved by ten points with the machine; alternating runs see the
    same machine, and the median drops an outlier on either side.
    """
    runs: dict[str, list[Result]] = {"trio": [], "asyncio": []}
    for _ in range(bench.settings.backend_rounds):
        for backend, results in runs.items():
            results.append(throughput(bench, sdk, concurrency, backend))
    pair: Result = {}
    for backend, results in runs.items():
        results.sort(key=lambda run: float(run["jobs_per_s"]))
        pair[backend] = results[len(results) // 2]
        pair[f"{backend}_runs"] = [round(float(run["jobs_per_s"]), 1) for run in results]
    return pair


def many_streams(bench: Bench, sdk: Sdk, backend: str = "asyncio") -> Result:
    """64 async-generator streams at once, no gap between chunks: aggregate chunks/s
    from the first take answer sent to the last job-done."""
    s = bench.settings
    report = _run_streams(bench, sdk, "stream", s.streams_chunks, BENCH_BACKEND=backend)
    done = [j for j in report["jobs"] if j["status"] == "COMPLETED"]
    chunks = sum(j["stream"] for j in done)
    span = max(j["done"] for j in done) - min(j["sent"] or j["take"] for j in done)
    return {
        "backend": backend,
        "streams": len(done),
        "chunks_received": chunks,
        "complete": all(j["stream"] == s.streams_chunks for j in done),
        "chunks_per_s": chunks / span if span > 0 else None,
    }


def paced_streams(bench: Bench, sdk: Sdk, backend: str = "asyncio") -> Result:
    """64 streams at 50 chunks/s each: latency from each ``yield`` to the chunk's arrival
    at the platform (wall clocks of one machine)."""
    s = bench.settings
    report = _run_streams(
        bench,
        sdk,
        "stream_paced",
        s.paced_chunks,
        BENCH_BACKEND=backend,
        BENCH_CHUNK_INTERVAL=str(s.paced_interval),
    )
    latency: list[float] = report["chunk_latency_ms"]
    if not latency:
        raise RuntimeError("no paced chunk arrived")
    return {
        "backend": backend,
        "chunks": len(latency),
        "offered_chunks_per_s": s.streams / s.paced_interval,
        "latency_ms": {
            "p50": quantile(latency, 0.50),
            "p99": quantile(latency, 0.99),
            "max": max(latency),
        },
    }
