"""An answer to a report whose body is over the read bound still answers by its status.

The client reads at most 1 MiB of an answer's body (docs/protocol.md §2.0); past it, the
rest is not read. The status is in the head, already read: a 413 refuses the result for
good (answered by the small ``ResultRefused`` report, docs/design.md §5), a 2xx
acknowledges it. Retrying either until the budget ran out lost the result, or stored it
again.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
import trio
import trio.testing

from trio_worker._config import MAX_ANSWER_BYTES
from trio_worker.testing import FakePlatform, Fault

from .backends import BOTH_BACKENDS, sleep_for
from .test_delivery import done_requests, finished, lost_lines, running

pytestmark = pytest.mark.timeout(60)

HUGE = b"<html>" + b"x" * (2 * MAX_ANSWER_BYTES) + b"</html>"  # a proxy's error page, say


@BOTH_BACKENDS
async def test_a_413_with_a_body_over_the_bound_is_refused_not_retried(
    backend: str, virtual_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="trio_worker")
    platform = FakePlatform()

    async def handler(job: dict[str, Any]) -> Any:
        await sleep_for(backend)(0)
        return "y" * 100_000

    async with running(platform, handler, backend=backend):
        platform.inject(Fault("done", status=413, body=HUGE))
        job_id = platform.enqueue({})
        job = await finished(platform, job_id, "FAILED")
    refused, notice = done_requests(platform, job_id)  # once each: no retry
    assert refused.status == 413
    assert len(notice.body) < 4096
    error = json.loads(job.error)  # type: ignore[arg-type]
    assert error["error_type"] == "ResultRefused"
    assert "HTTP 413" in error["error_message"]
    assert lost_lines(caplog) == []
    assert not any("retrying" in message for message in caplog.messages)


@BOTH_BACKENDS
async def test_a_2xx_with_a_body_over_the_bound_acknowledges_the_report(
    backend: str, virtual_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="trio_worker")
    platform = FakePlatform()
    async with running(platform, backend=backend):
        platform.inject(Fault("done", status=200, body=HUGE, when="after"))
        job_id = platform.enqueue({"n": 1})
        job = await finished(platform, job_id, "COMPLETED")
        await trio.testing.wait_all_tasks_blocked()
    assert job.output == {"echo": {"n": 1}}
    assert len(done_requests(platform, job_id)) == 1  # stored once, not sent again
    assert lost_lines(caplog) == []


@BOTH_BACKENDS
async def test_a_chunk_answered_413_with_a_body_over_the_bound_is_named_not_retried(
    backend: str, virtual_clock: trio.abc.Clock
) -> None:
    platform = FakePlatform()
    sleep = sleep_for(backend)

    async def stream(job: dict[str, Any]) -> Any:
        for n in range(4):
            await sleep(0)
            yield n

    async with running(platform, stream, backend=backend):
        platform.inject(Fault("stream", status=413, body=HUGE))
        job_id = platform.enqueue({})
        job = await finished(platform, job_id, "COMPLETED")
    assert job.stream == [1, 2, 3]
    streamed = [r for r in platform.requests if r.route == "stream"]
    assert len(streamed) == 4  # the refused chunk went once
    [final] = job.done_reports
    assert final == {"output": [], "undelivered_chunk_count": 1, "undelivered_chunks": [0]}
