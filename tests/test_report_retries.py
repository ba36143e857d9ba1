"""Delivery.post, the one retry policy of reports: retries, backoff, Retry-After, attempt
timeouts, over the in-memory network in virtual time (the scripted platform of
tests/test_platform_client.py), each attempt one ``post`` of the platform client.

See docs/protocol.md §2.3 and docs/design.md §5."""

from __future__ import annotations

import contextlib
import email.utils
import json
import logging
import math
import random
import time
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
import trio
import trio.testing

from trio_worker._config import Settings, Timings, platform_from_env
from trio_worker._delivery import Delivery
from trio_worker._pacing import RATE_LIMIT_JITTER
from trio_worker._payloads import Payloads
from trio_worker._platform._client import REPORT_CONTENT_TYPE, PlatformClient, ReportOutcome
from trio_worker._platform._http import HttpResponse
from trio_worker._platform._wire import retry_after
from trio_worker._scopes import Scopes

from .test_platform_client import (
    DONE_URL,
    WIRING,
    FakePlatform,
    Hang,
    Reply,
    client_for,
    max_backoff_fixture,  # noqa: F401 (a fixture)
)

# --- Delivery.post ------------------------------------------------------------------------


def delivery_over(client: PlatformClient) -> Delivery:
    """The worker's Delivery around *client*, with a shutdown plan that never stops."""
    settings = Settings.from_environ(WIRING, timings=client.timings, capture_logs="off")
    return Delivery(settings, client, Scopes(client.timings), Payloads.for_worker(settings))


@contextlib.asynccontextmanager
async def delivery_for(
    fake: FakePlatform, timings: Timings | None = None
) -> AsyncIterator[Delivery]:
    async with client_for(fake, timings) as client:
        yield delivery_over(client)


async def post(
    delivery: Delivery,
    body: bytes = b"{}",
    *,
    job_id: str = "j1",
    outcome: ReportOutcome | None = None,
    superseded: Callable[[], bool] | None = None,
) -> ReportOutcome:
    outcome = ReportOutcome() if outcome is None else outcome
    await delivery.post(DONE_URL, body, job_id=job_id, outcome=outcome, superseded=superseded)
    return outcome


async def post_within(
    delivery: Delivery, budget: float, body: bytes = b"{}", job_id: str = "j1"
) -> ReportOutcome:
    """Delivery.post as a report runs it: under a cancel scope that is the budget."""
    outcome = ReportOutcome()
    with trio.move_on_after(budget):
        await post(delivery, body, job_id=job_id, outcome=outcome)
    return outcome


async def test_report_delivered_on_200_with_the_body_verbatim() -> None:
    body = json.dumps({"output": {"text": "caf\u00e9 \u4e2d"}}, ensure_ascii=False).encode()
    fake = FakePlatform([httpx.Response(200, text="ok")])
    async with delivery_for(fake) as delivery:
        outcome = await post(delivery, body, job_id="j1")
    assert outcome == ReportOutcome(delivered=True, attempts=1, last_error=None, status=200)
    [seen] = fake.seen
    assert seen.request.method == "POST"
    assert str(seen.request.url) == DONE_URL
    assert seen.body == body
    assert seen.request.headers["content-type"] == REPORT_CONTENT_TYPE
    assert seen.request.headers["content-length"] == str(len(body))


@pytest.mark.parametrize("status", [200, 201, 202, 204])
async def test_any_2xx_acknowledges(status: int) -> None:
    async with delivery_for(FakePlatform([httpx.Response(status)])) as delivery:
        outcome = await post(delivery, b"{}", job_id="j1")
    # Only the status matters: a 200 whose body cannot be decoded is still an ack.
    assert outcome.delivered
    assert outcome.attempts == 1


async def test_report_bytes_are_not_reencoded() -> None:
    # Not JSON, not UTF-8: still sent byte for byte.
    body = b'\x00\xff{"a": 1}\n\r\t'
    fake = FakePlatform([httpx.Response(200)])
    async with delivery_for(fake) as delivery:
        await post(delivery, body, job_id="j1")
    assert fake.seen[0].body == body


