"""The client (llhttp, its one answer parser) against h11's reading of the same answer.

Each crafted answer is served to :class:`HttpPool` over a ``trio.testing.memory_stream_pair``
(in one write, or cut in two at any byte), and fed to a plain
``h11.Connection(our_role=h11.CLIENT)`` in one piece followed by the server's close. h11 is
the reference the client is held to (docs/protocol.md §2.0): it never reads an answer h11
rejects, nor reads one otherwise; it rejects a few forms RFC 9112 leaves to the recipient
and h11 reads (named below):

- Plain answers (any status and reason, any field names, values and whitespace, a
  ``Content-Length`` with leading zeros), alone or two and three in one pipelined round:
  the client reads exactly what h11 reads, headers included.
- Crafted answers, valid and RFC 9112-invalid (bad chunk sizes such as ``0x10`` or ``²``,
  bytes after chunk data, conflicting or duplicate Content-Lengths, ``Transfer-Encoding:
  gzip, chunked``, ``Connection: keep-alive, close``, obs-fold, truncated bodies, interim
  1xx answers before the final one), and plain answers with one flaw put in: what the
  client accepts, h11 accepts and reads the same (status and body); everything else is a
  :class:`~trio_worker.TransportError`.

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
from trio_worker._platform._connection import MAX_HEADER_BYTES, Connection
from trio_worker._platform._http import HttpPool, HttpResponse, QuietProbe, ServerKinds
from trio_worker._platform._request import parse_origin

Outcome = tuple[str, int, bytes]  # ("ok", status, body) or ("rejected", 0, b"")
REJECTED: Outcome = ("rejected", 0, b"")
ORIGIN = parse_origin("http://p.test")
HYPOTHESIS = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def h11_answers(wire: bytes, method: str = "GET", count: int = 1) -> list[HttpResponse] | None:
    """What a plain h11 client makes of *wire* followed by the server closing, as the
    answers to *count* requests: the answers, or None when it rejects them."""
    conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEADER_BYTES)
    conn.receive_data(wire)
    conn.receive_data(b"")
    read: list[HttpResponse] = []
    try:
        for _ in range(count):
            if conn.our_state is h11.DONE:
                conn.start_next_cycle()
            conn.send(h11.Request(method=method, target="/", headers=[("Host", "p.test")]))
            conn.send(h11.EndOfMessage())
            status, headers, body = 0, {}, b""
            while True:
                event = conn.next_event()
                if isinstance(event, h11.Response):
                    status = event.status_code
                    headers = {n.decode("latin-1"): v.decode("latin-1") for n, v in event.headers}
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    read.append(HttpResponse(status, headers, body))
                    break
                elif not isinstance(event, h11.InformationalResponse):
                    return None  # ConnectionClosed, NEED_DATA, PAUSED: no full answer
    except h11.ProtocolError:
        return None
    return read


def reference(wire: bytes, method: str = "GET") -> Outcome:
    read = h11_answers(wire, method)
    return REJECTED if read is None else ("ok", read[0].status, read[0].body)


async def client_answers(
    wire: bytes, method: str = "GET", count: int = 1, cut: int | None = None
) -> list[HttpResponse] | None:
    """What :class:`HttpPool` makes of *wire* (in two writes, at *cut*), answering *count*
    requests in one round: the answers, or None when it raises TransportError."""

    async def serve(server: trio.abc.Stream) -> None:
        request = b""
        while request.count(b"\r\n\r\n") < count:
            request += await server.receive_some(65536)
        try:
            if cut is None:
                await server.send_all(wire)
            else:
                await server.send_all(wire[:cut])
                await trio.testing.wait_all_tasks_blocked()  # the client reads it first
                await server.send_all(wire[cut:])
        except trio.BrokenResourceError:
            pass  # the client gave up first
        await server.aclose()

    servers = ServerKinds()  # as if p.test had answered as HTTP/1.1: a round goes out whole
    stream = trio.testing.memory_stream_pair()[0]
    servers.note(Connection(stream, ORIGIN, QuietProbe(stream).quiet), answered=True)
    async with trio.open_nursery() as nursery:

        async def open_stream(host: str, port: int, tls: bool) -> trio.abc.Stream:
            client, server = trio.testing.memory_stream_pair()
            nursery.start_soon(serve, server)
            return client

        pool = HttpPool({"User-Agent": "differential"}, open_stream=open_stream, servers=servers)
        requests = [(f"http://p.test/{n}", b"") for n in range(count)]
        try:
            return await pool.exchange(method, requests)
        except TransportError:
            return None
        finally:
            await pool.aclose()


async def through_client(wire: bytes, method: str = "GET", cut: int | None = None) -> Outcome:
    read = await client_answers(wire, method, cut=cut)
    return REJECTED if read is None else ("ok", read[0].status, read[0].body)


# -- plain answers -------------------------------------------------------------------------

TCHAR = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
VCHAR_OBS = [chr(c) for c in range(0x21, 0x7F)] + [chr(c) for c in range(0x80, 0x100)]
OWS = st.sampled_from(["", "", " ", "\t", " \t "])
NAMES = st.one_of(
    st.sampled_from(["Content-Type", "date", "Server", "ETag", "X-Request-Id", "Connection-Id"]),
    st.text(TCHAR, min_size=1, max_size=10),
).filter(lambda name: name.lower() not in ("content-length", "transfer-encoding", "connection"))


@st.composite
def field_values(draw: st.DrawFn) -> str:
    words = draw(st.lists(st.text(VCHAR_OBS, min_size=1, max_size=6), max_size=3))
    gaps = [draw(st.sampled_from([" ", "\t", "  "])) for _ in words]
    return "".join(gap + word for gap, word in zip(gaps, words, strict=True)).lstrip(" \t")


@dataclass
class Plain:
    lines: list[str]  # the head's, the status line first
    body: bytes

    def wire(self) -> bytes:
        head = "".join(f"{line}\r\n" for line in self.lines)
        return head.encode("latin-1") + b"\r\n" + self.body


@st.composite
def plain_answers(draw: st.DrawFn) -> Plain:
    """A valid answer."""
    status = draw(st.integers(200, 599))
    reason = draw(st.text([" ", "\t", *VCHAR_OBS], max_size=10))
    lines = [
        f"{name}:{draw(OWS)}{draw(field_values())}{draw(OWS)}"
        for name in draw(st.lists(NAMES, max_size=5))
    ]
    body = b"" if status in (204, 304) else draw(st.binary(max_size=40))
    zeros = "0" * draw(st.integers(0, 2))
    name = draw(st.sampled_from(["Content-Length", "content-length", "CONTENT-LENGTH"]))
    lines.insert(draw(st.integers(0, len(lines))), f"{name}:{draw(OWS)}{zeros}{len(body)}")
    return Plain([f"HTTP/1.1 {status} {reason}", *lines], body)


@settings(HYPOTHESIS, max_examples=150)
@given(answers=st.lists(plain_answers(), min_size=1, max_size=3), data=st.data())
async def test_plain_answers_are_read_as_h11_reads_them_however_the_bytes_come(
    answers: list[Plain], data: st.DataObject
) -> None:
    wire = b"".join(answer.wire() for answer in answers)
    cut = data.draw(st.one_of(st.none(), st.integers(0, len(wire))))
    expected = h11_answers(wire, count=len(answers))
    assert expected is not None and len(expected) == len(answers)
    assert await client_answers(wire, count=len(answers), cut=cut) == expected


# -- crafted answers -----------------------------------------------------------------------


def pick(draw: st.DrawFn, usual: list[str], odd: list[str]) -> str:
    """One of *usual* half of the time, else any: so most answers are not all broken."""
    return draw(st.sampled_from(usual if draw(st.booleans()) else usual + odd))


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
def chunked_body(draw: st.DrawFn) -> bytes:
    wire = b""
    for data in draw(st.lists(st.binary(min_size=1, max_size=12), max_size=3)):
        size = draw(chunk_size(len(data)))
        after = draw(st.sampled_from([b"\r\n", b"\r\n", b"XY", b"\n", b"", b"\r\nX"]))
        wire += size.encode("utf-8") + b"\r\n" + data + after
    last = [b"0\r\n\r\n", b"0\r\nX-T: 1\r\n\r\n", b"0;e\r\n\r\n", b"00\r\n\r\n"]
    return wire + draw(st.sampled_from(last))


@dataclass
class Answer:
    wire: bytes
    note: str


@st.composite
def answers(draw: st.DrawFn) -> Answer:
    """Valid and invalid answers."""
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
    tokens = st.sampled_from(["a", "X-Thing", "Content-Type", "ETag", "x_y", "X-Ünï", "X Y"])
    values = st.sampled_from(["", "v", "application/json", " padded ", "a\tb", "ca\xe9", "a\x00b"])
    lines = [f"{draw(tokens)}:{draw(values)}" for _ in range(draw(st.integers(0, 3)))]
    if draw(st.booleans()) and draw(st.booleans()):
        odd_lines = ["no colon", "X : y", " X-Fold: starts with space"]
        lines.append(draw(st.sampled_from(odd_lines)))
    payload = draw(st.binary(max_size=40))
    framings = ["length", "chunked", "close", "length+chunked"]
    framing = draw(st.sampled_from(framings))
    body = payload
    if framing in ("length", "length+chunked"):
        exact = str(len(payload))
        odd = [str(len(payload) + 3), "²", f"+{exact}", f"0x{exact}", f" {exact} "]
        declared = pick(draw, [exact], [*odd, f"{exact}, {exact}"])
        lines.append(f"Content-Length: {declared}")
        if draw(st.booleans()):  # a second Content-Length: the same or another
            seconds = [str(len(payload) + 1), declared]
            lines.append(f"Content-Length: {draw(st.sampled_from(seconds))}")
    if framing in ("chunked", "length+chunked"):
        coding = pick(
            draw, ["chunked", "Chunked"], ["gzip, chunked", "chunked, chunked", "identity"]
        )
        lines.append(f"Transfer-Encoding: {coding}")
        body = draw(chunked_body())
    connection = draw(st.sampled_from([None, "close", "keep-alive", "keep-alive, close"]))
    if connection is not None:
        lines.append(f"Connection: {connection}")
    eol = pick(draw, ["\r\n"], ["\n"])
    head = interim + eol.join([f"{version} {status}", *lines]) + eol + eol
    wire = head.encode("utf-8") + body
    if draw(st.booleans()) and draw(st.booleans()):  # truncated somewhere
        wire = wire[: draw(st.integers(0, max(0, len(wire) - 1)))]
    if draw(st.booleans()) and not draw(st.booleans()):  # junk after the answer
        wire += b"HTTP/1.1 200 OK\r\n\r\nsmuggled"
    return Answer(wire, f"{framing}, {connection}")


@st.composite
def flawed_answers(draw: st.DrawFn) -> Answer:
    """A plain answer with one byte put where RFC 9112 allows it nowhere, or a framing
    field's value bent."""
    answer = draw(plain_answers())
    lines, body = answer.lines, answer.body
    line = draw(st.integers(0, len(lines) - 1))
    text = lines[line]
    at = draw(st.integers(0, len(text)))
    flaw = draw(st.sampled_from(["\x00", "\x01", "\x7f", "\x0b", "\r", "\n", "\xdc", "(", " "]))
    lines[line] = text[:at] + flaw + text[at:]
    if draw(st.booleans()):
        forms = ["+{}", "-{}", "0x{}", "{} 1", "\xb2", "{}\xb2", "0" * 20 + "{}"]
        form = draw(st.sampled_from(forms))
        lines.append("Content-Length: " + form.format(len(body)))
    return Answer(answer.wire(), f"{flaw!r} in line {line}")


