"""The cost of holding many jobs: the ledger and the stop memory, per operation.

    python benchmarks/ledger_scale.py [--max 1000000]

For each size N from 1,000 up to --max: N adds to an empty ledger, a ping's snapshot of the
N held ids, then N finishes; and N stops for ids not held (a job-stop answer naming N
unknown ids). Prints the cost per operation, which must stay flat as N grows: work per
answer is linear (docs/security.md). Before the ledger's snapshot became lazy, 20,000
adds took 2 s and 40,000 took 8.7 s (n² in the held ids).
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trio_worker._job import StopMemory
from trio_worker._state import JobEvent, Ledger


def measure(n: int) -> dict[str, float]:
    """Nanoseconds per add, per finish and per unknown stop, and ms for one snapshot."""
    ids = [f"job-{i:08d}" for i in range(n)]
    ledger = Ledger()
    gc.collect()
    t0 = time.perf_counter()
    jobs = [ledger.add(job_id, {}) for job_id in ids]
    t1 = time.perf_counter()
    snapshot = ledger.held_ids
    t2 = time.perf_counter()
    for job in jobs:
        assert job is not None
        ledger.fire(job, JobEvent.RELEASE)
    t3 = time.perf_counter()
    assert len(snapshot) == n
    assert not ledger.held_ids
    memory = StopMemory(seconds=120.0, size=1024)
    t4 = time.perf_counter()
    for job_id in ids:
        memory.remember(job_id, 0.0)
    t5 = time.perf_counter()
    return {
        "add_ns": (t1 - t0) / n * 1e9,
        "snapshot_ms": (t2 - t1) * 1e3,
        "finish_ns": (t3 - t2) / n * 1e9,
        "stop_ns": (t5 - t4) / n * 1e9,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max", type=int, default=1_000_000, help="largest N (default 1e6)")
    args = parser.parse_args()
    print("| held ids | ns per add | one snapshot (ms) | ns per finish | ns per unknown stop |")
    print("|---:|---:|---:|---:|---:|")
    n = 1_000
    while n <= args.max:
        m = measure(n)
        print(
            f"| {n:,} | {m['add_ns']:.0f} | {m['snapshot_ms']:.2f} "
            f"| {m['finish_ns']:.0f} | {m['stop_ns']:.0f} |"
        )
        n *= 10


if __name__ == "__main__":
    main()
