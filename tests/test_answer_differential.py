"""The fast answer parser against h11: it only accepts what h11 reads the same way.

Hypothesis builds simple answers (the form :mod:`trio_worker._platform._answer` reads),
the same answers each with one flaw that makes them not simple, and the varied valid and
invalid answers of tests/test_http_differential.py. For every one, cut at every byte:

- whenever the fast parser returns an answer, a plain ``h11.Connection(h11.CLIENT)`` that
  sent a GET reads the same status, headers, body and end (its trailing data is the rest of
  the buffer), and may go on with the next request; where h11 rejects, the parser never
  returns an answer;
- a simple answer cut short asks for more (``None``), and whole it is read whatever follows;
- a flawed answer asks for more exactly until the byte that makes it not simple arrives,
  and from there on is NOT_SIMPLE (no wait for bytes that cannot help, no hand-over of an
  answer that could still be simple);
- two or three simple answers in a row are read one after the other.
"""

from __future__ import annotations

from dataclasses import dataclass

import h11
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.test_http_differential import Answer, answers
from trio_worker._platform._answer import NOT_SIMPLE, SimpleAnswer, parse_simple_answer

FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# -- h11's reading -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Reading:
    status: int
    headers: dict[str, str]
    body: bytes
    rest: bytes  # h11's trailing data: the bytes past the answer
    reusable: bool  # both sides done: the connection may carry the next request


