"""Take answers a hostile or broken platform sends, end to end: the real worker against the
in-process fake platform in virtual time (docs/security.md)."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import unquote

import httpx
import trio

import trio_worker
import trio_worker.testing
from trio_worker.testing import FakePlatform, Fault

DEEP = b"[" * 5_000 + b"]" * 5_000


async def _echo(job: dict[str, Any]) -> Any:
    return job["input"]


async def _serve(nursery: trio.Nursery, platform: FakePlatform) -> None:
    await nursery.start(
        lambda task_status: trio_worker.testing.serve(
            _echo,
            environ=platform.worker_env("http://platform"),
            transport=httpx.ASGITransport(app=platform),
            heartbeat="task",
            handle_signals=False,
            capture_logs="off",
            task_status=task_status,
        )
    )


def _reports(platform: FakePlatform) -> dict[str, Any]:
    """Each job-done body posted, by the job id in its URL."""
    out: dict[str, Any] = {}
    for request in platform.requests:
        if request.route == "done":
            out[unquote(request.path.rsplit("/", 1)[1])] = json.loads(request.body)
    return out


async def test_a_deep_job_in_a_batch_is_failed_by_name_and_the_others_run(
    nursery: trio.Nursery, virtual_clock: trio.abc.Clock
) -> None:
    # Before: RecursionError on the whole answer, one WARNING, and no job reported.
    platform = FakePlatform(take_hold=5.0, stop_hold=5.0)
    body = (
        b'[{"id": "a", "input": 1}, {"id": "de ep", "input": '
        + DEEP
        + b'}, {"id": "c", "input": 3}]'
    )
    platform.inject(Fault("take", status=200, body=body))
    await _serve(nursery, platform)
    with trio.fail_after(60):
        await platform.wait_for_requests("done", 3)
    reports = _reports(platform)
    assert reports["a"] == {"output": 1}
    assert reports["c"] == {"output": 3}
    error = json.loads(reports["de ep"]["error"])
    assert error["error_type"] == "trio_worker.MalformedJob"
    assert "nested too deep" in error["error_message"]
