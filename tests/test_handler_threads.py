"""Kept threads for sync user code (trio_worker/_backends/_handler_calls.py): reuse,
abandonment, the loop's messages back, the context the code sees, and check_cancelled()
(docs/reference.md)."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import threading
import time
from collections.abc import AsyncGenerator, Generator
from typing import Any, cast

import pytest
import trio
import trio.testing

from trio_worker import Timings as _Timings
from trio_worker._backends import BACKENDS
from trio_worker._backends._handler_calls import (
    HandlerKind,
    Stream,
    call_handler,
    check_cancelled,
    run_in_thread,
)
from trio_worker._scopes import Scopes

TRIO = BACKENDS["trio"]

JOB: dict[str, Any] = {"id": "j1", "input": {"n": 3}}
TIMEOUT = 5.0  # a safety bound on handshakes; never reached when the code is right


async def call(handler: Any) -> object:
    return await call_handler(handler, HandlerKind.SYNC, JOB, Scopes(_Timings()), backend=TRIO)


# --- check_cancelled ----------------------------------------------------------------------


def test_check_cancelled_is_a_noop_outside_trio() -> None:
    check_cancelled()


async def test_check_cancelled_is_a_noop_on_the_trio_thread_and_plain_threads() -> None:
    check_cancelled()
    errors: list[BaseException] = []

    def plain() -> None:
        try:
            check_cancelled()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=plain)
    thread.start()
    thread.join(TIMEOUT)
    assert errors == []


async def test_check_cancelled_is_silent_in_a_handler_thread_while_not_cancelled() -> None:
    def handler(job: dict[str, Any]) -> object:
        check_cancelled()
        return "fine"

    assert await call(handler) == "fine"


async def test_check_cancelled_raises_in_a_sync_handler_thread_after_cancel() -> None:
    started = threading.Event()
    go = threading.Event()
    outcome: list[str] = []
    returned = threading.Event()

    def handler(job: dict[str, Any]) -> object:
        try:
            started.set()
            assert go.wait(TIMEOUT)
            try:
                check_cancelled()
            except trio.Cancelled:
                outcome.append("cancelled")
                raise
            outcome.append("not cancelled")
            return "finished"
        finally:
            returned.set()

    waits = Scopes(_Timings())
    results: list[object] = []
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:

            async def run() -> None:
                results.append(
                    await call_handler(
                        handler, HandlerKind.SYNC, JOB, waits, backend=BACKENDS["trio"]
                    )
                )

            nursery.start_soon(run)
            assert await trio.to_thread.run_sync(started.wait, TIMEOUT)
            scope.cancel()
            go.set()
    assert scope.cancelled_caught
    assert outcome == ["cancelled"]
    assert results == []
    # The job task did not move on before the handler thread returned.
    assert returned.is_set()


# --- kept threads (trio_worker/_backends/_handler_calls.py) -----------------------------


async def test_sequential_sync_calls_reuse_one_kept_thread() -> None:
    """A kept thread serves the next call: no thread is started per job."""
    waits = Scopes(_Timings())
    first = await run_in_thread(threading.get_ident, waits=waits)
    second = await run_in_thread(threading.get_ident, waits=waits)
    assert first == second != threading.get_ident()


async def test_a_thread_left_running_by_a_cancelled_call_is_not_given_new_work() -> None:
    """The abandoned thread is still busy: the next call runs on another thread at once."""
    waits = Scopes(_Timings())
    release, running = threading.Event(), threading.Event()
    busy: list[int] = []

    def stuck() -> None:
        busy.append(threading.get_ident())
        running.set()
        release.wait(TIMEOUT)

    async def call_stuck(
        task_status: trio.TaskStatus[trio.CancelScope] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        with trio.CancelScope() as scope:
            task_status.started(scope)
            await run_in_thread(stuck, waits=waits)

    async with trio.open_nursery() as nursery:
        scope = await nursery.start(call_stuck)
        await trio.to_thread.run_sync(running.wait, TIMEOUT)
        waits.end_by(trio.current_time())  # the cancelled caller does not wait for it
        scope.cancel()
    other = await run_in_thread(threading.get_ident, waits=waits)
    assert other != busy[0]
    release.set()


async def test_trio_from_thread_in_a_sync_handler_needs_the_token_then_reaches_the_loop() -> None:
    """A sync handler's thread is the worker's, not one trio.to_thread started
    (docs/reference.md, check_cancelled): trio.from_thread says so, naming trio_token,
    and with the token it runs on the loop's thread."""
    loop_thread = threading.get_ident()
    token = trio.lowlevel.current_trio_token()

    def handler(job: dict[str, Any]) -> object:
        with pytest.raises(RuntimeError, match="trio_token"):
            trio.from_thread.run_sync(threading.get_ident)
        return trio.from_thread.run_sync(threading.get_ident, trio_token=token)

    result = await call_handler(
        handler, HandlerKind.SYNC, JOB, Scopes(_Timings()), backend=BACKENDS["trio"]
    )
    assert result == loop_thread


