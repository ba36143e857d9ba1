"""Building a request: the origin it goes to and its head, as bytes, checked once.

Every job has its own done and stream URL, so a URL is split by hand on the hot path and
only its origin (scheme, host, port) is parsed properly, once, then cached. What cannot go
in an HTTP head is refused or percent-encoded here, so a request on the wire is always one
well-formed message (docs/protocol.md §2.0).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import quote, urlsplit

from .._config import LIMITS
from .._exceptions import AnswerTooLarge, ConfigurationError, TransportError

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

# What may not appear in a request target as is: it is percent-encoded instead.
_UNSAFE_TARGET = re.compile(r"[^\x21-\x7e]")
_TARGET_SAFE = "/?#[]@!$&'()*+,;=:%~-._"
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_HEADER_VALUE_BAD = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def size_text(count: int) -> str:
    for unit, name in ((1 << 20, "MiB"), (1 << 10, "KiB")):
        if count >= unit and count % unit == 0:
            return f"{count // unit} {name}"
    return f"{count} bytes"


def check_size(
    size: int,
    max_body: int,
    method: str,
    url: str,
    status: int = 0,
    parts: Sequence[bytes | bytearray] = (),
) -> None:
    """Raises:
    AnswerTooLarge: when *size* bytes of answer body are over *max_body*; it carries the
        first bytes read (*parts*, at most ``Limits.answer_head``), so the ids at the head
        of a refused take answer are still failed (docs/security.md)."""
    if size > max_body:
        where = url.partition("?")[0]  # the query is nobody's business in a log line
        kept, room = [], LIMITS.answer_head  # not a copy of the whole answer: its head
        for part in parts:
            if room <= 0:
                break
            kept.append(part[:room])
            room -= len(part)
        raise AnswerTooLarge(
            f"{method} {where}: answer over {size_text(max_body)}, not read",
            status=status,
            size=size,
            head=b"".join(kept),
        )


def check_headers(headers: Mapping[str, str]) -> None:
    """Refuse fixed headers that cannot be sent: a value with a line break would forge
    headers, and httpx would put the value itself (the API key) in its error message.

    Raises:
        ConfigurationError: naming the header, never its value (it may be the API key).
    """
    for name, value in headers.items():
        if not _HEADER_NAME.fullmatch(name):
            raise ConfigurationError(f"{name!r} is not a valid HTTP header name")
        if _HEADER_VALUE_BAD.search(value) or not _latin1(value):
            raise ConfigurationError(
                f"the {name} header's value holds a control character or a character "
                "outside latin-1, and cannot be sent"
            )


def _latin1(text: str) -> bool:
    try:
        text.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return True


@dataclass(frozen=True)
class Origin:
    scheme: str
    host: str
    port: int

    @property
    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        host = f"[{self.host}]" if ":" in self.host else self.host  # an IPv6 literal
        return host if self.port == default else f"{host}:{self.port}"

    @property
    def where(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.where}"


class RequestHeads:
    """Request heads for one set of fixed headers: ``(origin, head bytes)`` per URL."""

    def __init__(self, headers: Mapping[str, str]) -> None:
        check_headers(headers)
        self._static = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        self._origins: dict[str, Origin] = {}
        # Take, stop, ping and a stream's chunk URLs repeat: each is built once. A job's
        # done URL is used once, so the cache is simply emptied when full.
        self._built: dict[tuple[str, str], tuple[Origin, bytes]] = {}

    def _origin(self, scheme_netloc: str, url: str) -> Origin:
        origin = self._origins.get(scheme_netloc)
        if origin is not None:
            return origin
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise TransportError(f"cannot request {url!r}")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError as exc:
            raise TransportError(f"cannot request {url!r}: {exc}") from None
        origin = Origin(parts.scheme, parts.hostname, port)
        if len(self._origins) < 64:
            self._origins[scheme_netloc] = origin
        return origin

    def head(self, method: str, url: str) -> tuple[Origin, bytes]:
        """The origin of *url* and the request head up to (not including) its
        ``Content-Length`` line.

        Raises:
            TransportError: when *url* cannot be requested (scheme, host, port, characters).
        """
        built = self._built.get((method, url))
        if built is None:
            built = self._build(method, url)
            if len(self._built) >= 256:
                self._built.clear()
            self._built[method, url] = built
        return built

    def _build(self, method: str, url: str) -> tuple[Origin, bytes]:
        scheme, sep, rest = url.partition("://")
        if not sep:
            raise TransportError(f"cannot request {url!r}")
        netloc, slash, target = rest.partition("/")
        for stop in "?#":
            if stop in netloc:  # http://host?query: no path at all
                netloc, _, tail = netloc.partition(stop)
                target, slash = stop + tail + slash + target, ""
        origin = self._origin(f"{scheme}://{netloc}", url)
        target = (slash + target).partition("#")[0]
        if not target.startswith("/"):
            target = "/" + target
        if _UNSAFE_TARGET.search(target):
            # A space, a control or a non-ASCII character (from a template: job ids come
            # encoded) would break the request line: sent percent-encoded as UTF-8.
            target = quote(target, safe=_TARGET_SAFE, errors="surrogatepass")
        head = f"{method} {target} HTTP/1.1\r\nHost: {origin.host_header}\r\n{self._static}"
        try:
            return origin, head.encode("latin-1")
        except UnicodeEncodeError as exc:
            raise TransportError(f"cannot send {url!r} in an HTTP head: {exc}") from None


def message(head: bytes, body: bytes) -> bytes:
    """One whole request: *head* (from :meth:`RequestHeads.head`) and *body*."""
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body
