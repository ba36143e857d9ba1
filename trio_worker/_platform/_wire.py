"""Parsing the platform's take and stop responses (docs/protocol.md §2.1, §2.2, §2.5).

No I/O but one log line, for jobs lost in an answer too large to read.

Kept pure so the rules for odd answers are tested one by one. Where the reference drops a
job silently (a single job missing ``input``; a batch item that crashes dispatch), these
rules keep it: an item with a usable ``id`` but a bad shape is returned as *malformed*, so the
worker can report a clear error on that job instead of losing it (docs/protocol.md §8 item 5).

One job's input never costs another job (docs/security.md). A take answer is decoded whole
when it can be (the fast path); when it cannot, each item is decoded on its own where it
starts, and one that does not decode is skipped by a scan that does not recurse
(:func:`_skip_value`): a job nested 5,000 deep once made the whole batch raise
``RecursionError``, and every job in it was dropped. An item that cannot be decoded is
malformed when its id can be read (``MalformedJob`` with the reason); an answer whose
structure is broken has its ids read by the same scan (:func:`recover_ids`), and each is
failed.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any

from .._config import LIMITS

MAX_JOB_ID_LENGTH = LIMITS.job_id

log = logging.getLogger("trio_worker")


@dataclass
class TakeResponse:
    """What one take answer delivered."""

    jobs: list[dict[str, Any]] = field(default_factory=list)
    # (job id, reason): owed an error report, the handler must not run.
    malformed: list[tuple[str, str]] = field(default_factory=list)
    # Items that carry no usable id: nothing can be reported, only logged.
    unaddressable: list[str] = field(default_factory=list)
    # The answer was not understood at all (not JSON, wrong content type).
    garbled: str | None = None

    @property
    def empty(self) -> bool:
        return not (self.jobs or self.malformed)


def id_problem(value: object) -> str | None:
    """Why *value* cannot address a job on the platform, or None when it can.

    A job id goes into the job-done and job-stream URLs percent-encoded as one path segment
    (``PlatformConfig.done_url``) and into the ping's ``job_id`` list, so it must be text
    that survives the trip: a string, not empty, at most ``MAX_JOB_ID_LENGTH`` characters
    (at most ~6 KiB once encoded, within any server's request line), and printable, which
    also rules out control characters (a log line or a header could be forged with them)
    and lone surrogates (no UTF-8 form, so no URL) (docs/protocol.md §2.1).
    """
    if not isinstance(value, str):
        return f"the id is not a string but {type(value).__name__}"
    if not value:
        return "the id is empty"
    if len(value) > MAX_JOB_ID_LENGTH:
        return f"the id has {len(value)} characters, over {MAX_JOB_ID_LENGTH}"
    if not value.isprintable():
        return "the id holds a control or unprintable character"
    return None


def _classify_item(item: object, out: TakeResponse) -> None:
    if not isinstance(item, dict):
        out.unaddressable.append(f"job is not an object: {_preview(item)}")
        return
    job_id = item.get("id")
    problem = "the job has no 'id'" if "id" not in item else id_problem(job_id)
    if problem is not None:
        out.unaddressable.append(f"{problem}: {_preview(item)}")
        return
    assert isinstance(job_id, str)
    if "input" not in item:
        out.malformed.append((job_id, "the job has no 'input' field"))
        return
    out.jobs.append(item)


def _preview(value: object, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def parse_take(status: int, content_type: str, body: bytes) -> TakeResponse:
    """Interpret a 2xx take answer; non-2xx statuses are handled by the caller.

    A JSON object is one job, a JSON array is a batch (also accepted on the single route),
    ``null``, ``[]`` and an empty body are "no job".
    """
    if status == 204 or not body:
        return TakeResponse()
    if "json" not in content_type.lower():
        return TakeResponse(garbled=f"content type {content_type!r} is not JSON")
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return _parse_one_by_one(body)
    out = TakeResponse()
    if isinstance(data, dict):
        _classify_item(data, out)
    elif isinstance(data, list):
        for item in data:
            _classify_item(item, out)
    elif data is not None:
        out.garbled = f"unexpected JSON {type(data).__name__}"
    return out


def parse_oversized_take(size: int, limit: int, head: bytes) -> TakeResponse:
    """A 2xx take answer of *size* bytes refused for being over *limit*, of which *head*
    (its first bytes) was read: the jobs named there are failed as too large, and the
    loss of any other is logged (ERROR) with what is known."""
    ids = recover_ids(head.decode("utf-8", errors="replace"))
    reason = f"input too large: its take answer has {size} bytes, over the {limit}-byte bound"
    if ids:
        log.error(
            "job-take answer of %d bytes refused (over %d): %d job(s) named in its first "
            "%d bytes are failed as too large; any job past them is lost",
            size,
            limit,
            len(ids),
            len(head),
        )
    else:
        log.error(
            "JOBS LOST: a job-take answer of %d bytes was refused (over %d) and names no "
            "job id in its first %d bytes: whatever jobs it carried are lost",
            size,
            limit,
            len(head),
        )
    return TakeResponse(malformed=[(job_id, reason) for job_id in ids])


def _why_not(exc: Exception) -> str:
    if isinstance(exc, RecursionError):
        return "its JSON is nested too deep to decode"
    return f"it is not JSON ({_preview(str(exc), 120)})"


def _parse_one_by_one(body: bytes) -> TakeResponse:
    """The answer as a whole did not decode: each item on its own, or every id failed.

    Each item is decoded where it starts (``raw_decode``, at C speed); only an item that
    does not decode is walked by the token scan, to find its end and its id.
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return _failed_whole(body.decode("utf-8", errors="replace"), [], 0)
    out = TakeResponse()
    lost: list[str] = []
    pos = _skip_space(text, 0)
    single = text.startswith("{", pos)
    if not single:
        if not text.startswith("[", pos):
            return _failed_whole(text, [], 0)
        pos = _skip_space(text, pos + 1)
    while True:
        item_start = pos
        try:
            item, pos = _DECODER.raw_decode(text, pos)
        except (ValueError, RecursionError) as exc:
            end = _skip_value(text, pos)
            if end is None:
                return _failed_whole(text, _ids_of(out), item_start)
            ids = recover_ids(text[pos:end], item_depth=1)
            if ids:
                out.malformed.append((ids[0], f"the job cannot be decoded: {_why_not(exc)}"))
            else:
                lost.append(_why_not(exc))
            pos = end
        else:
            _classify_item(item, out)
        pos = _skip_space(text, pos)
        if not single and text.startswith(",", pos):
            pos = _skip_space(text, pos + 1)
            continue
        if not single and text.startswith("]", pos):
            pos = _skip_space(text, pos + 1)
        if pos != len(text):
            return _failed_whole(text, _ids_of(out), item_start)
        break
    if lost:
        out.garbled = f"body is not JSON: {len(lost)} item(s) without a readable id ({lost[0]})"
    return out


def _failed_whole(text: str, decoded: list[str], rest: int) -> TakeResponse:
    """The ids of the items *decoded* before the structure broke, and those read by the
    scan from *rest* on: each is failed."""
    ids = list(dict.fromkeys([*decoded, *recover_ids(text[rest:], item_depth=1 if rest else None)]))
    out = TakeResponse(garbled=f"body is not JSON; {len(ids)} job id(s) recovered and failed")
    out.malformed = [(job_id, "the take answer carrying the job is not JSON") for job_id in ids]
    return out


def _ids_of(out: TakeResponse) -> list[str]:
    return [job["id"] for job in out.jobs] + [job_id for job_id, _ in out.malformed]


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


def recover_ids(text: str, *, item_depth: int | None = None) -> list[str]:
    """The usable job ids in *text*, read without decoding it: the string value of each
    ``"id"`` key of the objects at *item_depth* (default: the top-level object, or the
    objects of the top-level array). Works on a truncated answer too; never raises."""
    stack: list[str] = []
    ids: list[str] = []
    seen: set[str] = set()
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
            if job_id is not None and id_problem(job_id) is None and job_id not in seen:
                seen.add(job_id)
                ids.append(job_id)
            state = 0
        elif state == 1 and token == ":":
            state = 2
        elif at_item and token == '"id"':
            state = 1
        else:
            state = 0
    return ids


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
