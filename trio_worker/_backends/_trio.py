"""The trio backend: async handlers are trio tasks of the worker's own run."""

from __future__ import annotations

import contextlib
import functools
import math
import threading
from typing import TYPE_CHECKING, Any, TypeVar

import trio

from .._exceptions import AsyncioUnderTrio
from .._tracebacks import ASYNCIO_DIR
from ._handler_calls import ThreadCall, run_sync
from ._interface import ASYNCIO_HINTS, Backend, hinted

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable
    from contextlib import AbstractContextManager

    from ._interface import Holds, Initializer

T = TypeVar("T")


class TrioBackend(Backend):
    """Nothing stands between the supervisor and the user's coroutine."""

    name = "trio"
    round_linger = 0.001

    def run(self, async_fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        return trio.run(async_fn, *args)

    def check_host(self) -> None:
        return

    def thread_handoff(self, token: trio.lowlevel.TrioToken) -> Callable[..., object]:
        return token.run_sync_soon

    def initializer(self, initializer: Initializer | None, waits: Holds) -> Initializer | None:
        return initializer

    async def await_result(
        self, awaitable: Awaitable[Any], waits: Holds, *, cancel_bound: float = math.inf
    ) -> Any:
        if cancel_bound == math.inf:
            return await awaitable
        # A task of this run that swallows its cancellation (a bare except around an
        # await) holds its caller, and may hold the loop, as long as it likes: bounded,
        # the awaitable runs on a trio run of its own, which can be left behind.
        return await _on_a_run_of_its_own(awaitable, waits, cancel_bound)

    def chunks(
        self, source: AsyncIterator[Any], *, close_bound: float, waits: Holds
    ) -> AsyncIterator[Any]:
        return source

    def hand_off(self, chunks: AsyncIterator[Any], offer: Callable[[Any], bool]) -> None:
        return  # the generator runs in its reader's task: a chunk wakes nothing else

    def exits_from_user_tasks(
        self, request_exit: Callable[[SystemExit | KeyboardInterrupt], None]
    ) -> AbstractContextManager[None]:
        return contextlib.nullcontext()  # trio has no tasks outside the worker's nurseries

    def explain(self, exc: BaseException) -> BaseException:
        return hinted(
            exc,
            family_dir=ASYNCIO_DIR,
            hints=ASYNCIO_HINTS,
            cls=AsyncioUnderTrio,
            advice="asyncio code ran on trio, the worker's backend for it; asyncio code needs"
            ' async_backend="asyncio" (the default for async code)',
        )


class _RunOfItsOwn:
    """One awaitable on a trio run in a thread, cancellable from the caller's run."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cancel: Callable[[], object] | None = None
        self._cancelled = False

    async def main(self, awaitable: Awaitable[Any]) -> Any:
        with trio.CancelScope() as scope:
            token = trio.lowlevel.current_trio_token()
            with self._lock:
                self._cancel = functools.partial(token.run_sync_soon, scope.cancel)
                if self._cancelled:
                    scope.cancel()
            return await awaitable

    def cancel(self) -> None:
        """Cancel the run's awaitable (at once if it has started, else as it starts)."""
        with self._lock:
            self._cancelled = True
            cancel = self._cancel
        if cancel is not None:
            with contextlib.suppress(trio.RunFinishedError):
                cancel()


async def _on_a_run_of_its_own(awaitable: Awaitable[Any], waits: Holds, cancel_bound: float) -> Any:
    """*awaitable*'s value, computed on a trio run of its own in a kept thread. Once the
    caller is cancelled, so is that run, and the caller waits for it at most
    *cancel_bound* seconds (and no later than the end of the shutdown grace, *waits*);
    then the thread is left to itself, as an abandoned sync handler's is. The awaitable
    shares no trio object with the caller's run."""
    run = _RunOfItsOwn()
    call = ThreadCall(trio.run, (run.main, awaitable))
    await trio.lowlevel.checkpoint_if_cancelled()
    try:
        return await run_sync(call)
    except trio.Cancelled:
        run.cancel()
        if call.ended is not None:
            with waits.shielded(cancel_bound):
                await call.ended.wait()
        raise
