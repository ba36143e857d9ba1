"""The lean client over real loopback: the bytes on the wire, keep-alive and the reuse rule,
the connection's named state (:mod:`tests.scripted_server` plays the platform)."""

from __future__ import annotations

import ssl

import pytest
import trio
import trio.testing

from trio_worker._platform import _http as http_module
from trio_worker._platform._connection import Connection, Phase
from trio_worker._platform._http import HttpPool, HttpResponse, QuietProbe
from trio_worker._platform._network import trust_context
from trio_worker._platform._request import parse_origin

from .scripted_server import (
    TIMEOUT,
    Peer,
    Server,
    StrayAnswer,
    client_fixture,  # noqa: F401 (a fixture)
    response,
    send_one,
    server_fixture,  # noqa: F401 (a fixture)
)

pytestmark = pytest.mark.timeout(20)

# --------------------------------------------------------------------------------------
# Round trips: the bytes on the wire
# --------------------------------------------------------------------------------------


async def test_get_sends_exact_request_bytes(server: Server, client: HttpPool) -> None:
    server.reply(response(b'{"id": "j1"}', headers=("Content-Type: application/json",)))
    with trio.fail_after(TIMEOUT):
        answer = await send_one(client, "GET", server.url("/v2/ep/job-take/w1?batch=3&x=%2F"))
    assert answer == HttpResponse(
        200,
        {"content-type": "application/json", "content-length": "12"},
        b'{"id": "j1"}',
    )
    [request] = server.requests
    assert request.raw == (
        b"GET /v2/ep/job-take/w1?batch=3&x=%2F HTTP/1.1\r\n"
        + f"Host: 127.0.0.1:{server.port}\r\n".encode()
        + b"Authorization: Bearer secret-key\r\n"
        b"User-Agent: trio-worker-test/1\r\n"
        b"Content-Length: 0\r\n"
        b"\r\n"
    )


async def test_post_sends_body_verbatim(server: Server, client: HttpPool) -> None:
    body = b'{"output": "a\\r\\nb"}\r\n\r\nHTTP/1.1 200 OK\x00\xff' + bytes(range(256))
    server.reply(response(b"", "204 No Content", length=False))
    server.reply(response(b"ok"))
    with trio.fail_after(TIMEOUT):
        first = await send_one(
            client, "POST", server.url("/v2/ep/job-done/w1?isStream=false"), body
        )
        second = await send_one(client, "POST", server.url("/empty"))
    assert (first.status, first.body) == (204, b"")
    assert (second.status, second.body) == (200, b"ok")
    posted, empty = server.requests
    assert (posted.method, posted.target, posted.version) == (
        "POST",
        "/v2/ep/job-done/w1?isStream=false",
        "HTTP/1.1",
    )
    assert posted.header("Content-Length") == str(len(body))
    assert posted.body == body
    assert posted.header("Host") == f"127.0.0.1:{server.port}"
    assert posted.header("Authorization") == "Bearer secret-key"
    assert (empty.header("Content-Length"), empty.body) == ("0", b"")


async def test_target_defaults_to_slash_and_drops_fragment(
    server: Server, client: HttpPool
) -> None:
    server.reply(response())
    server.reply(response())
    with trio.fail_after(TIMEOUT):
        await send_one(client, "GET", f"http://127.0.0.1:{server.port}")
        await send_one(client, "GET", server.url("/p?q=1#fragment"))
    assert [r.target for r in server.requests] == ["/", "/p?q=1"]


async def test_no_static_headers(server: Server) -> None:
    server.reply(response())
    lean = HttpPool({})
    try:
        with trio.fail_after(TIMEOUT):
            await send_one(lean, "DELETE", server.url("/x"))
    finally:
        await lean.aclose()
    assert (
        server.requests[0].raw
        == (
            f"DELETE /x HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nContent-Length: 0\r\n\r\n"
        ).encode()
    )


@pytest.fixture
def redirected(server: Server, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, int]]:
    """Route every connection (http and https) to the plain loopback ``server``.

    So URLs on default ports (80, 443) can be tested without binding them, and the https
    code path is exercised without TLS. Records (kind, host, port) of each connect.
    """
    calls: list[tuple[str, str, int]] = []
    real_open = trio.open_tcp_stream

    async def fake_tcp(host: str, port: int, **kwargs: object) -> trio.SocketStream:
        calls.append(("tcp", host, port))
        return await real_open("127.0.0.1", server.port)

    async def fake_tls(host: str, port: int, context: ssl.SSLContext) -> trio.SocketStream:
        assert context is trust_context()  # the one trust store
        calls.append(("ssl", host, port))
        return await real_open("127.0.0.1", server.port)

    monkeypatch.setattr(trio, "open_tcp_stream", fake_tcp)
    monkeypatch.setattr(http_module, "open_tls_stream", fake_tls)
    return calls


