"""Calling the user's handler: kind detection, threads, streams, cooperative cancellation
(docs/design.md §2, §5, §9)."""

from __future__ import annotations

import contextlib
import functools
import operator
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator
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
    handler_kind,
    run_in_thread,
)
from trio_worker._scopes import Scopes

from .backends import BOTH_BACKENDS, sleep_for

TRIO = BACKENDS["trio"]

JOB: dict[str, Any] = {"id": "j1", "input": {"n": 3}}
TIMEOUT = 5.0  # a safety bound on handshakes; never reached when the code is right


# --- handlers of every kind ---------------------------------------------------------------


def sync_handler(job: dict[str, Any]) -> object:
    return {"sync": job["input"]}


async def async_handler(job: dict[str, Any]) -> object:
    await trio.lowlevel.checkpoint()
    return {"async": job["input"]}


def sync_gen_handler(job: dict[str, Any]) -> Generator[object, None, None]:
    yield from range(job["input"]["n"])


async def async_gen_handler(job: dict[str, Any]) -> AsyncGenerator[object, None]:
    for i in range(job["input"]["n"]):
        await trio.lowlevel.checkpoint()
        yield i


def two_args(prefix: str, job: dict[str, Any]) -> object:
    return prefix


async def two_args_async(prefix: str, job: dict[str, Any]) -> object:
    return prefix


def two_args_gen(prefix: str, job: dict[str, Any]) -> Generator[object, None, None]:
    yield prefix


async def two_args_agen(prefix: str, job: dict[str, Any]) -> AsyncGenerator[object, None]:
    yield prefix


class SyncCallable:
    def __call__(self, job: dict[str, Any]) -> object:
        return "sync"


class AsyncCallable:
    async def __call__(self, job: dict[str, Any]) -> object:
        return "async"


class SyncGenCallable:
    def __call__(self, job: dict[str, Any]) -> Generator[object, None, None]:
        yield "sync gen"


class AsyncGenCallable:
    async def __call__(self, job: dict[str, Any]) -> AsyncGenerator[object, None]:
        yield "async gen"


class Model:
    def predict(self, job: dict[str, Any]) -> object:
        return "predict"

    async def apredict(self, job: dict[str, Any]) -> object:
        return "apredict"

    def stream(self, job: dict[str, Any]) -> Generator[object, None, None]:
        yield "stream"

    async def astream(self, job: dict[str, Any]) -> AsyncGenerator[object, None]:
        yield "astream"


MODEL = Model()
KIND_CASES: list[tuple[str, Callable[..., Any], HandlerKind]] = [
    ("sync function", sync_handler, HandlerKind.SYNC),
    ("async function", async_handler, HandlerKind.ASYNC),
    ("sync generator", sync_gen_handler, HandlerKind.SYNC_GENERATOR),
    ("async generator", async_gen_handler, HandlerKind.ASYNC_GENERATOR),
    ("lambda", lambda job: job, HandlerKind.SYNC),
    ("partial sync", functools.partial(two_args, "p"), HandlerKind.SYNC),
    ("partial async", functools.partial(two_args_async, "p"), HandlerKind.ASYNC),
    ("partial sync gen", functools.partial(two_args_gen, "p"), HandlerKind.SYNC_GENERATOR),
    ("partial async gen", functools.partial(two_args_agen, "p"), HandlerKind.ASYNC_GENERATOR),
    ("nested partial sync", functools.partial(functools.partial(sync_handler)), HandlerKind.SYNC),
    (
        "nested partial async",
        functools.partial(functools.partial(two_args_async, "p")),
        HandlerKind.ASYNC,
    ),
    (
        "nested partial sync gen",
        functools.partial(functools.partial(functools.partial(two_args_gen), "p")),
        HandlerKind.SYNC_GENERATOR,
    ),
    (
        "nested partial async gen",
        functools.partial(functools.partial(two_args_agen, "p")),
        HandlerKind.ASYNC_GENERATOR,
    ),
    ("callable sync", SyncCallable(), HandlerKind.SYNC),
    ("callable async", AsyncCallable(), HandlerKind.ASYNC),
    ("callable sync gen", SyncGenCallable(), HandlerKind.SYNC_GENERATOR),
    ("callable async gen", AsyncGenCallable(), HandlerKind.ASYNC_GENERATOR),
    ("partial of callable async", functools.partial(AsyncCallable()), HandlerKind.ASYNC),
    (
        "partial of callable async gen",
        functools.partial(AsyncGenCallable()),
        HandlerKind.ASYNC_GENERATOR,
    ),
    ("bound method", MODEL.predict, HandlerKind.SYNC),
    ("bound async method", MODEL.apredict, HandlerKind.ASYNC),
    ("bound generator method", MODEL.stream, HandlerKind.SYNC_GENERATOR),
    ("bound async generator method", MODEL.astream, HandlerKind.ASYNC_GENERATOR),
    ("partial of bound async method", functools.partial(MODEL.apredict), HandlerKind.ASYNC),
]