# -- named cases ---------------------------------------------------------------------------

NAMED = {
    "chunk size 0x10": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"0x10\r\n0123456789abcdef\r\n0\r\n\r\n",
    "junk after chunk data": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"3\r\nabcXY0\r\n\r\n",
    "conflicting Content-Length": b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n"
    b"Content-Length: 4\r\n\r\nabcd",
    "gzip, chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
    b"3\r\nabc\r\n0\r\n\r\n",
    "keep-alive, close": b"HTTP/1.1 200 OK\r\nConnection: keep-alive, close\r\n"
    b"Content-Length: 2\r\n\r\nok",
    "Content-Length ²": "HTTP/1.1 200 OK\r\nContent-Length: ²\r\n\r\nok".encode(),
    "chunk size ²": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    + "²\r\nok\r\n0\r\n\r\n".encode(),
    "truncated body": b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",
    "truncated chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n",
    "1xx then final": b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Hints\r\nLink: x\r\n\r\n"
    b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok",
}
# What RFC 9112 asks of a client, case by case: h11 and the client agree on these.
EXPECTED: dict[str, Outcome] = {
    "chunk size 0x10": REJECTED,
    "junk after chunk data": REJECTED,
    "conflicting Content-Length": REJECTED,
    "gzip, chunked": REJECTED,
    "keep-alive, close": ("ok", 200, b"ok"),
    "Content-Length ²": REJECTED,
    "chunk size ²": REJECTED,
    "truncated body": REJECTED,
    "truncated chunked": REJECTED,
    "1xx then final": ("ok", 201, b"ok"),
}

