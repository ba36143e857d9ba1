"""Why a body cannot be posted: the value JSON refuses, found by its path, or its size. Only
a failed encoding comes here (``_payloads.encode_body``): the value is walked again, in the
encoder's order, so the error names the first offender the encoder met."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["ResultEncodingError", "explain", "too_large"]

_MiB = 1024 * 1024

ResultErrorType = Literal["OutputNotSerializable", "OutputTooLarge"]


class ResultEncodingError(Exception):
    """A body that cannot be posted: not JSON, or over the size limit. ``error_type`` is
    what the job's error reports; ``path`` locates the offending value (``"output['image']"``)
    when there is one."""

    def __init__(
        self, message: str, *, error_type: ResultErrorType, path: str | None = None
    ) -> None:
        super().__init__(message)
        self.error_type: ResultErrorType = error_type
        self.path = path


def _human(size: int) -> str:
    """``25.3 MiB (26528890 bytes)``: rounded for reading, exact for comparing."""
    if size >= _MiB:
        return f"{size / _MiB:.1f}".removesuffix(".0") + f" MiB ({size} bytes)"
    if size >= 1024:
        return f"{size / 1024:.1f}".removesuffix(".0") + f" KiB ({size} bytes)"
    return f"{size} bytes"


def too_large(size: int, limit: int) -> ResultEncodingError:
    return ResultEncodingError(
        f"result is {_human(size)}, over the platform limit of {_human(limit)}; "
        "upload it (object storage, a network volume) and return a URL",
        error_type="OutputTooLarge",
    )


def explain(body: dict[str, Any], exc: BaseException) -> ResultEncodingError:
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
