"""The fast path for simple HTTP/1.1 answers: what it reads, and each reason it hands over.

The agreement with h11 over generated answers is in tests/test_answer_differential.py;
here each case is named, with the exact edges of the bounds.
"""

from __future__ import annotations

import pytest

from trio_worker._platform._answer import (
    MAX_HEADER_BYTES,
    MAX_HEADER_COUNT,
    NOT_SIMPLE,
    SimpleAnswer,
    parse_simple_answer,
)

BIG = 1 << 20
TYPICAL = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n"
    b"date: Tue, 15 Jul 2025 10:00:00 GMT\r\nserver: uvicorn\r\n\r\n{}"
)


def answer(*fields: str, body: bytes = b"ok", status: bytes = b"200 OK") -> bytes:
    lines = "".join(f"{field}\r\n" for field in fields)
    return b"HTTP/1.1 " + status + b"\r\n" + lines.encode("latin-1") + b"\r\n" + body


def test_a_typical_answer() -> None:
    assert parse_simple_answer(TYPICAL, 0, BIG) == SimpleAnswer(
        200,
        {
            "content-type": "application/json",
            "content-length": "2",
            "date": "Tue, 15 Jul 2025 10:00:00 GMT",
            "server": "uvicorn",
        },
        b"{}",
        len(TYPICAL),
    )


def test_an_answer_within_a_buffer_leaves_what_follows() -> None:
    buffer = bytearray(b"junk" + TYPICAL + b"HTTP/1.1 201 Cre")
    parsed = parse_simple_answer(buffer, 4, BIG)
    assert isinstance(parsed, SimpleAnswer)
    assert type(parsed.body) is bytes
    assert (parsed.status, parsed.body, parsed.end) == (200, b"{}", 4 + len(TYPICAL))
    assert parse_simple_answer(buffer, parsed.end, BIG) is None


def test_names_are_lower_cased_values_stripped_and_latin1_decoded() -> None:
    wire = answer(
        "X-Thing:\t padded \t",
        "CONTENT-length:2",
        "X-Empty:",
        "X-Latin: caf\xe9 \x80",
        "x-thing: second",
        status=b"404 ",
    )
    parsed = parse_simple_answer(wire, 0, BIG)
    assert isinstance(parsed, SimpleAnswer)
    assert parsed.status == 404
    assert parsed.headers == {
        "x-thing": "second",  # a repeated name: the last one, as the lean client's dict
        "content-length": "2",
        "x-empty": "",
        "x-latin": "caf\xe9 \x80",
    }


def test_a_content_length_with_leading_zeros_is_its_number() -> None:
    # h11 reads Content-Length as 1*DIGIT, so 005 is 5.
    parsed = parse_simple_answer(answer("Content-Length: 005", body=b"12345xy"), 0, BIG)
    assert isinstance(parsed, SimpleAnswer)
    assert parsed.body == b"12345"
    assert parsed.headers["content-length"] == "005"


def test_an_empty_body() -> None:
    wire = answer("Content-Length: 0", body=b"", status=b"503 Busy")
    assert parse_simple_answer(wire, 0, 0) == SimpleAnswer(
        503, {"content-length": "0"}, b"", len(wire)
    )


def test_a_content_length_of_max_body_is_read_and_one_more_is_not() -> None:
    wire = answer("Content-Length: 2")
    assert isinstance(parse_simple_answer(wire, 0, 2), SimpleAnswer)
    assert parse_simple_answer(wire, 0, 1) is NOT_SIMPLE


@pytest.mark.parametrize(
    "wire",
    [
        b"",
        b"HTTP/1.1",
        b"HTTP/1.1 2",
        b"HTTP/1.1 200",
        b"HTTP/1.1 200 OK\r",
        b"HTTP/1.1 200 OK\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Len",
        b"HTTP/1.1 200 OK\r\nConnection",  # may yet become Connection-Id
        b"HTTP/1.1 200 OK\r\nContent-Length:",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\no",
        b"HTTP/1.1 200 OK\r\nX-A: b\r",  # the CR of the line's end
    ],
)
def test_the_beginning_of_a_simple_answer_asks_for_more(wire: bytes) -> None:
    assert parse_simple_answer(wire, 0, BIG) is None
    assert parse_simple_answer(b"xx" + wire, 2, BIG) is None


