"""The worker's HTTP clients: :class:`LeanHttp` over real loopback, :class:`HttpxHttp`, and
:func:`make_backend`.

The lean client is tested against a raw TCP server scripted byte by byte (:class:`Server`),
so every test controls exactly what the client receives: how the response is split into
TCP writes, when the server closes or resets, and whether a connection is reused (counted
by accepted connections). Real sockets use the real clock, so every wait is on an event
bounded by ``trio.fail_after``; the only sleeps are a few milliseconds to split writes.
"""

from __future__ import annotations

import contextlib
import gc
import pathlib
import socket
import ssl
import struct
import warnings
from collections import deque
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import trio
import trustme

from trio_worker import ConfigurationError, TransportError
from trio_worker._config import MAX_ANSWER_BYTES
from trio_worker._platform import _lean as lean_module
from trio_worker._platform import _reading as reading_module
from trio_worker._platform._answer import parse_simple_answer
from trio_worker._platform._http import (
    MAX_HEADER_BYTES,
    MAX_HEADER_COUNT,
    HttpResponse,
    HttpxHttp,
    LeanHttp,
    make_backend,
    proxy_configured,
)
from trio_worker._platform._tls import trust_context

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

pytestmark = pytest.mark.timeout(20)

STATIC_HEADERS = {"Authorization": "Bearer secret-key", "User-Agent": "trio-worker-test/1"}
TIMEOUT = 5.0


# --------------------------------------------------------------------------------------
# A scripted HTTP/1.1 server on loopback
# --------------------------------------------------------------------------------------


@dataclass
class Received:
    """One request as the server read it off the wire."""

    connection: int
    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]
    body: bytes
    raw: bytes

    def header(self, name: str) -> str | None:
        values = [v for k, v in self.headers if k.lower() == name.lower()]
        assert len(values) <= 1, f"duplicate header {name}: {values}"
        return values[0] if values else None


@dataclass
class Reply:
    """What the server does after reading one request.

    ``parts`` are sent as separate TCP writes (``pause`` seconds apart), then ``then``:
    ``"keep"`` reads the next request on the same connection, ``"close"`` closes it
    cleanly (FIN) and ``"reset"`` aborts it (RST, SO_LINGER 0).
    """

    parts: list[bytes]
    then: str = "keep"
    pause: float = 0.0


class Peer:
    """The server's side of one accepted connection."""

    def __init__(self, server: Server, stream: trio.SocketStream, index: int) -> None:
        self.server = server
        self.stream = stream
        self.index = index
        self.buffer = bytearray()
        self.client_closed = trio.Event()  # the client closed or reset its side
        self.client_reset = False
        self.done = trio.Event()  # the handler for this connection returned
        self.closed_by_server = False

    async def _receive(self) -> bytes:
        try:
            data = await self.stream.receive_some(65536)
        except trio.ClosedResourceError:  # we closed it ourselves (close()/reset())
            return b""
        except trio.BrokenResourceError:
            self.client_reset = True
            self.client_closed.set()
            return b""
        if not data and not self.closed_by_server:
            self.client_closed.set()
        return data

    async def read_request(self) -> Received | None:
        """The next request, or None when the connection ended at a request boundary."""
        while (end := self.buffer.find(b"\r\n\r\n")) < 0:
            data = await self._receive()
            if not data:
                assert not self.buffer, f"connection ended inside a head: {bytes(self.buffer)!r}"
                return None
            self.buffer += data
        head = bytes(self.buffer[:end]).decode("latin-1")
        lines = head.split("\r\n")
        method, target, version = lines[0].split(" ")
        headers: list[tuple[str, str]] = []
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            assert sep, f"bad header line {line!r}"
            headers.append((name, value.strip()))
        lengths = [v for k, v in headers if k.lower() == "content-length"]
        size = int(lengths[0]) if lengths else 0
        while len(self.buffer) < end + 4 + size:
            data = await self._receive()
            assert data, "connection ended inside a request body"
            self.buffer += data
        raw = bytes(self.buffer[: end + 4 + size])
        del self.buffer[: end + 4 + size]
        request = Received(self.index, method, target, version, headers, raw[end + 4 :], raw)
        self.server.requests.append(request)
        self.server.request_arrived.set()
        return request

    async def send(self, parts: list[bytes], pause: float = 0.0) -> None:
        for number, part in enumerate(parts):
            if number and pause:
                await trio.sleep(pause)
            await self.stream.send_all(part)

    async def close(self) -> None:
        self.closed_by_server = True
        await self.stream.aclose()

    async def reset(self) -> None:
        self.closed_by_server = True
        self.stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await self.stream.aclose()


