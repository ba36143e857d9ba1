"""The end of a shutdown's grace, and a cancellation of the whole worker.

Two background duties of the supervisor, kept apart from its four tasks:

* ``expire``: once the shutdown grace has run out (threads that ignore
  ``check_cancelled()`` stop holding the exit up by then: the plan's ``grace_end``), a
  handler that swallowed its cancellation gets its ``worker_shutdown`` report sent for it;
  then ``start()``'s exit guard is told the worker has settled (docs/design.md §9).
* ``watch``: a cancellation of the whole worker (init failure, ``serve()`` cancelled, a
  second SIGINT) would otherwise wait out every shielded report's budget: the shutdown
  plan is cut instead, and every report with it (docs/design.md §5).

Both end with the run task (``end``), when every job task is over.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from ._config import Timings
    from ._driver import JobDriver
    from ._exit import ExitGuard
    from ._lifecycle import Ledger
    from ._shutdown_plan import ShutdownPlan

log = logging.getLogger("trio_worker")

# After the grace, a handler still running this long after its cancellation swallowed it.
UNWIND_BOUND = 1.0


class Grace:
    def __init__(
        self,
        *,
        driver: JobDriver,
        plan: ShutdownPlan,
        ledger: Ledger,
        timings: Timings,
        exit_hooks: ExitGuard | None,
    ) -> None:
        self._driver = driver
        self._plan = plan
        self._ledger = ledger
        self._timings = timings
        self._exit_hooks = exit_hooks
        self._grace_scope = trio.CancelScope()
        self._watch_scope = trio.CancelScope()

    def end(self) -> None:
        """Every job task has ended: nothing is left for either duty."""
        self._grace_scope.cancel()
        self._watch_scope.cancel()

    async def expire(self, ledger_changed: Callable[[], Awaitable[None]]) -> None:
        """At the shutdown deadline, settle what cannot settle itself."""
        with self._grace_scope:
            await trio.sleep_until(self._plan.grace_end)
            await trio.sleep(min(UNWIND_BOUND, self._timings.exit_watchdog / 2))
            stuck = await self._driver.settle_stuck()
            if not stuck:
                return  # every task is unwinding: the run ends on its own
            while len(self._ledger):
                # Reports still in flight, each under its own deadline.
                await ledger_changed()
            if self._exit_hooks is not None:
                self._exit_hooks.settled()
            else:
                log.error("serve() cannot return before the handler(s) of %s return", stuck)

    async def watch(self) -> None:
        """Cut every report in flight if the whole worker is cancelled."""
        with self._watch_scope:
            try:
                await trio.sleep_forever()
            finally:
                if not self._watch_scope.cancel_called:
                    self._plan.cut("the worker was cancelled", now=trio.current_time())
