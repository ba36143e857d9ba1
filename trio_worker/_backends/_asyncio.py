"""The asyncio backend: async handlers run as asyncio tasks on the loop that hosts the
worker's trio run (docs/how-it-works.md, "The asyncio backend"); imported only when a
worker asks for it."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import logging
import math
from typing import TYPE_CHECKING, Any, TypeVar

import trio

from .._exceptions import TrioUnderAsyncio
from ._handler_calls import INITIALIZER_THREAD, in_thread
from ._host import escaped_exits_to, host_loop, host_run
from ._interface import TRIO_DIR, TRIO_HINTS, Backend, hinted, makes_coroutine

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator

    from ._interface import Holds, Initializer

log = logging.getLogger("trio_worker")

T = TypeVar("T")

# Chunks an async generator may run ahead of the trio side (which has its own bounded
# pipeline behind it); one wake-up of the trio side then moves a whole batch.
PUMP_DEPTH = 64


class AsyncioBackend(Backend):
    """Async handlers, async generators and an async initializer's coroutine run as tasks
    of the host loop, where the engines they build find it."""

    name = "asyncio"
    round_linger = 0.003

    def run(self, async_fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        return host_run(async_fn, *args)

    def check_host(self) -> None:
        host_loop()

    def thread_handoff(self, token: trio.lowlevel.TrioToken) -> Callable[..., object]:
        # A thread's result (asyncio.to_thread, an executor) reaches the handler's task
        # through the loop's own queue, after this call, so the job cannot end first;
        # trio's queue keeps no order with the loop's.
        return host_loop().call_soon_threadsafe

    def initializer(self, initializer: Initializer | None, waits: Holds) -> Initializer | None:
        if initializer is None:
            return None
        return asyncio_initializer(initializer, is_async=makes_coroutine(initializer), waits=waits)

    async def await_result(
        self, awaitable: Awaitable[Any], waits: Holds, *, cancel_bound: float = math.inf
    ) -> Any:
        # A handler's is held like a sync handler's thread: until it ends or the grace does.
        return await await_on_asyncio(awaitable, waits=waits, cancel_bound=cancel_bound)

    def chunks(
        self, source: AsyncIterator[Any], *, close_bound: float, waits: Holds
    ) -> AsyncIterator[Any]:
        return AsyncioChunks(source, close_bound=close_bound, waits=waits)

    def hand_off(self, chunks: AsyncIterator[Any], offer: Callable[[Any], bool]) -> None:
        if isinstance(chunks, AsyncioChunks):  # else not made here: nothing to hand off
            chunks.offer = offer

    @contextlib.contextmanager
    def exits_from_user_tasks(
        self, request_exit: Callable[[SystemExit | KeyboardInterrupt], None]
    ) -> Iterator[None]:
        # A sys.exit() in an asyncio task a handler started shuts the worker down as the
        # handler's own would (docs/how-it-works.md, the asyncio backend).
        token = trio.lowlevel.current_trio_token()

        def sink(exc: BaseException) -> bool:
            assert isinstance(exc, SystemExit | KeyboardInterrupt)
            try:
                token.run_sync_soon(request_exit, exc)
            except trio.RunFinishedError:
                return False  # the host loop then ends with it at once
            return True

        with escaped_exits_to(sink):
            yield

    def explain(self, exc: BaseException) -> BaseException:
        return hinted(
            exc,
            family_dir=TRIO_DIR,
            hints=TRIO_HINTS,
            cls=TrioUnderAsyncio,
            advice="trio code ran on asyncio, the worker's backend for async code; trio code"
            ' needs async_backend="trio"',
        )


async def _as_coroutine(awaitable: Awaitable[T]) -> T:
    return await awaitable


class _Escaped(Exception):
    """Carries a SystemExit/KeyboardInterrupt out of an asyncio task as a plain error.

    asyncio re-raises those two out of the loop itself, which would end the host loop (and
    the worker) at once, before the job is reported; the trio side unwraps it instead.
    """

    def __init__(self, exc: BaseException) -> None:
        super().__init__(exc)
        self.exc = exc


async def _contained(coro: Awaitable[T]) -> T:
    try:
        return await coro
    except (SystemExit, KeyboardInterrupt) as exc:
        raise _Escaped(exc) from None


def _result(task: asyncio.Task[T]) -> T:
    try:
        return task.result()
    except _Escaped as escaped:
        raise escaped.exc from None


def _retrieved(task: asyncio.Task[Any]) -> None:
    """Done callback of a task whose caller has moved on: without it, a task that ends with
    an error after its caller stopped waiting makes asyncio log "Task exception was never
    retrieved", with the user's traceback, when the task is garbage collected."""
    if not task.cancelled():
        task.exception()