async def test_check_cancelled_works_in_a_thread_a_handler_starts_with_trio_to_thread() -> None:
    """Outside the worker's own threads it falls back to trio's: async code on trio that
    hands its sync work to trio.to_thread still sees its job stopped."""
    started, stopped = threading.Event(), threading.Event()

    def work() -> None:
        started.set()
        while True:
            try:
                check_cancelled()
            except trio.Cancelled:
                stopped.set()
                raise
            time.sleep(0.001)

    async def handler(job: dict[str, Any]) -> object:
        return await trio.to_thread.run_sync(work, abandon_on_cancel=True)

    with trio.move_on_after(TIMEOUT) as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                functools.partial(
                    call_handler, handler, HandlerKind.ASYNC, JOB, Scopes(_Timings()), backend=TRIO
                )
            )
            await trio.to_thread.run_sync(started.wait, TIMEOUT)
            nursery.cancel_scope.cancel()
    assert not scope.cancelled_caught
    assert await trio.to_thread.run_sync(stopped.wait, TIMEOUT)


async def test_check_cancelled_works_in_a_thread_a_sync_handler_starts_in_its_context() -> None:
    """A thread the handler starts in a copy of its context (docs/reference.md) sees the job
    stopped; a plain thread cannot tell which job it works for, and check_cancelled() does
    nothing there."""
    started = [threading.Event(), threading.Event()]
    seen: dict[str, str] = {}
    stop_looking = threading.Event()

    def work(name: str, index: int) -> None:
        started[index].set()
        while not stop_looking.is_set():
            try:
                check_cancelled()
            except trio.Cancelled:
                seen[name] = "cancelled"
                return
            time.sleep(0.001)
        seen[name] = "never cancelled"

    threads: list[threading.Thread] = []

    def handler(job: dict[str, Any]) -> object:
        in_context = contextvars.copy_context()
        threads.append(threading.Thread(target=in_context.run, args=(work, "in context", 0)))
        threads.append(threading.Thread(target=work, args=("plain", 1)))
        for thread in threads:
            thread.start()
        for thread in threads[:1]:
            thread.join(TIMEOUT)
        return "done"

    with trio.move_on_after(TIMEOUT) as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call, handler)
            for event in started:
                assert await trio.to_thread.run_sync(event.wait, TIMEOUT)
            nursery.cancel_scope.cancel()
    assert not scope.cancelled_caught
    await trio.to_thread.run_sync(threads[0].join, TIMEOUT)
    stop_looking.set()
    await trio.to_thread.run_sync(threads[1].join, TIMEOUT)
    assert seen == {"in context": "cancelled", "plain": "never cancelled"}


async def test_a_sync_generators_close_runs_on_the_kept_thread_its_steps_ran_on() -> None:
    """One way into a thread for all sync user code: the generator's cleanup too."""
    steps: list[int] = []
    closed_on: list[int] = []

    def gen() -> Generator[object, None, None]:
        try:
            while True:
                steps.append(threading.get_ident())
                yield len(steps)
        finally:
            closed_on.append(threading.get_ident())

    chunks = cast(
        "AsyncGenerator[object, None]", aiter(Stream(gen(), Scopes(_Timings()), backend=TRIO))
    )
    async with contextlib.aclosing(chunks):
        assert await anext(chunks) == 1
        assert await anext(chunks) == 2
    assert closed_on == steps[:1] and steps == [steps[0]] * 2
    assert closed_on[0] != threading.get_ident()


async def test_outcomes_finished_before_the_loop_collects_them_share_one_message() -> None:
    """Each message back is a write to trio's wake-up socket: threads that finish while one
    is on its way add their outcome to it instead of posting their own."""
    from trio_worker._backends import _handler_calls

    release = threading.Event()
    started = [threading.Event() for _ in range(3)]
    results: list[int] = []

    def wait_then_return(index: int) -> int:
        started[index].set()
        release.wait(TIMEOUT)
        return index

    async def call(index: int) -> None:
        results.append(await run_in_thread(wait_then_return, index, waits=Scopes(_Timings())))

    async with trio.open_nursery() as nursery:
        for index in range(3):
            nursery.start_soon(call, index)
        for event in started:
            await trio.to_thread.run_sync(event.wait, TIMEOUT)
        # The loop's thread blocks here until all three outcomes are on their way back.
        release.set()
        returns = _handler_calls._RETURNS.get()
        deadline = time.monotonic() + TIMEOUT
        while len(returns._outcomes) < 3 and time.monotonic() < deadline:
            time.sleep(0.0001)
        assert len(returns._outcomes) == 3
        assert trio.lowlevel.current_statistics().run_sync_soon_queue_size == 1
    assert sorted(results) == [0, 1, 2]


async def test_a_sync_handler_sees_the_callers_context() -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    var.set("the job's")
    assert await run_in_thread(var.get, waits=Scopes(_Timings())) == "the job's"
