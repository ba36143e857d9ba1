"""The lean client reads answers as RFC 9112 frames them, and rejects what it says a client
must: bodies, interim answers, bounds, request building (over real loopback)."""

from __future__ import annotations

import pytest
import trio

from trio_worker import ConfigurationError, TransportError
from trio_worker._config import MAX_ANSWER_BYTES
from trio_worker._platform._connection import MAX_HEADER_BYTES, MAX_HEADER_COUNT
from trio_worker._platform._http import HttpPool, HttpResponse

from .scripted_server import (
    TIMEOUT,
    Server,
    client_fixture,  # noqa: F401 (a fixture)
    response,
    send_one,
    server_fixture,  # noqa: F401 (a fixture)
    split,
)

pytestmark = pytest.mark.timeout(20)

# --------------------------------------------------------------------------------------
# Bodies
# --------------------------------------------------------------------------------------


async def test_content_length_body_over_many_small_writes(server: Server, client: HttpPool) -> None:
    body = bytes(range(256)) * 3
    wire = response(body, headers=("X-Split: yes",))
    # The head byte by byte, then the body seven bytes at a time.
    head_len = len(wire) - len(body)
    server.reply(*split(wire[:head_len], 1), *split(body, 7), pause=0.0005)
    server.reply(response(b"after"))
    with trio.fail_after(TIMEOUT):
        answer = await send_one(client, "GET", server.url("/split"))
        after = await send_one(client, "GET", server.url("/after"))
    assert answer.status == 200
    assert answer.headers["x-split"] == "yes"
    assert answer.body == body
    assert after.body == b"after"
    assert server.accepted == 1


async def test_large_content_length_body(server: Server, client: HttpPool) -> None:
    body = b"0123456789abcdef" * 20_000  # 320 kB: many receive_some calls
    server.reply(response(body))
    with trio.fail_after(TIMEOUT):
        assert (await send_one(client, "GET", server.url("/big"))).body == body


async def test_pipelined_responses_in_one_write_are_not_mixed(
    server: Server, client: HttpPool
) -> None:
    # A zero-length body: Content-Length: 0 returns at once, without reading further.
    server.reply(response(b""))
    server.reply(response(b"x"))
    with trio.fail_after(TIMEOUT):
        assert (await send_one(client, "GET", server.url("/1"))).body == b""
        assert (await send_one(client, "GET", server.url("/2"))).body == b"x"
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
    server: Server, client: HttpPool, write_size: int
) -> None:
    server.reply(*split(CHUNKED_WIRE, write_size), pause=0.0002 if write_size < 10 else 0.0)
    server.reply(response(b"next"))
    with trio.fail_after(TIMEOUT):
        answer = await send_one(client, "GET", server.url("/chunked"))
        after = await send_one(client, "GET", server.url("/next"))
    assert answer.status == 200
    assert answer.body == CHUNKED_BODY
    assert answer.headers["transfer-encoding"] == "chunked"
    assert after.body == b"next"  # trailers consumed exactly: the connection stays in sync
    assert server.accepted == 1


async def test_chunked_beside_a_content_length_is_rejected(
    server: Server, client: HttpPool
) -> None:
    # RFC 9112 §6.3: such a message "ought to be handled as an error" (a smuggling
    # attempt, or response splitting); llhttp does, where h11 reads it as chunked.
    server.reply(
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: Chunked\r\n\r\n"
        b"4\r\nabcd\r\n0\r\n\r\n"
    )
    server.reply(response(b"next"))
    with trio.fail_after(TIMEOUT):
        with pytest.raises(TransportError, match="malformed answer"):
            await send_one(client, "GET", server.url("/1"))
        assert (await send_one(client, "GET", server.url("/2"))).body == b"next"
    assert server.accepted == 2


async def test_close_delimited_body_reads_to_eof(server: Server, client: HttpPool) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n"
    server.reply(head, b"part one, ", b"part two", then="close", pause=0.001)
    server.reply(response(b"fresh"))
    with trio.fail_after(TIMEOUT):
        answer = await send_one(client, "GET", server.url("/eof"))
        after = await send_one(client, "GET", server.url("/fresh"))
    assert answer.body == b"part one, part two"
    assert "content-length" not in answer.headers
    assert after.body == b"fresh"
    assert server.accepted == 2


async def test_close_delimited_empty_body(server: Server, client: HttpPool) -> None:
    server.reply(b"HTTP/1.1 200 OK\r\n\r\n", then="close")
    with trio.fail_after(TIMEOUT):
        answer = await send_one(client, "GET", server.url("/eof"))
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
async def test_204_and_304_have_no_body(server: Server, client: HttpPool, wire: bytes) -> None:
    server.reply(wire)
    server.reply(response(b"next"))
    with trio.fail_after(TIMEOUT):
        answer = await send_one(client, "GET", server.url("/nobody"))
        after = await send_one(client, "GET", server.url("/next"))
    assert answer.body == b""
    assert answer.status in (204, 304)
    assert after.body == b"next"  # the next response was not eaten as a body
    assert server.accepted == 1


@pytest.mark.parametrize("method", ["HEAD", "CONNECT"])
async def test_head_and_connect_are_refused_before_anything_is_sent(
    server: Server, client: HttpPool, method: str
) -> None:
    # Their answers are framed by the method, which llhttp is not told: no platform
    # route sends either, so none goes out.
    with pytest.raises(ValueError, match=f"does not send {method}"):
        await send_one(client, method, server.url("/h"))
    assert server.accepted == 0


