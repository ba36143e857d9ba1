"""The one deadline registry: every wait of the worker ends by what the state says.

A wait's cancel scope is *bound* here by a rule of the state (moved earlier whenever the
state's deadlines move), or it is a retry's wait (:meth:`Scopes.wait_to_retry`):
docs/how-it-works.md, "The state and its deadlines", lists every wait and its rule.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from ._state import WorkerState

if TYPE_CHECKING:
    from types import TracebackType

    from ._config import Timings

__all__ = ["Rule", "Scopes"]

#: A bound scope's deadline, as a function of the state (its own bound closed over).
Rule = Callable[[WorkerState], float]


def when_stopping(state: WorkerState) -> float:
    """The rule of a wait that ends as soon as any stop begins (the initializer, the
    take's idle waits, the stop long-poll)."""
    return -math.inf if state.stopping else math.inf


def at_grace_end(state: WorkerState) -> float:
    """The rule of a job's scope: it ends with the shutdown's grace."""
    return state.grace_end


def at_take_end(state: WorkerState) -> float:
    """The rule of a take in flight: shortened by a stop, never cancelled by one (I8)."""
    return state.take_end


class Scopes:
    """The deadline registry of one worker, over its :class:`WorkerState`."""

    def __init__(self, timings: Timings, state: WorkerState | None = None) -> None:
        self.state = state if state is not None else WorkerState(timings)
        self.state.on_change = self._apply
        self._scopes: dict[trio.CancelScope, Rule] = {}
        self._changed = trio.Event()
        self._waits_end = math.inf

    def __repr__(self) -> str:
        return f"<Scopes bound={len(self._scopes)} {self.state!r}>"

    def __len__(self) -> int:  # the scopes bound now
        return len(self._scopes)

    # Binding scopes.

    def bind(self, scope: trio.CancelScope, rule: Rule) -> None:
        """Give *scope* the deadline *rule* computes, now and whenever the state changes
        (never later than the deadline it has), until :meth:`unbind`."""
        deadline = rule(self.state)
        if deadline < scope.deadline:  # (setting a deadline costs trio a recalculation)
            scope.deadline = deadline
        self._scopes[scope] = rule

    def unbind(self, scope: trio.CancelScope) -> None:
        self._scopes.pop(scope, None)

    def open_scope(self, rule: Rule, *, shield: bool = False) -> _BoundScope:
        """A cancel scope bound by *rule* (see :meth:`bind`) while it is open."""
        return _BoundScope(self, rule, shield)

    def shielded(self, bound: float = math.inf) -> _BoundScope:
        """The scope of a wait for code that has not ended yet (a handler's thread, a
        cancelled asyncio task): shielded from its caller's cancellation, ended *bound*
        seconds from now or at the end of the grace, whichever comes first (or at
        :meth:`end_by`). A stuck thread cannot hold the exit: the process then ends
        with ``os._exit``."""
        return _BoundScope(self, self._wait_rule(bound), True)

    def bounded(self, bound: float) -> _BoundScope:
        """As :meth:`shielded`, for a caller that shields it already (a stream's close)."""
        return _BoundScope(self, self._wait_rule(bound), False)

    def _wait_rule(self, bound: float) -> Rule:
        ends = trio.current_time() + bound
        return lambda state: min(ends, state.grace_end, self._waits_end)

    def end_by(self, deadline: float) -> None:
        """End every wait of :meth:`shielded` and :meth:`bounded` by *deadline*, for a worker
        with no grace of its own (a load-balancing worker's last unwinding)."""
        self._waits_end = min(self._waits_end, deadline)
        self._apply()

    async def hold(self, finished: trio.Event) -> None:
        """Wait, shielded, for *finished*, until it is set or the grace ends."""
        with self.shielded():
            await finished.wait()

    async def wait_to_retry(self, until: float, bound: float) -> None:
        """Wait for a retry due at *until*, cut short to leave *bound* seconds (one
        attempt's timeout) before the deadline of the scope this runs in, so one last
        attempt still fits. When that deadline moves meanwhile (the state changed), the wait
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
        state = self.state
        for scope, rule in list(self._scopes.items()):
            deadline = rule(state)
            if deadline < scope.deadline:
                scope.deadline = deadline
        self._changed.set()
        self._changed = trio.Event()


class _BoundScope:
    """:meth:`Scopes.open_scope`'s context manager: a class, as a generator's costs a frame
    and two resumptions more."""

    __slots__ = ("_rule", "_scope", "_scopes")

    def __init__(self, scopes: Scopes, rule: Rule, shield: bool) -> None:
        self._scopes, self._rule = scopes, rule
        self._scope = trio.CancelScope(shield=shield)

    def __enter__(self) -> trio.CancelScope:
        scope = self._scope.__enter__()
        self._scopes.bind(scope, self._rule)
        return scope

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool:
        self._scopes.unbind(self._scope)
        return self._scope.__exit__(exc_type, exc, traceback)