@pytest.mark.parametrize(
    "failure",
    [
        httpx.ConnectError("refused"),
        httpx.ReadTimeout("slow"),
        httpx.RemoteProtocolError("reset"),
        httpx.Response(408),
        httpx.Response(429),
        httpx.Response(500),
        httpx.Response(502),
        httpx.Response(503),
        httpx.Response(504),
    ],
    ids=lambda f: f"HTTP {f.status_code}" if isinstance(f, httpx.Response) else type(f).__name__,
)
async def test_report_retries_transient_failures_then_delivers(
    failure: Reply, autojump_clock: trio.testing.MockClock, max_backoff: None
) -> None:
    fake = FakePlatform([failure, failure, httpx.Response(200)])
    async with delivery_for(fake, Timings(error_backoff_min=0.1)) as delivery:
        start = trio.current_time()
        outcome = await post(delivery, b'{"output": 1}', job_id="j1")
    assert outcome.delivered
    assert outcome.attempts == 3
    assert len(fake.seen) == 3
    assert all(s.body == b'{"output": 1}' for s in fake.seen)
    # Virtual time passed between attempts: exponential backoff 0.1 s, then 0.2 s.
    assert fake.gaps == pytest.approx([0.1, 0.2])
    assert trio.current_time() - start == pytest.approx(0.3)


async def test_report_retries_until_the_callers_budget_ends(
    autojump_clock: trio.testing.MockClock, max_backoff: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="trio_worker")
    fake = FakePlatform([httpx.Response(503)])
    async with delivery_for(fake, Timings(error_backoff_min=0.1)) as delivery:
        outcome = await post_within(delivery, 5.0, job_id="job-xyz")
    # No attempt limit: doubling from error_backoff_min, capped at 2 s, until the scope ends.
    assert fake.gaps == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6])
    assert outcome == ReportOutcome(False, 6, "HTTP 503", status=503)
    # Attempts 1, 2 and 4 are logged: an outage of minutes is not a line a second.
    retries = [r for r in caplog.records if "job-xyz" in r.getMessage()]
    assert [r.getMessage().split("attempt ")[1][0] for r in retries] == ["1", "2", "4"]


async def test_report_outlasts_a_long_outage(
    autojump_clock: trio.testing.MockClock, max_backoff: None
) -> None:
    failures: list[Reply] = [httpx.ConnectError("connection refused")] * 150
    fake = FakePlatform([*failures, httpx.Response(200)])
    async with delivery_for(fake) as delivery:
        outcome = await post_within(delivery, 300.0)
    assert outcome.delivered
    assert outcome.attempts == 151


async def test_report_gives_up_on_connect_errors_with_the_error_named(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def refuse(host: str, port: int, tls: bool) -> trio.abc.Stream:
        raise ConnectionRefusedError(111, "Connection refused")

    client = PlatformClient(platform_from_env(WIRING), Timings(), open_stream=refuse)
    try:
        outcome = await post_within(delivery_over(client), 3.0)
    finally:
        await client.aclose()
    assert outcome.delivered is False
    assert outcome.attempts >= 3
    assert outcome.status is None
    assert outcome.last_error is not None
    assert "cannot connect to platform.test:80" in outcome.last_error
    assert "Connection refused" in outcome.last_error


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 413, 422, 301])
async def test_report_does_not_retry_permanent_errors(
    status: int, autojump_clock: trio.testing.MockClock
) -> None:
    fake = FakePlatform([httpx.Response(status), httpx.Response(200)])
    async with delivery_for(fake) as delivery:
        start = trio.current_time()
        outcome = await post(delivery, b"{}", job_id="j1")
    assert outcome == ReportOutcome(False, 1, f"HTTP {status}", status=status)
    assert len(fake.seen) == 1
    assert trio.current_time() == start


@pytest.mark.parametrize(
    ("status", "header", "wait"),
    [
        (429, "3", 3.0),
        (429, "12", 12.0),
        (503, "59", 59.0),
        (503, "120", 60.0),  # the cap (Timings.rate_limit_cap), as on take and stop
        (429, "1000", 60.0),
    ],
)
async def test_report_waits_retry_after_within_the_one_floor_and_cap(
    status: int, header: str, wait: float, autojump_clock: trio.testing.MockClock
) -> None:
    # Before the one rule, a report waited 120 s and 1000 s as asked, uncapped.
    asked = httpx.Response(status, headers={"Retry-After": header})
    fake = FakePlatform([asked, httpx.Response(200)])
    async with delivery_for(fake) as delivery:
        outcome = await post(delivery, b"{}", job_id="j1")
    assert outcome.delivered
    [gap] = fake.gaps
    # Stretched upwards by the jitter, never past the cap.
    assert wait <= gap <= min(wait * (1 + RATE_LIMIT_JITTER), 60.0) + 1e-9