# Forms RFC 9112 lets a recipient read or reject as it likes: h11 reads them (the client
# does not: STRICTER, below).
NAMED |= {
    "duplicate Content-Length": b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n"
    b"Content-Length: 3\r\n\r\nabc",
    "a list of equal Content-Lengths": b"HTTP/1.1 200 OK\r\nContent-Length: 3, 3\r\n\r\nabc",
    "a control byte in a field value": b"HTTP/1.1 200 OK\r\nX-A: a\x01b\r\n"
    b"Content-Length: 2\r\n\r\nok",
    "obs-fold": b"HTTP/1.1 200 OK\r\nX-A: one\r\n two\r\nContent-Length: 2\r\n\r\nok",
    "bare LF": b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok",
    "a space after a chunk size": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"2 \r\nok\r\n0\r\n\r\n",
    # RFC 9112 §6.3: Transfer-Encoding overrides Content-Length.
    "chunked beside a Content-Length": b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    # h11 rejects these, and so does the client (llhttp alone reads the first three).
    "an empty line before the status line": b"\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    "a CR before the status line": b"\rHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    "RTSP/1.0": b"RTSP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
    "a NUL in the reason phrase": b"HTTP/1.1 200 O\x00K\r\nContent-Length: 2\r\n\r\nok",
    "a form feed in the reason phrase": b"HTTP/1.1 200 \x0c\r\nContent-Length: 2\r\n\r\nok",
}
EXPECTED |= {
    "duplicate Content-Length": ("ok", 200, b"abc"),
    "a list of equal Content-Lengths": ("ok", 200, b"abc"),
    "a control byte in a field value": ("ok", 200, b"ok"),
    "obs-fold": ("ok", 200, b"ok"),
    "bare LF": ("ok", 200, b"ok"),
    "a space after a chunk size": ("ok", 200, b"ok"),
    "chunked beside a Content-Length": ("ok", 200, b"abc"),
    "an empty line before the status line": REJECTED,
    "a CR before the status line": REJECTED,
    "RTSP/1.0": REJECTED,
    "a NUL in the reason phrase": REJECTED,
    "a form feed in the reason phrase": REJECTED,
}


