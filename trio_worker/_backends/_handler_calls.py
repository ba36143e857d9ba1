"""Running the user's handler (its kind, the call, its chunks as one `Stream`), and the kept
threads every piece of sync user code runs in (docs/how-it-works.md, the module map;
docs/reference.md, "Handlers and initializers" and ``check_cancelled``).

A kept-thread call costs one put into an idle thread's queue and at most one
``run_sync_soon`` back, shared by the outcomes that finish before the loop collects them
(:class:`_Returns`), where ``trio.to_thread.run_sync`` pays for a limiter, its cache's
hand-off and a message per call. Idle threads leave after ``IDLE_SECONDS``, as trio's do.
A call is abandoned on cancel, as with ``abandon_on_cancel=True``: the task is woken by
``wait_task_rescheduled``'s abort, may still wait for :attr:`ThreadCall.ended`, and
:func:`check_cancelled` raises in the thread with the ``raise_cancel`` of that abort.
"""

from __future__ import annotations

import contextvars
import enum
import inspect
import queue
import threading
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Iterator
from typing import TYPE_CHECKING, Any

import outcome
import trio

from .._config import DEFAULT_SYNC_CLOSE_BOUND
from .._exceptions import exception_leaves
from ._interface import unwrap_callable as _unwrap

if TYPE_CHECKING:
    from .._scopes import Scopes
    from ._interface import Backend

Handler = Callable[[dict[str, Any]], Any]


class HandlerKind(enum.Enum):
    SYNC = "sync"
    ASYNC = "async"
    SYNC_GENERATOR = "sync generator"
    ASYNC_GENERATOR = "async generator"


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
    """Run sync *fn* in a kept thread (:func:`run_sync`); when cancelled, wait for the
    thread to end, or for the grace to (*waits*), before ``trio.Cancelled`` propagates."""
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
        """Let the chunks reach *offer* where they are yielded (:meth:`Backend.hand_off`):
        a chunk *offer* takes (True) is not read from this stream."""
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
    (whose generator gets *close_bound* seconds for its cleanup when left early). A
    coroutine or an async generator it makes runs on *backend*; its exceptions propagate."""
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


# --- kept threads ----------------------------------------------------------------------------

IDLE_SECONDS = 10.0  # an unused kept thread leaves after this long
DEFAULT_NAME = "trio_worker sync code"
INITIALIZER_THREAD = "trio_worker initializer"

_idle: list[_KeptThread] = []
# The call whose code runs in this context (check_cancelled): set only while it runs, in
# the call's own copy of its task's context.
_CALL: contextvars.ContextVar[ThreadCall | None] = contextvars.ContextVar(
    "trio_worker_thread_call", default=None
)


def check_cancelled() -> None:
    """Raise ``trio.Cancelled`` in a sync handler's thread once its job has been stopped.

    Call it now and then from long sync work. It also works in a thread the handler starts
    in a copy of its context (``contextvars.copy_context().run``), and in one that
    ``trio.to_thread`` started; anywhere else it does nothing (docs/reference.md).
    """
    call = _CALL.get()
    if call is not None:
        raise_cancel = call.raise_cancel
        if raise_cancel is not None:
            raise_cancel()
        return
    try:
        trio.from_thread.check_cancelled()
    except RuntimeError:
        return  # not a thread of trio's either: nothing can be cancelled here


def in_kept_thread() -> bool:
    """Whether the caller runs the code of a kept-thread call (or a thread that code
    started in a copy of its context)."""
    return _CALL.get() is not None


class _Returns:
    """The outcomes of one trio run's kept-thread calls, on their way back to its loop.

    A thread appends its outcome, and posts one :meth:`_collect` unless one is on its way.
    The flag is cleared, under the lock, before the collect takes anything, so no outcome
    is ever left with no collect to come.
    """

    def __init__(self, token: trio.lowlevel.TrioToken) -> None:
        self.token = token
        self._lock = threading.Lock()
        self._outcomes: deque[tuple[ThreadCall, outcome.Outcome[Any]]] = deque()
        self._posted = False
        #: Calls a task is waiting for (not abandoned): read on the loop's thread.
        self.waited = 0

    def put(self, call: ThreadCall, result: outcome.Outcome[Any]) -> None:
        """In a kept thread: hand *result* to the loop."""
        self._outcomes.append((call, result))
        with self._lock:
            if self._posted:
                return
            self._posted = True
        try:
            self.token.run_sync_soon(self._collect)
        except trio.RunFinishedError:
            pass  # the loop is gone: nobody waits for it any more

    def _collect(self) -> None:
        # On the loop's thread, as is ThreadCall._abort: the two never interleave.
        with self._lock:
            self._posted = False
        outcomes = self._outcomes
        while outcomes:
            call, result = outcomes.popleft()
            call.deliver(result)


_RETURNS: trio.lowlevel.RunVar[_Returns] = trio.lowlevel.RunVar("trio_worker_thread_returns")


def _returns() -> _Returns:
    try:
        return _RETURNS.get()
    except LookupError:
        returns = _Returns(trio.lowlevel.current_trio_token())
        _RETURNS.set(returns)
        return returns


def outcomes_on_their_way() -> int:
    """Outcomes of this run's kept-thread calls not yet collected by the loop (for the
    property suite's lock-step harness, which must see a thread's outcome land)."""
    try:
        return len(_RETURNS.get()._outcomes)
    except LookupError:
        return 0


def calls_waited_for() -> int:
    """This run's kept-thread calls whose task still waits for them (an abandoned call no
    longer counts): what the property suite's harness counts as hosted threads."""
    try:
        return _RETURNS.get().waited
    except LookupError:
        return 0


