"""The benchmark harness runs end to end and produces its table (docs/benchmarks.md).

Benchmarks are not tests: nothing here asserts a timing. It checks that a tiny run
(``--quick --jobs 50``, trio_worker only, no chart) finishes, prints a table with every
expected row, and that each figure is a positive number.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RUN = REPO / "benchmarks" / "run.py"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

EXPECTED_ROWS = {
    "jobs_c1": "no-op jobs/s, concurrency 1",
    "jobs_c8": "no-op jobs/s, concurrency 8",
    "jobs_c64": "no-op jobs/s, concurrency 64",
    "overhead_p50": "take→done overhead p50 (c=1)",
    "overhead_p99": "take→done overhead p99 (c=1)",
    "first_take": "process start → first take",
    "idle_rss": "resident memory, idle (worker + children)",
    "load_rss": "resident memory, peak under load (c=64)",
    "init_failure": "init failure → all 8 held jobs reported",
    "stop": "stop signal → async handler cancelled",
    "stream": "streamed chunks/s (async generator)",
    "jobs_c8_asyncio": "no-op async jobs/s, c=8, asyncio backend",
    "streams64": "64 concurrent streams, no gap: chunks/s (asyncio backend)",
    "streams64_trio": "64 concurrent streams, no gap: chunks/s (trio backend)",
    "paced_p50": "64 streams at 50 chunks/s: yield→receipt p50 (asyncio)",
    "paced_p99": "64 streams at 50 chunks/s: yield→receipt p99 (asyncio)",
    "import": "import time (-X importtime)",
    "sigterm": "SIGTERM → exit, idle worker",
}


def test_quick_run_produces_the_table(tmp_path: Path) -> None:
    argv = [sys.executable, str(RUN), "--quick", "--jobs", "50", "--no-chart"]
    run = subprocess.run(
        [*argv, "--output-dir", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=80,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "FAILED" not in run.stderr, run.stderr[-3000:]

    table = run.stdout
    assert "| figure | trio_worker |" in table
    for label in EXPECTED_ROWS.values():
        assert f"| {label} |" in table, f"row {label!r} missing from:\n{table}"
    assert (tmp_path / "latest.md").read_text() == table.rstrip("\n") + "\n"

    data = json.loads((tmp_path / "latest.json").read_text())
    rows = {row["key"]: row for row in data["rows"]}
    assert set(rows) == set(EXPECTED_ROWS)
    for key, row in rows.items():
        value = row["trio_worker"]
        assert isinstance(value, float), f"{key}: {value!r}"
        assert value > 0, f"{key}: {value!r}"
        assert row["reference"] is None
    results = data["results"]["trio_worker"]
    assert results["throughput"]["1"]["jobs"] == 50
    assert results["init_failure"]["failed_jobs"] == [8]
    assert results["stream"]["complete"] is True
    assert results["stop"]["cancelled"] == results["stop"]["stops_sent"] > 0
    for key in ("cpu", "cores", "python", "trio", "httpx", "date"):
        assert data["machine"][key], key
