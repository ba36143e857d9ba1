"""Pacing what the platform and a failing loop can make the worker do: one backoff after
a failure, one rule for the wait a ``Retry-After`` asks for on every route (its floor and
why: docs/security.md, ``Retry-After``), and one way to fold a repeated log line.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import logging
    from collections.abc import Callable

    from ._config import Timings

# A wait is stretched by up to this fraction of itself, never shortened: the platform
# asked for at least that long.
RATE_LIMIT_JITTER = 0.2
DEFAULT_FOLD_WINDOW = 60.0


def backoff_delay(attempt: int, base: float, cap: float) -> float:
    """Full-jitter exponential backoff: uniform in [0, min(cap, base * 2**attempt)]."""
    # The exponent is clamped: an outage of hours must not overflow a float.
    return random.uniform(0, min(cap, base * (2 ** min(max(attempt, 0), 64))))


def rate_limit_wait(
    retry_after: float | None, timings: Timings, *, rng: random.Random | None = None
) -> float:
    """Seconds to wait after an answer that asked for *retry_after* seconds.

    *retry_after* is the parsed ``Retry-After`` (delta-seconds, or a date less now), or
    None when there was none or it could not be read: then the reference's debounce,
    ``timings.rate_limit_pause``. Anything not finite counts as none. The result lies in
    ``[rate_limit_floor, rate_limit_cap]``, jittered upwards by up to
    ``RATE_LIMIT_JITTER``.
    """
    if retry_after is None or not math.isfinite(retry_after):
        retry_after = timings.rate_limit_pause
    floor, cap = timings.rate_limit_floor, timings.rate_limit_cap
    base = min(max(retry_after, floor), cap)
    stretch = (rng or random).uniform(1.0, 1.0 + RATE_LIMIT_JITTER)
    return min(base * stretch, max(cap, floor))


@dataclass
class _Fold:
    since: float  # when the last line was written
    repeats: int = 0  # lines held back since


class FoldedLog:
    """Writes a line to *logger* unless the same line (same level and format) was
    written less than *window* seconds ago; then it is counted, and the next one written
    says how many were held back.

    *clock* is read at each call: ``trio.current_time`` in the event loop (so a
    ``MockClock`` drives it), the default elsewhere.
    """

    def __init__(
        self,
        logger: logging.Logger,
        *,
        window: float = DEFAULT_FOLD_WINDOW,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._window = window
        self._clock = clock
        # Keyed by (level, format): code writes a bounded set of formats.
        self._folds: dict[tuple[int, str], _Fold] = {}

    def log(self, level: int, msg: str, *args: object, exc_info: bool = False) -> None:
        """*exc_info*: the exception being handled goes with the line, when it is written."""
        now = self._clock()
        fold = self._folds.get((level, msg))
        if fold is not None and now - fold.since < self._window:
            fold.repeats += 1
            return
        self._folds[(level, msg)] = _Fold(now)
        if fold is not None and fold.repeats:
            args = (*args, fold.repeats, now - fold.since)
            msg = f"{msg} (%d more like it in the last %.0fs)"
        self._logger.log(level, msg, *args, exc_info=exc_info)