@pytest.mark.parametrize(
    ("wire", "max_body"),
    [
        # the status line
        (answer("Content-Length: 2", status=b"200"), BIG),  # no reason, no SP (h11 takes it)
        (b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", BIG),
        (b"HTTP/2 200 OK\r\nContent-Length: 2\r\n\r\nok", BIG),
        (b"http/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", BIG),
        (b" HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", BIG),
        (b"\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", BIG),
        (answer("Content-Length: 2", status=b"100 Continue"), BIG),
        (answer("Content-Length: 2", status=b"199 Low"), BIG),
        (answer("Content-Length: 2", status=b"204 No Content"), BIG),
        (answer("Content-Length: 2", status=b"304 Not Modified"), BIG),
        (answer("Content-Length: 2", status=b"600 High"), BIG),
        (answer("Content-Length: 2", status=b"20O OK"), BIG),
        (answer("Content-Length: 2", status=b"2000 OK"), BIG),
        (answer("Content-Length: 2", status=b"200 O\x00K"), BIG),
        (answer("Content-Length: 2", status=b"200 O\x7fK"), BIG),
        # line ends
        (b"HTTP/1.1 200 OK\nContent-Length: 2\r\n\r\nok", BIG),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\n\r\nok", BIG),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\nok", BIG),
        (b"HTTP/1.1 200 OK\r\nX: a\rb\r\nContent-Length: 2\r\n\r\nok", BIG),
        (b"HTTP/1.1 200 OK\r\nX: a\r\r\nContent-Length: 2\r\n\r\nok", BIG),
        # header lines
        (answer("X-A: one", " two", "Content-Length: 2"), BIG),  # obs-fold
        (answer("X-A: one", "\ttwo", "Content-Length: 2"), BIG),
        (answer("X-A : one", "Content-Length: 2"), BIG),
        (answer("X A: one", "Content-Length: 2"), BIG),
        (answer("X-\xdcn\xef: one", "Content-Length: 2"), BIG),
        (answer(": one", "Content-Length: 2"), BIG),
        (answer("no colon", "Content-Length: 2"), BIG),
        (answer("X-A: a\x00b", "Content-Length: 2"), BIG),
        (answer("X-A: a\x01b", "Content-Length: 2"), BIG),  # h11 takes it
        (answer("X-A: a\x0bb", "Content-Length: 2"), BIG),
        (answer("X-A: a\x7fb", "Content-Length: 2"), BIG),
        # framing
        (answer("X-A: b"), BIG),  # no Content-Length: the close delimits the body
        (answer("Content-Length: 2", "Content-Length: 2"), BIG),  # h11 takes it
        (answer("Content-Length: 2", "content-length: 3"), BIG),
        (answer("Content-Length: +2"), BIG),
        (answer("Content-Length: -2"), BIG),
        (answer("Content-Length: 2, 2"), BIG),
        (answer("Content-Length: 0x2"), BIG),
        (answer("Content-Length: 2 2"), BIG),
        (answer("Content-Length: "), BIG),
        (answer("Content-Length: \xb2"), BIG),  # latin-1 ²
        (answer("Content-Length: ²".encode().decode("latin-1")), BIG),  # UTF-8 ²
        (answer("Content-Length: \u0662".encode().decode("latin-1")), BIG),  # Arabic 2
        (answer("Content-Length: " + "0" * 20 + "2"), BIG),  # 21 digits: over h11's 20
        (answer("Content-Length: 2"), 1),  # over max_body
        (answer("Content-Length: 2", "Transfer-Encoding: chunked"), BIG),
        (answer("Transfer-Encoding: identity", "Content-Length: 2"), BIG),
        (answer("Content-Length: 2", "Connection: keep-alive"), BIG),
        (answer("CONNECTION: close", "Content-Length: 2"), BIG),
        (answer("Connection:", "Content-Length: 2"), BIG),
    ],
)
def test_everything_else_is_not_simple(wire: bytes, max_body: int) -> None:
    assert parse_simple_answer(wire, 0, max_body) is NOT_SIMPLE
    assert parse_simple_answer(b"HTTP/1.1 200 OK" + wire, 15, max_body) is NOT_SIMPLE


def test_20_digits_of_content_length_are_read() -> None:
    wire = answer("Content-Length: " + "0" * 19 + "2")
    assert isinstance(parse_simple_answer(wire, 0, BIG), SimpleAnswer)


@pytest.mark.parametrize(
    ("wire", "max_body"),
    [
        (b"HTTP/1.0", BIG),
        (b"HTTP/1.1 1", BIG),
        (b"HTTP/1.1 204", BIG),
        (b"HTTP/1.1 200\r", BIG),
        (b"HTTP/1.1 200 OK\n", BIG),
        (b"HTTP/1.1 200 OK\r\n ", BIG),
        (b"HTTP/1.1 200 OK\r\nX-A ", BIG),
        (b"HTTP/1.1 200 OK\r\nConnection:", BIG),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding:", BIG),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length:", BIG),
        (b"HTTP/1.1 200 OK\r\nContent-Length:\r", BIG),  # an empty value only
        (b"HTTP/1.1 200 OK\r\nContent-Length: +", BIG),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1 2", BIG),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 12", 11),  # more digits only add
        (b"HTTP/1.1 200 OK\r\nX-A: b\r\n\r", BIG),  # the blank line, and no length
        (b"HTTP/1.1 200 OK\r\nX-A: b\rc", BIG),
    ],
)
def test_a_beginning_that_cannot_become_simple_is_not_simple(wire: bytes, max_body: int) -> None:
    assert parse_simple_answer(wire, 0, max_body) is NOT_SIMPLE