@settings(HYPOTHESIS, max_examples=400)
@given(
    answer=st.one_of(answers(), flawed_answers()),
    method=st.sampled_from(["GET", "POST"]),
    data=st.data(),
)
@example(answer=Answer(NAMED["obs-fold"], "named"), method="GET", data=None)
@example(answer=Answer(NAMED["junk after chunk data"], "named"), method="GET", data=None)
@example(answer=Answer(NAMED["1xx then final"], "named"), method="POST", data=None)
@example(answer=Answer(NAMED["a CR before the status line"], "named"), method="GET", data=None)
async def test_the_client_never_reads_what_h11_rejects_nor_reads_it_otherwise(
    answer: Answer, method: str, data: st.DataObject | None
) -> None:
    cut = (
        None if data is None else data.draw(st.one_of(st.none(), st.integers(0, len(answer.wire))))
    )
    read = await through_client(answer.wire, method, cut)
    assert read == REJECTED or read == reference(answer.wire, method), answer.wire


# Where the client is stricter than h11: llhttp rejects these forms, which RFC 9112 lets a
# recipient read or reject (an obs-fold, which §5.2 asks a user agent to read, among them),
# or RFC 9110 §5.5 makes invalid (a control byte in a field value); no platform server
# sends one.
STRICTER = {
    "a control byte in a field value",
    "duplicate Content-Length",
    "a list of equal Content-Lengths",
    "obs-fold",
    "bare LF",
    "a space after a chunk size",
    "chunked beside a Content-Length",
}


@pytest.mark.parametrize("name", list(NAMED))
async def test_named_rfc9112_cases(name: str) -> None:
    assert reference(NAMED[name]) == EXPECTED[name]
    expected = REJECTED if name in STRICTER else EXPECTED[name]
    assert await through_client(NAMED[name]) == expected
