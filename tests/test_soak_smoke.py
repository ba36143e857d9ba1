"""scripts/soak_delivery.py runs end to end: a tiny soak, checked for its report's shape.

Not a reliability test (docs/reliability.md has those): whether anything was lost depends
on the delivery code the soak measures. This only proves the soak itself works, so the
figures it prints can be trusted: it starts the platform, the proxy and a worker process,
runs every job through them while faults come and go, stops by itself, and its counts add
up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "soak_delivery.py"
JOBS = 200


def test_a_short_soak_reports_counts_that_add_up(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNPOD_")}
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            f"--jobs={JOBS}",
            "--rate=100",
            "--max-outage=1",
            "--settle=10",
            "--minutes=0.5",
            "--report-every=5",
            "--seed=1",
            f"--json={out}",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=55,
        check=False,
    )
    assert done.returncode in (0, 1), done.stdout + done.stderr
    report = json.loads(out.read_text())
    assert "VERDICT: " + ("FAIL" if report["failed"] else "OK") in done.stdout

    assert report["enqueued"] == JOBS
    assert report["enqueued"] == report["taken"] + report["stuck_in_queue"]
    assert report["taken"] == (
        report["delivered_once"] + report["delivered_twice"] + report["lost"]
    )
    assert report["lost"] == report["stuck_in_progress"] + report["lost_failed"]
    assert 0 <= report["twice_explained"] <= report["delivered_twice"]
    assert report["failed"] == (
        report["lost"] > 0 or report["delivered_twice"] > report["twice_explained"]
    )
    assert (done.returncode == 1) == report["failed"]
    # It ran: every job was handed to the worker and reported over the routes.
    assert report["complete"] and report["stuck_in_queue"] == 0
    assert report["requests_by_route"].get("done", 0) >= report["delivered_once"]
    assert report["worker_restarts"] == 0
    assert set(report["rss_mib"]) == {"start", "middle", "end"}
    assert all(isinstance(v, float) and v > 0 for v in report["rss_mib"].values())
