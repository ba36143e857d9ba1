"""One Retry-After rule on every long-poll, and repeated warnings folded (docs/security.md).

The worker runs against the in-process fake platform in virtual time; requests are
counted over a virtual minute.
"""

from __future__ import annotations

import logging
import math
import random
from typing import Any

import pytest
import trio

from tests.conftest import serve_in_process
from trio_worker._config import Timings
from trio_worker._pacing import RATE_LIMIT_JITTER, FoldedLog, backoff_delay, rate_limit_wait
from trio_worker.testing import FakePlatform, Fault

HOSTILE_RETRY_AFTER = [0.0, -5.0, math.nan]
MINUTE = 60.0


async def _echo(job: dict[str, Any]) -> Any:
    return job["input"]


async def _requests_in_a_minute(
    nursery: trio.Nursery, fault: Fault, route: str, minutes: float = 1.0
) -> int:
    """How many *route* requests the worker makes in virtual *minutes* under *fault*."""
    platform = FakePlatform(take_hold=5.0, stop_hold=5.0)
    platform.inject(fault)
    await nursery.start(serve_in_process(platform, _echo))
    # A hot loop makes its 500 requests without ever letting virtual time pass.
    with trio.move_on_after(MINUTE * minutes):
        await platform.wait_for_requests(route, 500)
    return sum(1 for r in platform.requests if r.route == route)


@pytest.mark.parametrize("retry_after", HOSTILE_RETRY_AFTER)
@pytest.mark.parametrize("route", ["take", "stop"])
async def test_a_429_asking_for_no_wait_is_paced_by_the_floor(
    route: str,
    retry_after: float,
    nursery: trio.Nursery,
    virtual_clock: trio.abc.Clock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Before: about 4,500 requests a second, and as many WARNING lines, on either route.
    fault = Fault(route, status=429, retry_after=retry_after, times=10**9)
    count = await _requests_in_a_minute(nursery, fault, route)
    floor = Timings().rate_limit_floor
    assert count <= MINUTE / floor + 1
    assert count >= MINUTE / (Timings().rate_limit_pause * (1 + RATE_LIMIT_JITTER))
    lines = [r for r in caplog.records if "rate limited" in r.getMessage()]
    assert 1 <= len(lines) <= 2  # the first, and at most one more saying how many followed


async def test_a_retry_after_of_a_day_is_capped(
    nursery: trio.Nursery, virtual_clock: trio.abc.Clock
) -> None:
    count = await _requests_in_a_minute(
        nursery, Fault("take", status=429, retry_after=86_400.0, times=10**9), "take", 1.5
    )
    assert count == 2  # the first 429, then one more after the cap (60 s)


@pytest.mark.parametrize(
    ("asked", "low", "high"),
    [
        (None, 5.0, 5.0),  # no header: the reference's debounce
        (0.0, 1.0, 1.0),
        (-5.0, 1.0, 1.0),
        (math.nan, 5.0, 5.0),  # unreadable counts as absent
        (math.inf, 5.0, 5.0),
        (3.0, 3.0, 3.0),
        (1e9, 60.0, 60.0),
    ],
)
def test_rate_limit_wait_is_floored_capped_and_jittered_upwards(
    asked: float | None, low: float, high: float
) -> None:
    timings = Timings()
    rng = random.Random(7)
    waits = [rate_limit_wait(asked, timings, rng=rng) for _ in range(200)]
    assert min(waits) >= low
    assert max(waits) <= min(high * (1 + RATE_LIMIT_JITTER), timings.rate_limit_cap)
    if high < timings.rate_limit_cap:
        assert max(waits) > high  # jittered: workers limited together spread out


def test_folded_log_writes_the_first_line_and_then_the_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    folded = FoldedLog(logging.getLogger("trio_worker"), window=60.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="trio_worker"):
        for tenth in range(1_000):
            now[0] = tenth / 10
            folded.log(logging.WARNING, "take rate limited; pausing %.1fs", 1.0)
        folded.log(logging.WARNING, "another line")  # a different line is not folded
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "take rate limited; pausing 1.0s",
        "take rate limited; pausing 1.0s (599 more like it in the last 60s)",
        "another line",
    ]


# --- the backoff after a failure (long-polls and reports) -------------------------------


def test_backoff_delay_never_overflows() -> None:
    assert 0.0 <= backoff_delay(100_000, 0.1, 2.0) <= 2.0


@pytest.mark.parametrize("attempt", range(8))
def test_backoff_delay_is_full_jitter_within_the_capped_bound(attempt: int) -> None:
    bound = min(3.0, 0.1 * 2**attempt)
    samples = [backoff_delay(attempt, 0.1, 3.0) for _ in range(200)]
    assert all(0.0 <= s <= bound for s in samples)
    assert max(samples) > bound / 2  # really spread over the range
