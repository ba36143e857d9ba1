"""Turning what a handler returned into the job-done body, and that body into bytes.

The shapes are the reference's (docs/protocol.md §3.2, §3.4) so existing clients keep working.
What changes is what happens when a result cannot be sent (docs/design.md §5): the reference logged
a ``TypeError`` and posted nothing, so the request sat IN_PROGRESS until its timeout
(docs/protocol.md §8 #2). Here ``encode_result`` raises ``ResultEncodingError`` with a message that
names the offending value and what to return instead, and ``output_error_body`` turns it
into an error the caller of the endpoint actually receives.

Choices, and why:

- **The user's dict is not mutated.** The reference pops ``error`` and ``refresh_worker``
  from the returned dict itself; a handler that returns a cached dict then loses those keys
  for the next job. A shallow copy is made only when one of the two keys is present.
- **NaN and Infinity are rejected.** Python's ``json`` writes them by default, but they are
  not JSON, and the platform's parser rejects the body, which would lose the result.
- **``MAX_RESULT_BYTES`` is 20 MiB**, the threshold of the reference SDK's own result-size
  warning and the documented ``/runsync`` payload limit. A larger result would be refused
  by the platform after the work was done; the error says to upload it and return a URL.
- **The happy path walks the value once**: one C-accelerated ``json`` encoding. Only when
  that fails is the value walked (iteratively, in the encoder's order) to find the path.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any, Literal

from ._errors import json_error_body

if TYPE_CHECKING:
    from collections.abc import Iterator

    from ._capture import Redactor
    from ._errors import WorkerIdentity

__all__ = [
    "MAX_RESULT_BYTES",
    "ResultEncodingError",
    "encode_result",
    "output_error_body",
    "redact_value",
    "result_body",
    "stream_final_body",
]

MAX_RESULT_BYTES = 20 * 1024 * 1024
"""The largest encoded job-done body the worker will post (see the module docstring)."""

_MiB = 1024 * 1024
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False)
_ASCII_ENCODER = json.JSONEncoder(ensure_ascii=True, allow_nan=False)

_Copy = dict[object, object] | list[object]

ResultErrorType = Literal["OutputNotSerializable", "OutputTooLarge"]


class ResultEncodingError(Exception):
    """A result that cannot be posted: not JSON, or over the size limit.

    ``error_type`` is what the job's error reports: ``"OutputNotSerializable"`` or
    ``"OutputTooLarge"``; ``path`` locates the offending value (``"output['image']"``) when
    there is one.
    """

    def __init__(
        self, message: str, *, error_type: ResultErrorType, path: str | None = None
    ) -> None:
        super().__init__(message)
        self.error_type: ResultErrorType = error_type
        self.path = path


def with_stop_pod(body: dict[str, Any]) -> dict[str, Any]:
    """*body* asking the platform to replace this worker after the job (``refresh_worker``).

    The one place ``stopPod`` is written, whether the configuration or a result asked for it.
    """
    body["stopPod"] = True
    return body


def result_body(value: object, *, redactor: Redactor) -> dict[str, Any]:
    """The job-done body for a non-streaming handler's return value (docs/protocol.md §3.2).

    A returned ``error`` is the job's error: it is redacted like every error the worker
    sends (docs/design.md §8). The output is the user's data and is sent as returned.

    >>> from ._capture import Redactor
    >>> result_body({"error": "bad key s3cr3t", "a": 1}, redactor=Redactor(["s3cr3t"]))
    {'output': {'a': 1}, 'error': 'bad key [REDACTED]'}
    >>> result_body({"refresh_worker": True}, redactor=Redactor([]))
    {'stopPod': True}
    >>> result_body(None, redactor=Redactor([]))
    {'output': None}
    """
    body: dict[str, Any]
    if isinstance(value, dict):
        error: object = None
        refresh: object = None
        rest = value
        if "error" in value or "refresh_worker" in value:
            rest = dict(value)  # a copy: the user's dict is left as it was
            error = rest.pop("error", None)
            refresh = rest.pop("refresh_worker", None)
        body = {"output": rest} if len(rest) else {}
        if _truthy(error):
            body["error"] = redact_value(error, redactor)
        if _truthy(refresh):
            with_stop_pod(body)
    else:
        body = {"output": value}
    return body


def redact_value(value: object, redactor: Redactor) -> object:
    """*value* with every string in it, keys included, redacted; containers are copied,
    the user's value is left as it was.

    Anything JSON cannot hold is kept as is: ``encode_result`` then refuses it and the job
    reports an ``OutputNotSerializable`` error, itself redacted. Iterative, so a deep value
    cannot exhaust the interpreter's stack. A container met twice gets the same copy, so a
    cycle stays a cycle (and is refused like the original).
    """
    copies: dict[int, _Copy] = {}
    pending: list[dict[Any, Any] | list[Any] | tuple[Any, ...]] = []

    def redacted(item: object) -> object:
        if isinstance(item, str):
            return redactor.redact(item)
        if not isinstance(item, (dict, list, tuple)):
            return item
        if id(item) not in copies:
            copies[id(item)] = {} if isinstance(item, dict) else []
            pending.append(item)
        return copies[id(item)]

    root = redacted(value)
    while pending:
        source = pending.pop()
        copy = copies[id(source)]
        if isinstance(copy, dict) and isinstance(source, dict):
            for key, item in source.items():
                copy[redacted(key) if isinstance(key, str) else key] = redacted(item)
        elif isinstance(copy, list):
            copy.extend(redacted(item) for item in source)
    return root


def stream_final_body(chunks: list[object] | None, *, aggregate: bool) -> dict[str, Any]:
    """The final job-done body of a streaming handler (docs/protocol.md §3.4): the chunks when
    ``return_aggregate_stream`` is set, otherwise ``{"output": []}``."""
    return {"output": list(chunks) if aggregate and chunks else []}


def encode_result(body: dict[str, Any], *, max_bytes: int = MAX_RESULT_BYTES) -> bytes:
    """*body* as UTF-8 JSON bytes for job-done or job-stream.

    Raises ``ResultEncodingError`` when a value is not JSON (bytes, sets, datetimes, numpy
    values, NaN or Infinity, circular references, non-string keys), naming its path, or when
    the encoded body is larger than *max_bytes*.
    """
    try:
        text = _ENCODER.encode(body)
    except (TypeError, ValueError, RecursionError) as exc:
        raise _explain(body, exc) from exc
    if len(text) > max_bytes:  # at least one byte per character: too large already
        raise _too_large(len(text.encode(errors="surrogatepass")), max_bytes)
    try:
        data = text.encode()
    except UnicodeEncodeError:
        # Lone surrogates cannot be UTF-8: send them as JSON escapes instead, losslessly.
        data = _ASCII_ENCODER.encode(body).encode()
    if len(data) > max_bytes:
        raise _too_large(len(data), max_bytes)
    return data


def output_error_body(
    err: ResultEncodingError,
    *,
    category: str,
    identity: WorkerIdentity,
    redactor: Redactor,
) -> dict[str, Any]:
    """The error reported on the job in place of a result that could not be posted, in the
    handler-error shape (``{"error": "<JSON string>"}``), bounded like every error body."""
    return json_error_body(
        error_type=err.error_type,
        message=str(err),
        traceback="",
        category=category,
        logs="",
        identity=identity,
        redactor=redactor,
    )


# --- internals -----------------------------------------------------------------------------


def _truthy(value: object) -> bool:
    try:
        return bool(value)
    except Exception:  # e.g. a numpy array: ambiguous, but certainly present
        return True


def _human(size: int) -> str:
    """``25.3 MiB (26528890 bytes)``: rounded for reading, exact for comparing."""
    if size >= _MiB:
        return f"{size / _MiB:.1f}".removesuffix(".0") + f" MiB ({size} bytes)"
    if size >= 1024:
        return f"{size / 1024:.1f}".removesuffix(".0") + f" KiB ({size} bytes)"
    return f"{size} bytes"


def _too_large(size: int, limit: int) -> ResultEncodingError:
    return ResultEncodingError(
        f"result is {_human(size)}, over the platform limit of {_human(limit)}; "
        "upload it (object storage, a network volume) and return a URL",
        error_type="OutputTooLarge",
    )


def _explain(body: dict[str, Any], exc: BaseException) -> ResultEncodingError:
    if isinstance(exc, RecursionError):
        return ResultEncodingError(
            "result is nested too deeply to encode as JSON; flatten it",
            error_type="OutputNotSerializable",
        )
    found = _find_offender(body)
    if found is None:
        return ResultEncodingError(
            f"result is not JSON serializable: {exc}", error_type="OutputNotSerializable"
        )
    path, message = found
    return ResultEncodingError(message, error_type="OutputNotSerializable", path=path)


def _find_offender(body: dict[str, Any]) -> tuple[str, str] | None:
    """The first value, in the encoder's order, that ``json`` refuses: ``(path, message)``.

    Iterative, one iterator per open container, so memory grows with the depth of the
    value, not its size, and a deep value cannot exhaust the interpreter's stack.
    """
    stack: list[tuple[Iterator[tuple[object, object]], str, object]] = [
        (iter(body.items()), "", body)
    ]
    active: set[int] = set()  # the containers on the current path, to find cycles
    while stack:
        items, path, container = stack[-1]
        entry = next(items, None)  # entries are (key, value) pairs, never None
        if entry is None:
            stack.pop()
            active.discard(id(container))
            continue
        key, value = entry
        if container is body:
            child = str(key)
        elif isinstance(container, dict):
            bad_key = _bad_key(key, path)
            if bad_key is not None:
                return path, bad_key
            child = f"{path}[{_short_repr(key)}]"
        else:
            child = f"{path}[{key}]"
        problem = _problem(value, child)
        if problem is not None:
            return child, problem
        if isinstance(value, (list, tuple, dict)):
            if id(value) in active:
                return (
                    child,
                    f"{child} contains itself (a circular reference), which JSON cannot hold",
                )
            active.add(id(value))
            children = iter(value.items()) if isinstance(value, dict) else enumerate(value)
            stack.append((children, child, value))
    return None


def _problem(value: object, path: str) -> str | None:
    """Why ``json`` refuses *value* itself (not its contents), or None."""
    if value is None or isinstance(value, (str, int, list, tuple, dict)):
        return None
    if isinstance(value, float):
        if math.isfinite(value):
            return None
        return (
            f"{path} is {value!r}, which is not valid JSON (the platform rejects NaN and "
            "Infinity); return null or a string instead"
        )
    return f"{path} is {_type_name(value)}, which is not JSON serializable; {_hint(value)}"


def _bad_key(key: object, path: str) -> str | None:
    if key is None or isinstance(key, (str, int)):
        return None
    if isinstance(key, float):
        if math.isfinite(key):
            return None
        return f"{path} has the key {key!r}, which is not valid JSON; use a string key"
    return (
        f"{path} has a key {_short_repr(key)} of type {_type_name(key)}; JSON object keys "
        "must be strings"
    )


def _short_repr(value: object, limit: int = 60) -> str:
    try:
        text = repr(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _type_name(value: object) -> str:
    cls = type(value)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


def _hint(value: object) -> str:
    """What to return instead of *value*. Imports are local: this is the error path only."""
    import datetime
    import decimal
    import inspect

    if isinstance(value, (bytes, bytearray, memoryview)):
        return "return base64 text or a URL"
    if isinstance(value, (set, frozenset)):
        return "return a list"
    if isinstance(value, (datetime.date, datetime.time)):
        return "return an ISO 8601 string (.isoformat())"
    if isinstance(value, datetime.timedelta):
        return "return a number of seconds (.total_seconds())"
    if isinstance(value, decimal.Decimal):
        return "return a float or a string"
    if inspect.isgenerator(value) or inspect.isasyncgen(value):
        return (
            "to stream, the handler itself must be a generator function (or a partial or "
            "callable object wrapping one); otherwise return a list"
        )
    if inspect.isawaitable(value):
        return "the handler returned an awaitable that was never awaited"
    if callable(getattr(value, "tolist", None)):
        return "convert it with .tolist() (numpy arrays and scalars, tensors)"
    if isinstance(value, BaseException):
        return "return str(error), or raise it to fail the job"
    return "convert it to dict, list, str, int, float, bool or None"