@pytest.mark.parametrize(
    ("fn", "kind"), [(fn, kind) for _, fn, kind in KIND_CASES], ids=[c[0] for c in KIND_CASES]
)
def test_handler_kind(fn: Callable[..., Any], kind: HandlerKind) -> None:
    assert handler_kind(fn) is kind


@pytest.mark.parametrize(
    "fn",
    [operator.itemgetter("input"), len, dict, functools.lru_cache(maxsize=None)(sync_handler)],
    ids=["itemgetter", "builtin", "class", "lru_cache"],
)
def test_handler_kind_of_c_callables_is_sync(fn: Callable[..., Any]) -> None:
    assert handler_kind(fn) is HandlerKind.SYNC


# --- call_handler -------------------------------------------------------------------------


async def call(
    fn: Callable[..., Any], job: dict[str, Any] | None = None, *, backend: str = "trio"
) -> Any:
    """Call *fn* as the worker on *backend* would (``async_backend``)."""
    return await call_handler(
        fn,
        handler_kind(fn),
        JOB if job is None else job,
        Scopes(_Timings()),
        backend=BACKENDS[backend],
    )


def async_gen_on(backend: str) -> Callable[[dict[str, Any]], AsyncGenerator[object, None]]:
    """:func:`async_gen_handler` in *backend*'s own code."""
    sleep = sleep_for(backend)

    async def handler(job: dict[str, Any]) -> AsyncGenerator[object, None]:
        for i in range(job["input"]["n"]):
            await sleep(0)
            yield i

    return handler


async def collect(stream: Stream) -> list[object]:
    return [chunk async for chunk in stream]


@BOTH_BACKENDS
async def test_sync_handler_runs_in_a_worker_thread(backend: str) -> None:
    loop_thread = threading.current_thread()
    seen: list[tuple[threading.Thread, dict[str, Any]]] = []

    def handler(job: dict[str, Any]) -> object:
        seen.append((threading.current_thread(), job))
        return "ok"

    job = {"id": "x", "input": 1}
    assert await call(handler, job, backend=backend) == "ok"
    [(thread, passed)] = seen
    assert thread is not loop_thread
    # The handler gets the very dict the platform delivered.
    assert passed is job


@BOTH_BACKENDS
async def test_async_handler_runs_on_the_loop(backend: str) -> None:
    loop_thread = threading.current_thread()
    seen: list[threading.Thread] = []
    sleep = sleep_for(backend)

    async def handler(job: dict[str, Any]) -> object:
        seen.append(threading.current_thread())
        await sleep(0)
        return job["input"]

    assert await call(handler, backend=backend) == {"n": 3}
    assert seen == [loop_thread]


@BOTH_BACKENDS
async def test_async_callable_object_is_awaited(backend: str) -> None:
    assert await call(AsyncCallable(), backend=backend) == "async"


@BOTH_BACKENDS
async def test_sync_function_returning_a_coroutine_is_awaited_on_the_loop(backend: str) -> None:
    loop_thread = threading.current_thread()
    seen: list[threading.Thread] = []
    sleep = sleep_for(backend)

    async def inner(job: dict[str, Any]) -> object:
        seen.append(threading.current_thread())
        await sleep(0)
        return ("inner", job["id"])

    def wrapper(job: dict[str, Any]) -> object:
        return inner(job)

    assert handler_kind(wrapper) is HandlerKind.SYNC
    assert await call(wrapper, backend=backend) == ("inner", "j1")
    assert seen == [loop_thread]


@BOTH_BACKENDS
async def test_sync_function_returning_a_generator_is_a_stream(backend: str) -> None:
    def wrapper(job: dict[str, Any]) -> object:
        return sync_gen_handler(job)

    result = await call(wrapper, backend=backend)
    assert isinstance(result, Stream)
    assert await collect(result) == [0, 1, 2]


@BOTH_BACKENDS
async def test_sync_function_returning_an_async_generator_is_a_stream(backend: str) -> None:
    agen = async_gen_on(backend)

    def wrapper(job: dict[str, Any]) -> object:
        return agen(job)

    result = await call(wrapper, backend=backend)
    assert isinstance(result, Stream)
    assert await collect(result) == [0, 1, 2]


@BOTH_BACKENDS
async def test_async_function_returning_a_generator_is_a_stream(backend: str) -> None:
    async def wrapper(job: dict[str, Any]) -> object:
        return sync_gen_handler(job)

    result = await call(wrapper, backend=backend)
    assert isinstance(result, Stream)
    assert await collect(result) == [0, 1, 2]


