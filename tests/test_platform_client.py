"""PlatformClient over the in-memory network, in virtual time.

A scripted platform (:class:`FakePlatform`, one reply per request) is served as an ASGI app
on :func:`~trio_worker.testing.memory_network`, so the production lean client does every
request. A reply that is an exception drops the connection without an answer.

See docs/protocol.md §2 and docs/design.md §5."""

from __future__ import annotations

import contextlib
import itertools
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeAlias

import httpx
import pytest
import trio
import trio.testing

from trio_worker._config import Timings, platform_from_env
from trio_worker._exceptions import PlatformError, RateLimited, TransportError
from trio_worker._platform._client import (
    USER_AGENT,
    PlatformClient,
    ReportOutcome,
)
from trio_worker.testing import memory_network
from trio_worker.testing._http_server import AbortConnection, ASGIApp, Receive, Scope, Send

H = "http://platform.test/v2/ep1"
KEY = "rpa_SECRET_KEY_123"
WIRING = {
    "RUNPOD_WEBHOOK_GET_JOB": f"{H}/job-take/$ID?gpu=A100",
    "RUNPOD_WEBHOOK_POST_OUTPUT": f"{H}/job-done/$RUNPOD_POD_ID/$ID?gpu=A100",
    "RUNPOD_WEBHOOK_POST_STREAM": f"{H}/job-stream/$RUNPOD_POD_ID/$ID?gpu=A100",
    "RUNPOD_AI_API_KEY": KEY,
    "RUNPOD_POD_ID": "w1",
}
DONE_URL = f"{H}/job-done/w1/j1?gpu=A100&isStream=false"

Reply: TypeAlias = "httpx.Response | BaseException | Hang"
Responder = Callable[[httpx.Request], Awaitable[Reply]]


@dataclass
class Seen:
    """One request as the platform received it, with the virtual time it arrived."""

    at: float
    request: httpx.Request
    body: bytes


@dataclass(frozen=True)
class Hang:
    """A reply that answers *then* after *seconds* (a hung or slow connection)."""

    seconds: float
    then: httpx.Response = field(default_factory=lambda: httpx.Response(200))


@dataclass
class FakePlatform:
    """Answers requests from a script (one reply per request, the last one repeating)."""

    replies: list[Reply] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        self.seen.append(Seen(trio.current_time(), request, body))
        index = min(len(self.seen), len(self.replies)) - 1
        reply = self.replies[index] if self.replies else httpx.Response(204)
        if isinstance(reply, BaseException):
            raise reply
        if isinstance(reply, Hang):
            await trio.sleep(reply.seconds)
            return reply.then
        return reply

    @property
    def times(self) -> list[float]:
        return [s.at for s in self.seen]

    @property
    def gaps(self) -> list[float]:
        times = self.times
        return [b - a for a, b in itertools.pairwise(times)]


def served(fake: FakePlatform) -> ASGIApp:
    """*fake* as an ASGI app: each request rebuilt as the ``httpx.Request`` it asserts on.

    Every answer closes its connection, so each attempt is one connection and an answer
    the fake drops is never taken for a stale kept-alive connection (retried unseen).
    """

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        host = next(value for name, value in headers if name.lower() == "host")
        target = scope["raw_path"].decode("latin-1")
        if scope["query_string"]:
            target += "?" + scope["query_string"].decode("latin-1")
        request = httpx.Request(
            scope["method"], f"http://{host}{target}", headers=headers, content=body
        )
        try:
            reply = await fake(request)
        except httpx.HTTPError:
            raise AbortConnection from None
        # The server frames the body itself (the fake's own Content-Length may not match
        # what httpx hands out as its content).
        framing = (b"connection", b"content-length", b"transfer-encoding")
        raw = [(k, v) for k, v in reply.headers.raw if k.lower() not in framing]
        await send(
            {
                "type": "http.response.start",
                "status": reply.status_code,
                "headers": [*raw, (b"connection", b"close")],
            }
        )
        # The raw bytes, as given (a body httpx cannot decode included); none for a 204.
        content = b"".join([part async for part in reply.stream])  # type: ignore[union-attr]
        body = b"" if reply.status_code in (204, 304) else content
        await send({"type": "http.response.body", "body": body})

    return app