@pytest.mark.parametrize("separate_writes", [False, True])
async def test_interim_100_continue_is_skipped(
    server: Server, client: HttpPool, separate_writes: bool
) -> None:
    interim = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 102 Processing\r\nX-Interim: 1\r\n\r\n"
    final = response(b"done", "201 Created", headers=("X-Final: 1",))
    if separate_writes:
        server.reply(interim, final, pause=0.001)
    else:
        server.reply(interim + final)
    server.reply(response(b"next"))
    with trio.fail_after(TIMEOUT):
        answer = await send_one(client, "POST", server.url("/c"), b"payload")
        after = await send_one(client, "GET", server.url("/next"))
    assert answer == HttpResponse(201, {"x-final": "1", "content-length": "4"}, b"done")
    assert after.body == b"next"
    assert server.accepted == 1


async def test_header_parsing(server: Server, client: HttpPool) -> None:
    server.reply(
        b"HTTP/1.1 404\r\n"  # no reason phrase
        b"X-Mixed-Case:   padded value  \r\n"
        b"Location: http://host:1/a?b=c\r\n"
        b"Empty:\r\n"
        b"Content-Length: 2\r\n\r\nno"
    )
    with trio.fail_after(TIMEOUT):
        answer = await send_one(client, "GET", server.url("/h"))
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


async def test_a_content_length_of_20_digits_is_its_number(
    server: Server, client: HttpPool
) -> None:
    server.reply(b"HTTP/1.1 200 OK\r\nContent-Length: " + b"0" * 19 + b"2\r\n\r\nok")
    server.reply(response(b"next"))
    with trio.fail_after(TIMEOUT):
        assert (await send_one(client, "GET", server.url("/1"))).body == b"ok"
        assert (await send_one(client, "GET", server.url("/2"))).body == b"next"
    assert server.accepted == 1


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
    server: Server, client: HttpPool, wire: bytes
) -> None:
    server.reply(wire)
    server.reply(response(b"fresh"))
    with trio.fail_after(TIMEOUT):
        with pytest.raises(TransportError, match=f"malformed answer from 127.0.0.1:{server.port}"):
            await send_one(client, "GET", server.url("/bad"))
        assert (await send_one(client, "GET", server.url("/ok"))).body == b"fresh"
    assert server.accepted == 2


async def test_server_closing_before_answering_says_so(server: Server, client: HttpPool) -> None:
    server.reply(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", then="close")
    with trio.fail_after(TIMEOUT), pytest.raises(TransportError, match="closed the connection"):
        await send_one(client, "GET", server.url("/x"))


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
    server: Server, client: HttpPool, wire: bytes
) -> None:
    server.reply(wire)
    server.reply(response(b"y" * 100))
    with trio.fail_after(TIMEOUT):
        with pytest.raises(
            TransportError, match=r"GET http://127\.0\.0\.1:\d+/big: answer over 100"
        ):
            await send_one(client, "GET", server.url("/big?secret=1"), max_body=100)
        await server.peers[0].client_closed.wait()  # the connection was closed
        answer = await send_one(client, "GET", server.url("/ok"), max_body=100)
    assert answer.body == b"y" * 100  # exactly at the bound is fine


async def test_max_body_defaults_to_one_mib(server: Server, client: HttpPool) -> None:
    server.reply(response(b"x" * (MAX_ANSWER_BYTES + 1)), then="close")
    with trio.fail_after(TIMEOUT), pytest.raises(TransportError, match="answer over 1 MiB"):
        await send_one(client, "GET", server.url("/big"))


async def test_an_endless_run_of_interim_answers_is_bounded(
    server: Server, client: HttpPool
) -> None:
    interim = b"HTTP/1.1 102 Processing\r\n\r\n"
    server.reply(interim * (MAX_HEADER_BYTES // len(interim) + 1) + response(b"late"))
    with trio.fail_after(TIMEOUT), pytest.raises(TransportError, match="head too large"):
        await send_one(client, "GET", server.url("/interim"))


async def test_too_many_header_fields_is_a_transport_error(
    server: Server, client: HttpPool
) -> None:
    fields = tuple(f"X-F{n}: v" for n in range(MAX_HEADER_COUNT))
    server.reply(response(b"ok", headers=fields[:-1]))  # with Content-Length: at the bound
    server.reply(response(b"ok", headers=fields), then="close")
    with trio.fail_after(TIMEOUT):
        assert (await send_one(client, "GET", server.url("/1"))).body == b"ok"
        with pytest.raises(TransportError, match="header fields"):
            await send_one(client, "GET", server.url("/2"))


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
        HttpPool({name: value})
    if name == "Authorization":
        assert "key" not in str(caught.value)  # the value is the API key: never shown


async def test_an_odd_target_is_sent_percent_encoded(server: Server, client: HttpPool) -> None:
    server.reply(response())
    with trio.fail_after(TIMEOUT):
        await send_one(client, "GET", server.url("/a b/café/%41?q=é x&r=\ud800"))
    assert server.requests[0].target == "/a%20b/caf%C3%A9/%41?q=%C3%A9%20x&r=%ED%A0%80"


async def test_a_host_outside_latin1_is_a_transport_error(client: HttpPool) -> None:
    with trio.fail_after(TIMEOUT), pytest.raises(TransportError, match="cannot send"):
        await send_one(client, "GET", "http://例え.テスト/x")
