"""A fast path for the common HTTP/1.1 answer, so h11 need not parse every one.

The lean client (:mod:`._lean`) parses answers with h11, the authority on what RFC 9112
lets a client accept. Most answers the platform sends are of one plain shape: ``HTTP/1.1``,
a final status, a ``Content-Length`` body, no ``Connection`` or ``Transfer-Encoding``.
:func:`parse_simple_answer` reads exactly that shape at a fraction of h11's cost and says
:data:`NOT_SIMPLE` for anything else, so the caller hands the same bytes to h11.

What it accepts, h11 accepts with the same meaning (status, headers, body, where the answer
ends), and the connection may carry the next request (HTTP/1.1, no ``Connection`` header,
the body delimited by its length). The simple form, everything else being NOT_SIMPLE:

- the status line ``HTTP/1.1 SP 3DIGIT SP reason CRLF``, the reason of HTAB, SP, VCHAR or
  obs-text (RFC 9112 §4), the status 200-599 except 204 and 304 (whose body is empty
  whatever the headers say: h11 frames those);
- header lines ``token ":" OWS field-value OWS CRLF``, the value of VCHAR and obs-text
  separated by SP/HTAB (RFC 9110 §5.5; h11 also takes control characters: those go to h11);
  every line ends in CRLF (no bare CR or LF), none starts with whitespace (obs-fold);
- exactly one ``Content-Length``, of at most 20 ASCII digits (h11's bound) and at most
  ``max_body``; no ``Transfer-Encoding``; no ``Connection`` (whose value h11 interprets);
- a head (status line through the blank line) of at most :data:`MAX_HEADER_BYTES` and at
  most :data:`MAX_HEADER_COUNT` fields, the client's bounds (docs/protocol.md §2.0).

The caller must not take this path for the answer to a HEAD or CONNECT request (h11 frames
those bodies by the method, which this parser is not told).
"""

from __future__ import annotations

import enum
import re
from typing import Final, Literal, NamedTuple

MAX_HEADER_BYTES: Final = 64 * 1024  # one response head
MAX_HEADER_COUNT: Final = 128  # header fields in one response head
_MAX_LENGTH_DIGITS: Final = 20  # h11's CONTENT_LENGTH_MAX_DIGITS


class NotSimple(enum.Enum):
    NOT_SIMPLE = "not simple"


#: The bytes are not (and can no longer become) a simple answer: let h11 read them.
NOT_SIMPLE: Final = NotSimple.NOT_SIMPLE


class SimpleAnswer(NamedTuple):
    status: int
    headers: dict[str, str]  # lower-cased names, latin-1 decoded; a repeated name: the last
    body: bytes
    end: int  # the index just past this answer in the buffer


_TOKEN = rb"[-!#$%&'*+.^_`|~0-9A-Za-z]+"
_VCHAR = rb"[\x21-\x7e\x80-\xff]"  # VCHAR / obs-text
_VALUE = rb"(?:" + _VCHAR + rb"+(?:[ \t]+" + _VCHAR + rb"+)*)?"
_FIELD = _TOKEN + rb":[ \t]*" + _VALUE + rb"[ \t]*\r\n"
# The whole head in one match: group 1 the status, group 2 the header lines.
_HEAD = re.compile(rb"HTTP/1\.1 ([0-9]{3}) [\t\x20-\x7e\x80-\xff]*\r\n((?:" + _FIELD + rb")*)\r\n")
_FRAMING = frozenset(("content-length", "transfer-encoding", "connection"))
# A Content-Length among the complete lines of an unfinished head.
_LENGTH_LINE = re.compile(rb"\ncontent-length:", re.IGNORECASE)
_LENGTH_FIELD: Final = b"Content-Length:0\r\n"


def parse_simple_answer(
    buffer: bytes | bytearray, start: int, max_body: int
) -> SimpleAnswer | Literal[NotSimple.NOT_SIMPLE] | None:
    """The answer at ``buffer[start:]`` when it is of the simple form and complete.

    Returns:
        The answer; ``None`` when the bytes so far are the beginning of a simple answer
        (read more and call again); :data:`NOT_SIMPLE` when no more bytes could make them
        one (hand them to h11).

    Each call reads the head from *start* again, so a head that arrives in many small
    pieces costs more at each one (up to about 1 ms for a 64 KiB head). Handing the bytes
    to h11 is always correct: a caller may do so after a few calls on an unfinished head.
    """
    blank = buffer.find(b"\r\n\r\n", start, start + MAX_HEADER_BYTES)
    if blank < 0:
        return _unfinished(buffer, start, max_body)
    head_end = blank + 4
    # A platform answers a route the same way again and again (every stream chunk's 200):
    # a head already judged is not parsed again. Its max_body is part of the verdict.
    head = _judge(buffer, start, head_end, max_body)
    if head is NOT_SIMPLE:
        return NOT_SIMPLE
    status, headers, length = head
    headers = headers.copy()  # each answer's own, whatever its caller does with it
    end = head_end + length
    if len(buffer) < end:
        return None
    return SimpleAnswer(status, headers, bytes(buffer[head_end:end]), end)


