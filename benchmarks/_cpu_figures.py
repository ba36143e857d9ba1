"""CPU per streamed chunk and per no-op job, by the marginal method, and the floor.

A worker's CPU time includes its start-up: the interpreter, the imports, its fitness checks,
the fork of the crash watchdog. Per unit of work that is noise, so each figure is the
*marginal* CPU between a short and a long run of the same kind::

    CPU per unit = (cpu_long - cpu_short) / (units_long - units_short)

where ``cpu`` is the CPU time of every live process of the worker's tree (trio_worker: the
crash watchdog it execs and the worker, its child; the reference: the worker and the ping
process it forks) from spawn to the moment the platform has the last report, read before
the worker is killed (``_figures.measured_run``). Start-up is in both runs and cancels out.
The reference's no-op runs go by time instead of count: it sleeps between takes, so a run of
a fixed count would take minutes; its units are then the jobs finished at the reading.

The floor is ``floor_client.py raw``: one blocking socket, prebuilt requests. Its CPU per job
is its own ``time.process_time()`` around the take/done loop, read inside the process after
the interpreter has started and imported everything, so start-up is already out of it.

The paced handler alone (``handler_alone.py``) is the paced-streams generator with no SDK:
the part of a paced chunk's CPU that every SDK pays, measured the same marginal way, inside
its process.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from benchmarks._figures import Result, measured_run
from benchmarks._stream_figures import paced_streams

if TYPE_CHECKING:
    from benchmarks._figures import Bench
    from benchmarks._platform import PlatformProcess
    from benchmarks._sdks import Sdk

FLOOR_CLIENT = Path(__file__).with_name("floor_client.py")
HANDLER_ALONE = Path(__file__).with_name("handler_alone.py")


def marginal_us(short: tuple[float, float], long: tuple[float, float]) -> float | None:
    """µs of CPU per unit between two ``(cpu seconds, units)`` runs; None if the long run
    did not do more than the short one. In a tiny run (``--quick``, the smoke test) start-up
    noise can exceed the difference and the figure read zero or less: it is still given, as
    the run's reading, not hidden."""
    (cpu_short, units_short), (cpu_long, units_long) = short, long
    if units_long <= units_short:
        return None
    return (cpu_long - cpu_short) * 1e6 / (units_long - units_short)


def paced_pair(bench: Bench, sdk: Sdk, backend: str = "asyncio") -> tuple[float | None, Result]:
    """One short/long pair of the 64 paced streams (``paced_short_chunks``, then
    ``paced_chunks`` each): the marginal CPU per chunk, and the long run (the latency
    figure) with the pair's readings under ``pair``."""
    short = paced_streams(bench, sdk, backend, bench.settings.paced_short_chunks)
    long = paced_streams(bench, sdk, backend)
    us = marginal_us((short["cpu_s"], short["chunks"]), (long["cpu_s"], long["chunks"]))
    return us, {
        **long,
        "pair": {"short": _run_cpu(short, "chunks"), "long": _run_cpu(long, "chunks")},
    }


def paced_figure(samples: list[tuple[float | None, Result]]) -> Result:
    """The paced-streams figure of several pairs: the last long run, and the median of the
    pairs' marginal CPU per chunk."""
    measured = [us for us, _ in samples if us is not None]
    last = dict(samples[-1][1])
    last.pop("pair", None)
    return {
        **last,
        "cpu_us_per_chunk": statistics.median(measured) if measured else None,
        "cpu_us_samples": measured,
        "pairs": [run["pair"] for _, run in samples],
    }


