"""The reference's utilities in real handlers, several jobs in a row, beside trio_worker.

Each test runs ``handlers/whisper_style.py`` as its own worker process (``runpod``
imported, as in the user's container) against the fake platform over loopback.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from trio_worker.testing import TERMINAL_STATUSES, JobRecord

from .conftest import Platform, Spawn

pytestmark = pytest.mark.slow

JOBS = 5
STEPS = ["validation_step", "download_step", "prediction_step", "cleanup_step"]


async def _finish(platform: Platform, inputs: list[dict[str, Any]]) -> list[JobRecord]:
    """Queue *inputs* one after the other, each once the previous one has finished."""
    records = []
    for job_input in inputs:
        job_id = platform.fake.enqueue(job_input)
        with trio.fail_after(30):
            records.append(await platform.fake.wait_for_status(job_id, *TERMINAL_STATUSES))
    return records


async def test_function_timer_handler_runs_job_after_job(
    platform: Platform, spawn: Spawn, tmp_path: Path
) -> None:
    worker = await spawn("whisper_style.py", platform.env())
    inputs = [{"audio": f"clip {n}", "model": "tiny"} for n in range(JOBS)]
    records = await _finish(platform, inputs)
    # Without the per-job clear, every job after the first failed:
    # KeyError: 'Checkpoint name "run_whisper_job" already exists.'
    assert [r.status for r in records] == ["COMPLETED"] * JOBS, [r.error for r in records]
    outputs: list[dict[str, Any]] = [r.output for r in records]  # type: ignore[misc]
    assert [o["transcription"] for o in outputs] == [f"text of clip {n}" for n in range(JOBS)]
    # rp_cleanup.clean ran in the worker's directory, each time.
    assert [o["leftover_input_objects"] for o in outputs] == [False] * JOBS
    assert not (tmp_path / "input_objects").exists()
    assert await worker.stop() == 0


async def test_debugger_output_holds_only_the_current_job(platform: Platform, spawn: Spawn) -> None:
    await spawn("whisper_style.py", platform.env(), "--rp_debugger")
    records = await _finish(platform, [{"audio": f"a{n}", "with_timings": True} for n in range(3)])
    assert [r.status for r in records] == ["COMPLETED"] * 3, [r.error for r in records]
    for record in records:
        output: dict[str, Any] = record.output  # type: ignore[assignment]
        debugger = output["rp_debugger"]
        assert [t["name"] for t in debugger["timestamps"]] == STEPS
        assert debugger["system_info"]["runpod"]


async def test_validator_errors_and_a_raising_model_fail_only_their_job(
    platform: Platform, spawn: Spawn
) -> None:
    await spawn("whisper_style.py", platform.env())
    records = await _finish(
        platform,
        [
            {"audio": "fine"},
            {"model": "tiny"},  # rp_validator: audio is required
            {"audio": "x", "temperature": "hot"},  # rp_validator: the wrong type
            {"audio": "corrupt"},  # the stub model raises; RunPodLogger logged the error
            {"audio": "fine again"},
        ],
    )
    statuses = ["COMPLETED", "FAILED", "FAILED", "FAILED", "COMPLETED"]
    assert [r.status for r in records] == statuses
    assert "audio is a required input" in str(records[1].error)
    assert "temperature should be" in str(records[2].error)
    # The error travels as the reference's JSON string.
    failure = json.loads(str(records[3].error))
    assert failure["error_type"] == "RuntimeError"
    assert "could not decode audio" in failure["error_message"]
    # RunPodLogger prints to stdout: the job's captured output carries its line.
    assert "prediction failed: could not decode audio" in failure["logs"]


async def test_importing_runpod_does_not_log_a_line_per_request(
    platform: Platform, spawn: Spawn
) -> None:
    # `import runpod` sets the root logger to INFO with a stderr handler; the worker's
    # pings (every 100 ms here), takes and reports must not each log "HTTP Request:".
    worker = await spawn("whisper_style.py", platform.env())
    await _finish(platform, [{"audio": f"b{n}"} for n in range(3)])
    with trio.fail_after(30):
        await platform.fake.wait_for_requests("ping", 10)
    assert await worker.stop() == 0
    assert "HTTP Request" not in worker.output
    assert "GET /v2/" not in worker.output
