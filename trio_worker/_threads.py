"""Kept threads for sync user code: one hand-off each way per call (docs/how-it-works.md).

A sync handler (and each step of a sync generator) runs in a thread so the event loop
stays live. ``trio.to_thread.run_sync`` pays for generality on every call: a capacity
limiter, its thread cache's hand-off, a message object, and the worker added one more
wake-up of the loop to learn when an abandoned thread really ended. On a 2-core machine
that was 140-180 µs of CPU per call, more than the rest of a no-op job (docs/benchmarks.md).

Here a call costs one put into an idle thread's queue and at most one ``run_sync_soon``
back, which both reports the outcome and says the thread has ended. Outcomes that finish
while the loop has not yet collected earlier ones ride the message already on its way
(:class:`_Returns`): each message is a write to trio's wake-up socket, and on a 2-core
machine a no-op call cost 78 µs of CPU with one message per call, 56 µs with them shared
(median of three runs of 8 tasks calling a no-op 3,000 times each; a whole sync job at
concurrency 8 did not move beyond the noise). Threads are kept while
they are used and leave after ``IDLE_SECONDS`` unused, as trio's own cache does.

Every piece of sync user code the worker runs comes through here (:func:`run_sync`): a
handler and each step of a sync generator (through ``_handlers.run_in_thread``, which also
waits for an abandoned thread's end), a generator's ``close()``, a sync initializer, a sync
fitness check (through :func:`in_thread`). One way in, so what holds inside one (below)
holds inside all of them.

What trio promises inside a ``trio.to_thread`` thread holds here too, through trio's
per-thread record of the calling task (the one ``to_thread`` fills): ``trio.from_thread``
finds the loop without a token, and ``trio.from_thread.check_cancelled()`` (so the public
``check_cancelled()``) raises once the waiting task is cancelled. The call is abandoned on
cancel, as with ``abandon_on_cancel=True``: the task is woken at once, and can still wait
for the thread's end (:attr:`ThreadCall.ended`).

That record is private to trio (``trio._threads``). It is looked up once, at the first
call, never at import, and only used when it has the shape described above; a trio
release that renames it gets the public path instead, ``trio.to_thread.run_sync`` with
``abandon_on_cancel=True`` (the same promises, at to_thread's cost per call), and every
worker keeps working (``tests/test_trio_internals.py``).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import queue
import threading
from collections import deque
from typing import TYPE_CHECKING, Any, NamedTuple

import outcome
import trio

if TYPE_CHECKING:
    from collections.abc import Callable


class _TrioThreadHooks(NamedTuple):
    """What trio.from_thread reads (see the module docstring), and the count
    trio.testing's active_thread_count() and wait_all_threads_completed() see, as for
    to_thread's threads."""

    parent_task_data: threading.local
    track_active_thread: Callable[[], contextlib.AbstractContextManager[object]]


@functools.cache
def trio_thread_hooks() -> _TrioThreadHooks | None:
    """trio's private per-thread record and thread count, when this trio has them as the
    kept threads use them; None otherwise (the public path, ``trio.to_thread``)."""
    try:
        from trio._threads import PARENT_TASK_DATA, _track_active_thread
    except ImportError:
        return None
    if not (isinstance(PARENT_TASK_DATA, threading.local) and callable(_track_active_thread)):
        return None
    return _TrioThreadHooks(PARENT_TASK_DATA, _track_active_thread)


IDLE_SECONDS = 10.0  # an unused kept thread leaves after this long
DEFAULT_NAME = "trio_worker sync code"
INITIALIZER_THREAD = "trio_worker initializer"

_idle: list[_KeptThread] = []


class _Returns:
    """The outcomes of one trio run's kept-thread calls, on their way back to its loop.

    A thread appends its outcome, and posts the loop one :meth:`_collect` unless one is
    already on its way (then that one collects it too). The flag is cleared before the
    collect takes anything, under the lock, so no outcome is ever left with no collect to
    come.
    """

    def __init__(self, token: trio.lowlevel.TrioToken) -> None:
        self.token = token
        self._lock = threading.Lock()
        self._outcomes: deque[tuple[ThreadCall, outcome.Outcome[Any]]] = deque()
        self._posted = False

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


def outcomes_on_their_way() -> int:
    """Outcomes of this run's kept-thread calls not yet collected by the loop (for the
    property suite's lock-step harness, which must see a thread's outcome land)."""
    try:
        return len(_RETURNS.get()._outcomes)
    except LookupError:
        return 0


def _returns() -> _Returns:
    try:
        return _RETURNS.get()
    except LookupError:
        returns = _Returns(trio.lowlevel.current_trio_token())
        _RETURNS.set(returns)
        return returns


