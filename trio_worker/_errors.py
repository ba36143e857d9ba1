"""Error payloads for job-done: what a failed job tells the person who sent it.

Why this module is careful: an error body is built from text the SDK does not control (an
exception message, a traceback, the captured output) and posted to a platform that rejects
oversized bodies. The reference SDK posted these unbounded (docs/protocol.md §8 #32), so one
``print`` of a tensor could make a failed job's report itself fail, and the caller learned
nothing. Here every builder guarantees, whatever it is given (docs/design.md I6):

- every text field is redacted (docs/design.md §8) *before* it is cut, so a cut can never leave
  half a secret behind;
- every field is clipped, keeping head and tail (logs keep their tail: they already are the
  tail of the output, and the end is where a crash is explained);
- lone surrogates (``"\\ud800"``, from ``surrogateescape``-decoded bytes) become U+FFFD, so
  the body always encodes as UTF-8;
- the encoded body is at most ``MAX_ERROR_BODY_BYTES``, less a small reserve so the caller
  can still add ``"stopPod": true``.

Theory of operation
-------------------
Bodies are first built with the default per-field limits (``MAX_FIELD_CHARS``). That is
the common case and costs one ``json.dumps``. Only when the encoded body is too large, which
takes megabytes of ASCII or kilobytes of quotes, control characters or non-ASCII text (the
inner JSON is escaped twice, docs/protocol.md §3.7), the byte budget left after the fixed fields is
shared fairly between the large fields (small ones keep what they use, the rest split what
is left) and each over-budget field is re-clipped to the longest head+tail that fits its
share. A field is re-clipped from its original text, so the "[N characters truncated]"
count stays true.

The handler body's inner JSON uses ``ensure_ascii=False`` (the reference used ``True``):
both are valid JSON, but raw UTF-8 is up to 3 times smaller after the double escape and
stays readable in the console.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ._tracebacks import error_type_name, format_traceback, one_line, safe_str

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._capture import Redactor

__all__ = [
    "MAX_ERROR_BODY_BYTES",
    "MAX_FIELD_CHARS",
    "WorkerIdentity",
    "clip",
    "crashed_body",
    "encode_body",
    "error_type_name",
    "format_traceback",
    "generator_error_body",
    "handler_error_body",
    "init_failed_body",
    "json_error_body",
    "one_line",
    "refused_result_body",
    "safe_str",
    "shutdown_error_body",
]

MAX_FIELD_CHARS = 16 * 1024
"""Per-field clip, in characters (docs/protocol.md §3.7, the reference's ``MAX_CAPTURED_CHARS``)."""

MAX_ERROR_BODY_BYTES = 64 * 1024
"""The whole encoded job-done error body, in bytes (docs/design.md I6)."""

# Kept free below MAX_ERROR_BODY_BYTES, so that adding ``"stopPod": true`` (16 bytes) to a
# built body keeps it within the bound.
_RESERVED_BYTES = 64
# Identity fields, type names and categories: never worth more than this many characters.
_SMALL_FIELD_CHARS = 200
# Texts longer than a field's limit plus twice this are cut *before* redaction, with this
# much spare text on each side, so redacting a 5 MB log stays cheap. A secret straddling
# the first cut is at least this far from the final one, so it cannot survive in part.
_REDACT_MARGIN = 64 * 1024
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")

_Mode = Literal["both", "tail"]


@dataclass(frozen=True)
class WorkerIdentity:
    """Who reports: written into every error body so a bad host can be found."""

    worker_id: str
    hostname: str
    sdk_version: str


def clip(text: str, limit: int = MAX_FIELD_CHARS) -> str:
    """Keep the first and last ``limit // 2`` characters of *text* (docs/protocol.md §3.7).

    >>> clip("abcdefghij", 4)
    'ab\\n...[6 characters truncated]...\\nij'
    """
    if len(text) <= limit:
        return text
    half = max(limit, 0) // 2
    return text[:half] + _marker(len(text) - 2 * half) + text[len(text) - half :]


def encode_body(body: dict[str, Any]) -> bytes:
    """The job-done request body: UTF-8 JSON, as the platform expects (docs/protocol.md §2.3)."""
    text = json.dumps(body, ensure_ascii=False)
    try:
        return text.encode()
    except UnicodeEncodeError:
        # Lone surrogates from a body this module did not sanitise: escaped, still JSON.
        return json.dumps(body).encode()


def handler_error_body(
    exc: BaseException,
    *,
    logs: str,
    category: str,
    identity: WorkerIdentity,
    redactor: Redactor,
    traceback: str | None = None,
) -> dict[str, Any]:
    """``{"error": "<JSON string>"}`` for a handler that raised (*traceback*: the
    exception's, when the caller formatted it already).

    See docs/design.md §5 and docs/protocol.md §3.3.
    """
    return json_error_body(
        error_type=error_type_name(exc),
        message=safe_str(exc),
        traceback=format_traceback(exc) if traceback is None else traceback,
        category=category,
        logs=logs,
        identity=identity,
        redactor=redactor,
    )


def json_error_body(
    *,
    error_type: str,
    message: str,
    traceback: str,
    category: str,
    logs: str,
    identity: WorkerIdentity,
    redactor: Redactor,
) -> dict[str, Any]:
    """The handler-error shape for any failure of a job: the building block of
    ``handler_error_body``, ``shutdown_error_body`` and the results module's output errors.
    """
    fields: list[tuple[str, _Field | object]] = [
        ("error_type", _Field.small(error_type, redactor)),
        ("error_message", _Field.large(message, redactor)),
        ("error_traceback", _Field.large(traceback, redactor)),
        ("error_category", _Field.small(category, redactor)),
        ("hostname", _Field.small(identity.hostname, redactor)),
        ("worker_id", _Field.small(identity.worker_id, redactor)),
        ("sdk_version", _Field.small(identity.sdk_version, redactor)),
        ("runpod_version", _Field.small(identity.sdk_version, redactor)),
        ("logs", _Field.large(logs, redactor, mode="tail")),
    ]
    return _fit_json_body(fields)


def generator_error_body(exc: BaseException, *, logs: str, redactor: Redactor) -> dict[str, Any]:
    """``{"error": "handler: <msg> \\ntraceback: <tb>\\nlogs:\\n<logs>"}``: the reference's
    plain-string shape for a generator that raised mid-stream (docs/protocol.md §3.4), clipped as a
    whole."""
    message = _Field.large(safe_str(exc), redactor)
    trace = _Field.large(format_traceback(exc), redactor)
    tail = _Field.large(logs, redactor, mode="tail")

    def build() -> dict[str, Any]:
        text = f"handler: {message.render()} \ntraceback: {trace.render()}\nlogs:\n{tail.render()}"
        # The assembled string is clipped last (docs/design.md I6); the parts' limits already keep
        # it within the byte bound, so this only ever bounds its length in characters.
        return {"error": clip(text, 4 * MAX_FIELD_CHARS)}

    return _fit(build, [message, trace, tail], _plain_cost)


def init_failed_body(
    *,
    error_type: str,
    message: str,
    traceback: str,
    category: str,
    logs: str,
    elapsed_s: float,
    identity: WorkerIdentity,
    redactor: Redactor,
    init_timeout: float | None = None,
) -> dict[str, Any]:
    """``{"error": "<JSON string>"}`` with ``"event": "init_failed"`` for every job held when
    the initializer failed (docs/design.md §6, docs/protocol.md §3.6). ``logs`` is omitted
    when empty, as in the reference; ``hostname`` is added, because a crash-looping bad host
    is exactly what this report has to point at."""
    fields: list[tuple[str, _Field | object]] = [
        ("event", "init_failed"),
        ("error_type", _Field.small(error_type, redactor)),
        ("error_message", _Field.large(message, redactor)),
        ("error_traceback", _Field.large(traceback, redactor)),
        ("error_category", _Field.small(category, redactor)),
    ]
    if logs:
        fields.append(("logs", _Field.large(logs, redactor, mode="tail")))
    fields += [
        ("hostname", _Field.small(identity.hostname, redactor)),
        ("worker_id", _Field.small(identity.worker_id, redactor)),
        ("sdk_version", _Field.small(identity.sdk_version, redactor)),
        ("runpod_version", _Field.small(identity.sdk_version, redactor)),
        ("elapsed_s", _finite(elapsed_s, digits=3)),
        ("init_timeout", None if init_timeout is None else _finite(init_timeout, digits=6)),
    ]
    return _fit_json_body(fields)


def shutdown_error_body(
    *, job_id: str, grace_s: float, identity: WorkerIdentity, redactor: Redactor
) -> dict[str, Any]:
    """The report for a job still running when ``shutdown_grace`` ran out (docs/design.md §9)."""
    message = (
        f"The worker shut down while job {job_id} was running: it did not finish within the "
        f"shutdown grace of {grace_s:g} s and was cancelled. The worker was stopped by a "
        "signal (SIGTERM/SIGINT: scale-down, redeploy) or by refresh_worker."
    )
    return json_error_body(
        error_type="WorkerShutdown",
        message=message,
        traceback="",
        category="worker_shutdown",
        logs="",
        identity=identity,
        redactor=redactor,
    )


def refused_result_body(
    *,
    job_id: str,
    status: int,
    reason: str,
    size: int,
    identity: WorkerIdentity,
    redactor: Redactor,
) -> dict[str, Any]:
    """The small report that replaces a result the platform refused for good (400, 413),
    so the caller still learns the outcome (docs/design.md §5)."""
    message = (
        f"The platform refused the result of job {job_id} with HTTP {status} "
        f"({reason}): the report was {size} bytes. The result is lost; "
        "for 413, return a smaller result (store large outputs elsewhere and return a "
        "reference)."
    )
    return json_error_body(
        error_type="ResultRefused",
        message=message,
        traceback="",
        category="unknown",
        logs="",
        identity=identity,
        redactor=redactor,
    )


def crashed_body(
    *,
    job_id: str,
    how: str,
    during_init: bool,
    category: str,
    logs: str,
    identity: WorkerIdentity,
    redactor: Redactor,
) -> dict[str, Any]:
    """The report the crash watchdog sends for a job a dead worker held (docs/design.md
    §13); *how* says how the process ended ("killed by SIGSEGV ...")."""
    where = "while its initializer was running" if during_init else "while holding this job"
    message = (
        f"The worker process {how} {where} (job {job_id}), before it "
        "could report. No code in that process could run any more: the crash watchdog, its "
        "parent process, reports it. The last output of the worker is in logs."
    )
    return json_error_body(
        error_type="WorkerCrashed",
        message=message,
        traceback="",
        category=category,
        logs=logs,
        identity=identity,
        redactor=redactor,
    )


# --- internals -----------------------------------------------------------------------------


def _marker(truncated: int) -> str:
    return f"\n...[{truncated} characters truncated]...\n"


def _sanitize(text: str) -> str:
    if text.isascii():
        return text
    return _LONE_SURROGATE.sub("\ufffd", text)


def _finite(value: float, *, digits: int) -> float | None:
    """A number the platform's JSON accepts: NaN and infinities become null."""
    return round(value, digits) if math.isfinite(value) else None


class _Field:
    """One text field: its redacted source and the limit it is currently rendered at."""

    __slots__ = ("_head", "_length", "_tail", "_whole", "limit", "mode", "shrinkable")

    def __init__(self, text: str, redactor: Redactor, *, limit: int, mode: _Mode) -> None:
        self.limit = limit
        self.mode: _Mode = mode
        self.shrinkable = limit > _SMALL_FIELD_CHARS
        self._whole = len(text) <= limit + 2 * _REDACT_MARGIN
        if self._whole:
            clean = _sanitize(redactor.redact(text))
            self._head = self._tail = clean
            self._length = len(clean)
        else:
            span = limit + _REDACT_MARGIN
            self._head = _sanitize(redactor.redact(text[:span]))
            self._tail = _sanitize(redactor.redact(text[-span:]))
            self._length = len(text)

    @classmethod
    def large(cls, text: str, redactor: Redactor, *, mode: _Mode = "both") -> _Field:
        return cls(text, redactor, limit=MAX_FIELD_CHARS, mode=mode)

    @classmethod
    def small(cls, text: str, redactor: Redactor) -> _Field:
        return cls(text, redactor, limit=_SMALL_FIELD_CHARS, mode="both")

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


def _fit_json_body(fields: list[tuple[str, _Field | object]]) -> dict[str, Any]:
    def build() -> dict[str, Any]:
        inner = {k: v.render() if isinstance(v, _Field) else v for k, v in fields}
        return {"error": json.dumps(inner, ensure_ascii=False)}

    return _fit(build, [v for _, v in fields if isinstance(v, _Field)], _double_escaped_cost)


def _double_escaped_cost(text: str) -> int:
    """Bytes *text* takes inside a JSON string that is itself a JSON string value."""
    inner = json.dumps(text, ensure_ascii=False)
    # The outer dumps escapes only '"' and '\\' here: control characters are already
    # escaped by the inner dumps.
    return len(inner.encode()) + inner.count('"') + inner.count("\\")


def _plain_cost(text: str) -> int:
    return len(json.dumps(text, ensure_ascii=False).encode())


def _fit(
    build: Callable[[], dict[str, Any]],
    fields: list[_Field],
    cost: Callable[[str], int],
    max_bytes: int = MAX_ERROR_BODY_BYTES - _RESERVED_BYTES,
) -> dict[str, Any]:
    """Shrink the large fields until ``build()`` encodes within *max_bytes* (see the module
    docstring). Terminates: with every large field at limit 0 only markers remain."""
    body = build()
    size = len(encode_body(body))
    if size <= max_bytes:
        return body
    large = [f for f in fields if f.shrinkable]
    limits = [f.limit for f in large]
    for f in large:
        f.limit = 0
    budget = max_bytes - len(encode_body(build()))
    for f, limit in zip(large, limits, strict=True):
        f.limit = limit
    for _ in range(8):
        costs = [cost(f.render()) for f in large]
        for f, used, share in zip(large, costs, _fair_shares(costs, budget), strict=True):
            if used > share:
                f.limit = _longest_limit_within(f, share, cost)
        body = build()
        size = len(encode_body(body))
        if size <= max_bytes:
            return body
        budget -= size - max_bytes + 64
    for f in large:
        f.limit = 0
    return build()


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


def _longest_limit_within(f: _Field, share: int, cost: Callable[[str], int]) -> int:
    """The largest limit at which the rendered field costs at most *share* bytes."""
    lo, hi = 0, f.limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if cost(f.render(mid)) <= share:
            lo = mid
        else:
            hi = mid - 1
    return lo
