"""Sync user code in real threads, kept deterministic under a virtual clock.

The worker runs sync handlers, each step of a sync generator, a generator's ``close()`` and
a sync initializer in its kept threads (``trio_worker/_backends/_handler_calls.py``).
``MockClock``'s autojump only sees trio tasks: while a thread works, trio looks idle and the
clock would jump, and the thread's messages back to the loop would land in whichever loop
iteration the OS allows. Both would make an example depend on wall-clock luck. The `Baton`
removes both:

* **Virtual waits.** The harness's thread code never sleeps for real: it *parks* on the
  baton for a virtual duration (forever for a hang). Parked threads do nothing, so they
  cannot race the loop.
* **Lock-step.** A parked thread is resumed only by the baton's service task, only when every
  trio task is blocked (``trio.testing.wait_all_tasks_blocked``), one thread at a time in a
  fixed order, and the trio thread *blocks* until that thread parks again or returns. So the
  thread's code (its records, ``check_cancelled()``, its result) happens at one well-defined
  point of the virtual instant. A returning thread's outcome is waited for until it is on
  its way to the loop (in a message of its own, or added to one already queued: kept
  threads share one, ``trio_worker/_backends/_handler_calls.py``) before the loop runs on.
* **Thread starts.** A thread the worker starts is seen at once: an instrument blocks the
  trio thread after the step that started it (``calls_waited_for`` grew)
  until the thread parks on the baton, or has posted its result (``close()`` of a finished
  generator runs none of our code).
* **The clock.** The service is the autojump: when every task is blocked and no thread is
  on its way in or out, it jumps to the next trio deadline or parked thread's wake-up (or,
  on the asyncio host, the loop's next timer: the clock is then a
  ``HostLoopClock(autojump=False)``, ``tests/backends.py``, under which
  ``wait_all_tasks_blocked`` returns only once the host loop is idle too).
* **Abandonment.** The worker abandons a thread when its host task is cancelled: that
  call stops counting in ``calls_waited_for`` at once. When the count falls
  below the threads the baton believes hosted, each parked thread is *probed*: it calls
  ``check_cancelled()`` (in lock-step) and learns it was abandoned. A cooperative thread then
  stops (``trio.Cancelled`` from ``check_cancelled()``); one that ignores cancellation parks on.

Beyond the kept threads' own counts (``calls_waited_for``, ``outcomes_on_their_way``) and
their record of the call they run (``in_kept_thread``), only public trio API is used:
``trio.testing.wait_all_tasks_blocked``/``MockClock.jump``,
``trio.lowlevel.current_statistics`` and ``add_instrument`` (on the asyncio host, the
``HostLoopClock`` reads the loop's private ready queue and timers).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import trio
import trio.testing

import trio_worker
from trio_worker._backends._handler_calls import (
    calls_waited_for,
    in_kept_thread,
    outcomes_on_their_way,
)

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["Baton", "Lane", "RunOver", "in_worker_thread"]

# Real seconds a lock-step hand-over may take before the harness calls it a hang.
HANDOVER_LIMIT = 10.0
# Real seconds the service waits between looks while a thread is on its way in or out.
CUSHION = 0.0002


def _queued() -> int:
    return trio.lowlevel.current_statistics().run_sync_soon_queue_size


def _landed(queued: int, on_way: int) -> bool:
    """Whether a thread's outcome reached the loop since *queued* messages and *on_way*
    outcomes were counted: a message of its own, or its outcome added to one already
    queued (kept threads share a message, ``trio_worker/_backends/_handler_calls.py``). The
    loop's thread is blocked meanwhile, so neither count can fall."""
    return _queued() > queued or (outcomes_on_their_way() > on_way and _queued() >= 1)


class RunOver(BaseException):
    """Raised in a thread still parked when the run ends: its process would be gone."""