async def test_retry_after_zero_waits_the_floor_or_the_backoff_whichever_is_longer(
    autojump_clock: trio.testing.MockClock, max_backoff: None
) -> None:
    # "Retry-After: 0" is raised to the 1 s floor (1.2 s with the whole jitter), and a
    # report still never waits less than its backoff (0.5, 1.0, 2.0 s here).
    asked = httpx.Response(503, headers={"Retry-After": "0"})
    fake = FakePlatform([asked, asked, asked, httpx.Response(200)])
    async with delivery_for(fake, Timings(error_backoff_min=0.5)) as delivery:
        outcome = await post_within(delivery, 300.0)
    assert outcome.delivered
    floor = Timings().rate_limit_floor * (1 + RATE_LIMIT_JITTER)
    assert fake.gaps == pytest.approx([floor, floor, 2.0])


async def test_retry_after_is_honoured_within_the_remaining_budget(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # 60 s (the cap) asked, 50 s of budget: the last attempt still fits, one attempt's
    # bound early.
    asked = httpx.Response(429, headers={"Retry-After": "1000"})
    fake = FakePlatform([asked, httpx.Response(200)])
    async with delivery_for(fake, Timings(report_attempt_timeout=10.0)) as delivery:
        outcome = await post_within(delivery, 50.0)
    assert outcome.delivered
    assert fake.gaps == pytest.approx([50.0 - 10.0 - 2 / (1024 * 1024)])


async def test_retry_after_as_an_http_date(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(time, "time", lambda: 1_700_000_000.0)
    date = email.utils.formatdate(1_700_000_000.0 + 42, usegmt=True)
    fake = FakePlatform([httpx.Response(503, headers={"Retry-After": date}), httpx.Response(200)])
    async with delivery_for(fake) as delivery:
        outcome = await post(delivery, b"{}", job_id="j1")
    assert outcome.delivered
    [gap] = fake.gaps
    assert 42.0 <= gap <= 42.0 * (1 + RATE_LIMIT_JITTER)


@pytest.mark.parametrize("header", ["soon", "-5", "nan", "inf", "Mon, 99 Foo 2024"])
async def test_unreadable_retry_after_falls_back_to_the_backoff(
    header: str, autojump_clock: trio.testing.MockClock, max_backoff: None
) -> None:
    fake = FakePlatform([httpx.Response(429, headers={"Retry-After": header}), httpx.Response(200)])
    async with delivery_for(fake, Timings(error_backoff_min=0.25)) as delivery:
        await post(delivery, b"{}", job_id="j1")
    assert fake.gaps == pytest.approx([0.25])


async def test_report_429_without_retry_after_uses_the_backoff(
    autojump_clock: trio.testing.MockClock, max_backoff: None
) -> None:
    fake = FakePlatform([httpx.Response(429), httpx.Response(200)])
    async with delivery_for(fake, Timings(error_backoff_min=0.25)) as delivery:
        await post(delivery, b"{}", job_id="j1")
    assert fake.gaps == pytest.approx([0.25])


async def test_report_retry_delays_are_jittered_within_the_bound(
    autojump_clock: trio.testing.MockClock,
) -> None:
    random.seed(1234)
    replies: list[Reply] = [*[httpx.Response(502)] * 6, httpx.Response(200)]
    fake = FakePlatform(replies)
    async with delivery_for(fake, Timings(error_backoff_min=0.5)) as delivery:
        await post(delivery, b"{}", job_id="j1")
    bounds = [min(2.0, 0.5 * 2**k) for k in range(6)]
    assert len(fake.gaps) == 6
    for gap, bound in zip(fake.gaps, bounds, strict=True):
        assert 0.0 <= gap <= bound + 1e-9
    assert sum(fake.gaps) > 0


async def test_report_deadline_is_the_callers_scope(
    autojump_clock: trio.testing.MockClock, max_backoff: None
) -> None:
    fake = FakePlatform([httpx.Response(503)])
    async with delivery_for(fake, Timings(error_backoff_min=1.0)) as delivery:
        with trio.move_on_after(4.5) as scope:
            await post(delivery, b"{}", job_id="j1")
    assert scope.cancelled_caught
    assert fake.times[-1] - fake.times[0] <= 4.5
    assert len(fake.seen) == 3  # at 0, 1, 3 (the next is due at 5)


async def test_a_hung_attempt_costs_one_attempt_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    fake = FakePlatform([Hang(math.inf), httpx.Response(200)])
    async with delivery_for(fake, Timings(report_attempt_timeout=10.0)) as delivery:
        outcome = await post_within(delivery, 300.0)
    assert outcome.delivered
    assert outcome.attempts == 2
    assert 10.0 <= fake.gaps[0] <= 10.0 + 2.0  # the attempt's bound, then one backoff


@pytest.mark.parametrize(("size", "attempts"), [(1024, 2), (3 * 1024 * 1024, 1)])
async def test_the_attempt_timeout_grows_with_the_body(
    size: int, attempts: int, autojump_clock: trio.testing.MockClock
) -> None:
    # A platform taking 12 s to answer: 10 s + 1 KiB at 1 MiB/s is too short, 10 s + 3 s
    # for 3 MiB is not.
    fake = FakePlatform([Hang(12.0), httpx.Response(200)])
    timings = Timings(report_attempt_timeout=10.0, report_min_rate=1024 * 1024)
    async with delivery_for(fake, timings) as delivery:
        outcome = await post_within(delivery, 300.0, body=b"x" * size)
    assert outcome.delivered
    assert outcome.attempts == attempts
    assert len(fake.seen) == attempts


async def test_a_timed_out_attempt_is_named(autojump_clock: trio.testing.MockClock) -> None:
    fake = FakePlatform([Hang(math.inf)])
    async with delivery_for(fake, Timings(report_attempt_timeout=4.0)) as delivery:
        outcome = await post_within(delivery, 6.0)
    assert not outcome.delivered
    assert outcome.last_error is not None
    assert "no answer within 4.0s" in outcome.last_error


async def test_a_superseded_report_stops_retrying(
    autojump_clock: trio.testing.MockClock,
) -> None:
    fake = FakePlatform([httpx.Response(503)])
    newer = False

    def superseded() -> bool:
        return newer

    async with delivery_for(fake) as delivery:
        outcome = ReportOutcome()
        async with trio.open_nursery() as nursery:

            async def posting() -> None:
                await post(delivery, outcome=outcome, superseded=superseded)

            nursery.start_soon(posting)
            await trio.sleep(1.0)
            newer = True
    assert not outcome.delivered
    assert outcome.last_error is not None
    assert "superseded" in outcome.last_error


async def test_report_with_undecodable_response_body_does_not_raise() -> None:
    # A stream, so httpx does not try (and fail) to decode it while building the reply.
    reply = httpx.Response(
        200, headers={"content-encoding": "gzip"}, stream=httpx.ByteStream(b"not gzip")
    )
    async with delivery_for(FakePlatform([reply])) as delivery:
        outcome = await post(delivery, b"{}", job_id="j1")
    # Only the status matters: a 200 whose body cannot be decoded is still an ack.
    assert outcome.delivered


async def test_report_backoff_is_capped_by_report_backoff_max(
    autojump_clock: trio.testing.MockClock, max_backoff: None
) -> None:
    replies: list[Reply] = [*[httpx.Response(503)] * 4, httpx.Response(200)]
    fake = FakePlatform(replies)
    timings = Timings(error_backoff_min=0.1, report_backoff_max=0.3)
    async with delivery_for(fake, timings) as delivery:
        await post(delivery, b"{}", job_id="j1")
    assert fake.gaps == pytest.approx([0.1, 0.2, 0.3, 0.3])


# --- the one Retry-After parser -----------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("7", 7.0),
        (" 7 ", 7.0),
        ("0", 0.0),
        ("0.5", 0.5),
        ("3600", 3600.0),  # no cap here: each route has its own
        ("-3", None),
        ("-0.5", None),
        ("nan", None),
        ("inf", None),
        ("-inf", None),
        ("1e400", None),
        ("soon", None),
        ("", None),
        ("Wed, 21 Oct 2015 07:28:00", None),  # a date without its zone
        ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),  # long past: no wait
        (None, None),
    ],
)
def test_one_retry_after_parser(header: str | None, expected: float | None) -> None:
    headers = {} if header is None else {"retry-after": header}
    assert retry_after(HttpResponse(503, headers, b"")) == expected


def test_retry_after_as_a_future_http_date() -> None:
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    seconds = retry_after(HttpResponse(429, {"retry-after": when}, b""))
    assert seconds is not None
    assert 25 < seconds <= 30
