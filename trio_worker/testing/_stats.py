"""``GET /_stats`` of the fake platform: counters, a summary and per-job timestamps."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

import trio

from .._endpoint._queue import encode_json

if TYPE_CHECKING:
    from .._endpoint._state import PlatformState

__all__ = ["stats_body"]


def stats_body(platform: PlatformState, query: dict[str, str]) -> bytes:
    """``GET /_stats``: counters, a throughput/latency summary and per-job timestamps.

    Times are the platform's ``trio.current_time()``: only differences are meaningful.
    ``?jobs=0`` leaves out the per-job list.
    """
    jobs = list(platform.jobs.values())
    takes = [job.take_time for job in jobs if job.take_time is not None]
    done = [
        job for job in jobs if job.status in ("COMPLETED", "FAILED") and job.done_time is not None
    ]
    latencies = sorted(
        (job.done_time - job.take_time) * 1000
        for job in done
        if job.done_time is not None and job.take_time is not None
    )
    summary: dict[str, object] = {"finished": len(done)}
    if takes and done:
        first_take = min(takes)
        last_done = max(job.done_time for job in done if job.done_time is not None)
        span = last_done - first_take
        summary.update(
            first_take=first_take,
            last_done=last_done,
            jobs_per_second=len(done) / span if span > 0 else None,
            take_to_done_ms={
                "p50": _quantile(latencies, 0.50),
                "p90": _quantile(latencies, 0.90),
                "p99": _quantile(latencies, 0.99),
                "max": latencies[-1] if latencies else None,
            },
        )
    answer: dict[str, object] = {
        "now": trio.current_time(),
        "statistics": dataclasses.asdict(platform.statistics()),
        "summary": summary,
    }
    if query.get("jobs", "1") != "0":
        answer["jobs"] = [
            {
                "id": job.id,
                "status": job.status,
                "enqueue_time": job.enqueue_time,
                "take_time": job.take_time,
                "done_time": job.done_time,
                "taken_by": job.taken_by,
                "takes": job.takes,
            }
            for job in jobs
        ]
    return encode_json(answer)


def _quantile(sorted_values: list[float], q: float) -> float | None:
    """Nearest-rank quantile of an ascending list."""
    if not sorted_values:
        return None
    rank = max(math.ceil(q * len(sorted_values)) - 1, 0)
    return sorted_values[rank]
