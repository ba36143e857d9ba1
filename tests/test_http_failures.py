"""Every failure of the lean client is the package's TransportError, a cancelled or failed
request never leaks its connection, and a stale kept-alive connection is retried only when
nothing of the request was processed (over real loopback)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
import trio

from trio_worker import TransportError
from trio_worker._platform._connection import MAX_HEADER_BYTES
from trio_worker._platform._http import HttpPool, HttpResponse

from .scripted_server import (
    STATIC_HEADERS,
    TIMEOUT,
    Peer,
    Server,
    assert_no_resource_warning,
    client_fixture,  # noqa: F401 (a fixture)
    response,
    send_one,
    server_fixture,  # noqa: F401 (a fixture)
)

pytestmark = pytest.mark.timeout(20)

# --------------------------------------------------------------------------------------
# Errors map to TransportError
# --------------------------------------------------------------------------------------


async def test_connection_refused_is_transport_error(client: HttpPool) -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    await listeners[0].aclose()
    with trio.fail_after(TIMEOUT), pytest.raises(TransportError, match="cannot connect") as caught:
        await send_one(client, "GET", f"http://127.0.0.1:{port}/x")
    assert isinstance(caught.value.__cause__, OSError)
    assert f"127.0.0.1:{port}" in str(caught.value)


async def test_connect_timeout_is_transport_error() -> None:
    async def never(host: str, port: int, tls: bool) -> trio.abc.Stream:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    client = HttpPool({}, open_stream=never, connect_timeout=0.005)
    with trio.fail_after(TIMEOUT), pytest.raises(TransportError, match="timed out"):
        await send_one(client, "GET", "http://192.0.2.1:81/x")


@pytest.mark.parametrize(
    "url",
    ["ftp://127.0.0.1/x", "ws://127.0.0.1/x", "127.0.0.1:80/x", "/relative", "http:///nohost"],
)
async def test_unsupported_url_is_transport_error(client: HttpPool, url: str) -> None:
    with trio.fail_after(TIMEOUT), pytest.raises(TransportError, match="cannot request"):
        await send_one(client, "GET", url)


@pytest.mark.parametrize("url", ["http://127.0.0.1:notaport/x", "http://127.0.0.1:99999/x"])
async def test_invalid_port_raises_transport_error(client: HttpPool, url: str) -> None:
    with trio.fail_after(TIMEOUT), pytest.raises(TransportError):
        await send_one(client, "GET", url)


PROTOCOL_ERRORS = {
    "bad status code": b"HTTP/1.1 OK 200\r\nContent-Length: 0\r\n\r\n",
    "status line without code": b"HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
    "garbage status line": b"hello there\r\n\r\n",
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
    server: Server, client: HttpPool, wire: bytes
) -> None:
    server.reply(wire)
    server.reply(response(b"fresh"))
    with trio.fail_after(TIMEOUT):
        with pytest.raises(TransportError):
            await send_one(client, "GET", server.url("/bad"))
        # The broken connection was closed, not pooled: the next request gets a new one.
        await server.peers[0].client_closed.wait()
        assert (await send_one(client, "GET", server.url("/ok"))).body == b"fresh"
    assert server.accepted == 2


async def test_empty_lines_before_an_answer_are_a_malformed_answer(
    server: Server, client: HttpPool
) -> None:
    # h11 reads an empty line where a status line belongs as one that is malformed: the
    # connection is closed, and the next request goes on a fresh one.
    server.reply(b"\r\n\r\n" + response(b"after"))
    server.reply(response(b"fresh"))
    with trio.fail_after(TIMEOUT):
        with pytest.raises(TransportError, match="malformed answer"):
            await send_one(client, "GET", server.url("/1"))
        assert (await send_one(client, "GET", server.url("/2"))).body == b"fresh"
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
    server: Server, client: HttpPool, wire: bytes
) -> None:
    server.reply(wire, then="close")
    with trio.fail_after(TIMEOUT), pytest.raises(TransportError):
        await send_one(client, "POST", server.url("/x"), b"body")
    assert server.accepted == 1
    assert len(server.requests) == 1  # not retried


@pytest.mark.parametrize(
    "wire", [CUT_SHORT["mid head"], CUT_SHORT["body shorter than content-length"]]
)
async def test_server_closing_early_on_reused_connection_after_bytes_is_not_retried(
    server: Server, client: HttpPool, wire: bytes
) -> None:
    server.reply(response(b"first"))
    server.reply(wire, then="close")
    with trio.fail_after(TIMEOUT):
        await send_one(client, "GET", server.url("/1"))
        with pytest.raises(TransportError):
            await send_one(client, "POST", server.url("/2"), b"body")
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
    server: Server, client: HttpPool, wire: bytes
) -> None:
    server.reply(wire, then="reset", pause=0.005)
    with trio.fail_after(TIMEOUT), pytest.raises(TransportError, match="connection lost"):
        await send_one(client, "POST", server.url("/x"), b"body")
    assert server.accepted == 1
    assert len(server.requests) == 1


async def test_unbounded_response_head_is_transport_error(server: Server, client: HttpPool) -> None:
    # A head that never ends: the client gives up past the limit instead of buffering.
    server.reply(b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (MAX_HEADER_BYTES + 8192))
    with trio.fail_after(TIMEOUT), pytest.raises(TransportError, match="too large"):
        await send_one(client, "GET", server.url("/big"))
    with trio.fail_after(TIMEOUT):
        await server.peers[0].client_closed.wait()


async def test_huge_response_head_is_transport_error(server: Server, client: HttpPool) -> None:
    big = b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"a" * (1 << 20) + b"\r\n\r\n"
    server.reply(big)
    with trio.fail_after(TIMEOUT), pytest.raises(TransportError, match="too large"):
        await send_one(client, "GET", server.url("/big"))


async def test_response_head_just_over_limit_is_rejected(server: Server, client: HttpPool) -> None:
    wire = (
        b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * MAX_HEADER_BYTES + b"\r\nContent-Length: 2\r\n\r\nok"
    )
    head_size = wire.index(b"\r\n\r\n") + 4
    assert head_size > MAX_HEADER_BYTES + 16
    # The first 64 KiB, a pause (the client drains them), then the rest.
    server.reply(wire[:MAX_HEADER_BYTES], wire[MAX_HEADER_BYTES:], pause=0.005)
    with trio.fail_after(TIMEOUT), pytest.raises(TransportError):
        await send_one(client, "GET", server.url("/big"))


async def test_response_head_under_limit_is_accepted(server: Server, client: HttpPool) -> None:
    pad = b"a" * (MAX_HEADER_BYTES - 200)
    server.reply(b"HTTP/1.1 200 OK\r\nX-Pad: " + pad + b"\r\nContent-Length: 2\r\n\r\nok")
    with trio.fail_after(TIMEOUT):
        answer = await send_one(client, "GET", server.url("/big"))
    assert answer.body == b"ok"
    assert answer.headers["x-pad"] == pad.decode()


async def test_negative_content_length_is_transport_error(server: Server, client: HttpPool) -> None:
    server.reply(b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\nabc", then="close")
    with trio.fail_after(TIMEOUT), pytest.raises(TransportError):
        await send_one(client, "GET", server.url("/neg"))


async def test_negative_chunk_size_is_transport_error(server: Server, client: HttpPool) -> None:
    server.reply(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\n\r\n0\r\n\r\n", then="close"
    )
    with trio.fail_after(TIMEOUT), pytest.raises(TransportError):
        await send_one(client, "GET", server.url("/neg"))


# --------------------------------------------------------------------------------------
# Cancellation
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("stage", ["before answer", "mid head", "mid body", "mid chunked"])
async def test_cancelled_request_closes_its_connection(
    server: Server, client: HttpPool, stage: str
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
        assert (await send_one(client, "GET", server.url("/warm"))).body == b"warm"

        async def long_poll(task_status: trio.TaskStatus[trio.CancelScope]) -> None:
            nonlocal cancelled
            with trio.CancelScope() as scope:
                task_status.started(scope)
                await send_one(client, "GET", server.url("/job-take"))
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
        assert (await send_one(client, "GET", server.url("/after"))).body == b"after"
    assert server.accepted == 2
    assert [r.connection for r in server.requests] == [0, 0, 1]
    assert_no_resource_warning()


async def test_fail_after_timeout_closes_connection(server: Server, client: HttpPool) -> None:
    server.reply()  # never answers
    server.reply(response(b"after"))
    with pytest.raises(trio.TooSlowError), trio.fail_after(0.05):
        await send_one(client, "GET", server.url("/slow"))
    with trio.fail_after(TIMEOUT):
        assert (await send_one(client, "GET", server.url("/after"))).body == b"after"
    assert server.accepted == 2  # the cut connection was closed, not pooled
    assert_no_resource_warning()


async def test_cancelled_connect_leaks_nothing(
    client: HttpPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def never(host: str, port: int, **kwargs: object) -> trio.SocketStream:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    monkeypatch.setattr(trio, "open_tcp_stream", never)
    with trio.move_on_after(0.01) as scope:
        await send_one(client, "GET", "http://192.0.2.1:81/x")
    assert scope.cancelled_caught
    assert_no_resource_warning()


# --------------------------------------------------------------------------------------
# aclose
# --------------------------------------------------------------------------------------


def answer_once_two_are_in(server: Server) -> Callable[[Peer], Awaitable[None]]:
    """A handler that holds every answer until two requests have arrived (so two
    connections are open at once), then echoes each request's target."""
    gate = trio.Event()

    async def handler(peer: Peer) -> None:
        while (request := await peer.read_request()) is not None:
            if len(server.requests) >= 2:
                gate.set()
            await gate.wait()
            await peer.send([response(request.target.encode())])

    return handler


