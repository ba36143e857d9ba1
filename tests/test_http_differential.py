"""The lean client against h11's reference behaviour: the same crafted answer, the same verdict.

Hypothesis crafts server answers, valid and RFC 9112-invalid (bad chunk sizes such as
``0x10`` or ``²``, bytes after chunk data, conflicting or duplicate Content-Lengths,
``Transfer-Encoding: gzip, chunked``, ``Connection: keep-alive, close``, obs-fold,
truncated bodies, interim 1xx answers before the final one). Each is served to
:class:`LeanHttp` over a ``trio.testing.memory_stream_pair``, and fed to a plain
``h11.Connection(our_role=h11.CLIENT)`` in one piece followed by the server's close. The
client must accept exactly what h11 accepts (same status, same body) and turn everything
else into a :class:`~trio_worker.TransportError`.

The answers stay within the client's own bounds (head size, field count, body size), which
h11 does not have; those are tested in tests/test_http_framing.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import h11
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from trio_worker import TransportError
from trio_worker._platform._http import MAX_HEADER_BYTES, LeanHttp

Outcome = tuple[str, int, bytes]  # ("ok", status, body) or ("rejected", 0, b"")
REJECTED: Outcome = ("rejected", 0, b"")


def reference(wire: bytes, method: str = "GET") -> Outcome:
    """What a plain h11 client makes of *wire* followed by the server closing."""
    conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEADER_BYTES)
    conn.send(h11.Request(method=method, target="/", headers=[("Host", "p.test")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(wire)
    conn.receive_data(b"")
    status, body = 0, b""
    try:
        while True:
            event = conn.next_event()
            if isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                return ("ok", status, body)
            elif not isinstance(event, h11.InformationalResponse):
                return REJECTED  # ConnectionClosed, NEED_DATA, PAUSED: no full answer
    except h11.ProtocolError:
        return REJECTED


async def through_client(wire: bytes, method: str = "GET") -> Outcome:
    """What :class:`LeanHttp` makes of *wire*, served over an in-memory connection."""

    async def serve(server: trio.abc.Stream) -> None:
        request = b""
        while b"\r\n\r\n" not in request:
            request += await server.receive_some(65536)
        try:
            await server.send_all(wire)
        except trio.BrokenResourceError:
            pass  # the client gave up first
        await server.aclose()

    async with trio.open_nursery() as nursery:

        async def open_stream(host: str, port: int, tls: bool) -> trio.abc.Stream:
            client, server = trio.testing.memory_stream_pair()
            nursery.start_soon(serve, server)
            return client

        lean = LeanHttp({"User-Agent": "differential"}, open_stream=open_stream)
        try:
            response = await lean.request(method, "http://p.test/x")
        except TransportError:
            return REJECTED
        finally:
            await lean.aclose()
        return ("ok", response.status, response.body)


# -- crafting answers ------------------------------------------------------------------------

TOKENS = st.sampled_from(["a", "X-Thing", "Content-Type", "ETag", "x_y", "X-Ünï", "X Y"])
VALUES = st.sampled_from(["", "v", "application/json", " padded ", "a\tb", "ca\xe9", "a\x00b"])


def pick(draw: st.DrawFn, usual: list[str], odd: list[str]) -> str:
    """One of *usual* half of the time, else any: so most answers are not all broken."""
    return draw(st.sampled_from(usual if draw(st.booleans()) else usual + odd))


@st.composite
def header_lines(draw: st.DrawFn) -> list[str]:
    lines = [f"{draw(TOKENS)}:{draw(VALUES)}" for _ in range(draw(st.integers(0, 3)))]
    if draw(st.booleans()) and draw(st.booleans()):
        lines.append(draw(st.sampled_from(["no colon", " X-Fold: starts with space", "X : y"])))
    return lines


@st.composite
def chunk_size(draw: st.DrawFn, size: int) -> str:
    forms = [
        f"{size:x}",
        f"{size:X}",
        f"0x{size:x}",
        f"{size:x};ext=1",
        f"{size:x} ; ext",
        f"{size:x} ",
        f" {size:x}",
        f"{size:x}²",
        f"-{size:x}",
        f"{size + 1:x}",  # a size that lies
        "",
    ]
    return draw(st.sampled_from(forms[:2] if draw(st.booleans()) else forms))


@st.composite
def chunked_body(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """(wire, the body it stands for when valid)."""
    wire, body = b"", b""
    for data in draw(st.lists(st.binary(min_size=1, max_size=12), max_size=3)):
        size = draw(chunk_size(len(data)))
        after = draw(st.sampled_from([b"\r\n", b"\r\n", b"XY", b"\n", b"", b"\r\nX"]))
        wire += size.encode("utf-8") + b"\r\n" + data + after
        body += data
    last = draw(
        st.sampled_from([b"0\r\n\r\n", b"0\r\nX-T: 1\r\n\r\n", b"0;e\r\n\r\n", b"00\r\n\r\n"])
    )
    return wire + last, body


@dataclass
class Answer:
    wire: bytes
    note: str


@st.composite
def answers(draw: st.DrawFn) -> Answer:
    interim = "".join(
        f"HTTP/1.1 {code} Interim\r\n\r\n"
        for code in draw(st.lists(st.sampled_from([100, 102, 103]), max_size=2))
    )
    version = pick(draw, ["HTTP/1.1"], ["HTTP/1.0", "HTTP/2", "http/1.1", "HTTP/2.0"])
    status = pick(
        draw,
        ["200 OK", "201 Created", "204 No Content", "304 Not Modified", "404", "503 Busy"],
        ["99 Low", "2000 Big", "20O OK", "200"],
    )
    lines = [f"{version} {status}", *draw(header_lines())]
    payload = draw(st.binary(max_size=40))
    framing = draw(st.sampled_from(["length", "chunked", "close", "length+chunked"]))
    body = payload
    if framing in ("length", "length+chunked"):
        exact = str(len(payload))
        declared = pick(
            draw,
            [exact],
            [
                str(len(payload) + 3),
                f"{exact}, {exact}",
                "²",
                f"+{exact}",
                f"0x{exact}",
                f" {exact} ",
            ],
        )
        lines.append(f"Content-Length: {declared}")
        if draw(st.booleans()):  # a second Content-Length: the same or another
            lines.append(
                f"Content-Length: {draw(st.sampled_from([declared, str(len(payload) + 1)]))}"
            )
    if framing in ("chunked", "length+chunked"):
        coding = pick(
            draw, ["chunked", "Chunked"], ["gzip, chunked", "chunked, chunked", "identity"]
        )
        lines.append(f"Transfer-Encoding: {coding}")
        body, _ = draw(chunked_body())
    connection = draw(st.sampled_from([None, "close", "keep-alive", "keep-alive, close"]))
    if connection is not None:
        lines.append(f"Connection: {connection}")
    eol = pick(draw, ["\r\n"], ["\n"])
    head = interim + eol.join(lines) + eol + eol
    wire = head.encode("utf-8") + body
    if draw(st.booleans()) and draw(st.booleans()):  # truncated somewhere
        wire = wire[: draw(st.integers(0, max(0, len(wire) - 1)))]
    if draw(st.booleans()) and not draw(st.booleans()):  # junk after the answer
        wire += b"HTTP/1.1 200 OK\r\n\r\nsmuggled"
    return Answer(wire, f"{framing}, {connection}")


NAMED = {
    "chunk size 0x10": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"0x10\r\n0123456789abcdef\r\n0\r\n\r\n",
    "junk after chunk data": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"3\r\nabcXY0\r\n\r\n",
    "conflicting Content-Length": b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n"
    b"Content-Length: 4\r\n\r\nabcd",
    "duplicate Content-Length": b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n"
    b"Content-Length: 3\r\n\r\nabc",
    "gzip, chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
    b"3\r\nabc\r\n0\r\n\r\n",
    "keep-alive, close": b"HTTP/1.1 200 OK\r\nConnection: keep-alive, close\r\n"
    b"Content-Length: 2\r\n\r\nok",
    "obs-fold": b"HTTP/1.1 200 OK\r\nX-A: one\r\n two\r\nContent-Length: 2\r\n\r\nok",
    "Content-Length ²": "HTTP/1.1 200 OK\r\nContent-Length: ²\r\n\r\nok".encode(),
    "chunk size ²": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    + "²\r\nok\r\n0\r\n\r\n".encode(),
    "truncated body": b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",
    "truncated chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n",
    "1xx then final": b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Hints\r\nLink: x\r\n\r\n"
    b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok",
}
# What RFC 9112 asks of a client, case by case: the differential test below checks h11
# and the client agree; this pins what they agree on.
EXPECTED: dict[str, Outcome] = {
    "chunk size 0x10": REJECTED,
    "junk after chunk data": REJECTED,
    "conflicting Content-Length": REJECTED,
    "duplicate Content-Length": ("ok", 200, b"abc"),
    "gzip, chunked": REJECTED,
    "keep-alive, close": ("ok", 200, b"ok"),
    "obs-fold": ("ok", 200, b"ok"),  # a client replaces obs-fold with SP (RFC 9112 §5.2)
    "Content-Length ²": REJECTED,
    "chunk size ²": REJECTED,
    "truncated body": REJECTED,
    "truncated chunked": REJECTED,
    "1xx then final": ("ok", 201, b"ok"),
}


@pytest.mark.parametrize("name", list(NAMED))
async def test_named_rfc9112_cases(name: str) -> None:
    assert reference(NAMED[name]) == EXPECTED[name]
    assert await through_client(NAMED[name]) == EXPECTED[name]


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(answer=answers(), method=st.sampled_from(["GET", "POST", "HEAD"]))
@example(answer=Answer(NAMED["junk after chunk data"], "named"), method="GET")
@example(answer=Answer(NAMED["1xx then final"], "named"), method="POST")
async def test_the_client_agrees_with_h11(answer: Answer, method: str) -> None:
    expected = reference(answer.wire, method)
    assert await through_client(answer.wire, method) == expected, answer.wire