def noop_cpu_pair(bench: Bench, sdk: Sdk, concurrency: int = 8) -> tuple[float | None, Result]:
    """One short/long pair of no-op jobs of a sync handler (scenario ``noop_sync``): the
    marginal CPU per job, and the pair's readings.

    trio_worker: ``short_jobs`` then ``jobs`` preloaded jobs, each run to its last report.
    The reference: ``reference_cpu_seconds`` (short, long) after its first take, from a
    queue that outlasts both.
    """
    s = bench.settings
    runs: list[tuple[float, float]] = []
    if sdk.key == "reference":
        for seconds in s.reference_cpu_seconds:
            # More jobs than it can take in the time (about one per slot per second).
            jobs = int(concurrency * 4 * (seconds + 5))
            run = measured_run(bench, sdk, "noop_sync", concurrency, jobs, seconds=seconds)
            runs.append((run.cpu_s, run.finished))
    else:
        for jobs in (s.short_jobs, s.jobs):
            run = measured_run(bench, sdk, "noop_sync", concurrency, jobs)
            runs.append((run.cpu_s, run.finished))
    (short, long) = runs
    return marginal_us(short, long), {
        "short": {"cpu_s": short[0], "jobs": short[1]},
        "long": {"cpu_s": long[0], "jobs": long[1]},
    }


def noop_cpu_figure(
    samples: list[tuple[float | None, Result]], sdk: Sdk, concurrency: int = 8
) -> Result:
    """The CPU per no-op sync job of several pairs: their median."""
    measured = [us for us, _ in samples if us is not None]
    return {
        "concurrency": concurrency,
        "cpu_us_per_job": statistics.median(measured) if measured else None,
        "cpu_us_samples": measured,
        "by": "time" if sdk.key == "reference" else "count",
        "pairs": [pair for _, pair in samples],
    }


def noop_cpu(bench: Bench, sdk: Sdk, concurrency: int = 8) -> Result:
    """CPU per no-op sync job: the median over ``cpu_pairs`` pairs (the reference's: its
    own figure, no ratio target rests on it, so it is not alternated with anything)."""
    samples = [noop_cpu_pair(bench, sdk, concurrency) for _ in range(bench.settings.cpu_pairs)]
    return noop_cpu_figure(samples, sdk, concurrency)


def _run_cpu(run: Result, unit: str) -> Result:
    return {unit: run[unit], "cpu_s": run["cpu_s"]}


def run_floor(platform: PlatformProcess, mode: str, jobs: int, loops: int = 1) -> Result:
    """``floor_client.py MODE`` through *jobs* preloaded jobs: its answer (jobs/s, its CPU
    per job), plus the platform's CPU per job."""
    platform.reset(jobs, take_hold=0.0)
    cpu0 = platform.cpu_seconds()
    result = subprocess.run(
        [sys.executable, str(FLOOR_CLIENT), mode, platform.url, str(jobs), str(loops)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    answer: Result = json.loads(result.stdout.strip().splitlines()[-1])
    answer["platform_cpu_ms_per_job"] = (platform.cpu_seconds() - cpu0) * 1000 / answer["jobs"]
    return answer


def floor_once(bench: Bench) -> tuple[float, Result]:
    """One run of the raw floor through ``floor_jobs`` jobs: its CPU per job in µs, and
    its answer."""
    answer = run_floor(bench.platform, "raw", bench.settings.floor_jobs)
    return answer["client_cpu_ms_per_job"] * 1000, answer


def floor_figure(samples: list[tuple[float, Result]]) -> Result:
    """The floor of several runs: the median CPU per job (the last run's other figures)."""
    answer = dict(samples[-1][1])
    answer["cpu_us_samples"] = [us for us, _ in samples]
    answer["cpu_us_per_job"] = statistics.median(answer["cpu_us_samples"])
    return answer


def handler_alone(bench: Bench) -> Result:
    """The paced-streams handler with no SDK, per backend: its own CPU per chunk (the
    median of ``cpu_pairs`` short/long pairs, run inside one process)."""
    s = bench.settings
    results: Result = {}
    for backend in ("asyncio", "trio"):
        completed = subprocess.run(
            [
                sys.executable,
                str(HANDLER_ALONE),
                backend,
                str(s.streams),
                str(s.paced_short_chunks),
                str(s.paced_chunks),
                str(s.cpu_pairs),
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
            env={**os.environ, "BENCH_CHUNK_INTERVAL": str(s.paced_interval)},
        )
        results[backend] = json.loads(completed.stdout.strip().splitlines()[-1])
    return results
