"""Configuration is checked at start: a worker process with a bad wiring exits 1 with one
line naming the variable, before it takes anything (docs/protocol.md §1.1)."""

from __future__ import annotations

import pytest

from ..conftest import Platform
from .conftest import Spawn

pytestmark = pytest.mark.slow

KEY = "rpa_SECRETKEYVALUE"


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("RUNPOD_WEBHOOK_POST_OUTPUT", None),
        ("RUNPOD_WEBHOOK_POST_OUTPUT", "JOB_DONE_URL"),
        ("RUNPOD_WEBHOOK_POST_OUTPUT", "http://127.0.0.1:9/v2/ep/job-done/w1"),
        ("RUNPOD_WEBHOOK_POST_STREAM", "http://127.0.0.1:9/v2/ep/job-stream/w1?gpu=x"),
        ("RUNPOD_WEBHOOK_POST_STREAM", "/job-stream/$ID"),
        ("RUNPOD_WEBHOOK_GET_JOB", "http:///job-take/$ID"),
        ("RUNPOD_WEBHOOK_PING", "http://h:port/ping"),
        ("RUNPOD_AI_API_KEY", f"{KEY}\r\nX-Injected: 1"),
        ("RUNPOD_AI_API_KEY", f"{KEY}\n"),
    ],
)
async def test_bad_wiring_exits_1_naming_the_variable_before_any_take(
    platform: Platform, spawn: Spawn, variable: str, value: str | None
) -> None:
    env = platform.env()
    if value is None:
        del env[variable]
    else:
        env[variable] = value
    platform.fake.enqueue({"n": 1})
    worker = await spawn(env, "--rp_log_level", "DEBUG")
    assert await worker.wait() == 1, worker.output
    lines = [line for line in worker.output.splitlines() if "configuration error:" in line]
    assert len(lines) == 1, worker.output
    assert variable in lines[0]
    assert "Traceback" not in worker.output
    assert KEY not in worker.output
    assert platform.fake.requests == [], platform.fake.requests