async def test_aclose_closes_idle_connections(server: Server) -> None:
    server.handler = answer_once_two_are_in(server)
    lean = HttpPool(STATIC_HEADERS)
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(send_one, lean, "GET", server.url("/a"))
            nursery.start_soon(send_one, lean, "GET", server.url("/b"))
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
    lean = HttpPool({})
    try:
        with trio.fail_after(TIMEOUT):
            await send_one(lean, "GET", server.url("/1"))
            with trio.CancelScope() as scope:
                scope.cancel()
                await lean.aclose()  # closes even inside a cancelled scope
            await server.peers[0].client_closed.wait()
            assert (await send_one(lean, "GET", server.url("/2"))).body == b"two"
        assert server.accepted == 2
    finally:
        await lean.aclose()


# --------------------------------------------------------------------------------------
# Stale kept-alive connections
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["close", "reset"])
@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_stale_connection_is_retried_on_a_fresh_one(
    server: Server, client: HttpPool, how: str, method: str
) -> None:
    server.reply(response(b"first"))
    server.reply(response(b"second"))
    body = b'{"job": "done"}' if method == "POST" else b""
    with trio.fail_after(TIMEOUT):
        assert (await send_one(client, "GET", server.url("/1"))).body == b"first"
        # The server drops the idle kept-alive connection.
        idle = server.peers[0]
        await (idle.close() if how == "close" else idle.reset())
        await idle.done.wait()
        answer = await send_one(client, method, server.url("/2"), body)
    assert answer.body == b"second"
    assert server.accepted == 2
    # The request reached the server exactly once, on the fresh connection.
    assert [(r.connection, r.target, r.body) for r in server.requests] == [
        (0, "/1", b""),
        (1, "/2", body),
    ]