class Server:
    """Accepts connections and answers each request with the next queued :class:`Reply`."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = 0
        self.replies: deque[Reply] = deque()
        self.requests: list[Received] = []
        self.peers: list[Peer] = []
        self.accepted = 0
        self.request_arrived = trio.Event()
        self.handler: Callable[[Peer], Awaitable[None]] = self.scripted

    def url(self, target: str) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{target}"

    def reply(self, *parts: bytes, then: str = "keep", pause: float = 0.0) -> None:
        self.replies.append(Reply(list(parts), then, pause))

    async def start(self, nursery: trio.Nursery) -> Server:
        listeners = await nursery.start(partial(trio.serve_tcp, host=self.host), self._handle, 0)
        self.port = listeners[0].socket.getsockname()[1]
        return self

    async def _handle(self, stream: trio.SocketStream) -> None:
        peer = Peer(self, stream, self.accepted)
        self.accepted += 1
        self.peers.append(peer)
        try:
            await self.handler(peer)
        except trio.BrokenResourceError:  # the client gave up while we were sending
            peer.client_reset = True
            peer.client_closed.set()
        finally:
            peer.done.set()

    async def scripted(self, peer: Peer) -> None:
        while (request := await peer.read_request()) is not None:
            assert self.replies, f"unexpected request {request.raw!r}"
            reply = self.replies.popleft()
            await peer.send(reply.parts, reply.pause)
            if reply.then == "close":
                await peer.close()
                return
            if reply.then == "reset":
                if reply.pause:
                    await trio.sleep(reply.pause)
                await peer.reset()
                return
            assert reply.then == "keep", reply.then


def response(
    body: bytes = b"",
    status: str = "200 OK",
    headers: tuple[str, ...] = (),
    *,
    length: bool = True,
    version: str = "HTTP/1.1",
) -> bytes:
    lines = [f"{version} {status}", *headers]
    if length:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def split(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


@pytest.fixture
async def server(nursery: trio.Nursery) -> Server:
    return await Server().start(nursery)


@pytest.fixture
async def client() -> AsyncIterator[LeanHttp]:
    lean = LeanHttp(STATIC_HEADERS)
    try:
        yield lean
    finally:
        await lean.aclose()


def assert_no_resource_warning() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gc.collect()
    leaks = [w for w in caught if issubclass(w.category, ResourceWarning)]
    assert not leaks, [str(w.message) for w in leaks]


# --------------------------------------------------------------------------------------
# Round trips: the bytes on the wire
# --------------------------------------------------------------------------------------


async def test_get_sends_exact_request_bytes(server: Server, client: LeanHttp) -> None:
    server.reply(response(b'{"id": "j1"}', headers=("Content-Type: application/json",)))
    with trio.fail_after(TIMEOUT):
        answer = await client.request("GET", server.url("/v2/ep/job-take/w1?batch=3&x=%2F"))
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


async def test_post_sends_body_verbatim(server: Server, client: LeanHttp) -> None:
    body = b'{"output": "a\\r\\nb"}\r\n\r\nHTTP/1.1 200 OK\x00\xff' + bytes(range(256))
    server.reply(response(b"", "204 No Content", length=False))
    server.reply(response(b"ok"))
    with trio.fail_after(TIMEOUT):
        first = await client.request("POST", server.url("/v2/ep/job-done/w1?isStream=false"), body)
        second = await client.request("POST", server.url("/empty"))
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
    server: Server, client: LeanHttp
) -> None:
    server.reply(response())
    server.reply(response())
    with trio.fail_after(TIMEOUT):
        await client.request("GET", f"http://127.0.0.1:{server.port}")
        await client.request("GET", server.url("/p?q=1#fragment"))
    assert [r.target for r in server.requests] == ["/", "/p?q=1"]


async def test_no_static_headers(server: Server) -> None:
    server.reply(response())
    lean = LeanHttp({})
    try:
        with trio.fail_after(TIMEOUT):
            await lean.request("DELETE", server.url("/x"))
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
    monkeypatch.setattr(lean_module, "open_tls_stream", fake_tls)
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
    client: LeanHttp,
    redirected: list[tuple[str, str, int]],
    url: str,
    connect: tuple[str, str, int],
    host: str,
) -> None:
    server.reply(response(b"a"))
    server.reply(response(b"b"))
    with trio.fail_after(TIMEOUT):
        assert (await client.request("GET", url)).body == b"a"
        assert (await client.request("GET", url)).body == b"b"  # kept alive per origin
    assert redirected == [connect]
    assert [r.header("Host") for r in server.requests] == [host, host]
    assert [r.target for r in server.requests] == ["/v2/x?y=1", "/v2/x?y=1"]


async def test_origins_do_not_share_connections(
    server: Server, client: LeanHttp, redirected: list[tuple[str, str, int]]
) -> None:
    for _ in range(4):
        server.reply(response())
    with trio.fail_after(TIMEOUT):
        for url in ("http://a.test/", "http://b.test/", "http://a.test/", "https://a.test/"):
            await client.request("GET", url)
    assert redirected == [("tcp", "a.test", 80), ("tcp", "b.test", 80), ("ssl", "a.test", 443)]
    assert server.accepted == 3
    assert [r.connection for r in server.requests] == [0, 1, 0, 2]


async def test_host_header_for_ipv6_literal(nursery: trio.Nursery, client: LeanHttp) -> None:
    v6 = await Server("::1").start(nursery)
    v6.reply(response(b"ok"))
    with trio.fail_after(TIMEOUT):
        answer = await client.request("GET", v6.url("/x"))
    assert answer.body == b"ok"
    assert v6.requests[0].header("Host") == f"[::1]:{v6.port}"


# --------------------------------------------------------------------------------------
# Keep-alive
# --------------------------------------------------------------------------------------


async def test_sequential_requests_share_one_connection(server: Server, client: LeanHttp) -> None:
    n = 10
    for i in range(n):
        server.reply(response(f"answer {i}".encode()))
    with trio.fail_after(TIMEOUT):
        bodies = [
            (await client.request("POST" if i % 2 else "GET", server.url(f"/r/{i}"), b"x" * i)).body
            for i in range(n)
        ]
    assert bodies == [f"answer {i}".encode() for i in range(n)]
    assert server.accepted == 1
    assert [r.target for r in server.requests] == [f"/r/{i}" for i in range(n)]
    assert [r.body for r in server.requests] == [b"x" * i for i in range(n)]


async def test_concurrent_requests_open_separate_connections_then_reuse(
    server: Server, client: LeanHttp
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
        results.append((await client.request("GET", server.url(f"/{i}"))).body)

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
    server: Server, client: LeanHttp, value: str
) -> None:
    server.reply(response(b"first", headers=(f"Connection: {value}",)))
    server.reply(response(b"second"))
    with trio.fail_after(TIMEOUT):
        assert (await client.request("GET", server.url("/1"))).body == b"first"
        await server.peers[0].client_closed.wait()  # the client closed its side
        assert (await client.request("GET", server.url("/2"))).body == b"second"
    assert server.accepted == 2
    assert [r.connection for r in server.requests] == [0, 1]
    assert not server.peers[0].client_reset


async def test_http10_response_without_keep_alive_is_not_reused(
    server: Server, client: LeanHttp
) -> None:
    server.reply(response(b"old", version="HTTP/1.0"))
    server.reply(response(b"new"))
    with trio.fail_after(TIMEOUT):
        first = await client.request("GET", server.url("/1"))
        await server.peers[0].client_closed.wait()
        second = await client.request("GET", server.url("/2"))
    assert (first.status, first.body, second.body) == (200, b"old", b"new")
    assert server.accepted == 2


async def test_http10_response_with_keep_alive_is_not_reused(
    server: Server, client: LeanHttp
) -> None:
    # h11 keeps only HTTP/1.1 connections alive: an HTTP/1.0 server gets a fresh one.
    server.reply(response(b"old", version="HTTP/1.0", headers=("Connection: Keep-Alive",)))
    server.reply(response(b"new"))
    with trio.fail_after(TIMEOUT):
        assert (await client.request("GET", server.url("/1"))).body == b"old"
        await server.peers[0].client_closed.wait()
        assert (await client.request("GET", server.url("/2"))).body == b"new"
    assert server.accepted == 2


@pytest.mark.parametrize(
    "connection", ["keep-alive, close", "close, keep-alive", "Upgrade, Close", "x, CLOSE"]
)
async def test_close_anywhere_in_the_connection_list_is_not_reused(
    server: Server, client: LeanHttp, connection: str
) -> None:
    server.reply(response(b"first", headers=(f"Connection: {connection}",)))
    server.reply(response(b"second"))
    with trio.fail_after(TIMEOUT):
        assert (await client.request("GET", server.url("/1"))).body == b"first"
        await server.peers[0].client_closed.wait()
        assert (await client.request("GET", server.url("/2"))).body == b"second"
    assert server.accepted == 2


async def test_extra_bytes_after_response_prevent_reuse(server: Server, client: LeanHttp) -> None:
    # Bytes beyond the framed body (in the same write) mean the stream is out of sync:
    # the connection must not be reused.
    server.reply(response(b"ok") + b"garbage")
    server.reply(response(b"fresh"))
    with trio.fail_after(TIMEOUT):
        assert (await client.request("GET", server.url("/1"))).body == b"ok"
        assert (await client.request("GET", server.url("/2"))).body == b"fresh"
    assert server.accepted == 2


# --------------------------------------------------------------------------------------
# Bodies
# --------------------------------------------------------------------------------------


async def test_content_length_body_over_many_small_writes(server: Server, client: LeanHttp) -> None:
    body = bytes(range(256)) * 3
    wire = response(body, headers=("X-Split: yes",))
    # The head byte by byte, then the body seven bytes at a time.
    head_len = len(wire) - len(body)
    server.reply(*split(wire[:head_len], 1), *split(body, 7), pause=0.0005)
    server.reply(response(b"after"))
    with trio.fail_after(TIMEOUT):
        answer = await client.request("GET", server.url("/split"))
        after = await client.request("GET", server.url("/after"))
    assert answer.status == 200
    assert answer.headers["x-split"] == "yes"
    assert answer.body == body
    assert after.body == b"after"
    assert server.accepted == 1


async def test_large_content_length_body(server: Server, client: LeanHttp) -> None:
    body = b"0123456789abcdef" * 20_000  # 320 kB: many receive_some calls
    server.reply(response(body))
    with trio.fail_after(TIMEOUT):
        assert (await client.request("GET", server.url("/big"))).body == body


async def test_pipelined_responses_in_one_write_are_not_mixed(
    server: Server, client: LeanHttp
) -> None:
    # A zero-length body: Content-Length: 0 returns at once, without reading further.
    server.reply(response(b""))
    server.reply(response(b"x"))
    with trio.fail_after(TIMEOUT):
        assert (await client.request("GET", server.url("/1"))).body == b""
        assert (await client.request("GET", server.url("/2"))).body == b"x"
    assert server.accepted == 1


CHUNKED_WIRE = (
    b"HTTP/1.1 200 OK\r\n"
    b"Transfer-Encoding: chunked\r\n"
    b"Content-Type: application/json\r\n"
    b"\r\n"
    b"5;name=value;other\r\n"
    b"hello\r\n"
    b"1\r\n"
    b" \r\n"
    b"A\r\n"
    b"0123456789\r\n"
    b"b;ext\r\n"
    b"\r\n\r\n0\r\n\r\nab\r\n"
    b"0;last=1\r\n"
    b"X-Trailer: one\r\n"
    b"X-Other: two\r\n"
    b"\r\n"
)
CHUNKED_BODY = b"hello 0123456789\r\n\r\n0\r\n\r\nab"


@pytest.mark.parametrize("write_size", [len(CHUNKED_WIRE), 1, 3])
async def test_chunked_body_with_extensions_and_trailers(
    server: Server, client: LeanHttp, write_size: int
) -> None:
    server.reply(*split(CHUNKED_WIRE, write_size), pause=0.0002 if write_size < 10 else 0.0)
    server.reply(response(b"next"))
    with trio.fail_after(TIMEOUT):
        answer = await client.request("GET", server.url("/chunked"))
        after = await client.request("GET", server.url("/next"))
    assert answer.status == 200
    assert answer.body == CHUNKED_BODY
    assert answer.headers["transfer-encoding"] == "chunked"
    assert after.body == b"next"  # trailers consumed exactly: the connection stays in sync
    assert server.accepted == 1


async def test_chunked_takes_precedence_over_content_length(
    server: Server, client: LeanHttp
) -> None:
    server.reply(
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: Chunked\r\n\r\n"
        b"4\r\nabcd\r\n0\r\n\r\n"
    )
    server.reply(response(b"next"))
    with trio.fail_after(TIMEOUT):
        assert (await client.request("GET", server.url("/1"))).body == b"abcd"
        assert (await client.request("GET", server.url("/2"))).body == b"next"
    assert server.accepted == 1


async def test_close_delimited_body_reads_to_eof(server: Server, client: LeanHttp) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n"
    server.reply(head, b"part one, ", b"part two", then="close", pause=0.001)
    server.reply(response(b"fresh"))
    with trio.fail_after(TIMEOUT):
        answer = await client.request("GET", server.url("/eof"))
        after = await client.request("GET", server.url("/fresh"))
    assert answer.body == b"part one, part two"
    assert "content-length" not in answer.headers
    assert after.body == b"fresh"
    assert server.accepted == 2


async def test_close_delimited_empty_body(server: Server, client: LeanHttp) -> None:
    server.reply(b"HTTP/1.1 200 OK\r\n\r\n", then="close")
    with trio.fail_after(TIMEOUT):
        answer = await client.request("GET", server.url("/eof"))
    assert (answer.status, answer.body) == (200, b"")


@pytest.mark.parametrize(
    "wire",
    [
        b"HTTP/1.1 204 No Content\r\n\r\n",
        b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n",
        b"HTTP/1.1 304 Not Modified\r\n\r\n",
        b'HTTP/1.1 304 Not Modified\r\nContent-Length: 120\r\nETag: "x"\r\n\r\n',
    ],
)
async def test_204_and_304_have_no_body(server: Server, client: LeanHttp, wire: bytes) -> None:
    server.reply(wire)
    server.reply(response(b"next"))
    with trio.fail_after(TIMEOUT):
        answer = await client.request("GET", server.url("/nobody"))
        after = await client.request("GET", server.url("/next"))
    assert answer.body == b""
    assert answer.status in (204, 304)
    assert after.body == b"next"  # the next response was not eaten as a body
    assert server.accepted == 1


async def test_head_response_has_no_body(server: Server, client: LeanHttp) -> None:
    server.reply(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
    server.reply(response(b"next"))
    with trio.fail_after(TIMEOUT):
        answer = await client.request("HEAD", server.url("/h"))
        after = await client.request("GET", server.url("/next"))
    assert (answer.status, answer.headers["content-length"], answer.body) == (200, "1000", b"")
    assert after.body == b"next"
    assert server.accepted == 1


@pytest.mark.parametrize("separate_writes", [False, True])
async def test_interim_100_continue_is_skipped(
    server: Server, client: LeanHttp, separate_writes: bool
) -> None:
    interim = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 102 Processing\r\nX-Interim: 1\r\n\r\n"
    final = response(b"done", "201 Created", headers=("X-Final: 1",))
    if separate_writes:
        server.reply(interim, final, pause=0.001)
    else:
        server.reply(interim + final)
    server.reply(response(b"next"))
    with trio.fail_after(TIMEOUT):
        answer = await client.request("POST", server.url("/c"), b"payload")
        after = await client.request("GET", server.url("/next"))
    assert answer == HttpResponse(201, {"x-final": "1", "content-length": "4"}, b"done")
    assert after.body == b"next"
    assert server.accepted == 1


async def test_header_parsing(server: Server, client: LeanHttp) -> None:
    server.reply(
        b"HTTP/1.1 404\r\n"  # no reason phrase
        b"X-Mixed-Case:   padded value  \r\n"
        b"Location: http://host:1/a?b=c\r\n"
        b"Empty:\r\n"
        b"Content-Length: 2\r\n\r\nno"
    )
    with trio.fail_after(TIMEOUT):
        answer = await client.request("GET", server.url("/h"))
    assert answer == HttpResponse(
        404,
        {
            "x-mixed-case": "padded value",
            "location": "http://host:1/a?b=c",
            "empty": "",
            "content-length": "2",
        },
        b"no",
    )


# --------------------------------------------------------------------------------------
# Stale kept-alive connections
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["close", "reset"])
@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_stale_connection_is_retried_on_a_fresh_one(
    server: Server, client: LeanHttp, how: str, method: str
) -> None:
    server.reply(response(b"first"))
    server.reply(response(b"second"))
    body = b'{"job": "done"}' if method == "POST" else b""
    with trio.fail_after(TIMEOUT):
        assert (await client.request("GET", server.url("/1"))).body == b"first"
        # The server drops the idle kept-alive connection.
        idle = server.peers[0]
        await (idle.close() if how == "close" else idle.reset())
        await idle.done.wait()
        answer = await client.request(method, server.url("/2"), body)
    assert answer.body == b"second"
    assert server.accepted == 2
    # The request reached the server exactly once, on the fresh connection.
    assert [(r.connection, r.target, r.body) for r in server.requests] == [
        (0, "/1", b""),
        (1, "/2", body),
    ]


async def test_several_stale_connections_are_all_skipped(server: Server, client: LeanHttp) -> None:
    gate = trio.Event()

    async def handler(peer: Peer) -> None:
        while (request := await peer.read_request()) is not None:
            if len(server.requests) >= 2:
                gate.set()
            await gate.wait()
            await peer.send([response(request.target.encode())])

    server.handler = handler
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.request, "GET", server.url("/a"))
            nursery.start_soon(client.request, "GET", server.url("/b"))
        assert server.accepted == 2
        for peer in list(server.peers):
            await peer.close()
            await peer.done.wait()
        answer = await client.request("POST", server.url("/c"), b"once")
    assert answer.body == b"/c"
    assert server.accepted == 3
    assert [(r.connection, r.body) for r in server.requests][-1] == (2, b"once")
    assert len(server.requests) == 3


async def test_fresh_connection_closed_before_answer_is_not_retried(
    server: Server, client: LeanHttp
) -> None:
    server.reply(then="close")
    with trio.fail_after(TIMEOUT), pytest.raises(TransportError):
        await client.request("POST", server.url("/x"), b"body")
    assert server.accepted == 1
    assert len(server.requests) == 1


async def test_reset_after_response_head_on_reused_connection_is_not_retried(
    server: Server, client: LeanHttp
) -> None:
    server.reply(response(b"first"))
    # Head (promising 10 bytes) then an abortive close before any body byte.
    server.reply(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", then="reset", pause=0.005)
    server.reply(response(b"duplicate"))
    with trio.fail_after(TIMEOUT):
        await client.request("GET", server.url("/1"))
        try:
            answer: HttpResponse | None = await client.request(
                "POST", server.url("/done"), b"result"
            )
        except TransportError:
            answer = None
    posts = [r for r in server.requests if r.method == "POST"]
    assert len(posts) == 1, f"POST delivered {len(posts)} times; answer {answer}"
    assert answer is None


async def test_close_after_interim_answer_on_reused_connection_is_not_retried(
    server: Server, client: LeanHttp
) -> None:
    server.reply(response(b"first"))
    server.reply(b"HTTP/1.1 100 Continue\r\n\r\n", then="close")
    server.reply(response(b"duplicate"))
    with trio.fail_after(TIMEOUT):
        await client.request("GET", server.url("/1"))
        with pytest.raises(TransportError):
            await client.request("POST", server.url("/done"), b"result")
    assert len([r for r in server.requests if r.method == "POST"]) == 1


# --------------------------------------------------------------------------------------
# Errors map to TransportError
# --------------------------------------------------------------------------------------


async def test_connection_refused_is_transport_error(client: LeanHttp) -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    await listeners[0].aclose()
    with trio.fail_after(TIMEOUT), pytest.raises(TransportError, match="cannot connect") as caught:
        await client.request("GET", f"http://127.0.0.1:{port}/x")
    assert isinstance(caught.value.__cause__, OSError)
    assert f"127.0.0.1:{port}" in str(caught.value)


async def test_connect_timeout_is_transport_error() -> None:
    async def never(host: str, port: int, tls: bool) -> trio.abc.Stream:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    client = LeanHttp({}, open_stream=never, connect_timeout=0.005)
    with trio.fail_after(TIMEOUT), pytest.raises(TransportError, match="timed out"):
        await client.request("GET", "http://192.0.2.1:81/x")


@pytest.mark.parametrize(
    "url",
    ["ftp://127.0.0.1/x", "ws://127.0.0.1/x", "127.0.0.1:80/x", "/relative", "http:///nohost"],
)
async def test_unsupported_url_is_transport_error(client: LeanHttp, url: str) -> None:
    with trio.fail_after(TIMEOUT), pytest.raises(TransportError, match="cannot request"):
        await client.request("GET", url)


@pytest.mark.parametrize("url", ["http://127.0.0.1:notaport/x", "http://127.0.0.1:99999/x"])
async def test_invalid_port_raises_transport_error(client: LeanHttp, url: str) -> None:
    with trio.fail_after(TIMEOUT), pytest.raises(TransportError):
        await client.request("GET", url)


PROTOCOL_ERRORS = {
    "bad status code": b"HTTP/1.1 OK 200\r\nContent-Length: 0\r\n\r\n",
    "status line without code": b"HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
    "garbage status line": b"hello there\r\n\r\n",
    "empty status line": b"\r\n\r\n",
    "not http/1": b"HTTP/2 200 OK\r\nContent-Length: 0\r\n\r\n",
    "not http at all": b"SSH-2.0 200 OpenSSH\r\n\r\n",
    "bad header line": b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nno colon here\r\n\r\n",
    "bad content-length": b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n0123456789",
    "empty content-length": b"HTTP/1.1 200 OK\r\nContent-Length:\r\n\r\n",
    "bad chunk size": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n",
    "empty chunk size": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\r\n",
}


@pytest.mark.parametrize("wire", list(PROTOCOL_ERRORS.values()), ids=list(PROTOCOL_ERRORS))
async def test_malformed_response_is_transport_error(
    server: Server, client: LeanHttp, wire: bytes
) -> None:
    server.reply(wire)
    server.reply(response(b"fresh"))
    with trio.fail_after(TIMEOUT):
        with pytest.raises(TransportError):
            await client.request("GET", server.url("/bad"))
        # The broken connection was closed, not pooled: the next request gets a new one.
        await server.peers[0].client_closed.wait()
        assert (await client.request("GET", server.url("/ok"))).body == b"fresh"
    assert server.accepted == 2


CUT_SHORT = {
    "mid status line": b"HTTP/1.1 20",
    "mid head": b"HTTP/1.1 200 OK\r\nContent-",
    "after head line, before blank line": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n",
    "body shorter than content-length": b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",
    "no body at all": b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n",
    "mid chunk": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nabc",
    "mid chunk size line": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1",
    "before last chunk": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n",
    "inside trailers": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-T: 1\r\n",
}


@pytest.mark.parametrize("wire", list(CUT_SHORT.values()), ids=list(CUT_SHORT))
async def test_server_closing_early_on_fresh_connection_is_transport_error(
    server: Server, client: LeanHttp, wire: bytes
) -> None:
    server.reply(wire, then="close")
    with trio.fail_after(TIMEOUT), pytest.raises(TransportError):
        await client.request("POST", server.url("/x"), b"body")
    assert server.accepted == 1
    assert len(server.requests) == 1  # not retried


@pytest.mark.parametrize(
    "wire", [CUT_SHORT["mid head"], CUT_SHORT["body shorter than content-length"]]
)
async def test_server_closing_early_on_reused_connection_after_bytes_is_not_retried(
    server: Server, client: LeanHttp, wire: bytes
) -> None:
    server.reply(response(b"first"))
    server.reply(wire, then="close")
    with trio.fail_after(TIMEOUT):
        await client.request("GET", server.url("/1"))
        with pytest.raises(TransportError):
            await client.request("POST", server.url("/2"), b"body")
    assert server.accepted == 1
    assert len(server.requests) == 2


@pytest.mark.parametrize(
    "wire",
    [
        b"",  # reset before any byte of the answer
        b"HTTP/1.1 200 OK\r\nContent-",
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",
    ],
    ids=["before answer", "mid head", "mid body"],
)
async def test_reset_on_fresh_connection_is_transport_error(
    server: Server, client: LeanHttp, wire: bytes
) -> None:
    server.reply(wire, then="reset", pause=0.005)
    with trio.fail_after(TIMEOUT), pytest.raises(TransportError, match="connection lost"):
        await client.request("POST", server.url("/x"), b"body")
    assert server.accepted == 1
    assert len(server.requests) == 1


async def test_unbounded_response_head_is_transport_error(server: Server, client: LeanHttp) -> None:
    # A head that never ends: the client gives up past the limit instead of buffering.
    server.reply(b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (MAX_HEADER_BYTES + 8192))
    with trio.fail_after(TIMEOUT), pytest.raises(TransportError, match="too large"):
        await client.request("GET", server.url("/big"))
    with trio.fail_after(TIMEOUT):
        await server.peers[0].client_closed.wait()


async def test_huge_response_head_is_transport_error(server: Server, client: LeanHttp) -> None:
    big = b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"a" * (1 << 20) + b"\r\n\r\n"
    server.reply(big)
    with trio.fail_after(TIMEOUT), pytest.raises(TransportError, match="too large"):
        await client.request("GET", server.url("/big"))


async def test_response_head_just_over_limit_is_rejected(server: Server, client: LeanHttp) -> None:
    wire = (
        b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * MAX_HEADER_BYTES + b"\r\nContent-Length: 2\r\n\r\nok"
    )
    head_size = wire.index(b"\r\n\r\n") + 4
    assert head_size > MAX_HEADER_BYTES + 16
    # The first 64 KiB, a pause (the client drains them), then the rest.
    server.reply(wire[:MAX_HEADER_BYTES], wire[MAX_HEADER_BYTES:], pause=0.005)
    with trio.fail_after(TIMEOUT), pytest.raises(TransportError):
        await client.request("GET", server.url("/big"))


async def test_response_head_under_limit_is_accepted(server: Server, client: LeanHttp) -> None:
    pad = b"a" * (MAX_HEADER_BYTES - 200)
    server.reply(b"HTTP/1.1 200 OK\r\nX-Pad: " + pad + b"\r\nContent-Length: 2\r\n\r\nok")
    with trio.fail_after(TIMEOUT):
        answer = await client.request("GET", server.url("/big"))
    assert answer.body == b"ok"
    assert answer.headers["x-pad"] == pad.decode()


async def test_negative_content_length_is_transport_error(server: Server, client: LeanHttp) -> None:
    server.reply(b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\nabc", then="close")
    with trio.fail_after(TIMEOUT), pytest.raises(TransportError):
        await client.request("GET", server.url("/neg"))


async def test_negative_chunk_size_is_transport_error(server: Server, client: LeanHttp) -> None:
    server.reply(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\n\r\n0\r\n\r\n", then="close"
    )
    with trio.fail_after(TIMEOUT), pytest.raises(TransportError):
        await client.request("GET", server.url("/neg"))


# --------------------------------------------------------------------------------------
# Cancellation
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("stage", ["before answer", "mid head", "mid body", "mid chunked"])
async def test_cancelled_request_closes_its_connection(
    server: Server, client: LeanHttp, stage: str
) -> None:
    partial = {
        "before answer": [],
        "mid head": [b"HTTP/1.1 200 OK\r\nX-A: 1\r\n"],
        "mid body": [b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc"],
        "mid chunked": [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n"],
    }[stage]
    server.reply(response(b"warm"))  # so the long-poll runs on a reused connection
    server.reply(*partial)  # then holds the answer: a long-poll
    server.reply(response(b"after"))
    cancelled = False
    with trio.fail_after(TIMEOUT):
        assert (await client.request("GET", server.url("/warm"))).body == b"warm"

        async def long_poll(task_status: trio.TaskStatus[trio.CancelScope]) -> None:
            nonlocal cancelled
            with trio.CancelScope() as scope:
                task_status.started(scope)
                await client.request("GET", server.url("/job-take"))
            cancelled = scope.cancelled_caught

        async with trio.open_nursery() as nursery:
            scope = await nursery.start(long_poll)
            while len(server.requests) < 2:
                server.request_arrived = trio.Event()
                await server.request_arrived.wait()
            await trio.sleep(0.002)  # let the partial answer reach the client
            scope.cancel()
        assert cancelled
        # The server sees the client close the connection (EOF) ...
        await server.peers[0].client_closed.wait()
        # ... and the next request runs on a new one.
        assert (await client.request("GET", server.url("/after"))).body == b"after"
    assert server.accepted == 2
    assert [r.connection for r in server.requests] == [0, 0, 1]
    assert_no_resource_warning()


async def test_fail_after_timeout_closes_connection(server: Server, client: LeanHttp) -> None:
    server.reply()  # never answers
    server.reply(response(b"after"))
    with pytest.raises(trio.TooSlowError), trio.fail_after(0.05):
        await client.request("GET", server.url("/slow"))
    with trio.fail_after(TIMEOUT):
        assert (await client.request("GET", server.url("/after"))).body == b"after"
    assert server.accepted == 2  # the cut connection was closed, not pooled
    assert_no_resource_warning()


async def test_cancelled_connect_leaks_nothing(
    client: LeanHttp, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def never(host: str, port: int, **kwargs: object) -> trio.SocketStream:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    monkeypatch.setattr(trio, "open_tcp_stream", never)
    with trio.move_on_after(0.01) as scope:
        await client.request("GET", "http://192.0.2.1:81/x")
    assert scope.cancelled_caught
    assert_no_resource_warning()


# --------------------------------------------------------------------------------------
# aclose
# --------------------------------------------------------------------------------------


async def test_aclose_closes_idle_connections(server: Server) -> None:
    gate = trio.Event()

    async def handler(peer: Peer) -> None:
        while (request := await peer.read_request()) is not None:
            if len(server.requests) >= 2:
                gate.set()
            await gate.wait()
            await peer.send([response(request.target.encode())])

    server.handler = handler
    lean = LeanHttp(STATIC_HEADERS)
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lean.request, "GET", server.url("/a"))
            nursery.start_soon(lean.request, "GET", server.url("/b"))
        assert server.accepted == 2
        assert not any(peer.client_closed.is_set() for peer in server.peers)
        await lean.aclose()
        for peer in server.peers:
            await peer.client_closed.wait()
    assert not any(peer.client_reset for peer in server.peers)
    await lean.aclose()  # idempotent
    assert_no_resource_warning()


async def test_aclose_closes_even_when_cancelled_and_client_usable_afterwards(
    server: Server,
) -> None:
    server.reply(response(b"one"))
    server.reply(response(b"two"))
    lean = LeanHttp({})
    try:
        with trio.fail_after(TIMEOUT):
            await lean.request("GET", server.url("/1"))
            with trio.CancelScope() as scope:
                scope.cancel()
                await lean.aclose()  # closes even inside a cancelled scope
            await server.peers[0].client_closed.wait()
            assert (await lean.request("GET", server.url("/2"))).body == b"two"
        assert server.accepted == 2
    finally:
        await lean.aclose()


# --------------------------------------------------------------------------------------
# HttpxHttp
# --------------------------------------------------------------------------------------


@pytest.fixture
def seen() -> list[httpx.Request]:
    return []


def mock_backend(
    handler: Callable[[httpx.Request], httpx.Response],
    headers: dict[str, str] | None = None,
) -> HttpxHttp:
    client = httpx.AsyncClient(transport=httpx.MockTransport(handler), headers=headers)
    return HttpxHttp(client)


async def test_httpx_returns_status_lowercased_headers_and_raw_body(
    seen: list[httpx.Request],
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(
            202,
            headers={"X-Request-Id": "abc", "Content-Type": "application/json"},
            content=b'{"ok": true}',
        )

    backend = mock_backend(handler, {"Authorization": "Bearer k"})
    try:
        answer = await backend.request("POST", "http://platform.test/v2/done?x=1", b'{"a": 1}')
    finally:
        await backend.aclose()
    assert answer.status == 202
    assert answer.body == b'{"ok": true}'
    assert answer.headers["x-request-id"] == "abc"
    assert answer.headers["content-type"] == "application/json"
    assert all(name == name.lower() for name in answer.headers)
    [request] = seen
    assert (request.method, str(request.url)) == ("POST", "http://platform.test/v2/done?x=1")
    assert request.content == b'{"a": 1}'
    assert request.headers["authorization"] == "Bearer k"


async def test_httpx_empty_body_sends_no_content(seen: list[httpx.Request]) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(204)

    backend = mock_backend(handler)
    try:
        answer = await backend.request("GET", "http://platform.test/take")
    finally:
        await backend.aclose()
    assert (answer.status, answer.body) == (204, b"")
    assert seen[0].content == b""
    assert "content-length" not in seen[0].headers


async def test_httpx_bogus_gzip_stream_is_returned_raw() -> None:
    raw = b"this is not gzip at all"

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200,
            headers={"Content-Encoding": "gzip", "Content-Length": str(len(raw))},
            stream=httpx.ByteStream(raw),
        )

    backend = mock_backend(handler)
    try:
        answer = await backend.request("GET", "http://platform.test/x")
    finally:
        await backend.aclose()
    assert answer == HttpResponse(
        200, {"content-encoding": "gzip", "content-length": str(len(raw))}, raw
    )


async def test_httpx_streamed_body_in_chunks() -> None:
    class Chunks(httpx.AsyncByteStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            for part in (b"a", b"bc", b"", b"def"):
                yield part

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, stream=Chunks())

    backend = mock_backend(handler)
    try:
        answer = await backend.request("GET", "http://platform.test/x")
    finally:
        await backend.aclose()
    assert (answer.status, answer.body) == (500, b"abcdef")


@pytest.mark.parametrize(
    "error",
    [httpx.ConnectError("refused"), httpx.ReadTimeout("slow"), httpx.RemoteProtocolError("bad")],
)
async def test_httpx_transport_errors_become_transport_error(error: httpx.HTTPError) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise error

    backend = mock_backend(handler)
    try:
        with pytest.raises(TransportError, match=type(error).__name__) as caught:
            await backend.request("GET", "http://platform.test/x")
    finally:
        await backend.aclose()
    assert caught.value.__cause__ is error


async def test_httpx_bad_url_is_transport_error() -> None:
    backend = mock_backend(lambda request: httpx.Response(200))
    try:
        with pytest.raises(TransportError):
            await backend.request("GET", "http://platform.test:notaport/x")
    finally:
        await backend.aclose()


async def test_httpx_over_loopback_bogus_gzip_is_raw(server: Server) -> None:
    raw = b"\x00not gzip"
    server.reply(response(raw, headers=("Content-Encoding: gzip",)))
    backend = HttpxHttp(httpx.AsyncClient(trust_env=False))
    try:
        with trio.fail_after(TIMEOUT):
            answer = await backend.request("POST", server.url("/x?y=1"), b"body")
    finally:
        await backend.aclose()
    assert (answer.status, answer.body, answer.headers["content-encoding"]) == (200, raw, "gzip")
    [request] = server.requests
    assert (request.method, request.target, request.body) == ("POST", "/x?y=1", b"body")


# --------------------------------------------------------------------------------------
# make_backend / proxy_configured
# --------------------------------------------------------------------------------------


@pytest.fixture
def clean_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No proxy variables in os.environ, so httpx clients built here do not pick any up."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


async def test_make_backend_defaults_to_lean() -> None:
    backend = make_backend(STATIC_HEADERS, transport=None, environ={})
    try:
        assert isinstance(backend, LeanHttp)
    finally:
        await backend.aclose()


async def test_make_backend_ignores_empty_proxy_variables() -> None:
    env = {"HTTPS_PROXY": "", "http_proxy": "", "NO_PROXY": "*"}
    backend = make_backend(STATIC_HEADERS, transport=None, environ=env)
    try:
        assert isinstance(backend, LeanHttp)
    finally:
        await backend.aclose()


async def test_make_backend_uses_os_environ_by_default(
    monkeypatch: pytest.MonkeyPatch, clean_proxy_env: None
) -> None:
    lean = make_backend({}, transport=None)
    await lean.aclose()
    assert isinstance(lean, LeanHttp)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.test:3128")
    proxied = make_backend({}, transport=None)
    await proxied.aclose()
    assert isinstance(proxied, HttpxHttp)


async def test_make_backend_with_transport_is_httpx(seen: list[httpx.Request]) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=b"pong")

    backend = make_backend(
        STATIC_HEADERS, transport=httpx.MockTransport(handler), environ={}, max_connections=3
    )
    try:
        assert isinstance(backend, HttpxHttp)
        answer = await backend.request("POST", "http://platform.test/ping", b"ping")
    finally:
        await backend.aclose()
    assert (answer.status, answer.body) == (200, b"pong")
    [request] = seen
    assert request.content == b"ping"
    assert request.headers["authorization"] == "Bearer secret-key"
    assert request.headers["user-agent"] == "trio-worker-test/1"


@pytest.mark.parametrize(
    "name", ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"]
)
async def test_make_backend_with_proxy_variable_is_httpx(name: str, clean_proxy_env: None) -> None:
    env = {name: "http://proxy.test:3128"}
    assert proxy_configured(env)
    backend = make_backend(STATIC_HEADERS, transport=None, environ=env)
    try:
        assert isinstance(backend, HttpxHttp)
    finally:
        await backend.aclose()


def test_proxy_configured() -> None:
    assert not proxy_configured({})
    assert not proxy_configured({"NO_PROXY": "*", "no_proxy": "*", "FTP_PROXY": "x"})
    assert not proxy_configured({"HTTPS_PROXY": ""})
    assert proxy_configured({"HTTPS_PROXY": "", "https_proxy": "http://p:1"})


# --------------------------------------------------------------------------------------
# RFC 9112 rejections (h11), bounds, request building
# --------------------------------------------------------------------------------------

RFC9112_REJECTED = {
    "chunk size 0x10": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"0x10\r\n0123456789abcdef\r\n0\r\n\r\n",
    "bytes after chunk data": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"3\r\nabcXY0\r\n\r\n",
    "conflicting Content-Length": b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n"
    b"Content-Length: 4\r\n\r\nabcd",
    "gzip, chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
    b"3\r\nabc\r\n0\r\n\r\n",
    "Content-Length ²": "HTTP/1.1 200 OK\r\nContent-Length: ²\r\n\r\nok".encode(),
    "whitespace before a chunk extension": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked"
    b"\r\n\r\n3 ; ext\r\nabc\r\n0\r\n\r\n",
}


@pytest.mark.parametrize("wire", list(RFC9112_REJECTED.values()), ids=list(RFC9112_REJECTED))
async def test_what_rfc9112_rejects_is_a_transport_error(
    server: Server, client: LeanHttp, wire: bytes
) -> None:
    server.reply(wire)
    server.reply(response(b"fresh"))
    with trio.fail_after(TIMEOUT):
        with pytest.raises(TransportError, match=f"malformed answer from 127.0.0.1:{server.port}"):
            await client.request("GET", server.url("/bad"))
        assert (await client.request("GET", server.url("/ok"))).body == b"fresh"
    assert server.accepted == 2


async def test_server_closing_before_answering_says_so(server: Server, client: LeanHttp) -> None:
    server.reply(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", then="close")
    with trio.fail_after(TIMEOUT), pytest.raises(TransportError, match="closed the connection"):
        await client.request("GET", server.url("/x"))


@pytest.mark.parametrize(
    "wire",
    [
        response(b"x" * 101),
        response(b"x" * 50, headers=("Content-Length: 101",), length=False),  # declared
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"40\r\n" + b"x" * 64 + b"\r\n"
        b"40\r\n" + b"x" * 64 + b"\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n\r\n" + b"x" * 101,  # delimited by the close
    ],
    ids=["content-length", "declared only", "chunked", "close-delimited"],
)
async def test_an_answer_over_max_body_is_a_transport_error(
    server: Server, client: LeanHttp, wire: bytes
) -> None:
    server.reply(wire)
    server.reply(response(b"y" * 100))
    with trio.fail_after(TIMEOUT):
        with pytest.raises(TransportError, match=r"GET http://127\.0\.0\.1:\d+: answer over 100"):
            await client.request("GET", server.url("/big?secret=1"), max_body=100)
        await server.peers[0].client_closed.wait()  # the connection was closed
        answer = await client.request("GET", server.url("/ok"), max_body=100)
    assert answer.body == b"y" * 100  # exactly at the bound is fine


async def test_max_body_defaults_to_one_mib(server: Server, client: LeanHttp) -> None:
    server.reply(response(b"x" * (MAX_ANSWER_BYTES + 1)), then="close")
    with trio.fail_after(TIMEOUT), pytest.raises(TransportError, match="answer over 1 MiB"):
        await client.request("GET", server.url("/big"))


async def test_an_endless_run_of_interim_answers_is_bounded(
    server: Server, client: LeanHttp
) -> None:
    interim = b"HTTP/1.1 102 Processing\r\n\r\n"
    server.reply(interim * (MAX_HEADER_BYTES // len(interim) + 1) + response(b"late"))
    with trio.fail_after(TIMEOUT), pytest.raises(TransportError, match="head too large"):
        await client.request("GET", server.url("/interim"))


async def test_too_many_header_fields_is_a_transport_error(
    server: Server, client: LeanHttp
) -> None:
    fields = tuple(f"X-F{n}: v" for n in range(MAX_HEADER_COUNT))
    server.reply(response(b"ok", headers=fields[:-1]))  # with Content-Length: at the bound
    server.reply(response(b"ok", headers=fields), then="close")
    with trio.fail_after(TIMEOUT):
        assert (await client.request("GET", server.url("/1"))).body == b"ok"
        with pytest.raises(TransportError, match="header fields"):
            await client.request("GET", server.url("/2"))


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("Authorization", "key\r\nX-Injected: 1"),
        ("Authorization", "key\n"),
        ("Authorization", "key\x00"),
        ("Authorization", "clé-€"),  # outside latin-1
        ("Bad Name", "v"),
        ("", "v"),
    ],
)
def test_static_headers_that_cannot_be_sent_are_refused(name: str, value: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        LeanHttp({name: value})
    if name == "Authorization":
        assert "key" not in str(caught.value)  # the value is the API key: never shown


async def test_an_odd_target_is_sent_percent_encoded(server: Server, client: LeanHttp) -> None:
    server.reply(response())
    with trio.fail_after(TIMEOUT):
        await client.request("GET", server.url("/a b/café/%41?q=é x&r=\ud800"))
    assert server.requests[0].target == "/a%20b/caf%C3%A9/%41?q=%C3%A9%20x&r=%ED%A0%80"


async def test_a_host_outside_latin1_is_a_transport_error(client: LeanHttp) -> None:
    with trio.fail_after(TIMEOUT), pytest.raises(TransportError, match="cannot send"):
        await client.request("GET", "http://例え.テスト/x")


# --------------------------------------------------------------------------------------
# TLS: one trust store, handshakes within the connect timeout, failures that say why
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


async def serve_tls(nursery: trio.Nursery, ca: trustme.CA, hostname: str = "127.0.0.1") -> int:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(hostname).configure_cert(context)

    async def handler(stream: trio.SSLStream[trio.SocketStream]) -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    return
                data += chunk
            await stream.send_all(response(b"secure", headers=("Connection: close",)))
            await stream.aclose()

    listeners = await nursery.start(
        partial(trio.serve_ssl_over_tcp, host="127.0.0.1"), handler, 0, context
    )
    port: int = listeners[0].transport_listener.socket.getsockname()[1]
    return port


async def test_tls_with_a_trusted_certificate(nursery: trio.Nursery, ca: trustme.CA) -> None:
    port = await serve_tls(nursery, ca)
    context = ssl.create_default_context()
    ca.configure_trust(context)
    lean = LeanHttp({}, ssl_context=context)
    with trio.fail_after(TIMEOUT):
        assert (await lean.request("GET", f"https://127.0.0.1:{port}/")).body == b"secure"
    await lean.aclose()


async def test_tls_failure_says_why(nursery: trio.Nursery, ca: trustme.CA) -> None:
    port = await serve_tls(nursery, ca)
    lean = LeanHttp({}, ssl_context=ssl.create_default_context())  # does not trust the CA
    with trio.fail_after(TIMEOUT), pytest.raises(TransportError) as caught:
        await lean.request("GET", f"https://127.0.0.1:{port}/")
    message = str(caught.value)
    assert message.startswith("TLS handshake with 127.0.0.1 failed: ")
    assert "certificate" in message


async def test_tls_wrong_hostname_says_why(nursery: trio.Nursery, ca: trustme.CA) -> None:
    port = await serve_tls(nursery, ca, hostname="other.test")
    context = ssl.create_default_context()
    ca.configure_trust(context)
    lean = LeanHttp({}, ssl_context=context)
    with trio.fail_after(TIMEOUT), pytest.raises(TransportError, match="TLS handshake with"):
        await lean.request("GET", f"https://127.0.0.1:{port}/")


async def test_a_server_that_never_handshakes_times_out_within_connect_timeout(
    server: Server,
) -> None:
    async def silent(peer: Peer) -> None:
        await peer.client_closed.wait()  # accepts TCP, never answers the ClientHello

    server.handler = silent
    lean = LeanHttp({}, connect_timeout=0.05)
    with trio.fail_after(TIMEOUT), pytest.raises(TransportError, match="timed out"):
        await lean.request("GET", f"https://127.0.0.1:{server.port}/")
    assert server.requests == []


async def test_a_plain_http_server_behind_https_says_why(server: Server) -> None:
    async def plain(peer: Peer) -> None:
        await peer.stream.receive_some(65536)  # a ClientHello, answered in plain HTTP
        await peer.send([b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"])
        await peer.close()

    server.handler = plain
    lean = LeanHttp({})
    with trio.fail_after(TIMEOUT), pytest.raises(TransportError, match="TLS handshake with"):
        await lean.request("GET", f"https://127.0.0.1:{server.port}/")


async def test_ssl_cert_file_is_honoured_by_every_client(
    nursery: trio.Nursery,
    ca: trustme.CA,
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    port = await serve_tls(nursery, ca)
    bundle = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    trust_context.cache_clear()
    try:
        lean = LeanHttp({})
        with trio.fail_after(TIMEOUT):
            assert (await lean.request("GET", f"https://127.0.0.1:{port}/")).body == b"secure"
        await lean.aclose()
        proxied = make_backend({}, transport=None, environ={"HTTPS_PROXY": "http://unused"})
        assert isinstance(proxied, HttpxHttp)
        assert proxied._client._transport._pool._ssl_context is trust_context()  # type: ignore[attr-defined]
        await proxied.aclose()
    finally:
        trust_context.cache_clear()


@pytest.mark.parametrize("environ", [{}, {"HTTPS_PROXY": "http://proxy.test:3128"}])
def test_make_backend_refuses_a_key_that_cannot_be_sent_on_either_path(
    environ: dict[str, str],
) -> None:
    with pytest.raises(ConfigurationError, match="Authorization") as caught:
        make_backend({"Authorization": "rpa_key\nX: y"}, transport=None, environ=environ)
    assert "rpa_key" not in str(caught.value)


# --------------------------------------------------------------------------------------
# Pipelining (stream chunks, docs/protocol.md §2.4)
# --------------------------------------------------------------------------------------

BODIES = [b'{"output": 0}', b'{"output": 1}', b'{"output": 2}']


def to(url: str, bodies: list[bytes]) -> list[tuple[str, bytes]]:
    return [(url, body) for body in bodies]


async def pipeline(
    client: LeanHttp, server: Server, bodies: list[bytes] = BODIES
) -> list[HttpResponse]:
    answers: list[HttpResponse] = []
    await client.pipeline("POST", to(server.url("/job-stream/w/j?x=1"), bodies), answers)
    return answers


async def test_pipelined_requests_are_answered_in_order_on_one_connection(
    server: Server, client: LeanHttp
) -> None:
    # All three answers in one write: each must be cut at its own end.
    server.reply(response(b"a") + response(b"b", "503 Busy") + response(b"c", "201 Created"))
    server.reply()
    server.reply()
    server.reply(response(b"after"))
    with trio.fail_after(TIMEOUT):
        answers = await pipeline(client, server)
        after = await client.request("GET", server.url("/after"))
    assert [(a.status, a.body) for a in answers] == [(200, b"a"), (503, b"b"), (201, b"c")]
    assert after.body == b"after"
    assert server.accepted == 1  # kept alive, and reused
    assert [(r.method, r.target, r.body) for r in server.requests[:3]] == [
        ("POST", "/job-stream/w/j?x=1", body) for body in BODIES
    ]
    assert all(r.header("Content-Length") == str(len(r.body)) for r in server.requests[:3])


async def test_requests_of_several_urls_go_in_one_pipeline_but_never_to_two_origins(
    server: Server, client: LeanHttp
) -> None:
    server.reply(response(b"a") + response(b"b"))  # both answers in one write
    server.reply()
    server.reply(response(b"after"))
    first, second = server.url("/job-stream/w/a"), server.url("/job-stream/w/b?x=1")
    answers: list[HttpResponse] = []
    with trio.fail_after(TIMEOUT):
        await client.pipeline("POST", [(first, b"1"), (second, b"2")], answers)
        # Served after both pipelined requests: the server has recorded them.
        assert (await client.request("GET", server.url("/after"))).body == b"after"
    assert [a.body for a in answers] == [b"a", b"b"]
    assert [(r.target, r.body) for r in server.requests[:2]] == [
        ("/job-stream/w/a", b"1"),
        ("/job-stream/w/b?x=1", b"2"),
    ]
    elsewhere = first.replace("127.0.0.1", "localhost", 1)
    assert elsewhere != first
    with pytest.raises(TransportError, match=r"cannot pipeline requests to .* on one connection"):
        await client.pipeline("POST", [(first, b"3"), (elsewhere, b"4")], answers)
    assert len(server.requests) == 3  # refused before anything was written
    assert server.accepted == 1


async def test_connection_close_ends_a_pipeline_with_the_answers_so_far(
    server: Server, client: LeanHttp
) -> None:
    server.reply(response(b"a", headers=("Connection: close",)), then="close")
    answers: list[HttpResponse] = []
    with trio.fail_after(TIMEOUT), pytest.raises(TransportError, match="after 1 of 3 pipelined"):
        await client.pipeline("POST", to(server.url("/s"), BODIES), answers)
    assert [a.body for a in answers] == [b"a"]


@pytest.mark.parametrize(
    "second", [b"HTTP/1.1 2OO OK\r\n\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab"]
)
async def test_a_bad_answer_mid_pipeline_keeps_the_earlier_answers(
    server: Server, client: LeanHttp, second: bytes
) -> None:
    server.reply(response(b"a"))
    server.reply(second, then="close")
    server.reply(response(b"fresh"))
    answers: list[HttpResponse] = []
    with trio.fail_after(TIMEOUT):
        with pytest.raises(TransportError):
            await client.pipeline("POST", to(server.url("/s"), BODIES), answers)
        assert [a.body for a in answers] == [b"a"]
        # The broken connection was not pooled.
        assert (await client.request("GET", server.url("/next"))).body == b"fresh"
    assert server.accepted == 2


async def test_a_stale_connection_sends_the_whole_batch_again_once(
    server: Server, client: LeanHttp
) -> None:
    server.reply(response(b"warm"))
    for body in (b"a", b"b", b"c"):
        server.reply(response(body))
    with trio.fail_after(TIMEOUT):
        assert (await client.request("GET", server.url("/warm"))).body == b"warm"
        idle = server.peers[0]
        await idle.close()
        await idle.done.wait()
        answers = await pipeline(client, server)
    assert [a.body for a in answers] == [b"a", b"b", b"c"]
    # Nothing reached the closed connection; each body reached the fresh one once.
    assert [(r.connection, r.body) for r in server.requests[1:]] == [(1, b) for b in BODIES]


async def test_a_close_after_some_answers_is_never_taken_for_a_stale_connection(
    server: Server, client: LeanHttp
) -> None:
    server.reply(response(b"warm"))
    server.reply(response(b"a"), then="close")  # no "Connection: close": just gone
    with trio.fail_after(TIMEOUT):
        assert (await client.request("GET", server.url("/warm"))).body == b"warm"
        answers: list[HttpResponse] = []
        with pytest.raises(TransportError):
            await client.pipeline("POST", to(server.url("/s"), BODIES), answers)
    assert [a.body for a in answers] == [b"a"]
    # Processed requests were not sent again: what followed the answered one is the
    # caller's to send again, not the client's.
    assert server.accepted == 1


async def test_a_cancelled_pipeline_keeps_its_answers_and_closes_its_connection(
    server: Server, client: LeanHttp
) -> None:
    server.reply(response(b"a"))
    server.reply(b"", response(b"b"), pause=10.0)  # far too late
    server.reply(response(b"after"))
    answers: list[HttpResponse] = []
    with trio.move_on_after(0.05) as scope:
        await client.pipeline("POST", to(server.url("/s"), BODIES[:2]), answers)
    assert scope.cancelled_caught
    assert [a.body for a in answers] == [b"a"]
    with trio.fail_after(TIMEOUT):
        assert (await client.request("GET", server.url("/after"))).body == b"after"
    assert server.accepted == 2  # the cut connection was closed, not pooled
    assert_no_resource_warning()


async def test_an_answer_h11_must_read_mid_pipeline_hands_it_the_rest(
    server: Server, client: LeanHttp
) -> None:
    # The second answer is chunked (not the plain shape): h11 reads it and the third.
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nbb\r\n0\r\n\r\n"
    server.reply(response(b"a") + chunked + response(b"c", "429 Too Many", ("Retry-After: 3",)))
    server.reply()
    server.reply()
    server.reply(response(b"after"))
    with trio.fail_after(TIMEOUT):
        answers = await pipeline(client, server)
        after = await client.request("GET", server.url("/after"))
    assert [(a.status, a.body) for a in answers] == [(200, b"a"), (200, b"bb"), (429, b"c")]
    assert answers[2].headers["retry-after"] == "3"
    assert after.body == b"after"
    assert server.accepted == 1  # h11 found both sides done: reused


async def test_answers_dripping_in_byte_by_byte_are_read_whole_by_h11(
    server: Server, client: LeanHttp, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The fast path re-reads an unfinished head at every call: after a few reads the
    # bytes go to h11, or a head dripping in would be parsed once per byte.
    calls = 0

    def counted(*args: Any) -> Any:
        nonlocal calls
        calls += 1
        return parse_simple_answer(*args)

    monkeypatch.setattr(reading_module, "parse_simple_answer", counted)
    wire = response(b"a") + response(b"bb", "503 Busy") + response(b"ccc")
    server.reply(*split(wire, 1), pause=0.0005)
    server.reply()
    server.reply()
    with trio.fail_after(TIMEOUT):
        answers = await pipeline(client, server)
    assert [(a.status, a.body) for a in answers] == [(200, b"a"), (503, b"bb"), (200, b"ccc")]
    # At most FAST_READS + 1 calls an answer: with one byte a read, the first answer's
    # fifth call hands everything to h11; a machine slow enough to let bytes gather
    # between reads may finish an answer or two by the fast path first. The fast path
    # alone would make one call per read: about 125 here.
    assert calls <= 3 * (reading_module.FAST_READS + 1)


async def test_bytes_past_the_last_pipelined_answer_end_the_connection(
    server: Server, client: LeanHttp
) -> None:
    server.reply(response(b"a") + response(b"b") + response(b"c") + b"HTTP/1.1 200 OK\r\n")
    server.reply()
    server.reply()
    server.reply(response(b"fresh"))
    with trio.fail_after(TIMEOUT):
        answers = await pipeline(client, server)
        fresh = await client.request("GET", server.url("/next"))
    assert [a.body for a in answers] == [b"a", b"b", b"c"]
    assert fresh.body == b"fresh"
    assert server.accepted == 2  # out of step: not pooled


@pytest.mark.parametrize("cut", [0, 5, 40])
async def test_a_close_inside_a_pipelined_answer_says_so(
    server: Server, client: LeanHttp, cut: int
) -> None:
    server.reply(response(b"a") + response(b"bbbbbbbbbb")[:cut], then="close")
    answers: list[HttpResponse] = []
    with trio.fail_after(TIMEOUT), pytest.raises(TransportError) as caught:
        await client.pipeline("POST", to(server.url("/s"), BODIES), answers)
    assert [a.body for a in answers] == [b"a"]
    want = "after 1 of 3 pipelined" if cut == 0 else "before answering in full"
    assert want in str(caught.value)
