"""Streaming figures: one stream's chunks/s, 64 streams with no gap, 64 paced streams.

Each run also carries the CPU of the worker's process tree at its end (``cpu_s``), which
``benchmarks/_cpu_figures.py`` turns into a marginal CPU per chunk.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from benchmarks._figures import Result, measured_run, quantile
from benchmarks._procs import kill_group, tree_cpu_seconds

if TYPE_CHECKING:
    from benchmarks._figures import Bench
    from benchmarks._sdks import Sdk


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
    """``streams`` jobs at once, one stream each, to the last job-done: the platform's
    report, with the worker tree's CPU at that moment (``cpu_s``)."""
    s = bench.settings
    env = {"BENCH_CHUNKS": str(chunks), **extra}
    run = measured_run(bench, sdk, scenario, s.streams, s.streams, env)
    return {**run.report, "cpu_s": run.cpu_s}


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
        "cpu_s": report["cpu_s"],
    }


def paced_streams(
    bench: Bench, sdk: Sdk, backend: str = "asyncio", chunks: int | None = None
) -> Result:
    """64 streams at 50 chunks/s each (*chunks* each, default ``paced_chunks``): latency
    from each ``yield`` to the chunk's arrival at the platform (wall clocks of one
    machine)."""
    s = bench.settings
    report = _run_streams(
        bench,
        sdk,
        "stream_paced",
        s.paced_chunks if chunks is None else chunks,
        BENCH_BACKEND=backend,
        BENCH_CHUNK_INTERVAL=str(s.paced_interval),
    )
    latency: list[float] = report["chunk_latency_ms"]
    if not latency:
        raise RuntimeError("no paced chunk arrived")
    return {
        "backend": backend,
        "chunks": len(latency),
        "cpu_s": report["cpu_s"],
        "offered_chunks_per_s": s.streams / s.paced_interval,
        "latency_ms": {
            "p50": quantile(latency, 0.50),
            "p99": quantile(latency, 0.99),
            "max": max(latency),
        },
    }
