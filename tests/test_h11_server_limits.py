"""The fake platform's server (trio_worker/testing/_h11_server.py): its deadlines and connection
cap (``ServerLimits``), so no peer holds it by dripping. (The local endpoint runs on
hypercorn: its bounds are tested in ``tests/test_local_endpoint_hypercorn.py``.)

The fake platform served over in-memory streams in virtual time, so a deadline
is checked to the second and a peer that drips a byte a second costs no wall time. The
connection cap is checked over real loopback, where every connection shares one server.
"""

from __future__ import annotations

import json
from functools import partial
from typing import TYPE_CHECKING

import pytest
import trio
import trio.testing

from trio_worker.testing import FakePlatform
from trio_worker.testing._h11_server import (
    BODY_TIMEOUT,
    HEADER_TIMEOUT,
    KEEP_ALIVE_TIMEOUT,
    ServerLimits,
    serve_asgi,
    serve_stream,
)

if TYPE_CHECKING:
    from trio.testing import MockClock

    from trio_worker.testing._exchange import Receive, Scope, Send

pytestmark = pytest.mark.timeout(30)

RUN_HEAD = b"POST /run HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"


def endpoint() -> FakePlatform:
    return FakePlatform(
        take_hold=5.0, stop_hold=5.0, requeue_after=None, endpoint_id="ep", record_requests=False
    )


async def drip(stream: trio.abc.Stream, data: bytes, every: float) -> None:
    """Send *data* a byte at a time, *every* seconds apart, until the server hangs up."""
    for index in range(len(data)):
        try:
            await stream.send_all(data[index : index + 1])
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        await trio.sleep(every)


async def read_to_eof(stream: trio.abc.Stream) -> bytes:
    received = b""
    while chunk := await stream.receive_some(65536):
        received += chunk
    return received


def refusal(answer: bytes) -> tuple[int, str]:
    """The status and the one-line reason of a refusal the server sent before closing."""
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    assert b"connection: close" in head.lower()
    reason = json.loads(body)["error"]
    assert "\n" not in reason
    return status, reason


async def serve_one(
    nursery: trio.Nursery, limits: ServerLimits | None = None
) -> tuple[trio.abc.Stream, FakePlatform]:
    app = endpoint()
    client, server = trio.testing.memory_stream_pair()
    nursery.start_soon(partial(serve_stream, app, server, limits=limits))
    return client, app


def test_the_defaults_are_named() -> None:
    limits = ServerLimits()
    assert limits.header_timeout == HEADER_TIMEOUT == 10.0
    assert limits.body_timeout == BODY_TIMEOUT == 60.0
    assert limits.keep_alive_timeout == KEEP_ALIVE_TIMEOUT == 75.0
    with pytest.raises(ValueError, match="positive"):
        ServerLimits(body_timeout=0)
    with pytest.raises(ValueError, match="max_connections"):
        ServerLimits(max_connections=0)


async def test_a_body_dripped_slowly_is_cut_at_the_body_deadline(
    autojump_clock: MockClock, nursery: trio.Nursery
) -> None:
    # Issue 18's finding: a /run body sent a byte a second was still open at 85 s.
    client, app = await serve_one(nursery)
    body = json.dumps({"input": {"pad": "x" * 500}}).encode()
    await client.send_all(RUN_HEAD + b"Content-Length: %d\r\n\r\n" % len(body))
    start = trio.current_time()
    nursery.start_soon(drip, client, body, 1.0)
    with trio.fail_after(10 * BODY_TIMEOUT):
        answer = await read_to_eof(client)
    assert trio.current_time() - start == BODY_TIMEOUT
    assert refusal(answer) == (408, f"request body not received within {BODY_TIMEOUT:g} s")
    assert app.jobs == {}


async def test_a_head_dripped_slowly_is_cut_at_the_header_deadline(
    autojump_clock: MockClock, nursery: trio.Nursery
) -> None:
    client, _ = await serve_one(nursery, ServerLimits(header_timeout=4.0))
    start = trio.current_time()
    nursery.start_soon(drip, client, RUN_HEAD + b"X-Pad: " + b"y" * 100, 1.0)
    with trio.fail_after(10 * KEEP_ALIVE_TIMEOUT):
        answer = await read_to_eof(client)
    assert trio.current_time() - start == 4.0
    assert refusal(answer) == (408, "request head not received within 4 s")


async def test_a_connection_that_sends_nothing_is_closed_at_the_header_deadline(
    autojump_clock: MockClock, nursery: trio.Nursery
) -> None:
    client, _ = await serve_one(nursery)
    start = trio.current_time()
    with trio.fail_after(10 * KEEP_ALIVE_TIMEOUT):
        answer = await read_to_eof(client)
    assert trio.current_time() - start == HEADER_TIMEOUT
    assert answer == b""  # nothing was asked, so nothing is answered


async def test_a_kept_alive_connection_waits_keep_alive_then_owes_a_whole_head(
    autojump_clock: MockClock, nursery: trio.Nursery
) -> None:
    client, _ = await serve_one(nursery)
    await client.send_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
    first = await client.receive_some(65536)
    assert first.startswith(b"HTTP/1.1 200 ")
    # Idle for most of the keep-alive, then a head dripped past the header deadline.
    await trio.sleep(KEEP_ALIVE_TIMEOUT - 1)
    start = trio.current_time()
    nursery.start_soon(drip, client, b"GET /health HTTP/1.1\r\nHost: localhost\r\n", 1.0)
    with trio.fail_after(10 * KEEP_ALIVE_TIMEOUT):
        answer = await read_to_eof(client)
    # The keep-alive deadline came first; the head had begun, so it is told why.
    assert trio.current_time() - start == 1.0
    assert refusal(answer)[0] == 408


async def test_connections_past_the_cap_are_answered_503_and_closed(
    nursery: trio.Nursery,
) -> None:
    holding = 0
    both_in = trio.Event()
    release = trio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        nonlocal holding
        holding += 1
        if holding == 2:
            both_in.set()
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    limits = ServerLimits(max_connections=2)
    port = await nursery.start(partial(serve_asgi, app, "127.0.0.1", 0, limits=limits))
    request = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    held = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(2)]
    for stream in held:
        await stream.send_all(request)
    with trio.fail_after(5):
        await both_in.wait()
        extra = await trio.open_tcp_stream("127.0.0.1", port)
        answer = await read_to_eof(extra)
    assert refusal(answer) == (503, "too many connections (at most 2 at once)")
    release.set()
    with trio.fail_after(5):
        for stream in held:
            assert (await stream.receive_some(65536)).startswith(b"HTTP/1.1 200 ")
            await stream.aclose()
        # Below the cap again (once the server has seen those two close), one is served.
        while True:
            again = await trio.open_tcp_stream("127.0.0.1", port)
            await again.send_all(request)
            answer = await again.receive_some(65536)
            await again.aclose()
            if not answer.startswith(b"HTTP/1.1 503 "):
                break
            await trio.sleep(0.005)
    assert answer.startswith(b"HTTP/1.1 200 ")
    await extra.aclose()