@contextlib.asynccontextmanager
async def client_for(
    fake: FakePlatform, timings: Timings | None = None, **env: str
) -> AsyncIterator[PlatformClient]:
    config = platform_from_env({**WIRING, **env})
    async with memory_network(served(fake)) as opener:
        client = PlatformClient(config, timings or Timings(), open_stream=opener)
        try:
            yield client
        finally:
            await client.aclose()


def job_json(*items: object) -> httpx.Response:
    document = items[0] if len(items) == 1 else list(items)
    return httpx.Response(200, json=document)


@pytest.fixture(name="max_backoff")
def max_backoff_fixture(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the full-jitter backoff deterministic: always its upper bound."""
    monkeypatch.setattr(random, "uniform", lambda low, high: high)


# --- take: URLs ---------------------------------------------------------------------------


async def test_single_take_url_carries_job_in_progress() -> None:
    fake = FakePlatform([httpx.Response(204)])
    async with client_for(fake) as client:
        await client.take(1, in_progress=False)
        await client.take(1, in_progress=True)
    urls = [str(s.request.url) for s in fake.seen]
    assert urls == [
        f"{H}/job-take/w1?gpu=A100&job_in_progress=0",
        f"{H}/job-take/w1?gpu=A100&job_in_progress=1",
    ]
    assert all(s.request.method == "GET" for s in fake.seen)


async def test_batch_take_uses_the_batch_route_with_batch_size() -> None:
    fake = FakePlatform([httpx.Response(204)])
    async with client_for(fake) as client:
        await client.take(4, in_progress=True)
        await client.take(2, in_progress=False)
    assert [str(s.request.url) for s in fake.seen] == [
        f"{H}/job-take-batch/w1?gpu=A100&batch_size=4&job_in_progress=1",
        f"{H}/job-take-batch/w1?gpu=A100&batch_size=2&job_in_progress=0",
    ]


async def test_batch_take_without_job_take_in_template_stays_on_the_same_url() -> None:
    fake = FakePlatform([httpx.Response(204)])
    async with client_for(fake, RUNPOD_WEBHOOK_GET_JOB=f"{H}/take/$ID?gpu=A100") as client:
        await client.take(3, in_progress=False)
    assert str(fake.seen[0].request.url) == f"{H}/take/w1?gpu=A100&batch_size=3&job_in_progress=0"


async def test_take_template_without_query_gets_a_question_mark() -> None:
    fake = FakePlatform([httpx.Response(204)])
    async with client_for(fake, RUNPOD_WEBHOOK_GET_JOB=f"{H}/job-take/$ID") as client:
        await client.take(1, in_progress=False)
        await client.take(2, in_progress=False)
    assert [str(s.request.url) for s in fake.seen] == [
        f"{H}/job-take/w1?job_in_progress=0",
        f"{H}/job-take-batch/w1?batch_size=2&job_in_progress=0",
    ]


# --- take: answers ------------------------------------------------------------------------


@pytest.mark.parametrize("status", [204, 400])
async def test_204_and_400_are_empty(status: int) -> None:
    reply = httpx.Response(status, json={"id": "ignored", "input": 1})
    async with client_for(FakePlatform([reply])) as client:
        response = await client.take(1, in_progress=False)
    assert response.empty
    assert response.jobs == []
    assert response.garbled is None


async def test_take_returns_a_job() -> None:
    job = {"id": "j1", "input": {"prompt": "hi"}}
    async with client_for(FakePlatform([job_json(job)])) as client:
        response = await client.take(1, in_progress=False)
    assert response.jobs == [job]


async def test_batch_take_returns_every_job_even_more_than_asked() -> None:
    jobs = [{"id": f"j{i}", "input": i} for i in range(3)]
    async with client_for(FakePlatform([job_json(*jobs)])) as client:
        response = await client.take(2, in_progress=False)
    assert response.jobs == jobs


async def test_take_non_json_answer_is_garbled() -> None:
    reply = httpx.Response(200, text="<html>", headers={"content-type": "text/html"})
    async with client_for(FakePlatform([reply])) as client:
        response = await client.take(1, in_progress=False)
    assert response.empty
    assert response.garbled is not None


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("7", 7.0),
        ("0.5", 0.5),
        ("120", 120.0),  # as asked: the cap is rate_limit_wait's, the one rule
        ("-3", None),
        ("nan", None),
        ("inf", None),
        ("soon", None),
        (None, None),
    ],
)
async def test_429_raises_rate_limited_honouring_retry_after(
    header: str | None, expected: float | None
) -> None:
    headers = {} if header is None else {"Retry-After": header}
    fake = FakePlatform([httpx.Response(429, headers=headers)])
    async with client_for(fake) as client:
        with pytest.raises(RateLimited) as single:
            await client.take(1, in_progress=False)
        with pytest.raises(RateLimited) as batch:
            await client.take(2, in_progress=False)
    # The raw parse: the take loop's wait (floor, cap, jitter, rate_limit_pause when none
    # was said) is rate_limit_wait's (tests/test_pacing.py).
    assert single.value.retry_after == expected
    assert single.value.status == 429
    assert isinstance(single.value, PlatformError)
    assert single.value.route == "take"
    assert batch.value.route == "take_batch"


@pytest.mark.parametrize("status", [500, 502, 503, 401, 403, 404, 409, 301])
async def test_other_statuses_raise_platform_error(status: int) -> None:
    async with client_for(FakePlatform([httpx.Response(status)])) as client:
        with pytest.raises(PlatformError) as info:
            await client.take(1, in_progress=False)
    assert info.value.status == status
    assert not isinstance(info.value, RateLimited)
    assert str(status) in str(info.value)


async def test_take_transport_errors_are_transport_error() -> None:
    fake = FakePlatform([httpx.ConnectError("refused")])
    async with client_for(fake) as client:
        with pytest.raises(TransportError, match="closed the connection before answering"):
            await client.take(1, in_progress=False)


async def test_take_with_undecodable_body_is_a_handled_error() -> None:
    reply = httpx.Response(
        200, headers={"content-encoding": "gzip", "content-type": "application/json"}, content=b"x"
    )
    async with client_for(FakePlatform([reply])) as client:
        response = await client.take(1, in_progress=False)
    # Not a crash of the take loop: "no job" (the body is unusable) or a garbled answer.
    assert response.empty


# --- post: one attempt at a report -----------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "status", "asked", "error"),
    [
        (httpx.Response(200), 200, None, None),
        (httpx.Response(503, headers={"Retry-After": "1000"}), 503, 1000.0, "HTTP 503"),
        (httpx.Response(429, headers={"Retry-After": "0"}), 429, 0.0, "HTTP 429"),
        (httpx.Response(429, headers={"Retry-After": "nan"}), 429, None, "HTTP 429"),
        (httpx.Response(500, headers={"Retry-After": "5"}), 500, None, "HTTP 500"),
        (httpx.ConnectError("down"), None, None, "closed the connection before answering"),
    ],
)
async def test_a_post_makes_one_attempt_and_records_it_as_answered(
    reply: Reply, status: int | None, asked: float | None, error: str | None
) -> None:
    fake = FakePlatform([reply, httpx.Response(200)])
    outcome = ReportOutcome(attempts=2, retry_after=7.0)
    async with client_for(fake) as client:
        answers = await client.post([(DONE_URL, b"{}")], outcome)
    assert [answer.status for answer in answers] == ([] if status is None else [status])
    assert len(fake.seen) == 1  # retrying is the delivery's (tests/test_report_retries.py)
    assert outcome.attempts == 3
    assert outcome.delivered is (status == 200)
    # Retry-After as parsed, no floor or cap of the client's; only a 429's or a 503's.
    assert outcome.retry_after == asked
    assert (error is None) is (outcome.last_error is None)
    assert error is None or error in (outcome.last_error or "")


# --- headers ------------------------------------------------------------------------------


async def test_authorization_is_the_raw_key_on_every_route() -> None:
    fake = FakePlatform([httpx.Response(204), httpx.Response(204), httpx.Response(200)])
    async with client_for(fake) as client:
        await client.take(1, in_progress=False)
        await client.poll_stop()
        await client.post([(DONE_URL, b"{}")], ReportOutcome())
    assert len(fake.seen) == 3
    for seen in fake.seen:
        assert seen.request.headers["authorization"] == KEY
        assert "bearer" not in seen.request.headers["authorization"].lower()
        assert seen.request.headers["user-agent"] == USER_AGENT
    assert USER_AGENT.startswith("trio_worker/")


async def test_empty_key_is_sent_as_an_empty_header() -> None:
    fake = FakePlatform([httpx.Response(204)])
    async with client_for(fake, RUNPOD_AI_API_KEY="") as client:
        await client.take(1, in_progress=False)
    assert fake.seen[0].request.headers["authorization"] == ""


# --- poll_stop ----------------------------------------------------------------------------


async def test_poll_stop_url_keeps_the_query_and_adds_nothing() -> None:
    fake = FakePlatform([httpx.Response(204)])
    async with client_for(fake) as client:
        assert await client.poll_stop() == []
    [seen] = fake.seen
    assert seen.request.method == "GET"
    assert str(seen.request.url) == f"{H}/job-stop/w1?gpu=A100"


async def test_poll_stop_returns_ids() -> None:
    fake = FakePlatform([httpx.Response(200, json={"jobsToStop": ["a", "b"]})])
    async with client_for(fake) as client:
        assert await client.poll_stop() == ["a", "b"]


async def test_poll_stop_drops_non_string_entries_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="trio_worker")
    fake = FakePlatform([httpx.Response(200, json={"jobsToStop": ["a", 3, None, "b"]})])
    async with client_for(fake) as client:
        assert await client.poll_stop() == ["a", "b"]
    assert any("jobsToStop" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    "reply",
    [
        httpx.Response(200, json={"jobs": ["a"]}),
        httpx.Response(200, json=["a"]),
        httpx.Response(200, text="a,b", headers={"content-type": "text/plain"}),
        httpx.Response(200, content=b"{", headers={"content-type": "application/json"}),
    ],
    ids=["missing key", "array", "text", "unparsable"],
)
async def test_poll_stop_unusable_answer_is_empty_with_a_warning(
    reply: httpx.Response, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="trio_worker")
    async with client_for(FakePlatform([reply])) as client:
        assert await client.poll_stop() == []
    assert [r for r in caplog.records if r.levelno == logging.WARNING]


async def test_poll_stop_429_and_errors() -> None:
    fake = FakePlatform(
        [
            httpx.Response(429, headers={"Retry-After": "2"}),
            httpx.Response(500),
            httpx.ConnectError("down"),
        ]
    )
    async with client_for(fake) as client:
        with pytest.raises(RateLimited) as limited:
            await client.poll_stop()
        with pytest.raises(PlatformError) as failed:
            await client.poll_stop()
        with pytest.raises(TransportError, match="closed the connection before answering"):
            await client.poll_stop()
    assert limited.value.retry_after == 2.0
    assert limited.value.route == "stop"
    assert failed.value.status == 500
    assert failed.value.route == "stop"


async def test_aclose_closes_both_clients() -> None:
    fake = FakePlatform([httpx.Response(204)])
    async with client_for(fake) as client:
        pass
    with pytest.raises(RuntimeError):
        await client.take(1, in_progress=False)
    with pytest.raises(RuntimeError):
        await client.post([(DONE_URL, b"{}")], ReportOutcome())
    assert fake.seen == []


async def test_connect_timeout_comes_from_timings(autojump_clock: trio.testing.MockClock) -> None:
    async def never(host: str, port: int, tls: bool) -> trio.abc.Stream:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    config = platform_from_env(WIRING)
    client = PlatformClient(config, Timings(connect_timeout=3.0), open_stream=never)
    start = trio.current_time()
    with pytest.raises(TransportError, match="timed out"):
        await client.take(1, in_progress=False)
    await client.aclose()
    assert trio.current_time() - start == pytest.approx(3.0)
