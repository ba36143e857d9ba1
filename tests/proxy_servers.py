"""Proxies on loopback for the worker to go through: an HTTP forward proxy and a SOCKS5 one.

Both send every connection to 127.0.0.1 on the port the client asked for, whatever the
host, so a platform URL such as ``http://platform.test:PORT`` (a name nobody resolves, and
not loopback, which is never proxied) reaches a fake platform served on that port through
the proxy only. Each records what it was asked, for the tests to check.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import h11
import trio

RECEIVE = 65536
# The headers of a hop, not of the request: never forwarded.
HOP_HEADERS = {b"connection", b"proxy-authorization", b"proxy-connection", b"keep-alive"}


@dataclass
class ForwardedRequest:
    method: str
    target: str
    proxy_authorization: str | None


@dataclass
class ForwardProxy:
    """An HTTP forward proxy, one request per connection. *refuse* is asked of each
    request: True answers 407 Proxy Authentication Required instead of forwarding it."""

    refuse: Callable[[ForwardedRequest], bool] = lambda request: False
    requests: list[ForwardedRequest] = field(default_factory=list)
    refused: int = 0
    port: int = 0

    async def handle(self, stream: trio.SocketStream) -> None:
        async with stream:
            server = h11.Connection(h11.SERVER)
            head, body = await _read_message(server, stream)
            assert isinstance(head, h11.Request), head
            headers = dict(head.headers)
            authorization = headers.get(b"proxy-authorization")
            request = ForwardedRequest(
                head.method.decode(),
                head.target.decode(),
                authorization.decode() if authorization is not None else None,
            )
            self.requests.append(request)
            if self.refuse(request):
                self.refused += 1
                await _answer(
                    server,
                    stream,
                    407,
                    [(b"Proxy-Authenticate", b'Basic realm="test"')],
                    b"proxy authentication required",
                )
                return
            status, answer_headers, answer = await _forward(head, body)
            await _answer(server, stream, status, answer_headers, answer)


async def _forward(head: h11.Request, body: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    target = urlsplit(head.target.decode())
    path = target.path + (f"?{target.query}" if target.query else "")
    upstream = await trio.open_tcp_stream("127.0.0.1", target.port or 80)
    async with upstream:
        client = h11.Connection(h11.CLIENT)
        headers = [(k, v) for k, v in head.headers if k.lower() not in HOP_HEADERS]
        request = h11.Request(method=head.method, target=path, headers=headers)
        await upstream.send_all(client.send(request) or b"")
        await upstream.send_all(client.send(h11.Data(data=body)) or b"")
        await upstream.send_all(client.send(h11.EndOfMessage()) or b"")
        response, answer = await _read_message(client, upstream)
    assert isinstance(response, h11.Response), response
    framing = {b"content-length", b"transfer-encoding", *HOP_HEADERS}
    kept = [(k, v) for k, v in response.headers if k.lower() not in framing]
    return response.status_code, kept, answer


async def _read_message(
    connection: h11.Connection, stream: trio.abc.Stream
) -> tuple[h11.Request | h11.Response, bytes]:
    head: h11.Request | h11.Response | None = None
    body = bytearray()
    while True:
        event = connection.next_event()
        if event is h11.NEED_DATA:
            connection.receive_data(bytes(await stream.receive_some(RECEIVE)))
        elif isinstance(event, h11.Request | h11.Response):
            head = event
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            assert head is not None
            return head, bytes(body)
        elif isinstance(event, h11.InformationalResponse):
            continue
        else:
            raise AssertionError(f"unexpected {event!r}")


async def _answer(
    connection: h11.Connection,
    stream: trio.abc.Stream,
    status: int,
    headers: list[tuple[bytes, bytes]],
    body: bytes,
) -> None:
    framing = [(b"Content-Length", str(len(body)).encode()), (b"Connection", b"close")]
    response = h11.Response(status_code=status, headers=[*headers, *framing])
    await stream.send_all(connection.send(response) or b"")
    await stream.send_all(connection.send(h11.Data(data=body)) or b"")
    await stream.send_all(connection.send(h11.EndOfMessage()) or b"")


@dataclass
class Socks5Proxy:
    """A SOCKS5 proxy without authentication that takes CONNECT to a domain name (what
    ``socks5h://`` asks for) or an IPv4 address; records the hosts asked for."""

    hosts: list[str] = field(default_factory=list)
    port: int = 0

    async def handle(self, stream: trio.SocketStream) -> None:
        async with stream:
            reader = _Reader(stream)
            version, count = await reader.read(2)
            assert version == 5
            await reader.read(count)  # the methods offered: "none" is taken
            await stream.send_all(b"\x05\x00")
            version, command, _, kind = await reader.read(4)
            assert (version, command) == (5, 1), "CONNECT only"
            if kind == 3:
                (size,) = await reader.read(1)
                host = (await reader.read(size)).decode()
            else:
                assert kind == 1, "a domain name or IPv4 address"
                host = ".".join(str(byte) for byte in await reader.read(4))
            (port,) = struct.unpack("!H", await reader.read(2))
            self.hosts.append(host)
            upstream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(b"\x05\x00\x00\x01\x00\x00\x00\x00\x00\x00")
            async with upstream, trio.open_nursery() as nursery:
                if reader.rest:
                    await upstream.send_all(reader.rest)
                nursery.start_soon(_pipe, stream, upstream, nursery.cancel_scope)
                nursery.start_soon(_pipe, upstream, stream, nursery.cancel_scope)


class _Reader:
    def __init__(self, stream: trio.abc.Stream) -> None:
        self._stream = stream
        self.rest = b""

    async def read(self, size: int) -> bytes:
        while len(self.rest) < size:
            data = await self._stream.receive_some(RECEIVE)
            if not data:
                raise trio.BrokenResourceError("closed during the SOCKS handshake")
            self.rest += data
        wanted, self.rest = self.rest[:size], self.rest[size:]
        return wanted


async def _pipe(source: trio.abc.Stream, sink: trio.abc.Stream, done: trio.CancelScope) -> None:
    try:
        while data := await source.receive_some(RECEIVE):
            await sink.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    done.cancel()


@asynccontextmanager
async def serving(proxy: ForwardProxy | Socks5Proxy) -> AsyncIterator[str]:
    """Serve *proxy* on a loopback port while the block runs; yields ``127.0.0.1:PORT``."""
    async with trio.open_nursery() as nursery:
        serve = functools.partial(trio.serve_tcp, proxy.handle, 0, host="127.0.0.1")
        listeners = await nursery.start(serve)
        proxy.port = listeners[0].socket.getsockname()[1]
        try:
            yield f"127.0.0.1:{proxy.port}"
        finally:
            nursery.cancel_scope.cancel()
