"""Running a trio test on either backend (docs/design.md §2), in virtual time on both.

pytest-trio runs each async test with the ``run`` of its first ``trio`` mark; a mark carried
by a parametrize value comes before the one trio mode adds, so these parameters choose the
runner per case: ``trio.run``, or ``trio_worker.run_asyncio_host`` (the test body as trio's
guest on an asyncio loop, where the worker's asyncio backend needs to run).

Virtual time on the asyncio host: asyncio tasks do not run on trio's clock, and trio's
autojump would leap ahead while an asyncio task still has work queued on the loop. A test
that asks for the ``virtual_clock`` fixture gets a :class:`HostLoopClock` instead of
``MockClock``: on ``trio.run`` it is ``MockClock(autojump_threshold=0)``; on the asyncio
host it also drives the asyncio loop's time, and it jumps only when both sides are idle, to
the earlier of trio's next deadline and asyncio's next timer. So ``asyncio.sleep``,
``asyncio.wait_for`` and the supervisor's own deadlines all run on one virtual clock, and an
asyncio handler in these tests is real asyncio code.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest
import trio
import trio.testing

import trio_worker

T = TypeVar("T")


class HostLoopClock(trio.abc.Clock):
    """Virtual time with autojump for trio as the guest of an asyncio loop, shared with it.

    While :meth:`sharing` a loop, the loop tells time by this clock, and the clock jumps
    only when both sides are idle: no trio task has run since trio last looked for work
    (``MockClock(autojump_threshold=0)``'s rule) and the loop has no callback ready. It
    jumps to the earlier of trio's next deadline and asyncio's next timer. Outside
    :meth:`sharing` it is a virtual clock that stands still.

    With ``autojump=False`` it never jumps by itself: time moves only by :meth:`jump` (the
    property suite's ``Baton``, ``tests/properties/threads.py``, is then the autojump, and
    asks :meth:`next_host_timer`). Either way, while the loop has a callback ready or a
    timer due, trio is told to look again at once, so ``wait_all_tasks_blocked`` returns
    only once both sides are idle.

    ``MockClock`` cannot be subclassed, and trio autojumps only a ``MockClock``, so the rule
    lives here, in ``deadline_to_sleep_time``, which trio calls when none of its tasks is
    runnable. It reads two private attributes of CPython's ``BaseEventLoop`` (``_ready`` and
    ``_scheduled``): there is no public way to ask an asyncio loop whether it is idle. This
    is test-only code, pinned by ``tests/test_backends.py``.
    """

    # One I/O poll after trio turns idle before a jump: thread results and the tasks
    # waiting in wait_all_tasks_blocked come first, as with MockClock.
    IDLE_LOOK = 1e-9
    # Nothing scheduled on either side: wait for events (a thread's result) this long.
    IDLE_POLL = 0.01

    def __init__(self, *, autojump: bool = True) -> None:
        self.autojump = autojump
        self._now = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._steps = 0
        self._steps_at_last_look = -1

    def start_clock(self) -> None:
        pass

    def current_time(self) -> float:
        return self._now

    def jump(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("time can't go backwards")
        self._now += seconds

    @contextlib.contextmanager
    def sharing(self, loop: asyncio.AbstractEventLoop) -> Iterator[None]:
        """Make *loop* tell time by this clock, and autojump, until the block ends."""
        counter = _StepCounter(self)
        trio.lowlevel.add_instrument(counter)
        self._loop = loop
        loop.time = self.current_time  # type: ignore[method-assign]
        try:
            yield
        finally:
            del loop.time
            self._loop = None
            trio.lowlevel.remove_instrument(counter)

    def host_busy(self) -> bool:
        """The shared loop has a callback ready to run (always False outside :meth:`sharing`)."""
        return self._loop is not None and bool(self._loop._ready)  # type: ignore[attr-defined]

    def next_host_timer(self) -> float:
        """When the shared loop's next timer is due (``math.inf``: none, or not sharing)."""
        if self._loop is None:
            return math.inf
        return min(
            (h.when() for h in self._loop._scheduled if not h.cancelled()),  # type: ignore[attr-defined]
            default=math.inf,
        )

    def deadline_to_sleep_time(self, deadline: float) -> float:
        now = self._now
        if self.host_busy():
            # A zero timeout schedules trio's next tick behind asyncio's ready callbacks,
            # and tells wait_all_tasks_blocked that the host is not idle yet.
            return 0.0
        target = min(deadline, self.next_host_timer())
        if target <= now:
            return 0.0
        if not self.autojump or self._loop is None:
            # Time moves only by jump(): wait for I/O, a thread, or wait_all_tasks_blocked.
            return 999_999_999.0
        if self._steps != self._steps_at_last_look:
            self._steps_at_last_look = self._steps
            return self.IDLE_LOOK
        if math.isinf(target):
            return self.IDLE_POLL
        self.jump(target - now)
        return 0.0


class _StepCounter(trio.abc.Instrument):
    def __init__(self, clock: HostLoopClock) -> None:
        self._clock = clock

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._clock._steps += 1


def run_on_asyncio_host(
    async_fn: Callable[..., Awaitable[T]],
    *args: Any,
    clock: trio.abc.Clock | None = None,
    instruments: tuple[trio.abc.Instrument, ...] | list[trio.abc.Instrument] = (),
) -> T:
    """``trio_worker.run_asyncio_host``, with a :class:`HostLoopClock` shared with the loop."""
    if not isinstance(clock, HostLoopClock):
        return trio_worker.run_asyncio_host(async_fn, *args, clock=clock, instruments=instruments)
    shared = clock

    async def on_shared_clock() -> T:
        with shared.sharing(asyncio.get_running_loop()):
            return await async_fn(*args)

    return trio_worker.run_asyncio_host(on_shared_clock, clock=clock, instruments=instruments)


def sleep_for(backend: str) -> Callable[[float], Awaitable[None]]:
    """The sleep an async handler on *backend* would use."""
    return asyncio.sleep if backend == "asyncio" else trio.sleep


ON_ASYNCIO_HOST = pytest.param(
    "asyncio", id="asyncio", marks=pytest.mark.trio(run=run_on_asyncio_host)
)

# The worker's async_backend, each on the host it needs.
BOTH_BACKENDS = pytest.mark.parametrize(
    "backend", [pytest.param("trio", id="trio"), ON_ASYNCIO_HOST]
)
ASYNCIO_ONLY = pytest.mark.parametrize("backend", [ON_ASYNCIO_HOST])