@pytest.mark.parametrize(
    ("url", "connect", "host"),
    [
        ("http://api.example.test/v2/x?y=1", ("tcp", "api.example.test", 80), "api.example.test"),
        (
            "http://api.example.test:80/v2/x?y=1",
            ("tcp", "api.example.test", 80),
            "api.example.test",
        ),
        (
            "http://api.example.test:8080/v2/x?y=1",
            ("tcp", "api.example.test", 8080),
            "api.example.test:8080",
        ),
        (
            "http://api.example.test:443/v2/x?y=1",
            ("tcp", "api.example.test", 443),
            "api.example.test:443",
        ),
        ("https://api.example.test/v2/x?y=1", ("ssl", "api.example.test", 443), "api.example.test"),
        (
            "https://api.example.test:8443/v2/x?y=1",
            ("ssl", "api.example.test", 8443),
            "api.example.test:8443",
        ),
        (
            "https://api.example.test:80/v2/x?y=1",
            ("ssl", "api.example.test", 80),
            "api.example.test:80",
        ),
    ],
)
async def test_host_header_and_default_ports(
    server: Server,
    client: HttpPool,
    redirected: list[tuple[str, str, int]],
    url: str,
    connect: tuple[str, str, int],
    host: str,
) -> None:
    server.reply(response(b"a"))
    server.reply(response(b"b"))
    with trio.fail_after(TIMEOUT):
        assert (await send_one(client, "GET", url)).body == b"a"
        assert (await send_one(client, "GET", url)).body == b"b"  # kept alive per origin
    assert redirected == [connect]
    assert [r.header("Host") for r in server.requests] == [host, host]
    assert [r.target for r in server.requests] == ["/v2/x?y=1", "/v2/x?y=1"]


async def test_origins_do_not_share_connections(
    server: Server, client: HttpPool, redirected: list[tuple[str, str, int]]
) -> None:
    for _ in range(4):
        server.reply(response())
    with trio.fail_after(TIMEOUT):
        for url in ("http://a.test/", "http://b.test/", "http://a.test/", "https://a.test/"):
            await send_one(client, "GET", url)
    assert redirected == [("tcp", "a.test", 80), ("tcp", "b.test", 80), ("ssl", "a.test", 443)]
    assert server.accepted == 3
    assert [r.connection for r in server.requests] == [0, 1, 0, 2]


async def test_host_header_for_ipv6_literal(nursery: trio.Nursery, client: HttpPool) -> None:
    v6 = await Server("::1").start(nursery)
    v6.reply(response(b"ok"))
    with trio.fail_after(TIMEOUT):
        answer = await send_one(client, "GET", v6.url("/x"))
    assert answer.body == b"ok"
    assert v6.requests[0].header("Host") == f"[::1]:{v6.port}"


# --------------------------------------------------------------------------------------
# Keep-alive
# --------------------------------------------------------------------------------------


async def test_sequential_requests_share_one_connection(server: Server, client: HttpPool) -> None:
    n = 10
    for i in range(n):
        server.reply(response(f"answer {i}".encode()))
    with trio.fail_after(TIMEOUT):
        bodies = [
            (
                await send_one(client, "POST" if i % 2 else "GET", server.url(f"/r/{i}"), b"x" * i)
            ).body
            for i in range(n)
        ]
    assert bodies == [f"answer {i}".encode() for i in range(n)]
    assert server.accepted == 1
    assert [r.target for r in server.requests] == [f"/r/{i}" for i in range(n)]
    assert [r.body for r in server.requests] == [b"x" * i for i in range(n)]


async def test_concurrent_requests_open_separate_connections_then_reuse(
    server: Server, client: HttpPool
) -> None:
    # Three requests in flight at once need three connections; afterwards all three are
    # idle and the next three requests reuse them.
    gate = trio.Event()

    async def handler(peer: Peer) -> None:
        while (request := await peer.read_request()) is not None:
            if len(server.requests) >= 3:
                gate.set()
            await gate.wait()
            await peer.send([response(request.target.encode())])

    server.handler = handler
    results: list[bytes] = []

    async def one(i: int) -> None:
        results.append((await send_one(client, "GET", server.url(f"/{i}"))).body)

    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            for i in range(3):
                nursery.start_soon(one, i)
        assert server.accepted == 3
        async with trio.open_nursery() as nursery:
            for i in range(3, 6):
                nursery.start_soon(one, i)
    assert sorted(results) == [f"/{i}".encode() for i in range(6)]
    assert server.accepted == 3