class ThreadCall:
    """One call of sync code in a kept thread, awaited by one trio task."""

    __slots__ = (
        "_abandoned",
        "_args",
        "_context",
        "_finished",
        "_fn",
        "_lock",
        "_returns",
        "_task",
        "cancel",
        "ended",
        "name",
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
        # trio.from_thread.check_cancelled reads [0]: the task's raise_cancel once cancelled.
        self.cancel: list[Any] = [None]
        #: Set when the thread has returned, for a task that was cancelled while it ran.
        self.ended: trio.Event | None = None
        # The public path's record of the thread's end (see _run_sync_public).
        self._lock: threading.Lock | None = None
        self._finished = False

    def run(self, hooks: _TrioThreadHooks) -> outcome.Outcome[Any]:
        """In the kept thread: run the code."""
        record = hooks.parent_task_data
        record.token = self._returns.token
        record.abandon_on_cancel = True
        record.cancel_register = self.cancel
        record.task_register = [self._task]
        try:
            result: outcome.Outcome[Any] = outcome.Value(self._context.run(self._fn, *self._args))
        except BaseException as exc:
            result = outcome.Error(exc)
        finally:
            del record.token, record.abandon_on_cancel
            del record.cancel_register, record.task_register
        return result

    def run_in_to_thread(self) -> outcome.Outcome[Any]:
        """In a ``trio.to_thread`` thread (the public path): run the code, then say the
        thread has ended to a task that was cancelled meanwhile."""
        result = outcome.capture(self._context.run, self._fn, *self._args)
        assert self._lock is not None
        with self._lock:
            self._finished = True
            abandoned = self._abandoned
        if abandoned:
            with contextlib.suppress(trio.RunFinishedError):
                self._returns.token.run_sync_soon(self._set_ended)
        return result

    def abandon(self) -> None:
        """On the loop's thread (the public path): the waiting task was cancelled."""
        assert self._lock is not None
        with self._lock:
            self._abandoned = True
            self.ended = trio.Event()
            if self._finished:
                self.ended.set()

    def _set_ended(self) -> None:
        if self.ended is not None:
            self.ended.set()

    def report(self, result: outcome.Outcome[Any]) -> None:
        """In the kept thread: hand the outcome to the loop (which also learns the end)."""
        self._returns.put(self, result)

    def deliver(self, result: outcome.Outcome[Any]) -> None:
        """On the loop's thread: wake the waiting task, or say an abandoned call ended."""
        if self._abandoned:
            if self.ended is not None:
                self.ended.set()
        else:
            trio.lowlevel.reschedule(self._task, result)

    def _abort(self, raise_cancel: Any) -> trio.lowlevel.Abort:
        self._abandoned = True
        self.cancel[0] = raise_cancel
        self.ended = trio.Event()
        return trio.lowlevel.Abort.SUCCEEDED


async def run_sync(call: ThreadCall) -> Any:
    """Run *call* in a kept thread; its result, or its exception raised here.

    Cancelled while the thread runs: raises ``trio.Cancelled`` at once (the thread goes
    on; ``call.ended`` is set when it returns). The caller checks for a cancellation
    before, if one that landed first must keep the code from starting.
    """
    hooks = trio_thread_hooks()
    if hooks is None:
        return await _run_sync_public(call)
    thread = _idle.pop() if _idle else _KeptThread(hooks)
    with hooks.track_active_thread():
        thread.inbox.put(call)
        return await trio.lowlevel.wait_task_rescheduled(call._abort)


async def _run_sync_public(call: ThreadCall) -> Any:
    """:func:`run_sync` on trio's public API alone, for a trio without the hooks."""
    call._lock = threading.Lock()
    try:
        await trio.lowlevel.checkpoint_if_cancelled()
    except trio.Cancelled:
        call._finished = True  # it never starts: nothing to wait for
        call.abandon()
        raise
    try:
        result: outcome.Outcome[Any] = await trio.to_thread.run_sync(
            call.run_in_to_thread, abandon_on_cancel=True, thread_name=call.name or DEFAULT_NAME
        )
    except trio.Cancelled:
        call.abandon()
        raise
    return result.unwrap()


async def in_thread(fn: Callable[..., Any], *args: Any, name: str | None = None) -> Any:
    """Run sync *fn* in a kept thread (named *name* meanwhile, if given) unless the task
    is already cancelled; abandoned on cancel, as :func:`run_sync`. For code the worker
    runs once or rarely (an initializer, a check, a generator's ``close()``)."""
    await trio.lowlevel.checkpoint_if_cancelled()
    return await run_sync(ThreadCall(fn, args, name=name))


class _KeptThread:
    def __init__(self, hooks: _TrioThreadHooks) -> None:
        self._hooks = hooks
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
                result = call.run(self._hooks)
            else:
                self._thread.name = call.name
                try:
                    result = call.run(self._hooks)
                finally:
                    self._thread.name = DEFAULT_NAME
            # Idle again before the loop hears of the outcome, so the task woken by it
            # finds this thread free for its next call.
            _idle.append(self)
            call.report(result)
