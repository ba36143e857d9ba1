"""serve()'s contract around its nursery: progress updates find their own worker, and no
exception group leaves serve()."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

import pytest
import trio

import trio_worker
import trio_worker.testing
from tests.backends import ASYNCIO_ONLY, BOTH_BACKENDS
from tests.conftest import serve_in_process
from trio_worker import Timings as _Timings
from trio_worker._backends import BACKENDS
from trio_worker._backends._asyncio import await_on_asyncio
from trio_worker._progress_calls import ProgressTarget, current_progress
from trio_worker._scopes import Scopes
from trio_worker._worker import _outside
from trio_worker.testing import FakePlatform


async def start_worker(
    nursery: trio.Nursery, platform: FakePlatform, handler: Any, worker_id: str, backend: str
) -> trio_worker.WorkerHandle:
    handle: trio_worker.WorkerHandle = await nursery.start(
        serve_in_process(platform, handler, backend=backend, worker_id=worker_id)
    )
    return handle


@BOTH_BACKENDS
async def test_two_workers_in_one_run_each_get_their_own_progress(
    backend: str, nursery: trio.Nursery, virtual_clock: trio.abc.Clock
) -> None:
    def sync_handler(job: dict[str, Any]) -> str:
        trio_worker.progress_update(job, {"worker": "sync"})
        return "ok"

    async def async_handler(job: dict[str, Any]) -> str:
        trio_worker.progress_update(job, {"worker": "async"})
        update = functools.partial(trio_worker.progress_update, job, {"thread": "async"})
        if backend == "asyncio":
            await asyncio.to_thread(update)
        else:
            await trio.to_thread.run_sync(update)
        return "ok"

    first, second = FakePlatform(take_hold=5.0), FakePlatform(take_hold=5.0)
    await start_worker(nursery, first, sync_handler, "w1", backend)
    await start_worker(nursery, second, async_handler, "w2", backend)
    one, two = first.enqueue({}), second.enqueue({})
    # A hang guard, not a timing claim: autojump is blind to the sync handler's thread,
    # and the other worker's timers carry virtual time on while it runs.
    with trio.fail_after(3600):
        done_one = await first.wait_for_status(one, "COMPLETED")
        done_two = await second.wait_for_status(two, "COMPLETED")
    assert done_one.progress == [{"worker": "sync"}]
    assert done_two.progress == [{"worker": "async"}, {"thread": "async"}]
    nursery.cancel_scope.cancel()


def test_progress_update_with_no_worker_running_warns_and_does_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="trio_worker")
    trio_worker.progress_update({"id": "j1"}, 50)
    assert "progress_update for job j1 with no worker running in this process; ignored" in (
        caplog.text
    )


@BOTH_BACKENDS
async def test_progress_update_in_a_task_beside_the_worker_for_a_job_it_does_not_hold(
    backend: str,
    nursery: trio.Nursery,
    virtual_clock: trio.abc.Clock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="trio_worker")
    platform = FakePlatform(take_hold=5.0)
    await start_worker(nursery, platform, lambda job: "ok", "w1", backend)
    # A worker is running, but holds no job j1: the update has nowhere to go.
    if backend == "asyncio":

        async def beside_the_worker() -> None:  # an asyncio task on the worker's loop
            trio_worker.progress_update({"id": "j1"}, 50)

        await await_on_asyncio(beside_the_worker(), waits=Scopes(_Timings()))
    else:
        trio_worker.progress_update({"id": "j1"}, 50)
    assert "progress_update for job j1, which no worker here is running; ignored" in caplog.text
    nursery.cancel_scope.cancel()


@ASYNCIO_ONLY
async def test_an_update_from_a_thread_is_posted_before_what_the_thread_hands_the_loop_next(
    backend: str,
) -> None:
    # asyncio.to_thread hands the thread's result to the handler's task through the loop's
    # queue. An update the thread sent before returning must be posted ahead of it, or the
    # handler could end the job first and the update be dropped as too late.
    loop = asyncio.get_running_loop()
    order: list[str] = []
    result = trio.Event()
    token = trio.lowlevel.current_trio_token()
    target = ProgressTarget(
        lambda job_id, body: order.append("posted"),
        token,
        BACKENDS["asyncio"].thread_handoff(token),
    )

    def hand_over() -> None:
        order.append("result")
        result.set()

    def thread() -> None:
        trio_worker.progress_update({"id": "j1"}, 50)
        loop.call_soon_threadsafe(hand_over)

    reset = current_progress.set(target)
    try:
        runner = threading.Thread(target=contextvars.copy_context().run, args=(thread,))
        runner.start()
        runner.join()  # blocks the loop: both hand-offs are queued before either runs
    finally:
        current_progress.reset(reset)
    with trio.fail_after(5):
        await result.wait()
    assert order == ["posted", "result"]


# --- what leaves serve() ------------------------------------------------------------------


def test_a_keyboard_interrupt_anywhere_in_the_group_leaves_as_a_plain_one() -> None:
    group = BaseExceptionGroup("nursery", [ValueError("x"), KeyboardInterrupt()])
    outside = _outside(group)
    assert type(outside) is KeyboardInterrupt
    assert outside.__cause__ is group


def test_a_single_documented_error_leaves_as_itself() -> None:
    error = trio_worker.ConfigurationError("bad")
    assert _outside(BaseExceptionGroup("nursery", [ExceptionGroup("inner", [error])])) is error


def test_anything_else_is_a_worker_internal_error_chained_from_the_group() -> None:
    group = ExceptionGroup("nursery", [ValueError("x"), TypeError("y")])
    outside = _outside(group)
    assert isinstance(outside, trio_worker.WorkerInternalError)
    assert outside.__cause__ is group


@BOTH_BACKENDS
async def test_a_cancellation_from_outside_reaches_the_callers_scope(
    backend: str, virtual_clock: trio.abc.Clock
) -> None:
    platform = FakePlatform(take_hold=5.0)
    with trio.move_on_after(3.0) as scope:
        await serve_in_process(platform, lambda job: "ok", backend=backend)()
    assert scope.cancelled_caught


async def test_testing_serve_rejects_an_unknown_heartbeat_mode() -> None:
    with pytest.raises(trio_worker.ConfigurationError, match="heartbeat"):
        await trio_worker.testing.serve(
            lambda job: "ok",
            environ={"RUNPOD_WEBHOOK_GET_JOB": "http://platform/job-take/$ID"},
            heartbeat="sometimes",  # type: ignore[arg-type]
        )


@pytest.mark.parametrize("ended", ["trio run", "host loop"])
def test_a_progress_update_after_its_worker_ended_is_ignored_with_a_warning(
    ended: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A sync handler's thread abandoned at the end of the shutdown grace may still call
    # progress_update once serve() has returned: a warning, never an exception in it.
    async def token_of_a_run() -> trio.lowlevel.TrioToken:
        return trio.lowlevel.current_trio_token()

    posted: list[str] = []
    token = trio.run(token_of_a_run)
    handoff: Callable[..., object] = token.run_sync_soon
    if ended == "host loop":
        loop = asyncio.new_event_loop()
        loop.close()
        handoff = loop.call_soon_threadsafe
    target = ProgressTarget(lambda job_id, body: posted.append(job_id), token, handoff)
    errors: list[BaseException] = []

    def in_thread() -> None:
        try:
            trio_worker.progress_update({"id": "late"}, 50)
        except BaseException as exc:  # whatever it raises is the failure
            errors.append(exc)

    context = contextvars.copy_context()
    context.run(current_progress.set, target)
    thread = threading.Thread(target=context.run, args=(in_thread,))
    with caplog.at_level(logging.WARNING, logger="trio_worker"):
        thread.start()
        thread.join()
    assert errors == []
    assert posted == []
    assert "progress_update for job late after its worker ended; ignored" in caplog.text