@pytest.mark.parametrize("value", ["close", "Close", "CLOSE"])
async def test_connection_close_response_is_not_reused(
    server: Server, client: HttpPool, value: str
) -> None:
    server.reply(response(b"first", headers=(f"Connection: {value}",)))
    server.reply(response(b"second"))
    with trio.fail_after(TIMEOUT):
        assert (await send_one(client, "GET", server.url("/1"))).body == b"first"
        await server.peers[0].client_closed.wait()  # the client closed its side
        assert (await send_one(client, "GET", server.url("/2"))).body == b"second"
    assert server.accepted == 2
    assert [r.connection for r in server.requests] == [0, 1]
    assert not server.peers[0].client_reset


async def test_http10_response_without_keep_alive_is_not_reused(
    server: Server, client: HttpPool
) -> None:
    server.reply(response(b"old", version="HTTP/1.0"))
    server.reply(response(b"new"))
    with trio.fail_after(TIMEOUT):
        first = await send_one(client, "GET", server.url("/1"))
        await server.peers[0].client_closed.wait()
        second = await send_one(client, "GET", server.url("/2"))
    assert (first.status, first.body, second.body) == (200, b"old", b"new")
    assert server.accepted == 2


async def test_http10_response_with_keep_alive_is_not_reused(
    server: Server, client: HttpPool
) -> None:
    # h11 keeps only HTTP/1.1 connections alive: an HTTP/1.0 server gets a fresh one.
    server.reply(response(b"old", version="HTTP/1.0", headers=("Connection: Keep-Alive",)))
    server.reply(response(b"new"))
    with trio.fail_after(TIMEOUT):
        assert (await send_one(client, "GET", server.url("/1"))).body == b"old"
        await server.peers[0].client_closed.wait()
        assert (await send_one(client, "GET", server.url("/2"))).body == b"new"
    assert server.accepted == 2


@pytest.mark.parametrize(
    "connection", ["keep-alive, close", "close, keep-alive", "Upgrade, Close", "x, CLOSE"]
)
async def test_close_anywhere_in_the_connection_list_is_not_reused(
    server: Server, client: HttpPool, connection: str
) -> None:
    server.reply(response(b"first", headers=(f"Connection: {connection}",)))
    server.reply(response(b"second"))
    with trio.fail_after(TIMEOUT):
        assert (await send_one(client, "GET", server.url("/1"))).body == b"first"
        await server.peers[0].client_closed.wait()
        assert (await send_one(client, "GET", server.url("/2"))).body == b"second"
    assert server.accepted == 2


async def test_extra_bytes_after_response_prevent_reuse(server: Server, client: HttpPool) -> None:
    # Bytes beyond the framed body (in the same write) mean the stream is out of sync:
    # the connection must not be reused.
    server.reply(response(b"ok") + b"garbage")
    server.reply(response(b"fresh"))
    with trio.fail_after(TIMEOUT):
        assert (await send_one(client, "GET", server.url("/1"))).body == b"ok"
        assert (await send_one(client, "GET", server.url("/2"))).body == b"fresh"
    assert server.accepted == 2


@pytest.mark.parametrize(
    "stray",
    [
        response(b"", "200 OK"),
        response(b"", "408 Request Timeout"),
        b"HTTP/1.1 200 OK\r\n",  # the start of one
    ],
)
async def test_an_answer_nobody_asked_for_on_an_idle_connection_is_never_read(
    server: Server, client: HttpPool, stray: bytes
) -> None:
    # Regression: a stray answer on an idle kept-alive connection was read as the next
    # request's answer: job B's 503 was taken as job C's 200, so B was never stored and
    # C was stored twice. An idle connection is used again only when it is quiet.
    script = StrayAnswer(server, stray)
    server.reply(response(b"A stored"))
    server.reply(response(b"B refused", "503 Service Unavailable"))
    server.reply(response(b"C stored"))
    with trio.fail_after(TIMEOUT):
        a = await send_one(client, "POST", server.url("/job-done/w1/A"), b"{}")
        script.answers_read.set()
        await script.stray_sent.wait()
        await trio.sleep(0.005)  # the stray's bytes cross loopback
        b = await send_one(client, "POST", server.url("/job-done/w1/B"), b"{}")
        c = await send_one(client, "POST", server.url("/job-done/w1/C"), b"{}")
    assert [a.body, b.body, c.body] == [b"A stored", b"B refused", b"C stored"]
    assert [a.status, b.status, c.status] == [200, 503, 200]
    assert server.accepted == 2  # the spoiled connection was closed, one opened
    assert [r.target for r in server.requests] == [
        "/job-done/w1/A",
        "/job-done/w1/B",
        "/job-done/w1/C",
    ]


