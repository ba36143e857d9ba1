"""Take answers a hostile or broken platform sends, end to end: the real worker against the
in-process fake platform in virtual time (docs/security.md)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any
from urllib.parse import unquote

import pytest
import trio

import trio_worker
import trio_worker.testing
from trio_worker._exceptions import AnswerTooLarge
from trio_worker._platform._http import HttpPool
from trio_worker.testing import FakePlatform, Fault
from trio_worker.testing._memory import memory_network

from .scripted_server import send_one

DEEP = b"[" * 5_000 + b"]" * 5_000


async def _echo(job: dict[str, Any]) -> Any:
    return job["input"]


@asynccontextmanager
async def _worker(platform: FakePlatform) -> AsyncIterator[None]:
    """The worker, on the production HTTP client, against *platform* in memory."""
    async with memory_network(platform) as open_stream, trio.open_nursery() as nursery:
        await nursery.start(
            partial(
                trio_worker.testing.serve,
                _echo,
                environ=platform.worker_env("http://platform"),
                open_stream=open_stream,
                heartbeat="task",
                handle_signals=False,
                capture_logs="off",
            )
        )
        yield
        nursery.cancel_scope.cancel()


def _reports(platform: FakePlatform) -> dict[str, Any]:
    """Each job-done body posted, by the job id in its URL."""
    out: dict[str, Any] = {}
    for request in platform.requests:
        if request.route == "done":
            out[unquote(request.path.rsplit("/", 1)[1])] = json.loads(request.body)
    return out


async def test_a_deep_job_in_a_batch_is_failed_by_name_and_the_others_run(
    virtual_clock: trio.abc.Clock,
) -> None:
    # Before: RecursionError on the whole answer, one WARNING, and no job reported.
    platform = FakePlatform(take_hold=5.0, stop_hold=5.0)
    body = (
        b'[{"id": "a", "input": 1}, {"id": "de ep", "input": '
        + DEEP
        + b'}, {"id": "c", "input": 3}]'
    )
    platform.inject(Fault("take", status=200, body=body))
    with trio.fail_after(60):
        async with _worker(platform):
            await platform.wait_for_requests("done", 3)
    reports = _reports(platform)
    assert reports["a"] == {"output": 1}
    assert reports["c"] == {"output": 3}
    error = json.loads(reports["de ep"]["error"])
    assert error["error_type"] == "trio_worker.MalformedJob"
    assert "nested too deep" in error["error_message"]


OVER = 65 * 1024 * 1024  # over the 64 MiB bound of a take answer


async def test_an_oversized_take_answer_fails_the_jobs_named_at_its_head(
    virtual_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    # Before: refused as designed, and the job in it lost without a line in the log.
    platform = FakePlatform(take_hold=5.0, stop_hold=5.0)
    body = b'[{"id": "big-1", "input": "' + b"x" * OVER + b'"}]'
    platform.inject(Fault("take", status=200, body=body))
    with trio.fail_after(60):
        async with _worker(platform):
            await platform.wait_for_requests("done", 1)
    error = json.loads(_reports(platform)["big-1"]["error"])
    assert error["error_type"] == "trio_worker.MalformedJob"
    assert "input too large" in error["error_message"]
    assert any("refused" in r.getMessage() and r.levelname == "ERROR" for r in caplog.records)


async def test_an_oversized_take_answer_without_ids_at_its_head_is_logged_as_a_loss(
    virtual_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    platform = FakePlatform(take_hold=5.0, stop_hold=5.0)
    body = b'[{"input": "' + b"x" * OVER + b'", "id": "late"}]'
    platform.inject(Fault("take", status=200, body=body))
    with trio.fail_after(60):
        async with _worker(platform):
            await platform.wait_for_requests("take", 2)
    (line,) = [r for r in caplog.records if "JOBS LOST" in r.getMessage()]
    assert line.levelname == "ERROR"
    assert str(len(body)) in line.getMessage()


async def test_the_lean_client_hands_over_the_head_of_an_answer_refused_for_its_size() -> None:
    # The refusal reads no more than what already arrived with the head: no wait.
    answered = trio.Event()

    async def handle(stream: trio.SocketStream) -> None:
        await stream.receive_some(65536)
        await stream.send_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Content-Length: 70000000\r\n\r\n" + b'[{"id": "a", "input": "xxxx'
        )
        await answered.wait()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, handle, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        client = HttpPool({})
        try:
            with trio.fail_after(10), pytest.raises(AnswerTooLarge) as caught:
                await send_one(client, "GET", f"http://127.0.0.1:{port}/take", max_body=1024)
        finally:
            answered.set()
            await client.aclose()
            nursery.cancel_scope.cancel()
    assert (caught.value.status, caught.value.size) == (200, 70_000_000)
    assert caught.value.head == b'[{"id": "a", "input": "xxxx'
