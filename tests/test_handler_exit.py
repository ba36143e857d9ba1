"""In virtual time, against the in-process fake: what the worker's own log and ``serve()``
say when a handler ends the process (sys.exit, KeyboardInterrupt), when a job fails, and
while a failed initializer waits to claim a request to fail (docs/design.md §6, §9)."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
import trio.testing

import trio_worker
import trio_worker.testing
from trio_worker.testing import FakePlatform

from .backends import ASYNCIO_ONLY, BOTH_BACKENDS, sleep_for
from .conftest import serve_in_process


def serve(
    platform: FakePlatform,
    handler: Any,
    *,
    secrets: dict[str, str] | None = None,
    backend: str = "trio",
    **kwargs: Any,
) -> functools.partial[Any]:
    kwargs.setdefault("timings", trio_worker.Timings(shutdown_grace=2.0, claim_grace=3.0))
    return serve_in_process(platform, handler, backend=backend, env=secrets, **kwargs)


def error_of(platform: FakePlatform, job_id: str) -> dict[str, Any]:
    (body,) = platform.job(job_id).done_reports
    assert isinstance(body, dict)
    parsed = json.loads(body["error"])
    assert isinstance(parsed, dict)
    return parsed


def exits_or_sleeps(backend: str) -> Any:
    """A handler in *backend*'s code: sleeps ``input.seconds``, or calls sys.exit(code)."""
    sleep = sleep_for(backend)

    async def handler(job: dict[str, Any]) -> Any:
        if "seconds" in job["input"]:
            await sleep(job["input"]["seconds"])
            return "slept"
        await sleep(0)
        sys.exit(job["input"]["code"])

    return handler


@BOTH_BACKENDS
async def test_serve_reports_the_job_shuts_down_then_raises_system_exit(
    backend: str, virtual_clock: trio.abc.Clock
) -> None:
    platform = FakePlatform(take_hold=5.0, stop_hold=5.0)
    slow = platform.enqueue({"seconds": 60})
    exiting = platform.enqueue({"code": 3})
    after = platform.enqueue({"code": 9})
    started = trio.current_time()
    with pytest.raises(SystemExit) as info:
        await serve(platform, exits_or_sleeps(backend), backend=backend, concurrency=2)()
    assert info.value.code == 3
    error = error_of(platform, exiting)
    assert error["error_type"] == "SystemExit"
    assert "sys.exit(3)" in str(error["error_message"])
    # The job still running got the shutdown grace (2 s), then was failed.
    assert error_of(platform, slow)["error_type"] == "WorkerShutdown"
    assert trio.current_time() - started == pytest.approx(2.0, abs=0.1)
    # Nothing was taken after the exit request.
    assert platform.job(after).status == "IN_QUEUE"


@BOTH_BACKENDS
async def test_a_slow_job_that_finishes_within_the_grace_completes(
    backend: str, virtual_clock: trio.abc.Clock
) -> None:
    platform = FakePlatform(take_hold=5.0, stop_hold=5.0)
    slow = platform.enqueue({"seconds": 1})
    platform.enqueue({"code": 0})
    with pytest.raises(SystemExit) as info:
        await serve(platform, exits_or_sleeps(backend), backend=backend, concurrency=2)()
    assert info.value.code == 0
    assert platform.job(slow).output == "slept"


@pytest.mark.parametrize(
    ("code", "status", "shown"),
    [(None, 0, "sys.exit()"), ("CUDA broke", 1, "sys.exit('CUDA broke')"), (258, 2, "(258)")],
)
@BOTH_BACKENDS
async def test_the_exit_status_is_pythons_own(
    backend: str, virtual_clock: trio.abc.Clock, code: object, status: int, shown: str
) -> None:
    platform = FakePlatform(take_hold=5.0, stop_hold=5.0)
    job_id = platform.enqueue({"code": code})
    with pytest.raises(SystemExit) as info:
        await serve(platform, exits_or_sleeps(backend), backend=backend)()
    assert info.value.code == status
    message = str(error_of(platform, job_id)["error_message"])
    assert shown in message and f"status {status}" in message


# Trio only: on the asyncio backend a KeyboardInterrupt raised in a task the handler
# starts leaves the host loop at once and ends the test session; see the sys.exit() test
# below for that backend.
async def test_a_keyboard_interrupt_from_a_task_of_the_handler_leaves_as_itself(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def interrupted(job: dict[str, Any]) -> Any:
        async def child() -> None:
            raise KeyboardInterrupt

        async with trio.open_nursery() as nursery:
            nursery.start_soon(child)

    platform = FakePlatform(take_hold=5.0, stop_hold=5.0)
    job_id = platform.enqueue({})
    with pytest.raises(KeyboardInterrupt):
        await serve(platform, interrupted)()
    error = error_of(platform, job_id)
    assert error["error_type"] == "KeyboardInterrupt"
    assert "status 130" in str(error["error_message"])


@BOTH_BACKENDS
async def test_a_sys_exit_in_a_task_of_the_handler_is_reported_then_leaves_serve(
    backend: str, virtual_clock: trio.abc.Clock
) -> None:
    async def exits_in_a_task(job: dict[str, Any]) -> Any:
        def child() -> None:
            sys.exit(3)

        if backend == "asyncio":

            async def task() -> None:
                await asyncio.sleep(0)
                child()

            await asyncio.create_task(task())
        else:

            async def trio_task() -> None:
                await trio.lowlevel.checkpoint()
                child()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio_task)

    platform = FakePlatform(take_hold=5.0, stop_hold=5.0)
    job_id = platform.enqueue({})
    with pytest.raises(SystemExit) as info:
        await serve(platform, exits_in_a_task, backend=backend)()
    assert info.value.code == 3
    error = error_of(platform, job_id)
    assert error["error_type"] == "SystemExit"
    assert "sys.exit(3)" in str(error["error_message"])