class ThreadCall:
    """One call of sync code in a kept thread, awaited by one trio task."""

    __slots__ = (
        "_abandoned",
        "_args",
        "_context",
        "_fn",
        "_returns",
        "_task",
        "ended",
        "name",
        "raise_cancel",
    )

    def __init__(
        self, fn: Callable[..., Any], args: tuple[Any, ...], *, name: str | None = None
    ) -> None:
        self._fn = fn
        self._args = args
        self.name = name  # the thread's name while it runs this call, if not the default
        self._context = contextvars.copy_context()
        self._returns = _returns()
        self._task = trio.lowlevel.current_task()
        self._abandoned = False
        #: Once the waiting task is cancelled: raises its cancellation (check_cancelled).
        self.raise_cancel: Callable[[], object] | None = None
        #: Set when the thread has returned, for a task that was cancelled while it ran.
        self.ended: trio.Event | None = None

    def run(self) -> outcome.Outcome[Any]:
        """In the kept thread: run the code."""
        return outcome.capture(self._context.run, self._run_here)

    def _run_here(self) -> Any:
        # Reset after the call, so the context does not keep the call alive (nor the call
        # its context); a copy the code made meanwhile keeps its own reference.
        token = _CALL.set(self)
        try:
            return self._fn(*self._args)
        finally:
            _CALL.reset(token)

    def deliver(self, result: outcome.Outcome[Any]) -> None:
        """On the loop's thread: wake the waiting task, or say an abandoned call ended."""
        if self._abandoned:
            if self.ended is not None:
                self.ended.set()
            return
        self._returns.waited -= 1
        trio.lowlevel.reschedule(self._task, result)

    def _abort(self, raise_cancel: Callable[[], object]) -> trio.lowlevel.Abort:
        self._abandoned = True
        self._returns.waited -= 1
        self.raise_cancel = raise_cancel
        self.ended = trio.Event()
        return trio.lowlevel.Abort.SUCCEEDED


async def run_sync(call: ThreadCall) -> Any:
    """Run *call* in a kept thread; its result, or its exception raised here.

    Cancelled while the thread runs: raises ``trio.Cancelled`` at once (the thread goes
    on; ``call.ended`` is set when it returns). It does not check for a cancellation
    first: a caller that must not start the code once cancelled does.
    """
    thread = _idle.pop() if _idle else _KeptThread()
    call._returns.waited += 1
    thread.inbox.put(call)
    return await trio.lowlevel.wait_task_rescheduled(call._abort)


async def in_thread(fn: Callable[..., Any], *args: Any, name: str | None = None) -> Any:
    """Run sync *fn* in a kept thread (named *name* meanwhile, if given) unless the task
    is already cancelled; abandoned on cancel, as :func:`run_sync`. For code the worker
    runs once or rarely (an initializer, a check, a generator's ``close()``)."""
    await trio.lowlevel.checkpoint_if_cancelled()
    return await run_sync(ThreadCall(fn, args, name=name))


class _KeptThread:
    def __init__(self) -> None:
        self.inbox: queue.SimpleQueue[ThreadCall] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=DEFAULT_NAME, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                call = self.inbox.get(timeout=IDLE_SECONDS)
            except queue.Empty:
                try:
                    _idle.remove(self)
                except ValueError:
                    continue  # taken off the idle list just now: its call is on the way
                return
            if call.name is None:
                result = call.run()
            else:
                self._thread.name = call.name
                try:
                    result = call.run()
                finally:
                    self._thread.name = DEFAULT_NAME
            # Idle again before the loop hears of the outcome, so the task woken by it
            # finds this thread free for its next call.
            _idle.append(self)
            call._returns.put(call, result)
