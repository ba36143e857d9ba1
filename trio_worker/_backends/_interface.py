"""What the worker asks of the loop that runs the user's async code (:class:`Backend`),
which one it picks (:func:`default_backend`), and the words it has for code of the other
family (:func:`hinted`)."""

from __future__ import annotations

import functools
import inspect
import math
import os
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

import trio

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable
    from contextlib import AbstractContextManager
    from types import TracebackType

    from .._exceptions import AsyncioUnderTrio, TrioUnderAsyncio

    Initializer = Callable[[], Any]

T = TypeVar("T")

AsyncBackend = Literal["trio", "asyncio"]


class Holds(Protocol):
    """Where a cancelled caller waits for code that has not ended yet (``Scopes``):
    never past the end of the shutdown grace."""

    def shielded(self, bound: float = ...) -> AbstractContextManager[trio.CancelScope]: ...

    def bounded(self, bound: float) -> AbstractContextManager[trio.CancelScope]: ...


class Backend(ABC):
    """What the worker asks of the loop that runs the user's async code."""

    name: AsyncBackend
    #: Seconds a round of stream chunks waits for more streams' chunks, unless every open
    #: stream boards sooner (docs/protocol.md §2.4, "Streams share writes").
    round_linger: float

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
        *cancel_bound* seconds (default: no bound) and no later than the end of the grace
        (*waits*)."""

    @abstractmethod
    def chunks(
        self, source: AsyncIterator[Any], *, close_bound: float, waits: Holds
    ) -> AsyncIterator[Any]:
        """The chunks of an async generator the handler made, read from trio."""

    @abstractmethod
    def hand_off(self, chunks: AsyncIterator[Any], offer: Callable[[Any], bool]) -> None:
        """From now on, let *chunks* (made by :meth:`chunks`) give each chunk to *offer*
        where it is yielded, while their reader waits for one, instead of waking the
        reader's task; a chunk *offer* refuses (False) is read as before. Nothing to do
        where async generators run in their reader's own task."""

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
TRIO_DIR = os.path.dirname(trio.__file__) + os.sep

# What the other family says when it meets code of this one (sniffio, trio's and asyncio's
# own checks on what a coroutine yields), whatever file raised it.
ASYNCIO_HINTS = (
    "no running event loop",
    "no current event loop",
    "asynclibrarynotfound",
    "unrecognized yield message",
)
TRIO_HINTS = ("got bad yield",)


def hinted(
    exc: BaseException,
    *,
    family_dir: str,
    hints: tuple[str, ...],
    cls: type[AsyncioUnderTrio | TrioUnderAsyncio],
    advice: str,
) -> BaseException:
    """*exc*, or a *cls* saying ``<type>: <first line> -- <advice>`` (chained from *exc*)
    when *exc* is code of the family in *family_dir* failing for want of its loop."""
    if not _from_other_family(exc, family_dir, hints):
        return exc
    said = str(exc).strip().splitlines()
    explained = cls(f"{type(exc).__name__}: {said[0] if said else ''} -- {advice}")
    explained.__cause__ = exc
    explained.__traceback__ = exc.__traceback__
    return explained


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
