"""What a request may hold, checked once per origin or client, off the hot path, so a
request on the wire is always one well-formed message; and the client's errors.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, NamedTuple
from urllib.parse import quote, urlsplit

from .._config import LIMITS
from .._exceptions import AnswerTooLarge, ConfigurationError, TransportError

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

# What may not appear in a request target as is: it is percent-encoded instead.
UNSAFE_TARGET = re.compile(r"[^\x21-\x7e]")
_TARGET_SAFE = "/?#[]@!$&'()*+,;=:%~-._"
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# A control character but HTAB, or one outside latin-1.
_HEADER_VALUE_BAD = re.compile(r"[^\t\x20-\x7e\x80-\xff]")


class StaleConnection(Exception):
    """A kept-alive connection the server had already closed; retry on a fresh one."""


class PipeliningUnsupported(TransportError):
    """The platform cannot take pipelined requests on this client: it answers in HTTP/1.0
    or delimits answers by closing, or it is reached through a proxy. Raised before the
    requests it leaves unanswered are sent, so none of them can be processed unawares."""


class Origin(NamedTuple):
    """Where a request goes, parsed once by :func:`parse_origin`: a tuple, hashed and read
    at C speed by the pool."""

    scheme: str
    host: str
    port: int
    where: str  # ``host:port``, for connecting and for error messages
    host_header: str  # the ``Host`` value: the port only when not the scheme's default


def parse_origin(url: str) -> Origin:
    """The origin *url* goes to.

    Raises:
        TransportError: when *url* cannot be requested (scheme, host, port).
    """
    parts = urlsplit(url)
    scheme, host = parts.scheme, parts.hostname
    if scheme not in ("http", "https") or not host:
        raise TransportError(f"cannot request {url!r}")
    default = 443 if scheme == "https" else 80
    try:
        port = parts.port or default
    except ValueError as exc:
        raise TransportError(f"cannot request {url!r}: {exc}") from None
    bracketed = f"[{host}]" if ":" in host else host  # an IPv6 literal
    host_header = bracketed if port == default else f"{bracketed}:{port}"
    return Origin(scheme, host, port, f"{host}:{port}", host_header)


def safe_target(target: str) -> str:
    """*target* with what would break a request line (a space, a control or a non-ASCII
    character, from a template: job ids come encoded) percent-encoded as UTF-8."""
    return quote(target, safe=_TARGET_SAFE, errors="surrogatepass")


def check_headers(headers: Mapping[str, str]) -> None:
    """Refuse fixed headers that cannot be sent (docs/protocol.md §2.0, "Request headers"),
    before httpx could quote the value (the API key) in its error.

    Raises:
        ConfigurationError: naming the header, never its value (it may be the API key).
    """
    for name, value in headers.items():
        if not _HEADER_NAME.fullmatch(name):
            raise ConfigurationError(f"{name!r} is not a valid HTTP header name")
        if _HEADER_VALUE_BAD.search(value):
            raise ConfigurationError(
                f"the {name} header's value holds a control character or a character "
                "outside latin-1, and cannot be sent"
            )


def size_text(count: int) -> str:
    for unit, name in ((1 << 20, "MiB"), (1 << 10, "KiB")):
        if count >= unit and count % unit == 0:
            return f"{count // unit} {name}"
    return f"{count} bytes"


def too_large(
    size: int,
    max_body: int,
    request: str,
    status: int,
    parts: Sequence[bytes | bytearray] = (),
) -> AnswerTooLarge:
    """The error of an answer of *size* bytes of body (declared, or read so far) over
    *max_body*, to *request* (``"METHOD URL"``), carrying its first bytes (*parts*, at most
    ``Limits.answer_head``): the ids at the head of a refused take answer are still failed."""
    where = request.partition("?")[0]  # the query is nobody's business in a log line
    kept, room = [], LIMITS.answer_head  # not a copy of the whole answer: its head
    for part in parts:
        if room <= 0:
            break
        kept.append(part[:room])
        room -= len(part)
    return AnswerTooLarge(
        f"{where}: answer over {size_text(max_body)}, not read",
        status=status,
        size=size,
        head=b"".join(kept),
    )


def head_too_large(origin: Origin, limit: int) -> TransportError:
    return TransportError(
        f"answer from {origin.where}: response head too large (over {size_text(limit)})"
    )
