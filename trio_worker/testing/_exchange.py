"""One HTTP/1.1 request/response cycle on h11, as the ASGI ``receive``/``send`` pair.

:class:`Exchange` is what :mod:`._h11_server` hands an app for each request.
``receive()`` first hands out the request body (chunked or Content-Length, decoded by
h11), under the body deadline. Once the body is complete, a further ``receive()`` reads
the socket itself and returns ``http.disconnect`` when the client goes away: that is how
an app's long-poll notices a disconnect (it calls ``receive()`` in a task of its own
beside its wait). Bytes that arrive meanwhile (a pipelined request) are fed to h11 and
kept for the next cycle.

The response is written lazily: ``http.response.start`` is only remembered, and the
headers go out together with the first body message. When that first body message is
also the last and the app gave no Content-Length, one is added, so a typical JSON
response keeps the connection reusable without chunked framing.
"""

from __future__ import annotations

from typing import Final

import h11
import trio

__all__ = [
    "ASGIApp",
    "AbortConnection",
    "BodyTimeout",
    "ClientDisconnected",
    "Exchange",
    "Message",
    "Receive",
    "Scope",
    "Send",
    "bytes_out",
]

from .._endpoint._asgi import (
    AbortConnection,
    ASGIApp,
    Message,
    Receive,
    Scope,
    Send,
)

#: How many bytes one ``receive_some`` asks for.
RECEIVE_SIZE: Final = 64 * 1024

_NO_BODY_STATUSES: Final = frozenset({204, 304})


class ClientDisconnected(OSError):
    """Raised by ``send()`` when the client has gone away (ASGI spec: an OSError)."""


class BodyTimeout(Exception):
    """Raised by ``receive()`` past the body deadline; the server answers 408 and closes."""


def bytes_out(conn: h11.Connection, event: h11.Event) -> bytes:
    data = conn.send(event)
    assert data is not None  # only ConnectionClosed returns None, and we never send it
    return data


def _parts_out(conn: h11.Connection, event: h11.Event) -> list[bytes]:
    """Like :func:`bytes_out` but without joining, so a body is copied only once."""
    parts = conn.send_with_data_passthrough(event)
    assert parts is not None
    return parts


class Exchange:
    """One request/response cycle: the ASGI ``receive``/``send`` pair for it."""

    __slots__ = (
        "body_deadline",
        "body_done",
        "conn",
        "disconnected",
        "head_request",
        "response_complete",
        "response_headers",
        "response_started",
        "status",
        "stream",
    )

    def __init__(
        self, conn: h11.Connection, stream: trio.abc.Stream, method: bytes, body_deadline: float
    ) -> None:
        self.conn = conn
        self.stream = stream
        self.head_request = method == b"HEAD"
        #: When the whole body must have arrived (``trio.current_time()``): a body dripped
        #: a byte at a time would otherwise hold the connection for ever.
        self.body_deadline = body_deadline
        self.body_done = False
        self.disconnected = False
        self.response_started = False
        self.response_complete = False
        self.status = 0
        self.response_headers: list[tuple[bytes, bytes]] | None = None

    async def receive(self) -> Message:
        """The next request-body chunk, then ``http.disconnect`` once the client leaves."""
        if self.disconnected:
            return {"type": "http.disconnect"}
        if not self.body_done:
            return await self._receive_body()
        if self.response_complete:
            return {"type": "http.disconnect"}
        # The body is complete: the only thing left to learn is that the client left.
        try:
            data = await self.stream.receive_some(RECEIVE_SIZE)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            data = b""
        if not data:
            self.disconnected = True
            return {"type": "http.disconnect"}
        # A pipelined next request: keep it for the next cycle. Reading further would
        # buffer without bound, and the client is evidently still there.
        self.conn.receive_data(bytes(data))
        await trio.sleep_forever()
        raise AssertionError("unreachable")  # pragma: no cover

    async def _receive_body(self) -> Message:
        conn = self.conn
        if conn.they_are_waiting_for_100_continue:
            await self.stream.send_all(
                bytes_out(conn, h11.InformationalResponse(status_code=100, headers=[]))
            )
        chunks: list[bytes] = []
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                if chunks:
                    break  # hand out what we have rather than wait for more
                with trio.move_on_at(self.body_deadline) as waited:
                    try:
                        data = await self.stream.receive_some(RECEIVE_SIZE)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        data = b""
                if waited.cancelled_caught:
                    raise BodyTimeout
                if not data:
                    # EOF in the middle of a body: h11 would call it a protocol error,
                    # but for the app it is simply a client that went away.
                    self.disconnected = True
                    return {"type": "http.disconnect"}
                conn.receive_data(bytes(data))
            elif type(event) is h11.Data:
                chunks.append(event.data)
            elif type(event) is h11.EndOfMessage:
                self.body_done = True
                break
            else:  # pragma: no cover - h11 yields only Data/EndOfMessage in SEND_BODY
                raise h11.RemoteProtocolError(f"unexpected event {event!r}")
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        return {"type": "http.request", "body": body, "more_body": not self.body_done}

    async def send(self, message: Message) -> None:
        """Write the response; headers are deferred until the first body message."""
        kind = message["type"]
        if kind == "http.response.start":
            if self.response_started:
                raise RuntimeError("http.response.start sent twice")
            self.response_started = True
            self.status = int(message["status"])
            self.response_headers = list(message.get("headers", ()))
            return
        if kind != "http.response.body":
            raise RuntimeError(f"unsupported ASGI message type {kind!r}")
        if not self.response_started or self.response_complete:
            raise RuntimeError("http.response.body outside of a response")
        if self.disconnected:
            raise ClientDisconnected("the client has disconnected")
        body: bytes = message.get("body", b"")
        more_body: bool = message.get("more_body", False)
        conn = self.conn
        out: list[bytes] = []
        if self.response_headers is not None:
            headers = self.response_headers
            self.response_headers = None
            if not more_body and self.status not in _NO_BODY_STATUSES:
                if not any(name.lower() == b"content-length" for name, _ in headers):
                    headers.append((b"content-length", str(len(body)).encode()))
            out += _parts_out(conn, h11.Response(status_code=self.status, headers=headers))
        if body and not self.head_request:
            out += _parts_out(conn, h11.Data(data=body))
        if not more_body:
            out += _parts_out(conn, h11.EndOfMessage())
            self.response_complete = True
        if not out:
            return
        try:
            # One send_all (one syscall, one segment) for headers and body together.
            await self.stream.send_all(out[0] if len(out) == 1 else b"".join(out))
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self.disconnected = True
            raise ClientDisconnected("the client has disconnected") from exc