async def await_on_asyncio(
    awaitable: Awaitable[T],
    *,
    waits: Holds,
    cancel_bound: float = 5.0,
) -> T:
    """Await *awaitable* as an asyncio task on the host loop, from a trio task.

    Once cancelled, the task is cancelled and awaited (shielded) before ``trio.Cancelled``
    propagates: at most *cancel_bound* seconds, and no later than the end of the shutdown
    grace (``waits``; local mode has none).
    """
    loop = host_loop()
    coro: Coroutine[Any, Any, T] = (
        awaitable if inspect.iscoroutine(awaitable) else _as_coroutine(awaitable)
    )
    # It copies this task's context: progress_update and output attribution see the job.
    task = loop.create_task(_contained(coro))
    finished = trio.Event()
    task.add_done_callback(lambda _: finished.set())
    try:
        # Its first step runs before trio's next tick: a quick handler is taken then, with
        # no wait in trio's helper thread (docs/how-it-works.md, "The asyncio backend").
        await trio.lowlevel.checkpoint()
        if not task.done():
            await finished.wait()
    except trio.Cancelled:
        task.cancel()
        task.add_done_callback(_retrieved)  # now, or once it ends after we stop waiting
        await _wait_cancelled(finished, waits, cancel_bound)
        raise
    return _result(task)


async def _wait_cancelled(finished: trio.Event, waits: Holds, bound: float) -> None:
    with waits.shielded(bound):
        await finished.wait()
    if not finished.is_set():
        log.warning("asyncio task still running after its cancellation; no longer waited for")


def asyncio_initializer(
    initializer: Callable[[], Any], *, is_async: bool, waits: Holds
) -> Callable[[], Awaitable[None]]:
    """*initializer*, with its coroutine (if it makes one) run as an asyncio task.

    Once cancelled (``init_timeout``, a shutdown) the task gets a bounded wait for its
    cleanup, which the end of the shutdown grace (*waits*) also ends.
    """

    async def on_host() -> None:
        if is_async:
            await await_on_asyncio(_call(initializer), waits=waits)
            return
        # A sync initializer keeps its abandonable thread (boxed, so a coroutine it
        # returns reaches us), and a coroutine it returns runs on the host loop.
        (result,) = await in_thread(lambda: (initializer(),), name=INITIALIZER_THREAD)
        if inspect.isawaitable(result):
            await await_on_asyncio(result, waits=waits)

    return on_host


async def _call(fn: Callable[[], Any]) -> None:
    result = fn()
    if inspect.isawaitable(result):
        await result


class AsyncioChunks:
    """An async generator running on the asyncio host, read from trio: one asyncio task
    pumps it, offering a chunk to :attr:`offer` while the reader waits with nothing
    buffered (docs/how-it-works.md, "The asyncio backend"). ``aclose()`` cancels the pump
    and waits for the generator's cleanup at most *close_bound* seconds, and no later than
    the end of the shutdown grace (*waits*).
    """

    def __init__(self, source: AsyncIterator[Any], *, close_bound: float, waits: Holds) -> None:
        self._source = source
        self._close_bound = close_bound
        self._waits = waits
        self._buffer: collections.deque[Any] = collections.deque()
        self._room = asyncio.Event()
        self._reader: trio.Event | None = None
        self._finished = trio.Event()
        #: Where a chunk goes first while the reader waits (None: to the reader).
        self.offer: Callable[[Any], bool] | None = None
        self._task = host_loop().create_task(_contained(self._pump()))
        self._task.add_done_callback(lambda _: self._wake_reader(finished=True))

    def _wake_reader(self, *, finished: bool = False) -> None:
        if finished:
            self._finished.set()
        if self._reader is not None:
            self._reader.set()
            self._reader = None

    async def _pump(self) -> None:
        source = self._source
        try:
            async for chunk in source:
                if self._offered(chunk):
                    continue
                self._buffer.append(chunk)
                self._wake_reader()
                while len(self._buffer) >= PUMP_DEPTH:
                    self._room.clear()
                    await self._room.wait()
        finally:
            aclose = getattr(source, "aclose", None)
            if aclose is not None:
                await aclose()

    def _offered(self, chunk: Any) -> bool:
        # Only while the reader waits with nothing buffered: every chunk before this one
        # has then been through the reader's hands, so order holds. A cancelled reader has
        # left its event's waiters at once (trio aborts a cancelled wait as it is
        # cancelled), so a stopped stream takes nothing more this way.
        reader = self._reader
        return (
            self.offer is not None
            and reader is not None
            and not self._buffer
            and reader.statistics().tasks_waiting > 0
            and self.offer(chunk)
        )

    def __aiter__(self) -> AsyncioChunks:
        return self

    async def __anext__(self) -> Any:
        while not self._buffer:
            if self._task.done():
                _result(self._task)  # the generator's own error, with its traceback
                raise StopAsyncIteration
            self._reader = reader = trio.Event()
            await reader.wait()
        chunk = self._buffer.popleft()
        if len(self._buffer) < PUMP_DEPTH:
            self._room.set()
        return chunk

    async def aclose(self) -> None:
        if not self._task.done():
            self._task.cancel()
        # Bounded, not shielded: the one caller (Stream._chunks in _handler_calls.py) already
        # closes streams under a shield, so that shield stays the one that matters.
        started = trio.current_time()
        with self._waits.bounded(self._close_bound):
            await self._finished.wait()
        if not self._finished.is_set():
            log.warning("async generator cleanup cut after %.1fs", trio.current_time() - started)
            self._task.add_done_callback(_retrieved)
        elif not self._task.cancelled() and self._task.exception() is not None:
            log.debug("async generator ended with %r while closing", repr(self._task.exception()))
