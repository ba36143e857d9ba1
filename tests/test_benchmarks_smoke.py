"""The benchmark harness runs end to end and produces its table (docs/benchmarks.md).

Benchmarks are not tests: nothing here asserts a timing. It checks that a tiny run
(``--quick --jobs 50``, trio_worker only, no chart, ``--against HEAD``: the throwaway
worktree of an older commit, made of this one so a shallow clone has it) finishes, prints
both tables with every expected row, and that each figure is a positive number (a marginal
CPU figure at these sizes may be a tick either way: it only has to be there). The
benchmark platform's lean HTTP front has its own tests: tests/test_bench_lean_front.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RUN = REPO / "benchmarks" / "run.py"

pytestmark = pytest.mark.timeout(10)


EXPECTED_ROWS = {
    "jobs_c1": "no-op jobs/s, concurrency 1",
    "jobs_c8": "no-op jobs/s, concurrency 8",
    "jobs_c64": "no-op jobs/s, concurrency 64",
    "overhead_p50": "take→done overhead p50 (c=1)",
    "overhead_p99": "take→done overhead p99 (c=1)",
    "first_take": "process start → first take",
    "first_take_no_checks": "process start → first take, fitness checks skipped",
    "idle_rss": "resident memory, idle (worker + children)",
    "load_rss": "resident memory, peak under load (c=64)",
    "init_failure": "init failure → all 8 held jobs reported",
    "stop": "stop signal → async handler cancelled",
    "stream": "streamed chunks/s (async generator)",
    "jobs_c8_asyncio": "no-op async jobs/s, c=8, asyncio backend",
    "jobs_c8_trio_paired": "no-op jobs/s, c=8, trio backend, alternating rounds",
    "streams64": "64 concurrent streams, no gap: chunks/s (asyncio backend)",
    "streams64_trio": "64 concurrent streams, no gap: chunks/s (trio backend)",
    "paced_p50": "64 streams at 50 chunks/s: yield→receipt p50 (asyncio)",
    "paced_p99": "64 streams at 50 chunks/s: yield→receipt p99 (asyncio)",
    "import": "import time (the package and its entry point)",
    "sigterm": "SIGTERM → exit, idle worker",
}


EXPECTED_TARGETS = (
    "cpu_chunk_asyncio",
    "cpu_chunk_trio",
    "handler_alone_asyncio",
    "handler_alone_trio",
    "handler_phased_asyncio",
    "handler_phased_trio",
    "paced_p50",
    "paced_p99",
    "streams64",
    "cpu_job_sync",
    "first_take",
    "jobs_c8_against",
)
MARGINAL = {
    "cpu_chunk_asyncio",
    "cpu_chunk_trio",
    "handler_alone_asyncio",
    "handler_alone_trio",
    "handler_phased_asyncio",
    "handler_phased_trio",
    "cpu_job_sync",
}


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_quick_run_produces_the_table(tmp_path: Path) -> None:
    argv = [sys.executable, str(RUN), "--quick", "--jobs", "50", "--no-chart", "--against", "HEAD"]
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

    assert "| figure | reference | trio_worker | ratio | target | holds |" in table
    targets = {row["key"]: row for row in data["targets"]}
    assert tuple(targets) == EXPECTED_TARGETS
    for key, row in targets.items():
        value = row["trio_worker"]
        assert isinstance(value, float), f"{key}: {value!r}"
        assert key in MARGINAL or value > 0, f"{key}: {value!r}"
        assert f"| {row['label']} |" in table
        assert row["text"]["load"] != "–", key  # every row says how busy the machine was
    assert results["floor"]["cpu_us_per_job"] > 0
    lb = results["lb"]  # the load-balancing endpoint, beside hypercorn alone
    assert lb["start_app"]["requests_per_s"] > 0 and lb["hypercorn"]["requests_per_s"] > 0
    assert lb["start_app_over_hypercorn"] > 0
    assert lb["start_to_first_200_s"]["start_app"]["median"] > 0
    assert results["against"]["old_runs"] and results["against"]["current_runs"]
    assert results["paced"]["pairs"][0]["short"]["chunks"] < results["paced"]["chunks"]
    assert (
        "against-"
        not in subprocess.run(
            ["git", "-C", str(REPO), "worktree", "list"], capture_output=True, text=True, check=True
        ).stdout
    )


def test_check_refuses_a_baseline_of_another_machine_class(tmp_path: Path) -> None:
    """Exit 2 before measuring anything, and nothing written (docs/benchmarks.md)."""
    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps({"machine": {"cpu": "no such CPU", "cores": 1}, "rows": []}))
    published = [REPO / "benchmarks" / "results" / "latest.json", REPO / "docs" / "benchmarks.md"]
    before = [path.stat().st_mtime_ns for path in published]
    run = subprocess.run(
        [sys.executable, str(RUN), "--check", "--baseline", str(baseline)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert run.returncode == 2, run.stderr[-2000:]
    assert "no such CPU" in run.stderr
    assert "total" not in run.stderr  # no figure was run
    assert [path.stat().st_mtime_ns for path in published] == before