@BOTH_BACKENDS
@pytest.mark.parametrize(
    "make",
    [
        lambda backend: sync_gen_handler,
        async_gen_on,
        lambda backend: functools.partial(async_gen_on(backend)),
    ],
    ids=["sync gen", "async gen", "partial async gen"],
)
async def test_generator_handlers_give_streams(
    backend: str, make: Callable[[str], Callable[..., Any]]
) -> None:
    result = await call(make(backend), backend=backend)
    assert isinstance(result, Stream)
    assert await collect(result) == [0, 1, 2]


@BOTH_BACKENDS
@pytest.mark.parametrize("value", [None, [1, 2], "text", 0, {"a": 1}, iter([1])])
async def test_non_stream_results_are_returned_as_is(backend: str, value: object) -> None:
    def handler(job: dict[str, Any]) -> object:
        return value

    assert await call(handler, backend=backend) is value


@BOTH_BACKENDS
async def test_exceptions_propagate_unchanged(backend: str) -> None:
    error = ValueError("boom")

    def sync_fails(job: dict[str, Any]) -> object:
        raise error

    async def async_fails(job: dict[str, Any]) -> object:
        raise error

    for fn in (sync_fails, async_fails):
        with pytest.raises(ValueError, match="boom") as info:
            await call(fn, backend=backend)
        assert info.value is error


@BOTH_BACKENDS
async def test_base_exceptions_from_sync_handlers_propagate(backend: str) -> None:
    def exits(job: dict[str, Any]) -> object:
        raise SystemExit(3)

    with pytest.raises(SystemExit):
        await call(exits, backend=backend)


# --- Stream -------------------------------------------------------------------------------


async def test_stream_runs_each_sync_generator_step_in_a_thread() -> None:
    loop_ident = threading.get_ident()
    steps: list[int] = []

    def gen() -> Generator[object, None, None]:
        for i in range(3):
            steps.append(threading.get_ident())
            yield i
        steps.append(threading.get_ident())

    waits = Scopes(_Timings())
    assert await collect(Stream(gen(), waits, backend=TRIO)) == [0, 1, 2]
    assert len(steps) == 4
    assert loop_ident not in steps


async def test_stream_iterates_async_generators_on_the_loop() -> None:
    loop_thread = threading.current_thread()
    seen: list[threading.Thread] = []

    async def agen() -> AsyncGenerator[object, None]:
        for i in range(3):
            seen.append(threading.current_thread())
            yield {"i": i}

    waits = Scopes(_Timings())
    assert await collect(Stream(agen(), waits, backend=TRIO)) == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert seen == [loop_thread] * 3


async def test_stream_iterates_a_plain_iterator_and_yields_none_chunks() -> None:
    waits = Scopes(_Timings())
    assert await collect(Stream(iter([None, 0, ""]), waits, backend=TRIO)) == [None, 0, ""]


async def test_stream_propagates_a_generator_error_after_earlier_chunks() -> None:
    def gen() -> Generator[object, None, None]:
        yield 1
        raise KeyError("mid-stream")

    waits = Scopes(_Timings())
    got: list[object] = []

    async def consume() -> None:
        async for chunk in Stream(gen(), waits, backend=TRIO):
            got.append(chunk)

    with pytest.raises(KeyError, match="mid-stream"):
        await consume()
    assert got == [1]


async def test_stream_closes_an_async_source_when_abandoned_early() -> None:
    events: list[str] = []

    async def agen() -> AsyncGenerator[object, None]:
        try:
            for i in range(10):
                yield i
        finally:
            events.append("closed")

    waits = Scopes(_Timings())
    chunks = cast("AsyncGenerator[object, None]", aiter(Stream(agen(), waits, backend=TRIO)))
    async with contextlib.aclosing(chunks):
        assert await anext(chunks) == 0
    assert events == ["closed"]


async def test_stream_closes_a_sync_source_when_abandoned_early() -> None:
    events: list[str] = []

    def gen() -> Generator[object, None, None]:
        try:
            yield from range(10)
        finally:
            events.append("closed")

    source = gen()
    waits = Scopes(_Timings())
    chunks = cast("AsyncGenerator[object, None]", aiter(Stream(source, waits, backend=TRIO)))
    async with contextlib.aclosing(chunks):
        assert await anext(chunks) == 0
    assert events == ["closed"]


async def test_a_stuck_sync_cleanup_is_cut_at_the_close_bound(
    autojump_clock: trio.testing.MockClock,
) -> None:
    release = threading.Event()

    def gen() -> Generator[object, None, None]:
        try:
            yield from range(10)
        finally:
            release.wait(TIMEOUT)  # a cleanup that would hang

    waits = Scopes(_Timings())
    stream = Stream(gen(), waits, backend=TRIO, close_bound=2.5)
    chunks = cast("AsyncGenerator[object, None]", aiter(stream))
    async with contextlib.aclosing(chunks):
        assert await anext(chunks) == 0
        started = trio.current_time()
    assert trio.current_time() - started == pytest.approx(2.5)
    release.set()


