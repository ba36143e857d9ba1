"""Calling the user's handler: sync, async, sync generator, async generator (docs/design.md §2).

Detection looks through ``functools.partial`` and callable objects, which the reference
misses (docs/protocol.md §3.4); a plain function that *returns* a generator, a coroutine or an
async generator is also handled by what it returns, so nothing is ever left unserializable
because of how the handler was wrapped.

Sync code runs in a worker thread so the event loop (stop signals, reports, the take loop)
stays live. Such a thread cannot be interrupted; ``check_cancelled()`` lets it stop
cooperatively when its job is stopped.
"""

from __future__ import annotations

import enum
import inspect
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Iterator
from typing import TYPE_CHECKING, Any

import trio

from ._backends import unwrap_callable as _unwrap
from ._config import DEFAULT_SYNC_CLOSE_BOUND
from ._exceptions import exception_leaves
from ._threads import ThreadCall, in_thread, run_sync

if TYPE_CHECKING:
    from ._backends import Backend
    from ._scopes import Scopes

Handler = Callable[[dict[str, Any]], Any]


class HandlerKind(enum.Enum):
    SYNC = "sync"
    ASYNC = "async"
    SYNC_GENERATOR = "sync generator"
    ASYNC_GENERATOR = "async generator"

    @property
    def streams(self) -> bool:
        return self in (HandlerKind.SYNC_GENERATOR, HandlerKind.ASYNC_GENERATOR)


def handler_kind(fn: Callable[..., Any]) -> HandlerKind:
    """Classify *fn*, looking through partials and callable objects."""
    target = _unwrap(fn)
    if inspect.isasyncgenfunction(target):
        return HandlerKind.ASYNC_GENERATOR
    if inspect.isgeneratorfunction(target):
        return HandlerKind.SYNC_GENERATOR
    if inspect.iscoroutinefunction(target) or inspect.iscoroutinefunction(fn):
        return HandlerKind.ASYNC
    return HandlerKind.SYNC


def is_cancellation(exc: BaseException) -> bool:
    """True for ``trio.Cancelled``, and for a group holding nothing but ``Cancelled``
    (what a nursery inside a cancelled scope raises)."""
    return not exception_leaves(exc, ignore=trio.Cancelled)


async def run_in_thread(fn: Callable[..., Any], *args: Any, waits: Scopes) -> Any:
    """Run sync *fn* in a kept thread (:mod:`._threads`); when cancelled, wait for the
    thread to end.

    The call is abandoned on cancel so ``check_cancelled()`` inside it sees the stop at
    once, but the caller does not move on until the thread has really returned, or the
    grace has ended (*waits*: the deadline registry).
    """
    # Cancelled before the thread is asked (a stop that landed first): nothing to wait for.
    await trio.lowlevel.checkpoint_if_cancelled()
    call = ThreadCall(fn, args)
    try:
        return await run_sync(call)
    except trio.Cancelled:
        if call.ended is not None:
            await waits.hold(call.ended)
        raise


class Stream:
    """The chunks of a streaming handler, as one async iterator whatever its kind."""

    def __init__(
        self,
        source: Generator[Any, Any, Any] | Iterator[Any] | AsyncIterator[Any],
        waits: Scopes,
        *,
        backend: Backend,
        close_bound: float = DEFAULT_SYNC_CLOSE_BOUND,
    ) -> None:
        self._source = source
        self._waits = waits
        self._backend = backend  # where an async source's chunks come from
        self._close_bound = close_bound  # Timings.sync_close_bound

    def __aiter__(self) -> AsyncGenerator[Any, None]:
        return self._chunks()

    def hand_off(self, offer: Callable[[Any], bool]) -> None:
        """Let the chunks reach *offer* where they are yielded while the reader waits,
        where the backend can (:meth:`Backend.hand_off`): a chunk *offer* takes (True) is
        not read from this stream."""
        if isinstance(self._source, AsyncIterator):
            self._backend.hand_off(self._source, offer)

    async def _chunks(self) -> AsyncGenerator[Any, None]:
        source = self._source
        if isinstance(source, AsyncIterator):
            try:
                async for chunk in source:
                    yield chunk
            finally:
                aclose = getattr(source, "aclose", None)
                if aclose is not None:
                    with trio.CancelScope(shield=True):
                        await aclose()
            return
        done = object()
        try:
            while True:
                # Each step runs in a thread: a sync generator may block like any sync handler.
                chunk = await run_in_thread(next, source, done, waits=self._waits)
                if chunk is done:
                    return
                yield chunk
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                # Ended early (an error chunk, a stop): run the generator's own cleanup now,
                # in a thread as its body ran, bounded so a stuck finally cannot hang us,
                # and no later than the end of the shutdown grace.
                with self._waits.shielded(self._close_bound):
                    await in_thread(close)


async def call_handler(
    fn: Handler,
    kind: HandlerKind,
    job: dict[str, Any],
    waits: Scopes,
    *,
    backend: Backend,
    close_bound: float = DEFAULT_SYNC_CLOSE_BOUND,
) -> Any | Stream:
    """Call *fn* with *job*: the handler's result, or a :class:`Stream` of its chunks
    (whose generator gets *close_bound* seconds for its cleanup when left early).

    A coroutine or an async generator the handler makes runs on *backend*. Exceptions
    raised by the handler propagate unchanged.
    """
    if kind is HandlerKind.SYNC:
        result = await run_in_thread(fn, job, waits=waits)
    else:
        # Creating a generator runs none of its body, and an async handler runs on the
        # loop, so no thread is needed here.
        result = fn(job)
    if inspect.isawaitable(result):
        result = await backend.await_result(result, waits)
    if isinstance(result, AsyncIterator):
        result = backend.chunks(result, close_bound=close_bound, waits=waits)
    if inspect.isgenerator(result) or isinstance(result, AsyncIterator):
        return Stream(result, waits, backend=backend, close_bound=close_bound)
    return result