def h11_reading(wire: bytes | bytearray) -> Reading | str:
    """What h11 makes of *wire* as the answer to a GET: a Reading, or why there is none."""
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="GET", target="/", headers=[("Host", "p.test")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(bytes(wire))
    status, headers, body = 0, {}, b""
    try:
        while True:
            event = conn.next_event()
            if isinstance(event, h11.Response):
                status = event.status_code
                headers = {n.decode("latin-1"): v.decode("latin-1") for n, v in event.headers}
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                break
            else:
                return f"no answer: {event!r}"  # NEED_DATA, or an interim 1xx answer
    except h11.ProtocolError as exc:
        return f"rejected: {exc}"
    rest, closed = conn.trailing_data
    assert not closed
    reusable = conn.our_state is h11.DONE and conn.their_state is h11.DONE
    return Reading(status, headers, body, rest, reusable)


def check_agreement(buffer: bytes | bytearray, start: int, max_body: int) -> object:
    """The parser's verdict on ``buffer[start:]``, checked against h11 when it is an answer."""
    parsed = parse_simple_answer(buffer, start, max_body)
    if isinstance(parsed, SimpleAnswer):
        reading = h11_reading(buffer[start:])
        assert isinstance(reading, Reading), (bytes(buffer[start:]), parsed, reading)
        assert reading == Reading(
            parsed.status, parsed.headers, parsed.body, bytes(buffer[parsed.end :]), True
        )
        assert len(parsed.body) <= max_body
    return parsed


# -- simple answers ----------------------------------------------------------------------------

TCHAR = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
VCHAR_OBS = [chr(c) for c in range(0x21, 0x7F)] + [chr(c) for c in range(0x80, 0x100)]
OWS = st.sampled_from(["", "", " ", "\t", " \t "])
FRAMING = {"content-length", "transfer-encoding", "connection"}


@st.composite
def field_values(draw: st.DrawFn) -> str:
    words = draw(st.lists(st.text(VCHAR_OBS, min_size=1, max_size=6), max_size=3))
    gaps = [draw(st.sampled_from([" ", "\t", "  "])) for _ in words]
    return "".join(gap + word for gap, word in zip(gaps, words, strict=True)).lstrip(" \t")


NAMES = st.one_of(
    st.sampled_from(["Content-Type", "date", "Server", "ETag", "X-Request-Id", "Connection-Id"]),
    st.text(TCHAR, min_size=1, max_size=10),
).filter(lambda name: name.lower() not in FRAMING)


@dataclass
class Simple:
    """A simple answer and where its parts are, so that flaws can be put in."""

    head: list[str]  # the status line and the field lines, each without its CRLF
    length_at: int  # the index in head of the Content-Length line
    length_value: str  # its digits
    body: bytes

    def wire(self) -> bytes:
        return "".join(line + "\r\n" for line in self.head).encode("latin-1") + b"\r\n" + self.body

    def offset(self, line: int) -> int:
        """Where line *line* of the head starts in the wire."""
        return sum(len(text) + 2 for text in self.head[:line])


@st.composite
def simple_answers(draw: st.DrawFn) -> Simple:
    status = draw(st.integers(200, 599).filter(lambda code: code not in (204, 304)))
    reason = draw(st.text([" ", "\t", *VCHAR_OBS], max_size=10))
    fields = [
        f"{name}:{draw(OWS)}{draw(field_values())}{draw(OWS)}"
        for name in draw(st.lists(NAMES, max_size=5))
    ]
    body = draw(st.binary(max_size=40))
    zeros = "0" * draw(st.integers(0, 2))
    name = draw(st.sampled_from(["Content-Length", "content-length", "CONTENT-LENGTH"]))
    at = draw(st.integers(0, len(fields)))
    fields.insert(at, f"{name}:{draw(OWS)}{zeros}{len(body)}{draw(OWS)}")
    return Simple([f"HTTP/1.1 {status} {reason}", *fields], at + 1, zeros + str(len(body)), body)


AFTER = st.sampled_from([b"", b"", b"HTTP/1.1 200 OK\r\n", b"smuggled", b"\r\n"])


@FAST
@given(answer=simple_answers(), after=AFTER, as_bytearray=st.booleans())
def test_a_simple_answer_is_read_as_h11_reads_it_and_asks_for_more_until_whole(
    answer: Simple, after: bytes, as_bytearray: bool
) -> None:
    wire = answer.wire()
    whole = bytearray(wire + after) if as_bytearray else wire + after
    parsed = check_agreement(whole, 0, len(answer.body))
    assert isinstance(parsed, SimpleAnswer)
    assert (parsed.body, parsed.end) == (answer.body, len(wire))
    for cut in range(len(wire)):
        assert parse_simple_answer(whole[:cut], 0, len(answer.body)) is None, whole[:cut]


@FAST
@given(answers=st.lists(simple_answers(), min_size=2, max_size=3), after=AFTER)
def test_answers_in_a_row_are_read_one_after_the_other(answers: list[Simple], after: bytes) -> None:
    wires = [answer.wire() for answer in answers]
    buffer = b"".join(wires) + after
    start = 0
    for answer, wire in zip(answers, wires, strict=True):
        parsed = check_agreement(buffer, start, 1 << 20)
        assert isinstance(parsed, SimpleAnswer)
        assert (parsed.body, parsed.end) == (answer.body, start + len(wire))
        if parsed.end < len(buffer) - len(after):  # the next one cut short behind it
            assert parse_simple_answer(buffer[: parsed.end + 5], start, 1 << 20) == parsed
            assert parse_simple_answer(buffer[: parsed.end + 5], parsed.end, 1 << 20) is None
        start = parsed.end
    assert buffer[start:] == after


# -- flawed answers: where each stops being simple --------------------------------------------


@dataclass
class Flawed:
    wire: bytes
    doom: int  # the length of the shortest beginning that can no longer become simple
    max_body: int
    flaw: str


def put(answer: Simple, line: int, column: int, text: str) -> tuple[Simple, int]:
    """*answer* with *text* put into its head at (line, column), and where it went."""
    head = list(answer.head)
    head[line] = head[line][:column] + text + head[line][column:]
    flawed = Simple(head, answer.length_at, answer.length_value, answer.body)
    return flawed, answer.offset(line) + column


FLAWS = [
    "version",
    "status",
    "no reason",
    "reason control",
    "framing field",
    "second length",
    "value control",
    "name",
    "bare LF",
    "length value",
    "too many digits",
    "over max_body",
    "no length",
    "before the status line",
]


@st.composite
def flawed_answers(draw: st.DrawFn, flaw: str) -> Flawed:
    answer = draw(simple_answers())
    max_body = len(answer.body)
    body_start = len(answer.wire()) - len(answer.body)
    fields = list(range(1, len(answer.head)))
    others = [line for line in fields if line != answer.length_at]
    if flaw == "version":
        version = draw(st.sampled_from(["HTTP/1.0", "HTTP/2.0", "http/1.1", "HTTP/1.11"]))
        answer.head[0] = version + answer.head[0][8:]
        doom = next(i for i, (a, b) in enumerate(zip(version, "HTTP/1.1 ", strict=False)) if a != b)
        doom += 1
    elif flaw == "status":
        code = draw(st.sampled_from(["204", "304", "100", "101", "199", "600", "999", "099"]))
        answer.head[0] = answer.head[0][:9] + code + answer.head[0][12:]
        doom = 12 if code[0] in "2345" else 10
    elif flaw == "no reason":
        answer.head[0] = answer.head[0][:12]  # "HTTP/1.1 200": h11 takes it
        doom = 13  # its CR
    elif flaw == "reason control":
        column = draw(st.integers(13, len(answer.head[0])))
        bad = draw(st.sampled_from(["\x00", "\x01", "\x7f", "\x0b", "\n"]))
        answer, at = put(answer, 0, column, bad)
        doom = at + 1
    elif flaw == "framing field":
        name = draw(
            st.sampled_from(["Connection", "connection", "Transfer-Encoding", "TRANSFER-ENCODING"])
        )
        value = draw(st.sampled_from(["close", "keep-alive", "chunked", ""]))
        line = draw(st.sampled_from([*fields, len(answer.head)]))
        answer.head.insert(line, f"{name}: {value}")
        doom = answer.offset(line) + len(name) + 1
    elif flaw == "second length":
        line = draw(st.sampled_from([*fields, len(answer.head)]))
        answer.head.insert(line, f"content-Length: {answer.length_value}")
        second = line if line > answer.length_at else answer.length_at + 1
        doom = answer.offset(second) + len("Content-Length:")
    elif flaw == "value control":
        if not others:
            answer.head.insert(1, "X-Value: v")
            others = [1]
            answer.length_at += 1
        line = draw(st.sampled_from(others))
        colon = answer.head[line].index(":")
        column = draw(st.integers(colon + 1, len(answer.head[line])))
        bad = draw(st.sampled_from(["\x00", "\x0b", "\x0c", "\x7f", "\x1f", "\n", "\r"]))
        answer, at = put(answer, line, column, bad)
        # A CR may still be the line's end: the byte after it decides.
        doom = at + (2 if bad == "\r" else 1)
    elif flaw == "name":
        line = draw(st.sampled_from(fields))
        column = draw(st.integers(0, answer.head[line].index(":")))
        bad = draw(st.sampled_from([" ", "\t", "\xdc", "\x00", "(", "@"]))
        answer, at = put(answer, line, column, bad)
        doom = at + 1  # none of these may be in a name, nor first on a line (obs-fold)
    elif flaw == "bare LF":
        line = draw(st.integers(0, len(answer.head)))  # len(head): the blank line
        cr = answer.offset(line) + len(answer.head[line]) if line < len(answer.head) else -1
        wire = answer.wire()
        cr = body_start - 2 if cr < 0 else cr
        return Flawed(wire[:cr] + wire[cr + 1 :], cr + 1, max_body, flaw)
    elif flaw == "length value":
        value, bad_at = draw(
            st.sampled_from(
                [
                    ("+" + answer.length_value, 0),
                    ("-" + answer.length_value, 0),
                    (answer.length_value + ", " + answer.length_value, len(answer.length_value)),
                    ("0x" + answer.length_value, 1),
                    (answer.length_value + " 1", len(answer.length_value) + 1),
                    ("\xb2", 0),
                    ("\xc2\xb2", 0),
                    ("", 0),  # the CR of the line's end
                ]
            )
        )
        answer.head[answer.length_at] = "Content-Length: " + value
        doom = answer.offset(answer.length_at) + len("Content-Length: ") + bad_at + 1
    elif flaw == "too many digits":
        value = "0" * (21 - len(answer.length_value)) + answer.length_value
        answer.head[answer.length_at] = "Content-Length: " + value
        doom = answer.offset(answer.length_at) + len("Content-Length: ") + 21
    elif flaw == "over max_body":
        max_body = draw(st.integers(0, 9))
        value = answer.length_value + draw(st.sampled_from(["", "0", "9"]))
        if int(value) <= max_body:
            value += str(max_body + 1)
        answer.head[answer.length_at] = "Content-Length: " + value
        over = next(k for k in range(1, len(value) + 1) if int(value[:k]) > max_body)
        doom = answer.offset(answer.length_at) + len("Content-Length: ") + over
    elif flaw == "no length":
        del answer.head[answer.length_at]
        doom = len(answer.wire()) - len(answer.body) - 1  # the CR of the blank line
    else:
        assert flaw == "before the status line"
        before = draw(st.sampled_from([" ", "\t", "\r\n", "X", "\x16"]))
        return Flawed(before.encode() + answer.wire(), 1, max_body, flaw)
    return Flawed(answer.wire(), doom, max_body, flaw)


@pytest.mark.parametrize("flaw", FLAWS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_flawed_answer_asks_for_more_exactly_until_it_cannot_be_simple(
    flaw: str, data: st.DataObject
) -> None:
    flawed = data.draw(flawed_answers(flaw))
    assert check_agreement(flawed.wire, 0, flawed.max_body) is NOT_SIMPLE
    verdicts = [
        parse_simple_answer(flawed.wire[:cut], 0, flawed.max_body)
        for cut in range(len(flawed.wire) + 1)
    ]
    doom = verdicts.index(NOT_SIMPLE)
    assert doom == flawed.doom, (flawed.flaw, flawed.wire[: flawed.doom], flawed.wire[:doom])
    assert verdicts[:doom] == [None] * doom
    assert verdicts[doom:] == [NOT_SIMPLE] * (len(verdicts) - doom)


# -- everything else -----------------------------------------------------------------------


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(answer=answers(), max_body=st.sampled_from([0, 5, 1 << 20]))
def test_any_answer_cut_anywhere_is_read_as_h11_reads_it_or_handed_over(
    answer: Answer, max_body: int
) -> None:
    verdicts = [
        check_agreement(answer.wire[:cut], 0, max_body) for cut in range(len(answer.wire) + 1)
    ]
    event("read whole" if isinstance(verdicts[-1], SimpleAnswer) else repr(verdicts[-1]))
    if NOT_SIMPLE in verdicts:  # once not simple, never simple again
        doom = verdicts.index(NOT_SIMPLE)
        assert verdicts[doom:] == [NOT_SIMPLE] * (len(verdicts) - doom), answer.wire