async def test_a_connection_found_quiet_once_is_checked_again_at_its_next_reuse(
    server: Server, client: HttpPool
) -> None:
    # The quiet check keeps its poll of the socket from one reuse to the next: the stray
    # answer comes after the second request's, so only the second check can see it.
    script = StrayAnswer(server, response(b"", "408 Request Timeout"), after=2)
    for name in "ABC":
        server.reply(response(f"{name} stored".encode()))
    with trio.fail_after(TIMEOUT):
        a = await send_one(client, "POST", server.url("/job-done/w1/A"), b"{}")
        b = await send_one(client, "POST", server.url("/job-done/w1/B"), b"{}")
        script.answers_read.set()
        await script.stray_sent.wait()
        await trio.sleep(0.005)  # the stray's bytes cross loopback
        c = await send_one(client, "POST", server.url("/job-done/w1/C"), b"{}")
    assert [a.body, b.body, c.body] == [b"A stored", b"B stored", b"C stored"]
    assert server.accepted == 2  # A and B on the first connection; C on a new one


# --------------------------------------------------------------------------------------
# The connection's named state
# --------------------------------------------------------------------------------------


async def test_a_connection_shows_its_named_phase() -> None:
    client_end, server_end = trio.testing.memory_stream_pair()
    connection = Connection(
        client_end, parse_origin("http://platform.test:8080"), QuietProbe(client_end).quiet
    )
    assert repr(connection) == "<Connection to platform.test:8080 idle, 0 exchange(s)>"
    answers: list[HttpResponse] = []
    requests = [("http://platform.test:8080/a", b""), ("http://platform.test:8080/b", b"")]
    async with trio.open_nursery() as nursery:
        reusable: list[bool] = []

        async def exchange() -> None:
            wire = b"GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\n\r\n"
            reusable.append(await connection.exchange(wire, "GET", requests, answers, 99, 99))

        nursery.start_soon(exchange)
        await server_end.receive_some()
        await server_end.send_all(response(b"first") + b"HTTP/1.1 200 OK\r\nContent-Length: 6")
        await trio.testing.wait_all_tasks_blocked()
        assert repr(connection) == (
            "<Connection to platform.test:8080 exchanging, 1 exchange(s), "
            "1 answer(s) read, 1 due, reading a head>"
        )
        await server_end.send_all(b"\r\n\r\nsec")
        await trio.testing.wait_all_tasks_blocked()
        assert repr(connection) == (
            "<Connection to platform.test:8080 exchanging, 1 exchange(s), "
            "1 answer(s) read, 1 due, reading a body>"
        )
        await server_end.send_all(b"ond")
    assert reusable == [True]
    assert [answer.body for answer in answers] == [b"first", b"second"]
    assert repr(connection) == "<Connection to platform.test:8080 idle, 1 exchange(s)>"
    await connection.aclose()
    assert connection.phase is Phase.CLOSED
    assert repr(connection) == "<Connection to platform.test:8080 closed, 1 exchange(s)>"


async def test_the_client_shows_its_pool(server: Server) -> None:
    client = HttpPool({}, max_connections=3, keepalive_expiry=7.5)
    tail = "at most 3, kept idle for at most 7.5s>"
    server.reply(response(b"ok"))
    answered = trio.Event()
    slow = response(b"slow")
    server.reply(slow[:-2], slow[-2:], pause=0.01)  # the pool is shown meanwhile
    assert repr(client) == f"<HttpPool 0 in use, 0 idle, {tail}"
    try:
        with trio.fail_after(TIMEOUT):
            await send_one(client, "GET", server.url("/1"))
            where = f"127.0.0.1:{server.port}"
            assert repr(client) == f"<HttpPool 0 in use, 1 idle ({where}: 1), {tail}"
            async with trio.open_nursery() as nursery:

                async def second() -> None:
                    await send_one(client, "GET", server.url("/2"))
                    answered.set()

                nursery.start_soon(second)
                await trio.testing.wait_all_tasks_blocked()
                assert repr(client).startswith("<HttpPool 1 in use, 0 idle, ")
            assert answered.is_set()
            assert repr(client) == f"<HttpPool 0 in use, 1 idle ({where}: 1), {tail}"
    finally:
        await client.aclose()