def test_stream_is_an_async_iterable() -> None:
    stream = Stream(iter([]), Scopes(_Timings()), backend=TRIO)
    assert isinstance(aiter(stream), AsyncIterator)


# --- run_in_thread ------------------------------------------------------------------------


async def test_run_in_thread_returns_and_raises() -> None:
    waits = Scopes(_Timings())
    assert await run_in_thread(operator.add, 2, 3, waits=waits) == 5
    with pytest.raises(ZeroDivisionError):
        await run_in_thread(operator.truediv, 1, 0, waits=waits)
    assert len(waits) == 0


async def test_run_in_thread_runs_more_handlers_at_once_than_trios_default_limit() -> None:
    # Capacity is the ledger's business: 50 sync handlers run together, past the 40
    # threads trio allows by default, or the barrier would never open.
    waits = Scopes(_Timings())
    together = threading.Barrier(50, timeout=TIMEOUT)
    results: list[int] = []

    def work(n: int) -> int:
        together.wait()
        return n

    async def run(n: int) -> None:
        results.append(await run_in_thread(work, n, waits=waits))

    async with trio.open_nursery() as nursery:
        for n in range(50):
            nursery.start_soon(run, n)
    assert sorted(results) == list(range(50))


async def test_cancelled_run_in_thread_waits_for_its_thread() -> None:
    waits = Scopes(_Timings())
    started = threading.Event()
    release = threading.Event()
    returned = threading.Event()
    done: list[str] = []

    def blocking() -> str:
        started.set()
        try:
            assert release.wait(TIMEOUT)
            return "late"
        finally:
            returned.set()

    async with trio.open_nursery() as nursery:
        scope = trio.CancelScope()

        async def run() -> None:
            with scope:
                await run_in_thread(blocking, waits=waits)
            done.append("moved on")

        nursery.start_soon(run)
        assert await trio.to_thread.run_sync(started.wait, TIMEOUT)
        scope.cancel()
        await trio.testing.wait_all_tasks_blocked()
        # Cancelled, but still waiting for the thread (the job's slot stays taken).
        assert done == []
        assert len(waits) == 1
        release.set()
    assert scope.cancelled_caught
    assert done == ["moved on"]
    assert returned.is_set()
    assert len(waits) == 0


async def test_end_by_now_lets_a_cancelled_caller_move_on_without_the_thread() -> None:
    waits = Scopes(_Timings())
    started = threading.Event()
    release = threading.Event()
    returned = threading.Event()
    done: list[str] = []

    def stuck() -> None:
        started.set()
        try:
            assert release.wait(TIMEOUT)
        finally:
            returned.set()

    try:
        async with trio.open_nursery() as nursery:
            scope = trio.CancelScope()

            async def run() -> None:
                with scope:
                    await run_in_thread(stuck, waits=waits)
                done.append("moved on")

            nursery.start_soon(run)
            assert await trio.to_thread.run_sync(started.wait, TIMEOUT)
            scope.cancel()
            await trio.testing.wait_all_tasks_blocked()
            assert done == []
            assert len(waits) == 1
            waits.end_by(trio.current_time())
        # The caller moved on while the thread is still running.
        assert done == ["moved on"]
        assert scope.cancelled_caught
        assert not returned.is_set()
        assert len(waits) == 0
    finally:
        release.set()
        assert await trio.to_thread.run_sync(returned.wait, TIMEOUT)


async def test_end_by_now_without_waiters_is_harmless() -> None:
    waits = Scopes(_Timings())
    waits.end_by(trio.current_time())
    assert len(waits) == 0
    assert await run_in_thread(str, 7, waits=waits) == "7"


async def test_end_by_cuts_waits_already_running_and_those_started_later(
    autojump_clock: trio.testing.MockClock,
) -> None:
    waits = Scopes(_Timings())
    ended: dict[str, float] = {}

    async def wait(name: str, bound: float) -> None:
        with waits.shielded(bound):
            await trio.sleep_forever()
        ended[name] = trio.current_time()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait, "before", 10.0)
        await trio.sleep(1.0)
        waits.end_by(trio.current_time() + 2.0)  # a shutdown at 1 s with a 2 s grace
        nursery.start_soon(wait, "after", 10.0)
        nursery.start_soon(wait, "shorter", 0.5)
    # Nothing cancelled them: the deadline alone ended them, a shorter bound first.
    assert ended == {"before": 3.0, "after": 3.0, "shorter": 1.5}
