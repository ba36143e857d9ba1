"""trio as asyncio's guest, waiting for its I/O on the host loop instead of in a thread.

In guest mode (``trio.lowlevel.start_guest_run``) trio runs its tasks in callbacks of the
host loop, and when it has nothing to run it waits for its I/O in a helper thread, which
hands the events back through ``call_soon_threadsafe``. Each such idle costs a thread
hand-off each way: on a 2-core machine that was most of the asyncio backend's CPU per
paced stream chunk and per no-op job beside the trio backend (docs/benchmarks.md,
"Where the CPU went").

On Linux trio's I/O manager is an epoll object, and an epoll object's own descriptor is
readable while any of its descriptors is ready, wake-ups from other threads and signals
included (they write to a socket it watches). So the host loop can watch it: when trio
goes idle, the tick here has the asyncio loop watch that descriptor (``add_reader``, once
per run) and set a timer for trio's next deadline, and the loop calls trio back on either,
on its own thread, with no helper thread at all. A task scheduled while trio idles (an
asyncio callback setting a ``trio.Event``: each chunk of an async generator, each asyncio
task's end) wakes it with a callback on the loop, not a byte through trio's wake-up
socket. Everything else is trio's own tick, unchanged.

This replaces two private methods of trio (``GuestState.guest_tick`` and
``Runner.force_guest_tick_asap``; trio 0.22 to 0.35 have the same ones), and only for the
runs this package starts: a run whose host callback is not
:class:`HostCallSoon`, or whose I/O manager is not epoll, ticks as trio wrote it.
``tests/test_asyncio_backend.py`` checks that no helper thread is used and that every kind
of wake-up (I/O, a deadline, another thread, a signal) still reaches trio.

trio's private module is looked up only by :func:`install`, when the first asyncio-backend
worker starts, never at import: a trio release that renames it, or any field the tick
uses, leaves trio's own tick in place (the public path, a helper thread per idle wait)
and every worker working (``tests/test_trio_internals.py``).
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Protocol

import trio
from outcome import Error, capture
from sniffio import thread_local as sniffio_library

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable

# trio's own, for runs not started here: found by install(), which replaces them.
_trio_guest_tick: Callable[[Any], None] | None = None
_trio_force_guest_tick_asap: Callable[[Any], None] | None = None


class HostCallSoon:
    """``loop.call_soon`` for ``start_guest_run``, marking the run as one whose idle waits
    happen on *loop* (see the module docstring)."""

    __slots__ = ("loop", "waits")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        #: The run's waits on the loop, made at its first tick (None before it, and on a
        #: trio whose I/O manager is not epoll, which keeps trio's own tick).
        self.waits: _HostWaits | None = None

    def __call__(self, callback: Callable[[], object]) -> None:
        self.loop.call_soon(callback)


def _epoll_fd(state: Any) -> int | None:
    epoll = getattr(state.runner.io_manager, "_epoll", None)
    return None if epoll is None else int(epoll.fileno())


# The runs started here, by runner, for the wake-up below (a run leaves at its end).
_RUNS: weakref.WeakKeyDictionary[Any, _HostWaits] = weakref.WeakKeyDictionary()


def guest_tick(state: Any) -> None:
    """``GuestState.guest_tick``, waiting on the host loop for runs started here."""
    host = state.run_sync_soon_not_threadsafe
    waits = None
    if isinstance(host, HostCallSoon):
        if host.waits is None:
            fd = _epoll_fd(state)
            if fd is not None:
                host.waits = _RUNS[state.runner] = _HostWaits(state, host.loop, fd)
        waits = host.waits
    if waits is None:
        assert _trio_guest_tick is not None  # installed, so found
        _trio_guest_tick(state)
        return
    previous, sniffio_library.name = sniffio_library.name, "trio"
    try:
        timeout = state.unrolled_run_next_send.send(state.unrolled_run_gen)
    except StopIteration:
        waits.close()
        state.done_callback(state.runner.main_task_outcome)
        return
    except trio.TrioInternalError as exc:
        waits.close()
        state.done_callback(Error(exc))
        return
    finally:
        sniffio_library.name = previous

    events = capture(state.runner.io_manager.get_events, 0)
    if timeout <= 0 or isinstance(events, Error) or events.value:
        state.unrolled_run_next_send = events
        state.runner.guest_tick_scheduled = True
        host.loop.call_soon(state.guest_tick)
        return
    # Idle: the host loop wakes trio when its epoll has an event or its deadline comes.
    state.runner.guest_tick_scheduled = False
    waits.idle(timeout)


def force_guest_tick_asap(runner: Any) -> None:
    """``Runner.force_guest_tick_asap``: what trio calls when a task is scheduled (or its
    next deadline moves) while the run is idle. trio's own writes a byte to its wake-up
    socket, so that the thread waiting in epoll returns; a run waiting on this thread's
    host loop is woken with a callback instead, sparing the write, the loop's poll that
    sees it and trio's read of it. On the asyncio backend that is every chunk an async
    generator yields while trio idles, and every asyncio task that ends."""
    if runner.guest_tick_scheduled:
        return
    waits = _RUNS.get(runner)
    if (waits is None or not waits.wake_soon()) and _trio_force_guest_tick_asap is not None:
        _trio_force_guest_tick_asap(runner)


class Timer(Protocol):
    def cancel(self) -> None: ...


def start_timer(
    loop: asyncio.AbstractEventLoop, seconds: float, callback: Callable[[], object]
) -> Timer:
    """Call *callback* on *loop* after *seconds* of real time (trio's timeouts are real
    time, as the epoll wait it replaces; a test whose loop tells virtual time swaps this
    for a real-time timer, tests/backends.py)."""
    return loop.call_later(seconds, callback)


class _HostWaits:
    """A guest run's idle waits on the host loop: each ends, once, at whichever comes
    first of the epoll descriptor readable, trio's deadline and :meth:`wake_soon`.

    The descriptor stays registered with the loop from the run's first idle wait to its
    end, rather than added and removed at each (two ``epoll_ctl`` calls and the loop's
    bookkeeping, per chunk of a paced stream): between waits trio polls its epoll itself
    at every tick, so the loop sees it readable only for events trio is about to take,
    and the callback then finds no wait to end."""

    __slots__ = ("_fd", "_idle_now", "_loop", "_reading", "_state", "_timer")

    def __init__(self, state: Any, loop: asyncio.AbstractEventLoop, fd: int) -> None:
        self._state = state
        self._loop = loop
        self._fd = fd
        self._reading = False
        self._timer: Timer | None = None
        self._idle_now = False

    def idle(self, timeout: float) -> None:
        if not self._reading:
            self._loop.add_reader(self._fd, self._wake)
            self._reading = True
        self._idle_now = True
        self._timer = start_timer(self._loop, timeout, self._wake)

    def wake_soon(self) -> bool:
        """End the wait now; trio ticks at the loop's next turn. False if the run is not
        waiting on its loop (then trio's own wake-up is needed)."""
        if not self._end_wait():
            return False
        self._state.runner.guest_tick_scheduled = True
        self._loop.call_soon(self._tick)
        return True

    def close(self) -> None:
        """The run ended: its epoll is closed, so the loop stops watching it."""
        self._end_wait()
        if self._reading:
            self._reading = False
            self._loop.remove_reader(self._fd)
        _RUNS.pop(self._state.runner, None)

    def _end_wait(self) -> bool:
        if not self._idle_now:
            return False
        self._idle_now = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        return True

    def _wake(self) -> None:
        if self._end_wait():  # else: an event trio's next tick takes anyway
            self._state.runner.guest_tick_scheduled = True
            self._tick()

    def _tick(self) -> None:
        state = self._state
        state.unrolled_run_next_send = capture(state.runner.io_manager.get_events, 0)
        state.guest_tick()


# What the tick above reads and writes of trio's guest run; a trio without all of them
# keeps its own tick (and its helper thread).
STATE_FIELDS = frozenset(
    {"runner", "run_sync_soon_not_threadsafe", "done_callback", "unrolled_run_gen"}
    | {"unrolled_run_next_send"}
)
RUNNER_FIELDS = frozenset({"io_manager", "guest_tick_scheduled", "main_task_outcome"})


def install(state_class: type | None = None, runner_class: type | None = None) -> bool:
    """Make trio's ``GuestState.guest_tick`` (or *state_class*'s) the one above, if this
    trio's guest run has every field it uses; whether it did (idempotent; runs not started
    here are unchanged). Never raises: a trio without these names keeps its own tick."""
    global _trio_guest_tick, _trio_force_guest_tick_asap
    try:
        from trio._core import _run  # private: looked up here, guarded, never at import
    except ImportError:
        return False
    if state_class is None:
        state_class = getattr(_run, "GuestState", None)
    if runner_class is None:
        runner_class = getattr(_run, "Runner", None)
    if state_class is None or runner_class is None:
        return False
    trios_tick = getattr(state_class, "guest_tick", None)
    if not (
        _field_names(state_class) >= STATE_FIELDS
        and _field_names(runner_class) >= RUNNER_FIELDS
        and callable(trios_tick)
    ):
        return False
    if trios_tick is not guest_tick:  # not installed yet: this is trio's own
        _trio_guest_tick = trios_tick
    state_class.guest_tick = guest_tick  # type: ignore[attr-defined]
    # Without it (a trio that renamed it) a scheduled task still wakes the run, through
    # trio's wake-up socket as before.
    trios_force = getattr(runner_class, "force_guest_tick_asap", None)
    if callable(trios_force):
        if trios_force is not force_guest_tick_asap:
            _trio_force_guest_tick_asap = trios_force
        runner_class.force_guest_tick_asap = force_guest_tick_asap  # type: ignore[attr-defined]
    return True


def _field_names(cls: type) -> set[str]:
    return {field.name for field in getattr(cls, "__attrs_attrs__", ())}
