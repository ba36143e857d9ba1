"""The platform's answers off a job's path, no I/O: the stop answer, ``Retry-After``, a
report's answer too large to read, and a take answer that does not decode as a whole,
split into items here with a scan that does not recurse, so one deeply nested job cannot
cost the others. What it finds is text; which items are jobs, and which ids usable, is
the client's rule (docs/protocol.md §2.1).
"""

from __future__ import annotations

import email.utils
import json
import math
import re
import time
from typing import TYPE_CHECKING, NamedTuple

from ._connection import HttpResponse

if TYPE_CHECKING:
    from .._exceptions import AnswerTooLarge


class Unreadable(NamedTuple):
    """An item of a take answer that does not decode: the id strings it names, and why."""

    ids: list[str]
    why: str


class Items(NamedTuple):
    """What :func:`split_items` found: the items in order (decoded, or :class:`Unreadable`),
    and where the answer's structure broke, the id strings named from there on (None when
    it did not break)."""

    items: list[object]
    broken: list[str] | None


def split_items(body: bytes) -> Items:
    """The items of a take answer that did not decode as a whole, each decoded where it
    starts (``raw_decode``); only one that does not decode is walked by the token scan."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return Items([], id_strings(body.decode("utf-8", errors="replace")))
    items: list[object] = []
    pos = _skip_space(text, 0)
    single = text.startswith("{", pos)
    if not single:
        if not text.startswith("[", pos):
            return Items([], id_strings(text))
        pos = _skip_space(text, pos + 1)
    while True:
        item_start = pos
        try:
            item, pos = _DECODER.raw_decode(text, pos)
        except (ValueError, RecursionError) as exc:
            end = _skip_value(text, pos)
            if end is None:
                return Items(items, _rest_ids(text, item_start))
            items.append(Unreadable(id_strings(text[pos:end], item_depth=1), _why_not(exc)))
            pos = end
        else:
            items.append(item)
        pos = _skip_space(text, pos)
        if not single and text.startswith(",", pos):
            pos = _skip_space(text, pos + 1)
            continue
        if not single and text.startswith("]", pos):
            pos = _skip_space(text, pos + 1)
        if pos != len(text):
            return Items(items, _rest_ids(text, item_start))
        return Items(items, None)


def _rest_ids(text: str, start: int) -> list[str]:
    return id_strings(text[start:], item_depth=1 if start else None)


def _why_not(exc: Exception) -> str:
    if isinstance(exc, RecursionError):
        return "its JSON is nested too deep to decode"
    text = repr(str(exc))
    return f"it is not JSON ({text if len(text) <= 120 else text[:120] + '...'})"


_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"[ \t\n\r]*")
# A string token (escapes kept whole), a quote opening a string that never ends, or one
# structural character. The unrolled string pattern is linear and does not recurse.
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|"|[\[\]{},:]')
_OPEN = {"[": "]", "{": "}"}


def _skip_space(text: str, pos: int) -> int:
    match = _SPACE.match(text, pos)
    return pos if match is None else match.end()


def _skip_value(text: str, pos: int) -> int | None:
    """Where the value starting at *pos* ends, found without recursion: after its closing
    bracket, or before the ``,`` or ``]`` that follows a bare word; None when the answer
    ends first or its brackets do not match."""
    stack: list[str] = []
    for match in _TOKEN.finditer(text, pos):
        token = match.group()
        if token in _OPEN:
            stack.append(_OPEN[token])
        elif token in ("]", "}"):
            if not stack:
                return match.start()  # the end of the enclosing array
            if stack.pop() != token:
                return None
            if not stack:
                return match.end()
        elif token == "," and not stack:
            return match.start()
        elif token == '"':
            return None  # a string that never ends
    return None


def id_strings(text: str, *, item_depth: int | None = None) -> list[str]:
    """The string value of each ``"id"`` key of the objects at *item_depth* in *text*
    (default: the top-level object, or the objects of the top-level array), each once, in
    order, read without decoding it: whether each is a usable id is the caller's rule.
    Works on a truncated answer too; never raises."""
    stack: list[str] = []
    ids: dict[str, None] = {}
    depth = item_depth
    state = 0  # 1: an "id" key was read at the item depth, 2: its colon too
    for match in _TOKEN.finditer(text):
        token = match.group()
        if depth is None and token in _OPEN:
            depth = 2 if token == "[" else 1
        if token in _OPEN:
            stack.append(token)
        elif token in ("]", "}"):
            if stack:
                stack.pop()
        at_item = len(stack) == depth and stack[-1] == "{"
        if state == 2 and token.startswith('"') and len(token) > 1 and at_item:
            job_id = _decode_string(token)
            if job_id is not None:
                ids[job_id] = None
            state = 0
        elif state == 1 and token == ":":
            state = 2
        elif at_item and token == '"id"':
            state = 1
        else:
            state = 0
    return list(ids)


def _decode_string(token: str) -> str | None:
    try:
        value = json.loads(token)
    except ValueError:
        return None
    return value if isinstance(value, str) else None


def parse_stop(content_type: str, body: bytes) -> tuple[list[str], str | None]:
    """The job ids of a stop answer, and a warning when part of it was unusable."""
    if not body:
        return [], None
    if "json" not in content_type.lower():
        return [], f"content type {content_type!r} is not JSON"
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as exc:  # RecursionError: absurdly nested JSON
        return [], f"body is not JSON: {type(exc).__name__}"
    if not isinstance(data, dict) or not isinstance(data.get("jobsToStop"), list):
        return [], "no 'jobsToStop' list in the answer"
    items = data["jobsToStop"]
    ids = [item for item in items if isinstance(item, str)]
    warning = None if len(ids) == len(items) else "non-string entries in 'jobsToStop' dropped"
    return ids, warning


def answer_too_large(exc: AnswerTooLarge) -> HttpResponse:
    """A report's answer whose body was over the bound, as its status and first bytes
    (docs/protocol.md §2.0, "Bounds"); never its headers: its ``Retry-After`` is not
    waited for."""
    return HttpResponse(exc.status, {}, exc.head)


def asked_pause(response: HttpResponse) -> float | None:
    """The ``Retry-After`` of a report's 429 or 503 (docs/protocol.md §2.3); None for any
    other answer."""
    return retry_after(response) if response.status in (429, 503) else None


def retry_after(response: HttpResponse) -> float | None:
    """The wait an answer's ``Retry-After`` asks for, in seconds, as asked (its floor, cap
    and jitter are :func:`~trio_worker._pacing.rate_limit_wait`'s): delta-seconds (a
    fraction too) or an HTTP date (one past asks for none). None when absent or invalid:
    negative, not finite, garbage, a date without a zone."""
    raw = response.headers.get("retry-after")
    if raw is None:
        return None
    raw = raw.strip()
    try:
        seconds = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            return None
        seconds = max(0.0, when.timestamp() - time.time())
    if not math.isfinite(seconds) or seconds < 0:
        return None
    return seconds
