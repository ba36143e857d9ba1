"""async_backend="asyncio": real asyncio code served by the worker (docs/design.md §2).

Every test here runs the test body as trio's guest on an asyncio loop
(``trio_worker.run_asyncio_host``), in real time: asyncio tasks do not run on trio's clock.
The engine below has the shape of vLLM's AsyncLLMEngine: built in the initializer, one
background task serving requests from an ``asyncio.Queue`` and resolving futures.
"""

from __future__ import annotations

import asyncio
import gc
import json
import runpy
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

import trio_worker
import trio_worker.testing
from tests.conftest import serve_in_process
from trio_worker.testing import FakePlatform

from .backends import ASYNCIO_ONLY

WAIT = 30.0  # a safety bound on each wait; never reached when the code is right


class Engine:
    """A stand-in for an asyncio inference engine: a background loop and a request queue."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.requests: asyncio.Queue[tuple[int, asyncio.Future[int]]] = asyncio.Queue()
        self.task = asyncio.create_task(self._serve())
        self.served = 0

    async def _serve(self) -> None:
        while True:
            value, future = await self.requests.get()
            await asyncio.sleep(0)
            self.served += 1
            if not future.done():
                future.set_result(value * 2)

    async def generate(self, value: int) -> int:
        future: asyncio.Future[int] = self.loop.create_future()
        await self.requests.put((value, future))
        return await future


async def serve(
    platform: FakePlatform,
    handler: Any,
    task_status: trio.TaskStatus[trio_worker.WorkerHandle] = trio.TASK_STATUS_IGNORED,
    **options: Any,
) -> None:
    """The real worker on the asyncio backend, against *platform* in process."""
    await serve_in_process(platform, handler, backend="asyncio", **options)(task_status=task_status)


# Set when each worker started by start_worker has returned.
_EXITED: dict[trio_worker.WorkerHandle, trio.Event] = {}


async def start_worker(
    nursery: trio.Nursery, platform: FakePlatform, handler: Any, **options: Any
) -> trio_worker.WorkerHandle:
    exited = trio.Event()

    async def run(task_status: trio.TaskStatus[trio_worker.WorkerHandle]) -> None:
        try:
            await serve(platform, handler, task_status=task_status, **options)
        finally:
            exited.set()

    handle: trio_worker.WorkerHandle = await nursery.start(run)
    _EXITED[handle] = exited
    return handle


async def shut_down(handle: trio_worker.WorkerHandle) -> None:
    """End the test's worker and wait for it, before the in-process platform goes with the
    test's nursery: a report the platform recorded but never answered would otherwise be
    retried, shielded, for the whole report budget (10 s) against a platform gone."""
    handle.shutdown("test over")
    with trio.fail_after(WAIT):
        await _EXITED.pop(handle).wait()


def inner_error(record: Any) -> dict[str, Any]:
    error = json.loads(record.error)
    assert isinstance(error, dict)
    return error


@ASYNCIO_ONLY
async def test_an_engine_built_in_the_initializer_serves_many_concurrent_jobs(
    nursery: trio.Nursery, backend: str
) -> None:
    engines: list[Engine] = []

    async def init() -> None:
        engines.append(Engine())

    async def handler(job: dict[str, Any]) -> object:
        n = job["input"]["n"]
        # Several requests in flight at once on the engine's loop, as a batch would be.
        results = await asyncio.gather(*(engines[0].generate(n + i) for i in range(3)))
        return {"results": results, "same_loop": asyncio.get_running_loop() is engines[0].loop}

    platform = FakePlatform(take_hold=1.0)
    worker = await start_worker(nursery, platform, handler, initializer=init, concurrency=16)
    ids = [platform.enqueue({"n": n}) for n in range(200)]
    with trio.fail_after(WAIT):
        for n, job_id in enumerate(ids):
            record = await platform.wait_for_status(job_id, "COMPLETED")
            assert record.output == {"results": [2 * n, 2 * n + 2, 2 * n + 4], "same_loop": True}
    assert engines[0].served == 600
    assert not engines[0].task.done()  # the engine outlived every job
    await shut_down(worker)


@ASYNCIO_ONLY
async def test_a_stop_cancels_the_asyncio_task_mid_stream(
    nursery: trio.Nursery, backend: str
) -> None:
    seen: list[str] = []
    streaming, finished = trio.Event(), trio.Event()

    async def handler(job: dict[str, Any]) -> AsyncIterator[int]:
        try:
            for i in range(10_000):
                if i == 3:
                    streaming.set()
                await asyncio.sleep(0.001)
                yield i
        except asyncio.CancelledError:
            seen.append("CancelledError")
            raise
        finally:
            seen.append("finally")
            finished.set()  # from the asyncio task: trio wakes as from any host callback

    platform = FakePlatform(take_hold=1.0, stop_hold=1.0)
    worker = await start_worker(nursery, platform, handler)
    job_id = platform.enqueue({})
    with trio.fail_after(WAIT):
        await streaming.wait()
        platform.request_stop(job_id)
        await finished.wait()
    assert seen == ["CancelledError", "finally"]
    await shut_down(worker)


@ASYNCIO_ONLY
async def test_shutdown_past_the_grace_cancels_the_handler_and_reports_the_job(
    nursery: trio.Nursery, backend: str
) -> None:
    seen: list[str] = []
    started = trio.Event()

    async def handler(job: dict[str, Any]) -> object:
        started.set()
        try:
            await asyncio.Event().wait()  # never set: only a cancellation ends this
        except asyncio.CancelledError:
            seen.append("CancelledError")
            raise
        return None

    platform = FakePlatform(take_hold=1.0)
    handle = await start_worker(
        nursery, platform, handler, timings=trio_worker.Timings(shutdown_grace=0.05)
    )
    job_id = platform.enqueue({})
    with trio.fail_after(WAIT):
        await started.wait()
        handle.shutdown("test")
        record = await platform.wait_for_status(job_id, "FAILED")
    await shut_down(handle)
    assert seen == ["CancelledError"]
    assert "shutdown" in inner_error(record)["error_message"].lower()


@ASYNCIO_ONLY
async def test_a_task_abandoned_at_the_end_of_the_grace_leaves_no_unretrieved_error(
    backend: str, virtual_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    # Found by the property suite: a handler that swallows its cancellation is abandoned
    # when the grace ends (its job reported worker_shutdown); when it raises later, asyncio
    # must not log "Task exception was never retrieved" with the user's traceback.
    started = trio.Event()
    raised: list[str] = []

    async def handler(job: dict[str, Any]) -> object:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass  # swallowed: it runs on past the grace
        await asyncio.sleep(30)
        raised.append("late")
        raise RuntimeError("raised after the worker moved on")

    platform = FakePlatform(take_hold=1.0)
    job_id = platform.enqueue({})
    async with trio.open_nursery() as nursery:
        handle = await start_worker(
            nursery, platform, handler, timings=trio_worker.Timings(shutdown_grace=1.0)
        )
        await started.wait()
        handle.shutdown("test")
    assert "shutdown" in inner_error(platform.job(job_id))["error_message"].lower()
    await trio.sleep(60)  # virtual: the abandoned task raises meanwhile
    assert raised == ["late"]
    gc.collect()
    assert "never retrieved" not in caplog.text


@ASYNCIO_ONLY
async def test_a_stream_whose_cleanup_outlasts_its_bound_leaves_no_unretrieved_error(
    backend: str, virtual_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    # The worker stops waiting for a stopped generator's cleanup after sync_close_bound;
    # when that cleanup fails later, asyncio must not log "Task exception was never
    # retrieved" either.
    streaming = trio.Event()
    raised: list[str] = []

    async def handler(job: dict[str, Any]) -> AsyncIterator[int]:
        try:
            yield 1
            streaming.set()
            await asyncio.sleep(3600)
        finally:
            await asyncio.sleep(30)  # past the bound
            raised.append("late")
            raise RuntimeError("cleanup failed after the worker moved on")

    platform = FakePlatform(take_hold=1.0, stop_hold=1.0)
    async with trio.open_nursery() as nursery:
        handle = await start_worker(
            nursery, platform, handler, timings=trio_worker.Timings(sync_close_bound=1.0)
        )
        job_id = platform.enqueue({})
        await streaming.wait()
        handle.stop_job(job_id)
        await trio.sleep(10)  # virtual: the close bound passes, the job is settled
        assert not handle.held_ids
        nursery.cancel_scope.cancel()
    await trio.sleep(60)  # virtual: the cleanup raises meanwhile
    assert raised == ["late"]
    gc.collect()
    assert "never retrieved" not in caplog.text
    assert "async generator cleanup cut after 1.0s" in caplog.text


@ASYNCIO_ONLY
async def test_a_handler_error_keeps_its_type_and_traceback(
    nursery: trio.Nursery, backend: str
) -> None:
    async def handler(job: dict[str, Any]) -> object:
        await asyncio.sleep(0)
        raise KeyError("missing-key")

    platform = FakePlatform(take_hold=1.0)
    worker = await start_worker(nursery, platform, handler)
    job_id = platform.enqueue({})
    with trio.fail_after(WAIT):
        record = await platform.wait_for_status(job_id, "FAILED")
    error = inner_error(record)
    assert error["error_type"] == "KeyError"
    assert "missing-key" in error["error_message"]
    assert "in handler" in error["error_traceback"]
    await shut_down(worker)


@ASYNCIO_ONLY
async def test_a_generator_error_mid_stream_comes_after_its_chunks(
    nursery: trio.Nursery, backend: str
) -> None:
    async def handler(job: dict[str, Any]) -> AsyncIterator[str]:
        yield "first"
        await asyncio.sleep(0)
        yield "second"
        raise RuntimeError("decoder crashed")

    platform = FakePlatform(take_hold=1.0)
    worker = await start_worker(nursery, platform, handler)
    job_id = platform.enqueue({})
    with trio.fail_after(WAIT):
        record = await platform.wait_for_status(job_id, "FAILED")
    assert record.stream == ["first", "second"]
    assert "decoder crashed" in json.dumps(record.error)
    await shut_down(worker)


@ASYNCIO_ONLY
async def test_init_timeout_cancels_an_asyncio_initializer(
    nursery: trio.Nursery, backend: str
) -> None:
    seen: list[str] = []

    async def init() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            seen.append("CancelledError")
            raise

    platform = FakePlatform(take_hold=1.0)
    job_id = platform.enqueue({})
    with trio.fail_after(WAIT), pytest.raises(trio_worker.InitializationError):
        await serve(platform, lambda job: None, initializer=init, init_timeout=0.05)
    record = platform.job(job_id)
    assert inner_error(record)["error_type"] == "InitTimeout"
    assert seen == ["CancelledError"]


@ASYNCIO_ONLY
async def test_an_initializer_cut_by_init_timeout_finishes_its_cleanup_before_the_failure(
    nursery: trio.Nursery, backend: str
) -> None:
    # The SDK waits (bounded) for the cancelled asyncio task: a model load releasing its GPU
    # memory in its own cleanup is done before the init failure is reported and serve()
    # raises, not raced by the exit.
    seen: list[str] = []

    async def init() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            await asyncio.sleep(0.5)  # asyncio work in the cleanup, longer than the report
            seen.append("cleanup done")

    platform = FakePlatform(take_hold=1.0)
    job_id = platform.enqueue({})  # held at the gate: failed at once, no claim wait
    with trio.fail_after(WAIT), pytest.raises(trio_worker.InitializationError):
        await serve(platform, lambda job: None, initializer=init, init_timeout=0.05)
    assert seen == ["cleanup done"]
    assert inner_error(platform.job(job_id))["error_type"] == "InitTimeout"


@ASYNCIO_ONLY
async def test_a_stopped_stream_finishes_its_cleanup_before_its_slot_is_given_again(
    nursery: trio.Nursery, backend: str
) -> None:
    # At concurrency 1, the next job starts only once the stopped generator's own cleanup
    # (asyncio work in its finally) is over: a slot is never shared with a dying stream.
    events: list[str] = []
    streaming, second = trio.Event(), trio.Event()

    async def handler(job: dict[str, Any]) -> AsyncIterator[int]:
        events.append(f"start {job['input']['n']}")
        if job["input"]["n"] == 2:
            second.set()  # from the asyncio task: trio wakes as from any host callback
        try:
            for i in range(10_000):
                if i == 3:
                    streaming.set()
                await asyncio.sleep(0.001)
                yield i
        finally:
            await asyncio.sleep(0.05)
            events.append(f"cleanup {job['input']['n']}")

    platform = FakePlatform(take_hold=1.0, stop_hold=1.0)
    await start_worker(nursery, platform, handler, concurrency=1)
    first = platform.enqueue({"n": 1})
    with trio.fail_after(WAIT):
        await streaming.wait()
        platform.enqueue({"n": 2})
        platform.request_stop(first)
        await second.wait()
    assert events[:3] == ["start 1", "cleanup 1", "start 2"]
    nursery.cancel_scope.cancel()


@ASYNCIO_ONLY
async def test_a_users_asyncio_timeout_in_the_initializer_stays_the_users_error(
    nursery: trio.Nursery, backend: str
) -> None:
    async def init() -> None:
        async with asyncio.timeout(0.001):
            await asyncio.sleep(3600)

    platform = FakePlatform(take_hold=1.0)
    job_id = platform.enqueue({})
    with trio.fail_after(WAIT), pytest.raises(trio_worker.InitializationError):
        await serve(platform, lambda job: None, initializer=init, init_timeout=60)
    assert inner_error(platform.job(job_id))["error_type"] == "TimeoutError"


@ASYNCIO_ONLY
async def test_progress_updates_from_an_asyncio_task_reach_the_job(
    nursery: trio.Nursery, backend: str
) -> None:
    async def handler(job: dict[str, Any]) -> object:
        trio_worker.progress_update(job, {"step": 1})
        await asyncio.sleep(0)
        trio_worker.progress_update(job, {"step": 2})
        return "done"

    platform = FakePlatform(take_hold=1.0)
    worker = await start_worker(nursery, platform, handler)
    job_id = platform.enqueue({})
    with trio.fail_after(WAIT):
        record = await platform.wait_for_status(job_id, "COMPLETED")
    # Updates are posted concurrently on either backend: their order is not promised.
    assert sorted(record.progress, key=str) == [{"step": 1}, {"step": 2}]
    await shut_down(worker)


# --- an SSE upstream read with asyncio streams, streamed through an async generator -----


async def sse_server(events: int) -> tuple[asyncio.Server, int]:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
        for i in range(events):
            writer.write(f"data: token-{i}\n\n".encode())
            await writer.drain()
            await asyncio.sleep(0)
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def sse_tokens(port: int) -> AsyncIterator[str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
        await reader.readuntil(b"\r\n\r\n")
        while line := await reader.readline():
            if line.startswith(b"data: "):
                yield line[6:].strip().decode()
    finally:
        writer.close()


@ASYNCIO_ONLY
async def test_an_sse_upstream_streams_through_an_async_generator(
    nursery: trio.Nursery, backend: str
) -> None:
    servers: list[tuple[asyncio.Server, int]] = []

    async def init() -> None:
        servers.append(await sse_server(events=50))

    async def handler(job: dict[str, Any]) -> AsyncIterator[str]:
        async for token in sse_tokens(servers[0][1]):
            yield token

    platform = FakePlatform(take_hold=1.0)
    worker = await start_worker(
        nursery,
        platform,
        handler,
        initializer=init,
        concurrency=4,
        return_aggregate_stream=True,
    )
    ids = [platform.enqueue({}) for _ in range(8)]
    with trio.fail_after(WAIT):
        for job_id in ids:
            record = await platform.wait_for_status(job_id, "COMPLETED")
            assert record.stream == [f"token-{i}" for i in range(50)]
            assert record.output == record.stream
    servers[0][0].close()
    await shut_down(worker)


@ASYNCIO_ONLY
async def test_sync_handlers_still_run_in_threads_beside_the_loop(
    nursery: trio.Nursery, backend: str
) -> None:
    def handler(job: dict[str, Any]) -> object:
        # A thread has no running loop, so asyncio.run() works there as before.
        return asyncio.run(asyncio.sleep(0, result="ran"))

    platform = FakePlatform(take_hold=1.0)
    worker = await start_worker(nursery, platform, handler)
    job_id = platform.enqueue({})
    with trio.fail_after(WAIT):
        record = await platform.wait_for_status(job_id, "COMPLETED")
    assert record.output == "ran"
    await shut_down(worker)


@ASYNCIO_ONLY
async def test_the_vllm_style_example_serves_concurrent_streams(
    nursery: trio.Nursery, backend: str
) -> None:
    example = runpy.run_path(str(Path(__file__).parents[1] / "examples" / "vllm_style_worker.py"))
    platform = FakePlatform(take_hold=1.0)
    worker = await start_worker(
        nursery,
        platform,
        example["handler"],
        initializer=example["load_engine"],
        concurrency=example["concurrency_modifier"],
        return_aggregate_stream=True,
    )
    ids = [platform.enqueue({"prompt": f"p{n}", "tokens": 4}) for n in range(16)]
    with trio.fail_after(WAIT):
        for n, job_id in enumerate(ids):
            record = await platform.wait_for_status(job_id, "COMPLETED")
            assert record.stream == [f"p{n}-{i}" for i in range(4)]
    await shut_down(worker)