# -- the bounds, to the byte ------------------------------------------------------------


def padded_head(size: int, *fields: str) -> bytes:
    """A head of exactly *size* bytes: *fields*, then one X-Pad field making up the rest."""
    start = b"HTTP/1.1 200 OK\r\n" + "".join(f"{f}\r\n" for f in fields).encode()
    pad = size - len(start) - len(b"X-Pad: \r\n\r\n")
    return start + b"X-Pad: " + b"p" * pad + b"\r\n\r\n"


def test_a_head_of_max_header_bytes_is_read_and_one_byte_more_is_not() -> None:
    head = padded_head(MAX_HEADER_BYTES, "Content-Length: 2")
    assert len(head) == MAX_HEADER_BYTES
    parsed = parse_simple_answer(head + b"ok", 0, BIG)
    assert isinstance(parsed, SimpleAnswer)
    assert parsed.end == MAX_HEADER_BYTES + 2
    longer = padded_head(MAX_HEADER_BYTES + 1, "Content-Length: 2")
    assert parse_simple_answer(longer + b"ok", 0, BIG) is NOT_SIMPLE
    for cut in (MAX_HEADER_BYTES - 1, MAX_HEADER_BYTES):  # before its blank line
        assert parse_simple_answer(longer[:cut], 0, BIG) is NOT_SIMPLE


def test_an_unfinished_head_asks_for_more_only_while_its_end_still_fits() -> None:
    # The shortest ending of "...X-Pad: ppp" is "\r\nContent-Length:0\r\n\r\n".
    ending = b"\r\nContent-Length:0\r\n\r\n"
    fits = padded_head(MAX_HEADER_BYTES + len(b"\r\n\r\n") - len(ending))[:-4]
    assert len(fits) + len(ending) == MAX_HEADER_BYTES
    assert parse_simple_answer(fits, 0, BIG) is None
    assert isinstance(parse_simple_answer(fits + ending, 0, BIG), SimpleAnswer)
    assert parse_simple_answer(fits + b"p", 0, BIG) is NOT_SIMPLE
    # With its Content-Length already there, the shortest ending is "\r\n\r\n".
    fits = padded_head(MAX_HEADER_BYTES, "Content-Length: 0")[:-4]
    assert parse_simple_answer(fits, 0, BIG) is None
    assert parse_simple_answer(fits + b"p", 0, BIG) is NOT_SIMPLE


def fields(count: int) -> list[str]:
    return [f"X-{index}: v" for index in range(count)]


def test_max_header_count_fields_are_read_and_one_more_is_not() -> None:
    most = answer(*fields(MAX_HEADER_COUNT - 1), "Content-Length: 2")
    parsed = parse_simple_answer(most, 0, BIG)
    assert isinstance(parsed, SimpleAnswer)
    assert len(parsed.headers) == MAX_HEADER_COUNT
    assert parse_simple_answer(answer(*fields(MAX_HEADER_COUNT), "Content-Length: 2"), 0, BIG) is (
        NOT_SIMPLE
    )


def test_an_unfinished_head_asks_for_more_only_while_its_fields_still_fit() -> None:
    status = b"HTTP/1.1 200 OK\r\n"
    room = status + "".join(f"{f}\r\n" for f in fields(MAX_HEADER_COUNT - 1)).encode()
    full = status + "".join(f"{f}\r\n" for f in fields(MAX_HEADER_COUNT)).encode()
    assert parse_simple_answer(room, 0, BIG) is None  # a Content-Length may come
    assert parse_simple_answer(room + b"C", 0, BIG) is None  # ... and this may be it
    assert parse_simple_answer(room + b"X", 0, BIG) is NOT_SIMPLE  # no room for both
    assert parse_simple_answer(full, 0, BIG) is NOT_SIMPLE  # no room for a Content-Length
    last = status + "".join(f"{f}\r\n" for f in fields(MAX_HEADER_COUNT - 1)).encode()
    last += b"Content-Length: 2\r\n"
    assert parse_simple_answer(last + b"\r", 0, BIG) is None
    assert parse_simple_answer(last + b"X", 0, BIG) is NOT_SIMPLE
