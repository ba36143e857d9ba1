"""Parsing the platform's take and stop responses (docs/protocol.md §2.1, §2.2, §2.5). No I/O.

Kept pure so the rules for odd answers are tested one by one. Where the reference drops a
job silently (a single job missing ``input``; a batch item that crashes dispatch), these
rules keep it: an item with a usable ``id`` but a bad shape is returned as *malformed*, so the
worker can report a clear error on that job instead of losing it (docs/protocol.md §8 item 5).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

MAX_JOB_ID_LENGTH = 512


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
    except (ValueError, RecursionError) as exc:  # RecursionError: absurdly nested JSON
        return TakeResponse(garbled=f"body is not JSON: {type(exc).__name__}")
    out = TakeResponse()
    if isinstance(data, dict):
        _classify_item(data, out)
    elif isinstance(data, list):
        for item in data:
            _classify_item(item, out)
    elif data is not None:
        out.garbled = f"unexpected JSON {type(data).__name__}"
    return out


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
