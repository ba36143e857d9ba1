"""The in-memory network: the production HTTP client against an ASGI app, in virtual time.

Every test runs under ``MockClock(autojump_threshold=0)``: memory streams are plain trio,
so long waits cost no wall time and nothing here touches a socket.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest
import trio
import trio.testing

from trio_worker import Timings, TransportError
from trio_worker._config import platform_from_env
from trio_worker._platform._client import PlatformClient
from trio_worker._platform._http import HttpPool
from trio_worker.testing import FakePlatform
from trio_worker.testing._http_server import AbortConnection
from trio_worker.testing._memory import memory_network

from .scripted_server import send_one

if TYPE_CHECKING:
    from trio_worker._platform._http import StreamOpener
    from trio_worker.testing._http_server import Receive, Scope, Send

pytestmark = pytest.mark.timeout(20)

URL = "http://platform.test/x"


class App:
    """Answers ``GET /x`` with the request count; ``/drop`` closes unanswered; ``/slow``
    answers after 100 virtual seconds."""

    def __init__(self) -> None:
        self.requests = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.requests += 1
        if scope["path"] == "/drop":
            raise AbortConnection
        if scope["path"] == "/slow":
            await trio.sleep(100)
        body = b"answer %d" % self.requests
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})


class Counting:
    """Counts the connections a client opens."""

    def __init__(self, inner: StreamOpener) -> None:
        self.inner = inner
        self.streams: list[trio.abc.Stream] = []

    @property
    def opened(self) -> int:
        return len(self.streams)

    async def __call__(self, host: str, port: int, tls: bool) -> trio.abc.Stream:
        stream = await self.inner(host, port, tls)
        self.streams.append(stream)
        return stream


async def test_a_request_over_memory_streams(autojump_clock: trio.testing.MockClock) -> None:
    app = App()
    async with memory_network(app) as opener:
        client = HttpPool({"Authorization": "k"}, open_stream=opener)
        answer = await send_one(client, "GET", URL)
        await client.aclose()
    assert (answer.status, answer.body) == (200, b"answer 1")
    assert answer.headers["content-length"] == "8"


async def test_an_exception_leaves_the_block_as_it_came(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Not wrapped in the server nursery's ExceptionGroup: trio_worker.testing.serve(app=)
    # runs the worker inside this block, and its callers catch InitializationError.
    async def use_then_fail() -> None:
        async with memory_network(App()) as opener:
            client = HttpPool({}, open_stream=opener)
            await send_one(client, "GET", URL)
            await client.aclose()
            raise KeyError("raised inside")

    with pytest.raises(KeyError, match="raised inside") as caught:
        await use_then_fail()
    assert type(caught.value) is KeyError


async def test_keep_alive_reuses_one_connection(autojump_clock: trio.testing.MockClock) -> None:
    app = App()
    async with memory_network(app) as opener:
        counting = Counting(opener)
        client = HttpPool({}, open_stream=counting)
        bodies = [(await send_one(client, "POST", URL, b"b")).body for _ in range(3)]
        await client.aclose()
    assert bodies == [b"answer 1", b"answer 2", b"answer 3"]
    assert counting.opened == 1


async def test_a_server_side_drop_is_a_transport_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app = App()
    async with memory_network(app) as opener:
        counting = Counting(opener)
        client = HttpPool({}, open_stream=counting)
        with pytest.raises(TransportError, match="closed the connection"):
            await send_one(client, "GET", "http://platform.test/drop")
        # The broken connection was not pooled: the next request opens a new one.
        assert (await send_one(client, "GET", URL)).body == b"answer 2"
        await client.aclose()
    assert counting.opened == 2


async def test_an_idle_connection_the_server_closed_is_retried_on_a_fresh_one(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app = App()
    async with memory_network(app, keep_alive_timeout=5.0) as opener:
        counting = Counting(opener)
        client = HttpPool({}, open_stream=counting)
        await send_one(client, "GET", URL)
        await trio.sleep(10)  # the server's keep-alive timeout closes the idle connection
        assert (await send_one(client, "GET", URL)).body == b"answer 2"
        await client.aclose()
    assert counting.opened == 2
    assert app.requests == 2


async def test_waits_run_on_the_virtual_clock(autojump_clock: trio.testing.MockClock) -> None:
    wall = time.monotonic()
    start = trio.current_time()
    async with memory_network(App()) as opener:
        client = HttpPool({}, open_stream=opener)
        answer = await send_one(client, "GET", "http://platform.test/slow")
        await client.aclose()
    assert answer.status == 200
    assert trio.current_time() - start == pytest.approx(100)
    assert time.monotonic() - wall < 5


async def test_a_cancelled_request_closes_its_connection(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with memory_network(App()) as opener:
        counting = Counting(opener)
        client = HttpPool({}, open_stream=counting)
        with trio.move_on_after(1):
            await send_one(client, "GET", "http://platform.test/slow")
        assert (await send_one(client, "GET", URL)).body == b"answer 2"
        await client.aclose()
    assert counting.opened == 2


async def test_the_platform_client_takes_a_job_from_the_fake_platform(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A proxy variable would route a default client through httpx; an injected opener wins.
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
    platform = FakePlatform(take_hold=1.0)
    job_id = platform.enqueue({"n": 1})
    config = platform_from_env(platform.worker_env("https://platform.test"))
    async with memory_network(platform) as opener:
        client = PlatformClient(config, Timings(), open_stream=opener)
        assert isinstance(client.polls, HttpPool)
        taken = await client.take(1, in_progress=False)
        empty = await client.take(1, in_progress=True)
        await client.aclose()
    assert [job["id"] for job in taken.jobs] == [job_id]
    assert empty.jobs == []


async def test_aclose_closes_every_idle_connection_even_when_cancelled(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with memory_network(App()) as opener:
        counting = Counting(opener)
        client = HttpPool({}, open_stream=counting)
        async with trio.open_nursery() as nursery:
            for _ in range(3):  # at once: three connections, all pooled afterwards
                nursery.start_soon(send_one, client, "GET", "http://platform.test/slow")
        assert counting.opened == 3
        with trio.CancelScope() as scope:
            scope.cancel()
            await client.aclose()
        for stream in counting.streams:
            with pytest.raises(trio.ClosedResourceError):
                await stream.send_all(b"GET / HTTP/1.1\r\n\r\n")
