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
goes idle, the tick here registers that descriptor with the asyncio loop (``add_reader``)
and a timer for trio's next deadline, and the loop calls trio back on either, on its own
thread, with no helper thread at all. Everything else is trio's own tick, unchanged.

This replaces a private method of trio (``GuestState.guest_tick``; trio 0.22 to 0.35 have
the same one), and only for the runs this package starts: a run whose host callback is not
:class:`HostCallSoon`, or whose I/O manager is not epoll, ticks as trio wrote it.
``tests/test_asyncio_backend.py`` checks that no helper thread is used and that every kind
of wake-up (I/O, a deadline, another thread, a signal) still reaches trio.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import trio
from outcome import Error, capture
from sniffio import thread_local as sniffio_library
from trio._core import _run

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable

_trio_guest_tick = _run.GuestState.guest_tick  # trio's own, for runs not started here


class HostCallSoon:
    """``loop.call_soon`` for ``start_guest_run``, marking the run as one whose idle waits
    happen on *loop* (see the module docstring)."""

    __slots__ = ("epoll_fd", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        #: The run's epoll descriptor, looked up at its first tick (None before it, and
        #: on a trio whose I/O manager is not epoll).
        self.epoll_fd: int | None = None

    def __call__(self, callback: Callable[[], object]) -> None:
        self.loop.call_soon(callback)


def _epoll_fd(state: Any) -> int | None:
    epoll = getattr(state.runner.io_manager, "_epoll", None)
    return None if epoll is None else int(epoll.fileno())


def guest_tick(state: Any) -> None:
    """``GuestState.guest_tick``, waiting on the host loop for runs started here."""
    host = state.run_sync_soon_not_threadsafe
    fd = None
    if isinstance(host, HostCallSoon):
        if host.epoll_fd is None:
            host.epoll_fd = _epoll_fd(state)
        fd = host.epoll_fd
    if fd is None:
        _trio_guest_tick(state)
        return
    previous, sniffio_library.name = sniffio_library.name, "trio"
    try:
        timeout = state.unrolled_run_next_send.send(state.unrolled_run_gen)
    except StopIteration:
        state.done_callback(state.runner.main_task_outcome)
        return
    except trio.TrioInternalError as exc:
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
    _IdleWait(state, host.loop, fd, timeout)


class Timer(Protocol):
    def cancel(self) -> None: ...


def start_timer(
    loop: asyncio.AbstractEventLoop, seconds: float, callback: Callable[[], object]
) -> Timer:
    """Call *callback* on *loop* after *seconds* of real time (trio's timeouts are real
    time, as the epoll wait it replaces; a test whose loop tells virtual time swaps this
    for a real-time timer, tests/backends.py)."""
    return loop.call_later(seconds, callback)


class _IdleWait:
    """One idle wait of a guest run on the host loop: whichever comes first of the epoll
    descriptor readable and trio's deadline ends it, once."""

    __slots__ = ("_fd", "_loop", "_state", "_timer")

    def __init__(
        self, state: Any, loop: asyncio.AbstractEventLoop, fd: int, timeout: float
    ) -> None:
        self._state = state
        self._loop = loop
        self._fd = fd
        loop.add_reader(fd, self._wake)
        self._timer: Timer | None = start_timer(loop, timeout, self._wake)

    def _wake(self) -> None:
        if self._timer is None:
            return  # the other of the two already ended this wait
        self._timer.cancel()
        self._timer = None
        self._loop.remove_reader(self._fd)
        state = self._state
        state.unrolled_run_next_send = capture(state.runner.io_manager.get_events, 0)
        state.runner.guest_tick_scheduled = True
        state.guest_tick()


# What the tick above reads and writes of trio's guest run; a trio without all of them
# keeps its own tick (and its helper thread).
STATE_FIELDS = frozenset(
    {"runner", "run_sync_soon_not_threadsafe", "done_callback", "unrolled_run_gen"}
    | {"unrolled_run_next_send"}
)
RUNNER_FIELDS = frozenset({"io_manager", "guest_tick_scheduled", "main_task_outcome"})


def install(state_class: type = _run.GuestState, runner_class: type = _run.Runner) -> bool:
    """Make *state_class*'s ``guest_tick`` the one above, if trio's guest run has every
    field it uses; whether it did (idempotent; runs not started here are unchanged)."""
    if not (
        _field_names(state_class) >= STATE_FIELDS
        and _field_names(runner_class) >= RUNNER_FIELDS
        and callable(getattr(state_class, "guest_tick", None))
    ):
        return False
    state_class.guest_tick = guest_tick  # type: ignore[attr-defined]
    return True


def _field_names(cls: type) -> set[str]:
    return {field.name for field in getattr(cls, "__attrs_attrs__", ())}
