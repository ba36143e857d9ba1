"""When the worker stops, and by when every wait must end: one plan every wait reads.

Theory of operation
-------------------
A worker stops for one of three reasons (docs/design.md §6, §9): a shutdown (SIGTERM, a
handler's ``SystemExit``, ``refresh_worker``) gives running jobs ``shutdown_grace``; an
init failure fails every held job at once; a cancellation of the whole worker (``serve()``
cancelled, a second SIGINT) cuts what is still in flight. :class:`ShutdownPlan` records
which, and when (its phase, reason and deadlines), and it is the only place that does: the
supervisor calls :meth:`~ShutdownPlan.drain`, :meth:`~ShutdownPlan.fail_init` or
:meth:`~ShutdownPlan.cut`, and every wait reads the plan.

A wait reads it in one of two ways:

* A cancel scope *bound* to the plan (:meth:`~ShutdownPlan.open_scope`,
  :meth:`~ShutdownPlan.bind`) carries a deadline computed from the plan by a rule of its
  own, and the plan moves it earlier whenever it changes. The take, each job's scope, each
  terminal report's shield (never before its ``report_deadline`` floor), each progress post
  and the initializer are bound this way; the thread waits follow :attr:`grace_end` through
  a listener (:meth:`~ShutdownPlan.subscribe`).
* A retry's wait (:meth:`~ShutdownPlan.wait_to_retry`) ends at the time asked for, or
  early enough for one last attempt before the deadline of the scope it runs in, and it
  wakes when the plan changes to check that again: a ``Retry-After: 30`` met 20 s before
  the grace ends becomes one last attempt before the grace ends, not a sleep through it.

Deadlines only ever move earlier. The plan does no I/O and starts no task.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from types import TracebackType

    from ._config import Timings

__all__ = ["Rule", "ShutdownPlan", "StopPhase"]

#: A bound scope's deadline, as a function of the plan (its own fixed bound closed over).
Rule = Callable[["ShutdownPlan"], float]


class StopPhase(enum.Enum):
    SERVING = "serving"  # no stop asked for: every deadline is infinite
    DRAINING = "draining"  # a shutdown: running jobs get shutdown_grace
    INIT_FAILED = "init_failed"  # every held job is failed now; a take gets claim_grace
    CUT = "cut"  # the whole worker was cancelled: what is in flight ends now


class ShutdownPlan:
    """The worker's stop: why, by when, and the deadlines each kind of wait reads.

    * :attr:`deadline`: when every wait ends; a terminal report still gets its
      ``report_deadline`` from its start (:meth:`report_deadline`).
    * :attr:`grace_end`: the end of a shutdown's grace (infinite without one): the jobs'
      scopes and the waits for their threads end by then.
    * :attr:`take_end`: by when a take in flight ends (``take_drain`` into a shutdown,
      ``claim_grace`` after an init failure).

    Example::

        >>> from trio_worker import Timings
        >>> plan = ShutdownPlan(Timings(shutdown_grace=20.0, take_drain=0.5))
        >>> plan.drain("SIGTERM", now=100.0)
        True
        >>> plan.phase, plan.deadline, plan.take_end
        (<StopPhase.DRAINING: 'draining'>, 120.0, 100.5)
    """

    def __init__(self, timings: Timings) -> None:
        self.timings = timings
        self.phase = StopPhase.SERVING
        self.reason = ""
        self.deadline = math.inf
        self.grace_end = math.inf
        self.take_end = math.inf
        self._scopes: dict[trio.CancelScope, Rule] = {}
        self._listeners: list[Callable[[ShutdownPlan], None]] = []
        self._changed = trio.Event()

    def __repr__(self) -> str:
        return (
            f"<ShutdownPlan {self.phase.value} reason={self.reason!r} "
            f"deadline={self.deadline:.3f} grace_end={self.grace_end:.3f} "
            f"take_end={self.take_end:.3f} scopes={len(self._scopes)}>"
        )

    @property
    def stopping(self) -> bool:
        return self.phase is not StopPhase.SERVING

    # -- the three ways to stop -----------------------------------------------------------

    def drain(self, reason: str, *, now: float) -> bool:
        """A shutdown from *now*: False (and nothing changes) when one is under way."""
        if self.grace_end < math.inf:
            return False
        timings = self.timings
        self.phase, self.reason = StopPhase.DRAINING, reason
        self.grace_end = now + timings.shutdown_grace
        self.deadline = min(self.deadline, self.grace_end)
        # The take in flight is the platform's to answer within take_drain: whatever it
        # hands over is run, failed or released on purpose (docs/design.md §9).
        self.take_end = min(self.take_end, now + min(timings.take_drain, timings.shutdown_grace))
        self._apply()
        return True

    def fail_init(self, reason: str, *, failed_at: float) -> None:
        """The initializer failed at *failed_at*: reports are cut from then on, a take
        may run ``claim_grace`` more to claim a job to fail (docs/design.md §6)."""
        self.phase, self.reason = StopPhase.INIT_FAILED, reason
        self.deadline = min(self.deadline, failed_at)
        # Set, not shortened: a take that starts now (the one claiming a job to fail)
        # gets claim_grace even after a drain's shorter take_drain; bound scopes only
        # ever move earlier, so the take already in flight keeps its own.
        self.take_end = min(failed_at + self.timings.claim_grace, self.grace_end)
        self._apply()

    def cut(self, reason: str, *, now: float) -> None:
        """The whole worker is cancelled: every report ends at its ``report_deadline``
        floor, whatever else was planned. The grace is left alone (the cancellation
        reaches the jobs, and their threads are still waited for until it ends)."""
        if now >= self.deadline:
            return
        self.phase, self.reason = StopPhase.CUT, reason
        self.deadline = now
        self._apply()

    # -- what the waits read --------------------------------------------------------------

    def grace_over(self, now: float) -> bool:
        return now >= self.grace_end

    def report_deadline(self, started: float) -> float:
        """A terminal report that started at *started* ends by this: its budget, cut to
        the plan's deadline, but never to less than ``report_deadline`` (so the report of
        a job cut at the end of the grace still gets its chance)."""
        timings = self.timings
        floor = max(self.deadline, started + timings.report_deadline)
        return min(started + timings.report_budget, floor)

    def bind(self, scope: trio.CancelScope, rule: Rule) -> None:
        """Give *scope* the deadline *rule* computes, now and whenever the plan changes
        (never later than the deadline it has), until :meth:`unbind`."""
        deadline = rule(self)
        if deadline < scope.deadline:  # (setting a deadline costs trio a recalculation)
            scope.deadline = deadline
        self._scopes[scope] = rule

    def unbind(self, scope: trio.CancelScope) -> None:
        self._scopes.pop(scope, None)

    def open_scope(self, rule: Rule, *, shield: bool = False) -> _BoundScope:
        """A cancel scope bound to the plan by *rule* (see :meth:`bind`) while it is open."""
        return _BoundScope(self, rule, shield)

    @staticmethod
    def when_stopping(plan: ShutdownPlan) -> float:
        """The rule of a wait that ends as soon as any stop begins (the initializer, the
        take's idle waits, the stop long-poll)."""
        return -math.inf if plan.stopping else math.inf

    def subscribe(self, listener: Callable[[ShutdownPlan], None]) -> None:
        """Call *listener* with the plan whenever it changes (for waits that keep their own
        scopes, as the thread waits do)."""
        self._listeners.append(listener)

    async def wait_to_retry(self, until: float, bound: float) -> None:
        """Wait for a retry due at *until*, cut short to leave *bound* seconds (one
        attempt's timeout) before the deadline of the scope this runs in, so one last
        attempt still fits. When that deadline moves meanwhile (the plan changed), the wait
        is measured again, and ends at once if the new deadline leaves no more room. A wait
        that starts with no room left is not cut (the deadline ends it): a budget's last
        moments are no hot loop of attempts. Always a checkpoint."""
        deadline = trio.current_effective_deadline()
        cut = deadline - bound > trio.current_time()
        while True:
            now = trio.current_time()
            if trio.current_effective_deadline() != deadline:
                deadline, cut = trio.current_effective_deadline(), True
            end = min(until, max(deadline - bound, now)) if cut else until
            if now >= end:
                await trio.lowlevel.checkpoint()
                return
            changed = self._changed
            with trio.move_on_at(end):
                await changed.wait()

    def _apply(self) -> None:
        for scope, rule in list(self._scopes.items()):
            scope.deadline = min(scope.deadline, rule(self))
        for listener in self._listeners:
            listener(self)
        self._changed.set()
        self._changed = trio.Event()


class _BoundScope:
    """:meth:`ShutdownPlan.open_scope`'s context manager: a class, not a generator (a
    generator's context manager costs a frame and two resumptions more)."""

    __slots__ = ("_plan", "_rule", "_scope")

    def __init__(self, plan: ShutdownPlan, rule: Rule, shield: bool) -> None:
        self._plan, self._rule = plan, rule
        self._scope = trio.CancelScope(shield=shield)

    def __enter__(self) -> trio.CancelScope:
        scope = self._scope.__enter__()
        self._plan.bind(scope, self._rule)
        return scope

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool:
        self._plan.unbind(self._scope)
        return self._scope.__exit__(exc_type, exc, traceback)
