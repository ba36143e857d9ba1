"""What governs taking: the concurrency in force, the stops remembered for unheld ids,
and the backoff of a long-poll that keeps failing."""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import TYPE_CHECKING

import trio

from ._pacing import FoldedLog, backoff_delay, rate_limit_wait

if TYPE_CHECKING:
    from ._config import Timings
    from ._options import Concurrency

log = logging.getLogger("trio_worker")


class Capacity:
    """The concurrency in force: a fixed int, or a callable ``f(current) -> int`` asked
    before every take (a bad answer or an exception keeps the current value).

    ``slots`` admits that many handlers at once, whatever a take delivered; its total
    follows every evaluation (a shrink lets running handlers finish, then admits fewer).
    """

    def __init__(self, concurrency: Concurrency) -> None:
        self._fn = concurrency if callable(concurrency) else None
        self.value = 1 if callable(concurrency) else concurrency
        self.slots = trio.CapacityLimiter(self.value)

    def evaluate(self) -> int:
        if self._fn is None:
            return self.value
        try:
            wanted = self._fn(self.value)
        except Exception:
            log.exception("concurrency callable raised; keeping %d", self.value)
            return self.value
        if isinstance(wanted, int) and not isinstance(wanted, bool) and wanted >= 1:
            self.value = self.slots.total_tokens = wanted
        else:
            log.error("concurrency callable returned %r; keeping %d", wanted, self.value)
        return self.value


class StopMemory:
    """Stops for ids not (yet) held: the take that delivers the job may still be on the
    wire (the reference forgets them, docs/protocol.md §8 item 6).

    At most *size* ids are remembered: past the size, those older than *seconds* are
    forgotten, then the oldest if still too many. The ids are kept in the order they came
    (the clock never goes back), so forgetting pops from the front of an ``OrderedDict``
    (O(1), where a plain dict rescans the holes its pops leave): each stop costs O(1)
    amortised, and a job-stop answer naming 100,000 unknown ids costs linear time and
    *size* entries, where rebuilding the dict on every stop stalled the event loop for a
    minute (docs/security.md).
    """

    def __init__(self, seconds: float, size: int) -> None:
        self.seconds = seconds
        self.size = size
        self._stops: OrderedDict[str, float] = OrderedDict()
        self.forgotten_early = 0  # recent stops dropped because of the size bound

    def __len__(self) -> int:
        return len(self._stops)

    def remember(self, job_id: str, now: float) -> None:
        stops = self._stops
        stops[job_id] = now
        stops.move_to_end(job_id)  # a repeated stop goes to the back, with its new time
        if len(stops) <= self.size:
            return
        while stops:
            oldest = next(iter(stops))
            if now - stops[oldest] < self.seconds:
                if len(stops) <= self.size:
                    return
                self.forgotten_early += 1
            del stops[oldest]

    def consume(self, job_id: str) -> bool:
        """Whether a stop for *job_id* was remembered; it is forgotten either way."""
        return self._stops.pop(job_id, None) is not None


class Backoff:
    """Consecutive failures of one long-poll route, and how long to wait after each."""

    def __init__(self, route: str, timings: Timings) -> None:
        self.route = route
        self.timings = timings
        self.errors = 0
        self._folded = FoldedLog(log, clock=trio.current_time)

    def rate_limited(self, retry_after: float | None) -> float:
        """The wait after a 429 that asked for *retry_after* seconds (None: it did not
        say), paced by the one rule every route follows; a run of them logs one line a
        minute."""
        delay = rate_limit_wait(retry_after, self.timings)
        self._folded.log(logging.WARNING, "%s rate limited; pausing %.1fs", self.route, delay)
        return delay

    def failed(self, exc: Exception) -> float:
        """The wait after this failure, logged once here."""
        self.errors += 1
        t = self.timings
        delay = backoff_delay(self.errors, t.error_backoff_min, t.error_backoff_max)
        # Text, never the exception: a handler that keeps records (caplog, MemoryHandler)
        # would keep its traceback and the whole finished run (tests/test_log_records.py).
        log.error("%s failed: %s; retrying in %.2fs", self.route, str(exc), delay)
        return delay

    def succeeded(self) -> None:
        self.errors = 0