@ASYNCIO_ONLY
async def test_a_sys_exit_in_a_task_nobody_awaits_shuts_the_worker_down_with_its_status(
    backend: str, virtual_clock: trio.abc.Clock
) -> None:
    # The handler starts a background task and returns; the task later calls sys.exit(4).
    # asyncio lets that out of the loop at once; the worker takes it as the handler's own:
    # the running job gets the grace, then serve() raises it.
    background: set[asyncio.Task[None]] = set()

    async def starts_a_task(job: dict[str, Any]) -> Any:
        if "seconds" in job["input"]:
            await asyncio.sleep(job["input"]["seconds"])
            return "slept"

        async def later() -> None:
            await asyncio.sleep(0.5)
            sys.exit(4)

        background.add(asyncio.create_task(later()))
        return "started"

    platform = FakePlatform(take_hold=5.0, stop_hold=5.0)
    slow = platform.enqueue({"seconds": 1.5})
    starter = platform.enqueue({})
    started = trio.current_time()
    with pytest.raises(SystemExit) as info:
        await serve(platform, starts_a_task, backend=backend, concurrency=2)()
    assert info.value.code == 4
    [task] = background
    assert task.exception() is info.value  # the task's own, retrieved (asyncio would log it)
    assert platform.job(starter).output == "started"
    # The exit came at 0.5 s; the slow job finished within the 2 s grace.
    assert platform.job(slow).output == "slept"
    assert trio.current_time() - started == pytest.approx(1.5, abs=0.1)


def test_with_no_worker_on_the_loop_an_exit_from_a_task_ends_it_at_once() -> None:
    tasks: list[asyncio.Task[None]] = []

    async def main() -> None:
        async def exits() -> None:
            sys.exit(5)

        tasks.append(asyncio.create_task(exits()))
        await trio.sleep(0.05)
        raise AssertionError("the loop went on")

    with pytest.raises(SystemExit) as info:
        trio_worker.run_asyncio_host(main)
    assert info.value.code == 5
    assert tasks[0].exception() is info.value


@BOTH_BACKENDS
async def test_each_failed_job_gets_one_redacted_error_line_without_its_input(
    backend: str,
    virtual_clock: trio.abc.Clock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def handler(job: dict[str, Any]) -> Any:
        await sleep_for(backend)(0)
        if job["input"]["n"] == 1:
            raise ValueError("token hf_secretsecretsecret refused\nsecond line")
        return {"private": "prompt text"}

    caplog.set_level(logging.INFO, logger="trio_worker")
    platform = FakePlatform(take_hold=5.0, stop_hold=5.0)
    failing = platform.enqueue({"n": 1})
    fine = platform.enqueue({"n": 2})
    async with trio.open_nursery() as nursery:
        secrets = {"HF_TOKEN": "hf_secretsecretsecret"}
        handle = await nursery.start(serve(platform, handler, secrets=secrets, backend=backend))
        await platform.wait_for_status(fine, "COMPLETED")
        handle.shutdown()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [
        f"job {failing} failed: ValueError: token [REDACTED] refused\\nsecond line"
        " (category unknown)"
    ]
    assert "prompt text" not in caplog.text


def failing_load(backend: str) -> Callable[[], Awaitable[None]]:
    """An initializer in *backend*'s code that fails after one checkpoint."""

    async def init() -> None:
        await sleep_for(backend)(0)
        raise RuntimeError("weights missing")

    return init


@BOTH_BACKENDS
async def test_the_claim_wait_after_a_failed_load_is_logged_when_it_starts_and_ends(
    backend: str, virtual_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="trio_worker")
    platform = FakePlatform(take_hold=0.5, stop_hold=0.5)

    async def enqueue_later() -> None:
        await trio.sleep(0.7)  # while the claim's take (from t=0.5, held 0.5 s) waits
        platform.enqueue({})

    async with trio.open_nursery() as nursery:
        nursery.start_soon(enqueue_later)
        with pytest.raises(trio_worker.InitializationError):
            await serve(
                platform,
                exits_or_sleeps(backend),
                backend=backend,
                initializer=failing_load(backend),
            )()
    lines = [r.getMessage() for r in caplog.records]
    assert (
        "initializer failed with no job held: waiting up to 2.5 s to claim a request to fail"
        in lines
    )
    assert "claim wait over: claimed 1 and failed it with the init failure" in lines


@BOTH_BACKENDS
async def test_a_claim_wait_that_claims_nothing_says_so(
    backend: str, virtual_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="trio_worker")
    platform = FakePlatform(take_hold=0.5, stop_hold=0.5)
    with pytest.raises(trio_worker.InitializationError):
        await serve(
            platform, exits_or_sleeps(backend), backend=backend, initializer=failing_load(backend)
        )()
    lines = [r.getMessage() for r in caplog.records]
    assert "claim wait over: none" in lines
