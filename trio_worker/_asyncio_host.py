"""The asyncio backend: trio as a guest on an asyncio host loop (docs/how-it-works.md).

With ``async_backend="asyncio"`` the process runs ``asyncio.run()``, and the supervisor (the
same trio code as on the trio backend) runs inside it through
``trio.lowlevel.start_guest_run``: trio's ticks are callbacks of the asyncio loop, on the
same thread. Every async initializer, async handler and async generator then runs as an
asyncio task on that one loop, which lives as long as the worker, so an engine built in the
initializer (its background tasks, futures and queues bound to the loop) serves every job.

A trio task waits for such an asyncio task on a ``trio.Event`` set by the task's done
callback; when the trio scope is cancelled (a stop, the shutdown, ``init_timeout``) the
asyncio task is cancelled and awaited, so the user's code sees ``asyncio.CancelledError``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import logging
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import trio

from ._exceptions import ConfigurationError
from ._guest_tick import HostCallSoon
from ._guest_tick import install as install_guest_tick
from ._hand_off import HandsOffChunks
from ._threads import INITIALIZER_THREAD, in_thread

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
    from contextlib import AbstractContextManager

log = logging.getLogger("trio_worker")

T = TypeVar("T")


class Holds(Protocol):
    """Where a cancelled caller waits for code that has not ended yet (``Scopes``):
    never past the end of the shutdown grace."""

    def shielded(self, bound: float = ...) -> AbstractContextManager[trio.CancelScope]: ...

    def bounded(self, bound: float) -> AbstractContextManager[trio.CancelScope]: ...


# Chunks an async generator may run ahead of the trio side (which has its own bounded
# pipeline behind it); one wake-up of the trio side then moves a whole batch.
PUMP_DEPTH = 64


def host_run(
    async_fn: Callable[..., Awaitable[T]],
    *args: Any,
    clock: trio.abc.Clock | None = None,
    instruments: tuple[trio.abc.Instrument, ...] = (),
) -> T:
    """:func:`trio_worker.run_asyncio_host`: ``trio.run(async_fn, *args)`` as the guest of
    a new asyncio loop (the public function lives in ``_backends``, which imports this
    module only when it is called)."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        main = loop.create_task(_host_main(async_fn, args, clock, instruments))
        return _run_through_escapes(loop, main)
    finally:
        try:
            _end_leftovers(loop)
        finally:
            asyncio.set_event_loop(None)
            loop.close()


# Per host loop: what a worker served on it does with a SystemExit or KeyboardInterrupt
# that left the loop (see _run_through_escapes).
_EXIT_SINKS: dict[asyncio.AbstractEventLoop, list[Callable[[BaseException], bool]]] = {}


@contextlib.contextmanager
def escaped_exits_to(sink: Callable[[BaseException], bool]) -> Iterator[None]:
    """While the block runs, a SystemExit or KeyboardInterrupt raised in an asyncio task
    of the user's own (one a handler started, not the handler's coroutine) goes to *sink*,
    and the host loop goes on, rather than the loop ending under the worker. *sink* says
    whether it took the exit (a worker already ended cannot)."""
    loop = host_loop()
    sinks = _EXIT_SINKS.setdefault(loop, [])
    sinks.append(sink)
    try:
        yield
    finally:
        sinks.remove(sink)
        if not sinks:
            del _EXIT_SINKS[loop]


def _run_through_escapes(loop: asyncio.AbstractEventLoop, main: asyncio.Task[T]) -> T:
    """Run the loop until *main* is done.

    asyncio lets a SystemExit or KeyboardInterrupt raised in a task out of the loop at
    once (the task keeps it as its exception, for whoever awaits it). The handlers' own
    coroutines are wrapped against that (:func:`_contained`), but not a task a handler
    starts. The first such exit is handed to the worker serving on this loop, which shuts
    down within its grace and then raises it (the handler that awaits the task also sees
    it, and its job is reported with the exit status); the loop resumes meanwhile. A second
    one (a second Ctrl-C), or one with no worker to tell, ends the loop at once as before.
    """
    handed = False
    while True:
        try:
            return loop.run_until_complete(main)
        except (SystemExit, KeyboardInterrupt) as exc:
            if main.done() or handed:
                raise
            # Every sink is told (several workers may share a loop in tests).
            told = [sink(exc) for sink in _EXIT_SINKS.get(loop, ())]
            if not any(told):
                raise
            handed = True


# How long the tasks the user's code left on the loop (an engine's background loop) get to
# finish once cancelled. asyncio.run() would wait for them without end, so one task that
# swallows its cancellation would keep the process from ever exiting.
LEFTOVER_BOUND = 1.0


def _end_leftovers(loop: asyncio.AbstractEventLoop) -> None:
    tasks = asyncio.all_tasks(loop)
    for task in tasks:
        task.cancel()
    if tasks:
        _, pending = loop.run_until_complete(asyncio.wait(tasks, timeout=LEFTOVER_BOUND))
        if pending:
            log.warning("%d asyncio task(s) ignored their cancellation at exit", len(pending))
    for task in tasks:
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: the worker is ending either way
    try:
        loop.run_until_complete(asyncio.wait_for(loop.shutdown_asyncgens(), LEFTOVER_BOUND))
    except TimeoutError:
        log.warning("async generators still closing at exit")


