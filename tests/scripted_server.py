"""A raw HTTP/1.1 server on loopback, scripted byte by byte, for the client's tests.

Every test controls exactly what the client receives: how an answer is split into TCP
writes, when the server closes or resets, and whether a connection is reused (counted by
accepted connections). Real sockets use the real clock, so every wait is on an event
bounded by ``trio.fail_after``; the only sleeps are a few milliseconds to split writes.
"""

from __future__ import annotations

import gc
import socket
import struct
import warnings
from collections import deque
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import pytest
import trio

from trio_worker._config import MAX_ANSWER_BYTES
from trio_worker._platform._http import HttpPool

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from trio_worker._platform._http import HttpBackend, HttpResponse

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


@pytest.fixture(name="server")
async def server_fixture(nursery: trio.Nursery) -> Server:
    return await Server().start(nursery)


@pytest.fixture(name="client")
async def client_fixture() -> AsyncIterator[HttpPool]:
    pool = HttpPool(STATIC_HEADERS)
    try:
        yield pool
    finally:
        await pool.aclose()


async def send_one(
    client: HttpBackend,
    method: str,
    url: str,
    body: bytes = b"",
    *,
    max_body: int = MAX_ANSWER_BYTES,
) -> HttpResponse:
    """One request through the client's one entry point: an exchange of one."""
    [answer] = await client.exchange(method, [(url, body)], max_body=max_body)
    return answer


def assert_no_resource_warning() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gc.collect()
    leaks = [w for w in caught if issubclass(w.category, ResourceWarning)]
    assert not leaks, [str(w.message) for w in leaks]


class StrayAnswer:
    """A script: after the first *after* requests of the first connection are answered,
    and once the test says the client has those answers (:attr:`answers_read`), the
    server sends *stray*, an answer nobody asked for (a proxy's, or an unsolicited 408
    before a close), and keeps the connection open."""

    def __init__(self, server: Server, stray: bytes, after: int = 1) -> None:
        self.server = server
        self.stray = stray
        self.after = after
        self.answers_read = trio.Event()
        self.stray_sent = trio.Event()
        server.handler = self.handle

    async def handle(self, peer: Peer) -> None:
        answered = 0
        while await peer.read_request() is not None:
            reply = self.server.replies.popleft()
            await peer.send(reply.parts)
            answered += 1
            if answered == self.after and peer.index == 0:
                await self.answers_read.wait()
                await peer.send([self.stray])
                self.stray_sent.set()
