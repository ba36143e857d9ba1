"""The measurements' common ground (settings, the bench, a measured run) and throughput.

Each figure runs worker processes against the platform and returns a dict; the start-up,
stop and init-failure figures are in ``_life_figures.py``, the streaming ones in
``_stream_figures.py``, the marginal-CPU ones in ``_cpu_figures.py``.

All times are wall-clock (``time.time()``): the harness's own readings (spawn, signals,
exits) and the platform's, which ``platform_server.py`` converts to wall-clock inside its
own process. Worker marks (cancel and init-failure times) are ``time.time()`` in the worker.
"""

from __future__ import annotations

import math
import statistics
import subprocess
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

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
    from collections.abc import Callable, Sequence
    from pathlib import Path

    from benchmarks._platform import PlatformProcess
    from benchmarks._sdks import Sdk

Result = dict[str, Any]
T = TypeVar("T")


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
    # Marginal CPU (benchmarks/_cpu_figures.py): the short run of each pair. The long runs
    # are the paced-streams figure (paced_chunks) and ``jobs`` no-op sync jobs.
    paced_short_chunks: int = 25
    cpu_short_jobs: int = 300
    # The reference's no-op runs go by time (it sleeps): seconds after its first take.
    reference_cpu_seconds: tuple[float, float] = (3.0, 12.0)
    floor_jobs: int = 3000  # floor_client.py raw
    # Short/long pairs per CPU figure (and floor runs): the median is the figure, since
    # one pair moves by tens of percent with what else the machine does.
    cpu_pairs: int = 3
    # Alternating rounds of the ratio targets' figures (benchmarks/_paired.py): each
    # ratio is the median of the rounds' ratios.
    ratio_rounds: int = 5
    against_rounds: int = 3  # alternating pairs, old commit and this checkout

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
            paced_short_chunks=5,
            cpu_short_jobs=50,
            reference_cpu_seconds=(1.0, 3.0),
            floor_jobs=400,
            cpu_pairs=1,
            ratio_rounds=1,
            against_rounds=1,
        )

    @property
    def short_jobs(self) -> int:
        """The short no-op run: ``cpu_short_jobs``, and at most a fifth of the long one."""
        return max(1, min(self.cpu_short_jobs, self.jobs // 5))


def quantile(values: list[float], q: float) -> float | None:
    """Nearest-rank quantile (the platform's ``/_stats`` uses the same rule)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def rss_dict(rss: TreeRss | None) -> Result | None:
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


def throughput(
    bench: Bench,
    sdk: Sdk,
    concurrency: int,
    backend: str = "trio",
    *,
    scenario: str = "noop",
    **extra: str,
) -> Result:
    """No-op jobs through one worker at *concurrency*, from a preloaded queue.

    jobs/s = finished jobs / (last done - first take answer sent). Overhead = per job, done
    arrived - take answer sent. The reference runs for a wall-clock cap instead of a count.
    *scenario* ``raising``: every job fails, and its FAILED reports are the ones counted.
    """
    s = bench.settings
    reference = sdk.key == "reference"
    jobs = s.reference_jobs_per_slot * concurrency if reference else s.jobs
    cap = s.reference_seconds if reference else 300.0
    bench.platform.reset(jobs, take_hold=2.0)
    worker = bench.start_worker(sdk, scenario, concurrency, BENCH_BACKEND=backend, **extra)
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
    status = "FAILED" if scenario == "raising" else "COMPLETED"
    done = [j for j in report["jobs"] if j["status"] == status and j["done"] is not None]
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
        "peak_rss": rss_dict(peak),
        "duplicate_reports": report["duplicate_reports"],
    }


def alternating(rounds: int, sides: Sequence[Callable[[], T]]) -> list[list[T]]:
    """Measure every side once a round, *rounds* times, the order turned round every other
    round (A B C, then C B A, ...): one list of results per side, aligned by round.

    The one way the harness measures the two sides of a ratio (docs/benchmarks.md,
    "Alternating rounds"): measured minutes apart, one after the other, a ratio also
    measures how the machine moved in between; in rounds, each round's two figures are
    close in time, and the turned order keeps either side from always going first.
    """
    results: list[list[T]] = [[] for _ in sides]
    for index in range(rounds):
        order = range(len(sides)) if index % 2 == 0 else range(len(sides) - 1, -1, -1)
        for side in order:
            results[side].append(sides[side]())
    return results


def round_ratios(values: Sequence[float | None], bases: Sequence[float | None]) -> list[float]:
    """Each round's *value* over its *base*, for the rounds that have both."""
    return [v / b for v, b in zip(values, bases, strict=True) if v and b and v > 0 and b > 0]


def backend_pair(bench: Bench, sdk: Sdk, concurrency: int) -> Result:
    """No-op jobs at *concurrency* on the trio and the asyncio backend, in alternating
    rounds (:func:`alternating`): the run with the median jobs/s of each backend, and the
    median of the rounds' ratios (asyncio over trio), the figure the target bounds
    (docs/design.md §11)."""
    trio_runs, asyncio_runs = alternating(
        bench.settings.backend_rounds,
        [
            lambda: throughput(bench, sdk, concurrency, "trio"),
            lambda: throughput(bench, sdk, concurrency, "asyncio"),
        ],
    )
    ratios = round_ratios(
        [run["jobs_per_s"] for run in asyncio_runs], [run["jobs_per_s"] for run in trio_runs]
    )
    pair: Result = {"ratios": ratios, "ratio": median(ratios)}
    for backend, results in (("trio", trio_runs), ("asyncio", asyncio_runs)):
        results = sorted(results, key=lambda run: float(run["jobs_per_s"]))
        pair[backend] = results[len(results) // 2]
        pair[f"{backend}_runs"] = [round(float(run["jobs_per_s"]), 1) for run in results]
    return pair


# -- a run to its end, with the CPU of the worker's process tree ------------------------------


@dataclass(frozen=True)
class Measured:
    """One worker run: the platform's report, and what the worker had done and spent."""

    report: Result
    cpu_s: float  # every live process of the worker's tree, from spawn to the reading
    finished: int  # jobs the platform had finished at the reading


def measured_run(
    bench: Bench,
    sdk: Sdk,
    scenario: str,
    concurrency: int,
    jobs: int,
    env: dict[str, str] | None = None,
    *,
    seconds: float | None = None,
) -> Measured:
    """*jobs* preloaded jobs through one worker at *concurrency* (*env*: its BENCH_ extras).

    The CPU of the worker's process tree (``tree_cpu_seconds`` of the spawned process: for
    trio_worker the crash watchdog and the worker, its child; for the reference the worker
    and its ping process) is read before the worker is killed: once the platform has the
    last job's report, or *seconds* after the first take (the reference's runs by time).
    """
    bench.platform.reset(jobs, take_hold=5.0)
    worker = bench.start_worker(sdk, scenario, concurrency, **(env or {}))
    try:
        bench.wait_until_taken(worker)
        deadline = time.monotonic() + (120.0 if seconds is None else seconds)
        while time.monotonic() < deadline:
            if seconds is None and bench.platform.progress()["finished"] >= jobs:
                break
            worker.check_alive()
            time.sleep(0.02)
        cpu = tree_cpu_seconds(worker.pid) or 0.0
        finished = bench.platform.progress()["finished"]
    finally:
        kill_group(worker)
    report: Result = bench.platform.report()
    if not any(j["status"] == "COMPLETED" for j in report["jobs"]):
        raise RuntimeError(f"no {scenario} job finished:\n{worker.log_tail()}")
    return Measured(report, cpu, finished)