async def _host_main(
    async_fn: Callable[..., Awaitable[T]],
    args: tuple[Any, ...],
    clock: trio.abc.Clock | None,
    instruments: tuple[trio.abc.Instrument, ...],
) -> T:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()
    guest_scope: list[trio.CancelScope] = []
    token: list[trio.lowlevel.TrioToken] = []

    async def guest_main() -> T:
        token.append(trio.lowlevel.current_trio_token())
        with trio.CancelScope() as scope:
            guest_scope.append(scope)
            return await async_fn(*args)
        raise trio.Cancelled._create()  # the host was cancelled (Ctrl-C under asyncio.run)

    install_guest_tick()
    trio.lowlevel.start_guest_run(
        guest_main,
        run_sync_soon_threadsafe=loop.call_soon_threadsafe,
        # trio's idle waits happen on this loop, not in a helper thread (._guest_tick).
        run_sync_soon_not_threadsafe=HostCallSoon(loop),
        done_callback=done.set_result,
        # asyncio installs its own wakeup fd when signal handlers are added to the loop.
        host_uses_signal_set_wakeup_fd=True,
        clock=clock,
        instruments=instruments,
    )
    while True:
        try:
            outcome = await asyncio.shield(done)
            break
        except asyncio.CancelledError:
            # The trio run must end before the host loop does: cancel it and keep waiting.
            if token and guest_scope:
                token[0].run_sync_soon(guest_scope[0].cancel)
    result: T = outcome.unwrap()
    return result


def host_loop() -> asyncio.AbstractEventLoop:
    """The asyncio loop hosting this trio run.

    Raises:
        ConfigurationError: trio is not running as a guest of asyncio.
    """
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        raise ConfigurationError(
            'async_backend="asyncio" needs an asyncio event loop hosting trio: use '
            "trio_worker.start(), or run serve() with trio_worker.run_asyncio_host(...) "
            "instead of trio.run(...)"
        ) from None


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
    """Done callback of a task whose caller has moved on: what it raised is not news.

    Without it, a task that ends with an error after its caller stopped waiting (abandoned
    at the end of the shutdown grace, or past a bound) makes asyncio log "Task exception was
    never retrieved", with the user's traceback, when the task is garbage collected.
    """
    if not task.cancelled():
        task.exception()


async def await_on_asyncio(
    awaitable: Awaitable[T],
    *,
    waits: Holds,
    cancel_bound: float = 5.0,
) -> T:
    """Await *awaitable* as an asyncio task on the host loop, from a trio task.

    If the trio scope is cancelled, the asyncio task is cancelled and awaited (shielded)
    before ``trio.Cancelled`` propagates. A task that swallows its cancellation holds its
    caller for at most *cancel_bound* seconds and no later than the end of the shutdown
    grace (``waits``; local mode has none), as a sync handler's thread does.
    """
    loop = host_loop()
    coro: Coroutine[Any, Any, T] = (
        awaitable if inspect.iscoroutine(awaitable) else _as_coroutine(awaitable)
    )
    # The task copies this trio task's context: progress_update and the job's output
    # attribution see the job.
    task = loop.create_task(_contained(coro))
    finished = trio.Event()
    task.add_done_callback(lambda _: finished.set())
    try:
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


class AsyncioChunks(HandsOffChunks):
    """An async generator running on the asyncio host, read from trio.

    One asyncio task pumps the generator into a bounded buffer and wakes the trio reader
    only when it waits, so a burst of chunks costs one wake-up, not one task per chunk.
    A chunk yielded while the reader waits with nothing buffered goes to the reader's
    :meth:`hand_off` first, in the pump itself: paced chunks (a token at a time) then
    wake no trio task of their own (docs/how-it-works.md, the asyncio backend).
    ``aclose()`` cancels the pump (the generator sees ``asyncio.CancelledError`` where it
    waits, or ``GeneratorExit`` at its ``yield``) and waits for the generator's cleanup:
    *close_bound* seconds at most, and no later than the end of the shutdown grace
    (*waits*), after which a plain handler's task is no longer waited for either.
    """

    def __init__(self, source: AsyncIterator[Any], *, close_bound: float, waits: Holds) -> None:
        self._source = source
        self._close_bound = close_bound
        self._waits = waits
        self._buffer: collections.deque[Any] = collections.deque()
        self._room = asyncio.Event()
        self._reader: trio.Event | None = None
        self._finished = trio.Event()
        self._offer: Callable[[Any], bool] | None = None
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

    def hand_off(self, offer: Callable[[Any], bool]) -> None:
        self._offer = offer

    def _offered(self, chunk: Any) -> bool:
        # Only while the reader waits with nothing buffered: every chunk before this one
        # has then been through the reader's hands, so order holds. A cancelled reader has
        # left its event's waiters at once (trio aborts a cancelled wait as it is
        # cancelled), so a stopped stream takes nothing more this way.
        reader = self._reader
        return (
            self._offer is not None
            and reader is not None
            and not self._buffer
            and reader.statistics().tasks_waiting > 0
            and self._offer(chunk)
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
        # Bounded, not shielded: the one caller (Stream._chunks in _handlers.py) already
        # closes streams under a shield, so that shield stays the one that matters.
        started = trio.current_time()
        with self._waits.bounded(self._close_bound):
            await self._finished.wait()
        if not self._finished.is_set():
            log.warning("async generator cleanup cut after %.1fs", trio.current_time() - started)
            self._task.add_done_callback(_retrieved)
        elif not self._task.cancelled() and self._task.exception() is not None:
            log.debug("async generator ended with %r while closing", repr(self._task.exception()))
