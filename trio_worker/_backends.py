"""Where the user's async code runs: one interface, one class per backend, chosen once.

Everything that differs between running async handlers on trio and on asyncio sits behind
:class:`Backend`, in the manner of anyio's ``AsyncBackend``: the options pick one
(:func:`default_backend` when the user names none, docs/design.md §2), and the runner, the
handlers, the worker and the local modes call it without asking which.

On asyncio, trio is a guest of the asyncio loop (``_asyncio_host.py``); on trio, nothing
stands between the supervisor and the user's coroutine. ``_asyncio_host`` (and asyncio) is
imported only when a worker uses the asyncio backend: a trio-backend worker never imports
asyncio.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import trio

from ._exceptions import AsyncioUnderTrio, TrioUnderAsyncio
from ._threads import ThreadCall, run_sync
from ._tracebacks import ASYNCIO_DIR

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
    from contextlib import AbstractContextManager
    from types import TracebackType

    from ._asyncio_host import Holds

    Initializer = Callable[[], Any]

T = TypeVar("T")

AsyncBackend = Literal["trio", "asyncio"]


class Backend(ABC):
    """What the worker asks of the loop that runs the user's async code."""

    name: AsyncBackend
    #: How long the stream convoy waits for more chunks before a round leaves
    #: (``_chunk_convoy.py``), unless every open stream has boarded sooner. A few
    #: scheduler passes gathered few chunks (about 3 a round at 64 streams of 50 chunks/s,
    #: each round a write, a read and, on asyncio, wake-ups of trio as the loop's guest).
    #: Waiting up to 1 ms: CPU per paced chunk 149-200 -> 128 us on asyncio (p50 0.5 ->
    #: 2.3 ms, p99 2.6-3.0 -> 4.8 ms), and 0.70x on trio in six alternating pairs
    #: (docs/benchmarks.md); a millisecond on a token that took tens to make.
    round_linger: float = 0.001

    @abstractmethod
    def run(self, async_fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run the worker (*async_fn*, trio code) as the process's event loop."""

    @abstractmethod
    def check_host(self) -> None:
        """Fail early, before anything is taken, when this backend cannot run here.

        Raises:
            ConfigurationError: the asyncio backend inside a plain ``trio.run``.
        """

    @abstractmethod
    def thread_handoff(self, token: trio.lowlevel.TrioToken) -> Callable[..., object]:
        """``call(fn, *args)``: run *fn* on the worker's trio thread, from any thread, in
        order with what the user's threads hand to their async code (a thread's
        ``progress_update`` must arrive before the job it belongs to ends)."""

    @abstractmethod
    def initializer(self, initializer: Initializer | None, waits: Holds) -> Initializer | None:
        """*initializer* as this backend runs it; once cancelled, its cleanup is waited for
        no later than the end of the shutdown grace (*waits*)."""

    @abstractmethod
    async def await_result(
        self, awaitable: Awaitable[Any], waits: Holds, *, cancel_bound: float = math.inf
    ) -> Any:
        """The value of a coroutine the user's code made; trio.Cancelled propagates. Once
        cancelled, code that swallows its cancellation holds the caller at most
        *cancel_bound* seconds (and no later than the end of the grace, *waits*)."""

    @abstractmethod
    def chunks(
        self, source: AsyncIterator[Any], *, close_bound: float, waits: Holds
    ) -> AsyncIterator[Any]:
        """The chunks of an async generator the handler made, read from trio."""

    @abstractmethod
    def exits_from_user_tasks(
        self, request_exit: Callable[[SystemExit | KeyboardInterrupt], None]
    ) -> AbstractContextManager[None]:
        """While the worker runs: where a ``sys.exit()`` in a task the user's code started
        goes (*request_exit*, on the trio thread)."""

    @abstractmethod
    def explain(self, exc: BaseException) -> BaseException:
        """*exc*, or one line naming ``async_backend`` when the user's code was written for
        the other backend (the original is chained)."""


class TrioBackend(Backend):
    """Async handlers are trio tasks of the worker's own run."""

    name = "trio"

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

    def exits_from_user_tasks(
        self, request_exit: Callable[[SystemExit | KeyboardInterrupt], None]
    ) -> AbstractContextManager[None]:
        return contextlib.nullcontext()  # trio has no tasks outside the worker's nurseries

    def explain(self, exc: BaseException) -> BaseException:
        if not _from_other_family(exc, ASYNCIO_DIR, _ASYNCIO_HINTS):
            return exc
        return _hinted(
            AsyncioUnderTrio,
            exc,
            "asyncio code ran on trio, the worker's backend for it; asyncio code needs"
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


class AsyncioBackend(Backend):
    """Async handlers run as asyncio tasks on one loop that lives as long as the worker,
    with the worker's trio run as its guest (``_asyncio_host.py``)."""

    name = "asyncio"

    def __init__(self) -> None:
        # Imported here, once, when a worker first asks for this backend (BACKENDS): asyncio
        # is about 15 ms of start-up (python -X importtime) a trio-backend worker never needs.
        from . import _asyncio_host

        self._host = _asyncio_host

    def run(self, async_fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        return self._host.host_run(async_fn, *args)

    def check_host(self) -> None:
        self._host.host_loop()

    def thread_handoff(self, token: trio.lowlevel.TrioToken) -> Callable[..., object]:
        # A thread's result (asyncio.to_thread, an executor) reaches the handler's task
        # through the loop's own queue, after this call, so the job cannot end first;
        # trio's queue keeps no order with the loop's.
        return self._host.host_loop().call_soon_threadsafe

    def initializer(self, initializer: Initializer | None, waits: Holds) -> Initializer | None:
        # Its coroutine (if it makes one) runs on the host loop, where the handlers will
        # find the engine it builds.
        if initializer is None:
            return None
        return self._host.asyncio_initializer(
            initializer, is_async=makes_coroutine(initializer), waits=waits
        )

    async def await_result(
        self, awaitable: Awaitable[Any], waits: Holds, *, cancel_bound: float = math.inf
    ) -> Any:
        # A handler's is held like a sync handler's thread: until it ends or the grace does.
        return await self._host.await_on_asyncio(awaitable, waits=waits, cancel_bound=cancel_bound)

    def chunks(
        self, source: AsyncIterator[Any], *, close_bound: float, waits: Holds
    ) -> AsyncIterator[Any]:
        return self._host.AsyncioChunks(source, close_bound=close_bound, waits=waits)

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

        with self._host.escaped_exits_to(sink):
            yield

    def explain(self, exc: BaseException) -> BaseException:
        if not _from_other_family(exc, _TRIO_DIR, _TRIO_HINTS):
            return exc
        return _hinted(
            TrioUnderAsyncio,
            exc,
            "trio code ran on asyncio, the worker's backend for async code; trio code needs"
            ' async_backend="trio"',
        )


class _Backends(Mapping[str, Backend]):
    """The backends by name, each built once; the asyncio one (and with it asyncio, about
    15 ms of ``python -X importtime``) only when a worker asks for it."""

    def __init__(self) -> None:
        self._built: dict[str, Backend] = {"trio": TrioBackend()}

    def __getitem__(self, name: str) -> Backend:
        try:
            return self._built[name]
        except KeyError:
            if name != "asyncio":
                raise
        return self._built.setdefault(name, AsyncioBackend())

    def __iter__(self) -> Iterator[str]:
        return iter(("trio", "asyncio"))

    def __len__(self) -> int:
        return 2


BACKENDS: Mapping[str, Backend] = _Backends()


def run_asyncio_host(
    async_fn: Callable[..., Awaitable[T]],
    *args: Any,
    clock: trio.abc.Clock | None = None,
    instruments: tuple[trio.abc.Instrument, ...] | list[trio.abc.Instrument] = (),
) -> T:
    """Like ``trio.run(async_fn, *args)``, with trio as a guest on a new asyncio loop.

    Inside, trio code and asyncio code share one thread: a worker served here with
    ``async_backend="asyncio"`` runs its async handlers on this loop. Its signature matches
    ``trio.run`` so pytest-trio can use it (``@pytest.mark.trio(run=run_asyncio_host)``).
    """
    # Imported here, once per run: a worker on the trio backend never imports asyncio.
    from ._asyncio_host import host_run

    return host_run(async_fn, *args, clock=clock, instruments=tuple(instruments))


def default_backend(
    handler: Callable[..., Any],
    initializer: Callable[..., Any] | None,
    concurrency: object,
) -> AsyncBackend:
    """The backend when the user names none (docs/design.md §2): asyncio when any of the
    user's code is async (every async handler written for the reference is asyncio code),
    trio when it is all sync (no user code sees the loop, and trio is the faster host)."""
    user_code = [c for c in (handler, initializer, concurrency) if callable(c)]
    return "asyncio" if any(is_async_callable(c) for c in user_code) else "trio"


def is_async_callable(fn: Callable[..., Any]) -> bool:
    """Whether calling *fn* makes a coroutine or an async generator (looking through
    ``functools.partial`` and callable objects): code that needs a loop."""
    return makes_coroutine(fn) or inspect.isasyncgenfunction(unwrap_callable(fn))


def makes_coroutine(fn: Callable[..., Any]) -> bool:
    """Whether calling *fn* makes a coroutine (looking through ``functools.partial`` and
    callable objects)."""
    return inspect.iscoroutinefunction(unwrap_callable(fn)) or inspect.iscoroutinefunction(fn)


def unwrap_callable(fn: object) -> object:
    """The function that says what *fn* is: through ``functools.partial`` and to a
    callable object's ``__call__``."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if not (inspect.isfunction(fn) or inspect.ismethod(fn)) and callable(fn):
        call = getattr(type(fn), "__call__", None)  # noqa: B004 - we want the method itself
        # Only a Python-level __call__ says anything; C callables (builtins, classes,
        # itemgetter, lru_cache wrappers) are plain sync callables.
        if inspect.isfunction(call):
            return call
    return fn


# The families' own packages: an error raised inside one is that family's code failing
# for want of its loop ("no running event loop"; an asyncio.Queue, Lock or Event with no
# loop: "'NoneType' object has no attribute 'create_future'"; trio on asyncio: "must be
# called from async context"). asyncio's is ASYNCIO_DIR, found without importing asyncio.
_TRIO_DIR = os.path.dirname(trio.__file__) + os.sep

# What the other family says when it meets code of this one (sniffio, trio's and asyncio's
# own checks on what a coroutine yields), whatever file raised it.
_ASYNCIO_HINTS = (
    "no running event loop",
    "no current event loop",
    "asynclibrarynotfound",
    "unrecognized yield message",
)
_TRIO_HINTS = ("got bad yield",)


def _from_other_family(exc: BaseException, package: str, hints: tuple[str, ...]) -> bool:
    text = f"{type(exc).__name__}: {exc}".lower()
    if any(hint in text for hint in hints):
        return True
    return isinstance(exc, RuntimeError | AttributeError) and _innermost_file(
        exc.__traceback__
    ).startswith(package)


def _innermost_file(tb: TracebackType | None) -> str:
    if tb is None:
        return ""
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code.co_filename


def _hinted(
    cls: type[AsyncioUnderTrio | TrioUnderAsyncio], exc: BaseException, advice: str
) -> BaseException:
    said = str(exc).strip().splitlines()
    hinted = cls(f"{type(exc).__name__}: {said[0] if said else ''} -- {advice}")
    hinted.__cause__ = exc
    hinted.__traceback__ = exc.__traceback__
    return hinted