def _judge(
    buffer: bytes | bytearray, start: int, head_end: int, max_body: int
) -> tuple[int, dict[str, str], int] | Literal[NotSimple.NOT_SIMPLE]:
    """:func:`_read_head`, remembered for short heads (at most 64 of 1 KiB)."""
    if head_end - start > 1024:
        return _read_head(buffer, start, head_end, max_body)
    key = (bytes(buffer[start:head_end]), max_body)
    head = _judged.get(key)
    if head is None:
        head = _read_head(buffer, start, head_end, max_body)
        if len(_judged) >= 64:
            _judged.clear()
        _judged[key] = head
    return head


_judged: dict[
    tuple[bytes, int], tuple[int, dict[str, str], int] | Literal[NotSimple.NOT_SIMPLE]
] = {}


def _read_head(
    buffer: bytes | bytearray, start: int, head_end: int, max_body: int
) -> tuple[int, dict[str, str], int] | Literal[NotSimple.NOT_SIMPLE]:
    """Status, headers and Content-Length of the head ``buffer[start:head_end]``."""
    match = _HEAD.fullmatch(buffer, start, head_end)
    if match is None:
        return NOT_SIMPLE
    status = int(match[1])
    if not 200 <= status < 600 or status == 204 or status == 304:
        return NOT_SIMPLE
    # The match vouches for every line: split and partition cut exactly where it did.
    lines = match[2].decode("latin-1").split("\r\n")
    lines.pop()  # after the last CRLF
    if len(lines) > MAX_HEADER_COUNT:
        return NOT_SIMPLE
    headers: dict[str, str] = {}
    length = -1
    for line in lines:
        name, _, value = line.partition(":")
        name = name.lower()
        value = value.strip(" \t")
        if name in _FRAMING:
            if name != "content-length" or length >= 0:
                return NOT_SIMPLE
            # isdigit alone would take "²" (latin-1 \xb2) and other digits outside ASCII.
            if not (value.isascii() and value.isdigit() and len(value) <= _MAX_LENGTH_DIGITS):
                return NOT_SIMPLE
            length = int(value)
            if length > max_body:
                return NOT_SIMPLE
        headers[name] = value
    if length < 0:
        return NOT_SIMPLE  # a body delimited by the close, which h11 frames
    return status, headers, length


def _unfinished(
    buffer: bytes | bytearray, start: int, max_body: int
) -> Literal[NotSimple.NOT_SIMPLE] | None:
    """Whether a head not finished yet can still become simple.

    The shortest and most permissive completion of the bytes so far is built and judged
    as a whole: if it is not simple, no completion is, and the verdict is exact, bounds
    (head size, field count, ``max_body``) included.
    """
    if len(buffer) - start >= MAX_HEADER_BYTES:
        return NOT_SIMPLE  # a whole head's worth and no blank line
    sofar = bytes(buffer[start:])
    completed = sofar + _completion(sofar)
    head_end = completed.find(b"\r\n\r\n") + 4
    if head_end > MAX_HEADER_BYTES:
        return NOT_SIMPLE
    if _read_head(completed, 0, head_end, max_body) is NOT_SIMPLE:
        return NOT_SIMPLE
    return None


def _completion(sofar: bytes) -> bytes:
    """The fewest bytes (and fields) that end the head *sofar* as a simple one, if any can.

    Where none can, whatever is returned fails the check of the completed head.
    """
    last = sofar.rfind(b"\r\n")
    tail = sofar[last + 2 :] if last >= 0 else sofar  # the line under way
    eol = b"\n" if tail.endswith(b"\r") else b"\r\n"
    if last < 0:  # still in the status line: the template's missing characters
        template = b"HTTP/1.1 200 " if len(tail) <= 9 else b"HTTP/1.1 000 "
        return template[len(tail) :] + eol + _LENGTH_FIELD + b"\r\n"
    length_field = b"" if _LENGTH_LINE.search(sofar, 0, last) else _LENGTH_FIELD
    if not tail:
        return length_field + b"\r\n"
    if tail == b"\r":
        return b"\n"  # the blank line: simple only if a Content-Length came
    name, colon, value = tail.partition(b":")
    name = name.lower()
    if not colon:
        if length_field and b"content-length".startswith(name):
            return b"content-length"[len(name) :] + b":0\r\n\r\n"
        # A framing name is not over yet: one more character makes it another name.
        extra = b"x" if name.decode("latin-1") in _FRAMING else b""
        return extra + b":\r\n" + length_field + b"\r\n"
    if name == b"content-length" and length_field:
        digit = b"" if value.strip(b" \t\r") else b"0"
        return digit + eol + b"\r\n"
    return eol + length_field + b"\r\n"