# --------------------------------------------------------------------------------------
# The pool: a cap on connections, and a keep-alive expiry (as httpcore's pool has)
# --------------------------------------------------------------------------------------


class MemoryOrigins:
    """An opener of in-memory connections whose server side answers each request once
    ``release`` is set (at once when it is None), and notes what it sees."""

    def __init__(self, nursery: trio.Nursery, release: trio.Event | None = None) -> None:
        self.nursery = nursery
        self.release = release
        self.opened: list[str] = []
        self.closed_by_client: list[str] = []

    async def open_stream(self, host: str, port: int, tls: bool) -> trio.abc.Stream:
        client_end, server_end = trio.testing.memory_stream_pair()
        self.opened.append(host)
        self.nursery.start_soon(self._serve, host, server_end)
        return client_end

    async def _serve(self, host: str, stream: trio.abc.Stream) -> None:
        buffer = b""
        while True:
            data = await stream.receive_some(65536)
            if not data:
                self.closed_by_client.append(host)
                return
            buffer += data
            while b"\r\n\r\n" in buffer:
                _, _, buffer = buffer.partition(b"\r\n\r\n")
                if self.release is not None:
                    await self.release.wait()
                await stream.send_all(response(host.encode()))


async def test_requests_beyond_the_cap_wait_for_a_connection() -> None:
    async with trio.open_nursery() as nursery:
        release = trio.Event()
        origins = MemoryOrigins(nursery, release)
        client = HttpPool({}, open_stream=origins.open_stream, max_connections=2)
        bodies: list[bytes] = []

        async def one(n: int) -> None:
            bodies.append((await send_one(client, "GET", f"http://p.test/{n}")).body)

        async with trio.open_nursery() as requests:
            for n in range(3):
                requests.start_soon(one, n)
            await trio.testing.wait_all_tasks_blocked()
            # Two connections at most: the third request waits for one of them.
            assert origins.opened == ["p.test", "p.test"]
            assert repr(client).startswith("<HttpPool 2 in use, 0 idle, at most 2,")
            release.set()
        assert bodies == [b"p.test"] * 3
        assert origins.opened == ["p.test", "p.test"]  # the third went on a kept one
        assert repr(client).startswith("<HttpPool 0 in use, 2 idle (p.test:80: 2), at most 2,")
        await client.aclose()
        nursery.cancel_scope.cancel()


async def test_an_idle_connection_to_another_origin_is_closed_to_make_room() -> None:
    async with trio.open_nursery() as nursery:
        origins = MemoryOrigins(nursery)
        client = HttpPool({}, open_stream=origins.open_stream, max_connections=1)
        assert (await send_one(client, "GET", "http://a.test/x")).body == b"a.test"
        assert repr(client).startswith("<HttpPool 0 in use, 1 idle (a.test:80: 1),")
        assert (await send_one(client, "GET", "http://b.test/y")).body == b"b.test"
        await trio.testing.wait_all_tasks_blocked()
        assert origins.opened == ["a.test", "b.test"]
        assert origins.closed_by_client == ["a.test"]
        assert repr(client).startswith("<HttpPool 0 in use, 1 idle (b.test:80: 1),")
        await client.aclose()
        nursery.cancel_scope.cancel()


async def test_an_idle_connection_is_used_again_only_within_the_keepalive_expiry(
    autojump_clock: trio.testing.MockClock,
) -> None:
    assert http_module.KEEPALIVE_EXPIRY == 15.0  # aiohttp's, which the reference runs with
    async with trio.open_nursery() as nursery:
        origins = MemoryOrigins(nursery)
        client = HttpPool({}, open_stream=origins.open_stream)
        await send_one(client, "GET", "http://p.test/1")
        await trio.sleep(14.9)
        await send_one(client, "GET", "http://p.test/2")
        await trio.testing.wait_all_tasks_blocked()
        assert (origins.opened, origins.closed_by_client) == (["p.test"], [])
        await trio.sleep(15.1)  # idle since its last answer for longer than the expiry
        await send_one(client, "GET", "http://p.test/3")
        await trio.testing.wait_all_tasks_blocked()
        assert origins.opened == ["p.test", "p.test"]
        assert origins.closed_by_client == ["p.test"]  # the expired one, not kept
        assert repr(client).startswith("<HttpPool 0 in use, 1 idle (p.test:80: 1),")
        await client.aclose()
        nursery.cancel_scope.cancel()