async def test_several_stale_connections_are_all_skipped(server: Server, client: HttpPool) -> None:
    server.handler = answer_once_two_are_in(server)
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(send_one, client, "GET", server.url("/a"))
            nursery.start_soon(send_one, client, "GET", server.url("/b"))
        assert server.accepted == 2
        for peer in list(server.peers):
            await peer.close()
            await peer.done.wait()
        answer = await send_one(client, "POST", server.url("/c"), b"once")
    assert answer.body == b"/c"
    assert server.accepted == 3
    assert [(r.connection, r.body) for r in server.requests][-1] == (2, b"once")
    assert len(server.requests) == 3


async def test_fresh_connection_closed_before_answer_is_not_retried(
    server: Server, client: HttpPool
) -> None:
    server.reply(then="close")
    with trio.fail_after(TIMEOUT), pytest.raises(TransportError):
        await send_one(client, "POST", server.url("/x"), b"body")
    assert server.accepted == 1
    assert len(server.requests) == 1


async def test_reset_after_response_head_on_reused_connection_is_not_retried(
    server: Server, client: HttpPool
) -> None:
    server.reply(response(b"first"))
    # Head (promising 10 bytes) then an abortive close before any body byte.
    server.reply(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", then="reset", pause=0.005)
    server.reply(response(b"duplicate"))
    with trio.fail_after(TIMEOUT):
        await send_one(client, "GET", server.url("/1"))
        try:
            answer: HttpResponse | None = await send_one(
                client, "POST", server.url("/done"), b"result"
            )
        except TransportError:
            answer = None
    posts = [r for r in server.requests if r.method == "POST"]
    assert len(posts) == 1, f"POST delivered {len(posts)} times; answer {answer}"
    assert answer is None


async def test_close_after_interim_answer_on_reused_connection_is_not_retried(
    server: Server, client: HttpPool
) -> None:
    server.reply(response(b"first"))
    server.reply(b"HTTP/1.1 100 Continue\r\n\r\n", then="close")
    server.reply(response(b"duplicate"))
    with trio.fail_after(TIMEOUT):
        await send_one(client, "GET", server.url("/1"))
        with pytest.raises(TransportError):
            await send_one(client, "POST", server.url("/done"), b"result")
    assert len([r for r in server.requests if r.method == "POST"]) == 1
