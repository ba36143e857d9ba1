"""Fitting an error body within 64 KiB (docs/protocol.md §3.7, docs/design.md I6): every
text field redacted before any cut, clipped head and tail (logs keep their tail), lone
surrogates made U+FFFD. Only a body too large with every field at its own limit is fitted:
the bytes left after the fixed parts are shared between the large fields by water-filling,
each one over its share re-clipped from its source, so its "[N characters truncated]"
count stays true."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from ._capture import Redactor

MAX_FIELD_CHARS = 16 * 1024
"""Per-field clip, in characters (docs/protocol.md §3.7, the reference's ``MAX_CAPTURED_CHARS``)."""

MAX_ERROR_BODY_BYTES = 64 * 1024
"""The whole encoded job-done error body, in bytes (docs/design.md I6)."""

# Identity fields, type names and categories: never worth more than this many characters.
SMALL_FIELD_CHARS = 200
# Texts longer than a field's limit plus twice this are cut *before* redaction, with this
# much spare text on each side, so redacting a 5 MB log stays cheap. A secret straddling
# the first cut is at least this far from the final one, so it cannot survive in part.
_REDACT_MARGIN = 64 * 1024
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")

_Mode = Literal["both", "tail"]


def clip(text: str, limit: int = MAX_FIELD_CHARS) -> str:
    """Keep the first and last ``limit // 2`` characters of *text* (docs/protocol.md §3.7)."""
    if len(text) <= limit:
        return text
    half = max(limit, 0) // 2
    return text[:half] + _marker(len(text) - 2 * half) + text[len(text) - half :]


class Field:
    """One text field of an error body: its redacted source, and the limit it is rendered at.

    *mode* "tail" keeps only the end (logs). A large field is one the fit may shrink.
    """

    __slots__ = ("_head", "_length", "_tail", "_whole", "limit", "mode", "shrinkable")

    def __init__(
        self, text: str, redactor: Redactor, *, large: bool = True, mode: _Mode = "both"
    ) -> None:
        self.limit = limit = MAX_FIELD_CHARS if large else SMALL_FIELD_CHARS
        self.mode: _Mode = mode
        self.shrinkable = large
        self._whole = len(text) <= limit + 2 * _REDACT_MARGIN
        if self._whole:
            self._head = self._tail = _sanitize(redactor.redact(text))
            self._length = len(self._head)
        else:
            span = limit + _REDACT_MARGIN
            self._head = _sanitize(redactor.redact(text[:span]))
            self._tail = _sanitize(redactor.redact(text[-span:]))
            self._length = len(text)

    def render(self, limit: int | None = None) -> str:
        limit = self.limit if limit is None else limit
        if self._whole and self._length <= limit:
            return self._head
        limit = max(limit, 0)
        if self.mode == "tail":
            tail = self._tail[max(len(self._tail) - limit, 0) :] if limit else ""
            return f"...[{self._length - limit} characters truncated]...\n{tail}"
        half = limit // 2
        tail = self._tail[max(len(self._tail) - half, 0) :] if half else ""
        return self._head[:half] + _marker(self._length - 2 * half) + tail


def fit(
    build: Callable[[], dict[str, Any]],
    fields: Sequence[Field],
    *,
    dumps: Callable[[object], str],
    nested: bool,
    max_bytes: int = MAX_ERROR_BODY_BYTES,
) -> bytes:
    """``build()`` encoded by *dumps* (the payloads' one JSON policy), its large *fields*
    shrunk until it is at most *max_bytes*. *nested*: the fields sit in a JSON string inside
    the body (the handler shape), so they are escaped twice. Terminates: with every large
    field at limit 0 only markers remain."""

    def encode() -> bytes:
        return dumps(build()).encode()  # the fields hold no lone surrogate: UTF-8 always

    def cost(text: str) -> int:
        once = dumps(text)
        # Escaped again, a JSON string adds a backslash before each '"' and '\\' only:
        # control characters are already escaped.
        return len(once.encode()) + (once.count('"') + once.count("\\") if nested else 0)

    data = encode()
    if len(data) <= max_bytes:
        return data
    large = [f for f in fields if f.shrinkable]
    limits = [f.limit for f in large]
    for f in large:
        f.limit = 0
    budget = max_bytes - len(encode())
    for f, limit in zip(large, limits, strict=True):
        f.limit = limit
    for _ in range(8):
        costs = [cost(f.render()) for f in large]
        for f, used, share in zip(large, costs, _fair_shares(costs, budget), strict=True):
            if used > share:
                f.limit = _longest_limit_within(f, share, cost)
        data = encode()
        if len(data) <= max_bytes:
            return data
        budget -= len(data) - max_bytes + 64
    for f in large:
        f.limit = 0
    return encode()


def _marker(truncated: int) -> str:
    return f"\n...[{truncated} characters truncated]...\n"


def _sanitize(text: str) -> str:
    if text.isascii():
        return text
    return _LONE_SURROGATE.sub("\ufffd", text)


def _fair_shares(costs: list[int], budget: int) -> list[int]:
    """Water-filling: fields under an equal share keep what they use; the rest split what
    is left equally."""
    shares = [0] * len(costs)
    remaining = max(budget, 0)
    order = sorted(range(len(costs)), key=costs.__getitem__)
    for rank, i in enumerate(order):
        fair = remaining // (len(costs) - rank)
        shares[i] = min(costs[i], fair)
        remaining -= shares[i]
    return shares


def _longest_limit_within(f: Field, share: int, cost: Callable[[str], int]) -> int:
    """The largest limit at which the rendered field costs at most *share* bytes."""
    lo, hi = 0, f.limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if cost(f.render(mid)) <= share:
            lo = mid
        else:
            hi = mid - 1
    return lo