@dataclass(eq=False)
class Parked:
    """One thread the worker started, as the baton sees it."""

    key: tuple[str, int]
    cooperative: bool
    state: str = "parked"  # parked | running | done
    delay: float = 0.0  # virtual seconds to wait, counted when the service sees the park
    wake_at: float | None = None
    reply: object = None
    hosted: bool = True


@dataclass(frozen=True)
class _Probe:
    now: float


class Jumps(Protocol):
    """A clock that moves only when told (``MockClock()``, ``HostLoopClock(autojump=False)``)."""

    def jump(self, seconds: float) -> None: ...


def _no_timer() -> float:
    return math.inf


class Baton(trio.abc.Instrument):
    """The service task, instrument and thread-side API described in the module docstring.

    *host_timer* tells when the asyncio host loop's next timer is due (the asyncio backend's
    user code waits on those): the clock never jumps past it.
    """

    def __init__(self, clock: Jumps, *, host_timer: Callable[[], float] = _no_timer) -> None:
        self.clock = clock
        self.host_timer = host_timer
        self._cond = threading.Condition()
        self._threads: list[Parked] = []
        self._entered = 0
        self._before: tuple[int, int, int, int] = (0, 0, 0, 0)
        self.closed = False

    # -- thread side -------------------------------------------------------------------

    def enter(self, key: tuple[str, int], *, cooperative: bool) -> tuple[Parked, float]:
        """Register the calling thread and wait for its turn; returns the virtual time."""
        me = Parked(key, cooperative)
        with self._cond:
            if self.closed:
                raise RunOver
            self._threads.append(me)
            self._entered += 1
            self._cond.notify_all()
            return me, self._wait(me)

    def sleep(self, me: Parked, delay: float) -> float:
        """Park for *delay* virtual seconds (math.inf: until the run ends)."""
        with self._cond:
            me.delay, me.wake_at, me.state = delay, None, "parked"
            self._cond.notify_all()
            return self._wait(me)

    def done(self, me: Parked) -> None:
        """The thread leaves the harness's code (it returns or raises to the worker)."""
        with self._cond:
            me.state = "done"
            self._cond.notify_all()

    def _wait(self, me: Parked) -> float:
        while True:
            self._cond.wait_for(lambda: me.state != "parked")
            reply = me.reply
            if reply is RunOver:
                me.state = "done"
                raise RunOver
            if isinstance(reply, _Probe):
                me.hosted = _still_hosted()
                if me.hosted or not me.cooperative:
                    me.state = "parked"
                    self._cond.notify_all()
                    continue
                return reply.now  # the caller's check_cancelled() raises trio.Cancelled
            assert isinstance(reply, float)
            return reply

    # -- instrument: a thread the worker just started ------------------------------------

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._before = (
            calls_waited_for(),
            self._entered,
            _queued(),
            outcomes_on_their_way(),
        )

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        count, entered, queued, on_way = self._before
        if calls_waited_for() <= count:
            return
        # The step started a thread: let it reach the baton (or post its result) first.
        self._until(
            lambda: self._entered > entered or _landed(queued, on_way),
            "a new thread to reach the baton",
        )

    # -- the service (also the autojump) -----------------------------------------------

    async def run(self) -> None:
        trio.lowlevel.add_instrument(self)
        try:
            busy_since = math.inf
            while True:
                await trio.testing.wait_all_tasks_blocked()
                if self._step():
                    continue
                if self._busy():
                    busy_since = min(busy_since, time.monotonic())
                    if time.monotonic() - busy_since > HANDOVER_LIMIT:
                        raise RuntimeError(f"a thread stayed on its way for {HANDOVER_LIMIT}s")
                    await trio.testing.wait_all_tasks_blocked(CUSHION)
                    continue
                busy_since = math.inf
                self._jump()
        finally:
            trio.lowlevel.remove_instrument(self)
            self._release_all()

    def _live(self) -> list[Parked]:
        self._threads = [t for t in self._threads if t.state != "done"]
        return self._threads

    def _step(self) -> bool:
        """At an idle instant: probe, or resume the first thread due. True if it did."""
        now = trio.current_time()
        with self._cond:
            live = self._live()
            for t in live:
                if t.wake_at is None:
                    t.wake_at = now + t.delay
            hosted = sorted((t for t in live if t.hosted), key=lambda t: t.key)
            if calls_waited_for() < len(hosted):
                for t in hosted:
                    self._resume(t, _Probe(now))
                return True
            due = [t for t in live if t.wake_at is not None and t.wake_at <= now]
            if not due:
                return False
            self._resume(min(due, key=lambda t: t.key), now)
        return True

    def _resume(self, t: Parked, reply: object) -> None:
        """Hand the turn to *t* and block until it parks again or has fully returned."""
        queued, on_way = _queued(), outcomes_on_their_way()
        t.reply, t.state = reply, "running"
        self._cond.notify_all()
        if not self._cond.wait_for(lambda: t.state != "running", HANDOVER_LIMIT):
            raise RuntimeError(f"harness thread {t.key} did not park within {HANDOVER_LIMIT}s")
        if t.state == "done":
            self._until(
                lambda: _landed(queued, on_way),
                f"the result of harness thread {t.key}",
                locked=True,
            )

    def _until(self, ready: Callable[[], bool], what: str, *, locked: bool = False) -> None:
        """Block the trio thread until *ready*; a thread's hand-over takes microseconds."""
        limit = time.monotonic() + HANDOVER_LIMIT
        while not ready():
            if time.monotonic() > limit:
                raise RuntimeError(f"waited {HANDOVER_LIMIT}s for {what}")
            if locked:
                self._cond.wait(0.00005)
            else:
                time.sleep(0.00005)

    def _busy(self) -> bool:
        """A thread is on its way out (its result not yet collected by its host task)."""
        if _queued() or outcomes_on_their_way():
            return True
        with self._cond:
            hosted = sum(1 for t in self._live() if t.hosted)
        return calls_waited_for() > hosted

    def _jump(self) -> None:
        with self._cond:
            wakes = [t.wake_at for t in self._live() if t.wake_at is not None]
        now = trio.current_time()
        jump = trio.lowlevel.current_statistics().seconds_to_next_deadline
        jump = min([jump, self.host_timer() - now, *(w - now for w in wakes)])
        if 0 < jump < math.inf:
            self.clock.jump(jump)

    def _release_all(self) -> None:
        with self._cond:
            self.closed = True
            for t in self._live():
                t.reply, t.state = RunOver, "running"
            self._cond.notify_all()


def _still_hosted() -> bool:
    """In a worker thread: False once its host task was cancelled (and so abandoned it)."""
    try:
        trio_worker.check_cancelled()
    except trio.Cancelled:
        return False
    return True


def in_worker_thread() -> bool:
    """True in a thread the worker started (not when the garbage collector closes a
    generator on the trio thread or after the run)."""
    return in_kept_thread()


class Lane:
    """One job's (or the initializer's) sync code, across the threads that run it."""

    def __init__(self, baton: Baton, name: str, *, cooperative: bool) -> None:
        self.baton = baton
        self.name = name
        self.cooperative = cooperative
        self.now = math.nan
        self._me: Parked | None = None
        self._count = 0

    def enter(self) -> float:
        self._count += 1
        key = (self.name, self._count)
        self._me, self.now = self.baton.enter(key, cooperative=self.cooperative)
        return self.now

    def nap(self, delay: float) -> float:
        """Wait *delay* virtual seconds; a cooperative thread then calls check_cancelled()."""
        assert self._me is not None
        self.now = self.baton.sleep(self._me, delay)
        if self.cooperative:
            trio_worker.check_cancelled()
        return self.now

    def leave(self) -> None:
        if self._me is not None:
            self.baton.done(self._me)
            self._me = None
