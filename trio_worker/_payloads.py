"""Every body the worker posts for a job (docs/protocol.md §3), and the one JSON policy they
are all encoded with (§3.8): a value that cannot be posted becomes an error naming it
(docs/design.md §5), and every error body comes from :meth:`Payloads.error`."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ._fitting import MAX_ERROR_BODY_BYTES as MAX_ERROR_BODY_BYTES
from ._fitting import Field, fit
from ._json_problems import ResultEncodingError as ResultEncodingError
from ._json_problems import explain, too_large
from ._tracebacks import error_type_name, format_traceback, safe_str
from ._version import __version__

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from ._capture import Redactor
    from ._config import Settings
    from ._exceptions import InitFailure

MAX_RESULT_BYTES = 20 * 1024 * 1024
"""The largest encoded body the worker posts: the reference's own result-size warning, and
the documented ``/runsync`` payload limit."""

MAX_LISTED_CHUNKS = 1000
"""A final report names at most this many undelivered chunks (and always their count)."""

_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False)
# Lone surrogates cannot be UTF-8: a body holding one is sent with JSON escapes instead.
_ASCII_ENCODER = json.JSONEncoder(ensure_ascii=True, allow_nan=False)

Shape = Literal["handler", "stream", "chunk", "init"]


def encode_body(body: dict[str, Any], *, max_bytes: int = MAX_RESULT_BYTES) -> bytes:
    """*body* as the platform reads it: UTF-8 JSON, NaN and Infinity refused.

    Raises:
        ResultEncodingError: a value is not JSON (bytes, sets, datetimes, numpy values,
            NaN or Infinity, circular references, non-string keys), named by its path; or
            the encoded body is over *max_bytes*.
    """
    try:
        text = _ENCODER.encode(body)
    except (TypeError, ValueError, RecursionError) as exc:
        raise explain(body, exc) from exc
    if len(text) > max_bytes:  # at least one byte per character: too large already
        raise too_large(len(text.encode(errors="surrogatepass")), max_bytes)
    try:
        data = text.encode()
    except UnicodeEncodeError:
        data = _ASCII_ENCODER.encode(body).encode()
    if len(data) > max_bytes:
        raise too_large(len(data), max_bytes)
    return data


def chunk_body(chunk: object) -> bytes:
    """One chunk of a stream, for job-stream (docs/protocol.md §3.4); raises as
    :func:`encode_body`."""
    return encode_body({"output": chunk})


def progress_body(progress: object) -> bytes:
    """A progress update, for job-done (docs/protocol.md §3.5); raises as
    :func:`encode_body`."""
    return encode_body({"status": "IN_PROGRESS", "output": progress})


@dataclass(frozen=True)
class WorkerIdentity:
    """Who reports: written into every error body so a bad host can be found."""

    worker_id: str
    hostname: str
    sdk_version: str = __version__


@dataclass(frozen=True)
class JobError:
    """What a failed job's report says, before it is redacted, fitted and encoded. *shape*
    is the body's (docs/reference.md, "Error shapes"): "handler", "stream", "chunk" (an
    error chunk's text alone) or "init" (with *elapsed* and *init_timeout*)."""

    error_type: str
    message: str
    traceback: str = ""
    category: str = "unknown"
    logs: str = ""
    shape: Shape = "handler"
    elapsed: float | None = None
    init_timeout: float | None = None

    @classmethod
    def raised(
        cls,
        exc: BaseException,
        *,
        logs: str = "",
        category: str = "unknown",
        traceback: str | None = None,
        shape: Shape = "handler",
    ) -> JobError:
        """The error *exc* is (*traceback*: its own, when the caller formatted it already)."""
        if traceback is None:
            traceback = format_traceback(exc)
        return cls(error_type_name(exc), safe_str(exc), traceback, category, logs, shape)

    @classmethod
    def output(cls, err: ResultEncodingError) -> JobError:
        """A result that could not be posted, reported in its place."""
        return cls(err.error_type, str(err))

    @classmethod
    def init_failed(cls, failure: InitFailure) -> JobError:
        """What every job held when the initializer failed is failed with (design §6.2)."""
        return cls(
            failure.error_type,
            failure.message,
            failure.traceback,
            failure.category,
            failure.logs,
            "init",
            failure.elapsed,
            failure.init_timeout,
        )


# The errors the SDK itself reports on a job: (category, message formatted with the facts).
_NOTICES = {
    "WorkerShutdown": (
        "worker_shutdown",
        "The worker shut down while job {job_id} was running: it did not finish within the "
        "shutdown grace of {grace_s:g} s and was cancelled. The worker was stopped by a "
        "signal (SIGTERM/SIGINT: scale-down, redeploy) or by refresh_worker.",
    ),
    "ResultRefused": (
        "unknown",
        "The platform refused the result of job {job_id} with HTTP {status} ({reason}): the "
        "report was {size} bytes. The result is lost; for 413, return a smaller result "
        "(store large outputs elsewhere and return a reference).",
    ),
    "WorkerCrashed": (
        "unknown",
        "The worker process {how} {where} (job {job_id}), before it could report. No code in "
        "that process could run any more: the crash watchdog, its parent process, reports "
        "it. The last output of the worker is in logs.",
    ),
}


def notice(
    error_type: str, *, category: str | None = None, logs: str = "", **facts: object
) -> JobError:
    """The error the SDK reports on a job of its own accord: a job cut at the end of the
    shutdown grace ("WorkerShutdown", docs/design.md §9), a result the platform refused for
    good ("ResultRefused", §5), a job a dead worker held ("WorkerCrashed", §13)."""
    default_category, message = _NOTICES[error_type]
    return JobError(error_type, message.format(**facts), "", category or default_category, logs)


class Payloads:
    """The bodies one worker posts for its jobs, with its identity and redactor. *stop_pod*
    (``refresh_worker``): every result and error asks for the worker to be replaced."""

    def __init__(
        self, identity: WorkerIdentity, redactor: Redactor, *, stop_pod: bool = False
    ) -> None:
        self.identity = identity
        self.redactor = redactor
        self.stop_pod = stop_pod

    @classmethod
    def for_worker(cls, settings: Settings, *, stop_pod: bool = False) -> Payloads:
        platform = settings.platform
        identity = WorkerIdentity(platform.worker_id, platform.hostname)
        return cls(identity, settings.redactor, stop_pod=stop_pod)

    def __repr__(self) -> str:
        return f"<Payloads {self.identity!r} stop_pod={self.stop_pod}>"

    def result(self, value: object) -> dict[str, Any]:
        """The job-done body of a non-streaming handler's return value (docs/protocol.md
        §3.2), to encode with :func:`encode_body`."""
        return result_body(value, self.redactor, stop_pod=self.stop_pod)

    def stream_final(
        self, chunks: list[object] | None, undelivered: Sequence[int] = ()
    ) -> dict[str, Any]:
        """The final job-done body of a stream that ended well (docs/protocol.md §3.4): the
        chunks when they were kept (``return_aggregate_stream``), else ``[]``, and the
        chunks never delivered, named."""
        return {"output": list(chunks) if chunks else [], **_closing(undelivered, self.stop_pod)}

    def error(
        self, error: JobError, *, undelivered: Sequence[int] = (), stop_pod: bool | None = None
    ) -> bytes:
        """The encoded error body for *error*, redacted and within 64 KiB (docs/design.md
        I6), naming the stream chunks never delivered. It asks ``stopPod`` when *stop_pod*
        says so, by default when the worker's rule does, except on an init failure, which
        ends the worker anyway (as the reference's init_failed body, it has none)."""
        if stop_pod is None:
            stop_pod = self.stop_pod and error.shape != "init"
        extra = _closing(undelivered, stop_pod)
        redactor = self.redactor
        message, trace = Field(error.message, redactor), Field(error.traceback, redactor)
        logs = Field(error.logs, redactor, mode="tail")
        text: Callable[[], str]
        if error.shape == "chunk":
            parts, text = [message], message.render
        elif error.shape == "stream":
            parts = [message, trace, logs]

            def text() -> str:
                head = f"handler: {message.render()} \ntraceback: {trace.render()}"
                return f"{head}\nlogs:\n{logs.render()}"

        else:  # the JSON string of every other error: escaped twice on the wire
            fields = self._fields(error, message, trace, logs)
            parts = [v for _, v in fields if isinstance(v, Field)]

            def text() -> str:
                return _ENCODER.encode(
                    {k: v.render() if isinstance(v, Field) else v for k, v in fields}
                )

        nested = error.shape in ("handler", "init")
        return fit(lambda: {"error": text(), **extra}, parts, dumps=_ENCODER.encode, nested=nested)

    def _fields(
        self, error: JobError, message: Field, trace: Field, logs: Field
    ) -> list[tuple[str, Field | object]]:
        """The inner object of the handler and init shapes, in the reference's key order."""
        redactor, identity = self.redactor, self.identity
        init = error.shape == "init"
        fields: list[tuple[str, Field | object]] = [
            *([("event", "init_failed")] if init else []),
            ("error_type", Field(error.error_type, redactor, large=False)),
            ("error_message", message),
            ("error_traceback", trace),
            ("error_category", Field(error.category, redactor, large=False)),
            # init_failed omits empty logs, as the reference does; the handler shape has
            # them always, last.
            *([("logs", logs)] if init and error.logs else []),
            ("hostname", Field(identity.hostname, redactor, large=False)),
            ("worker_id", Field(identity.worker_id, redactor, large=False)),
            ("sdk_version", Field(identity.sdk_version, redactor, large=False)),
            ("runpod_version", Field(identity.sdk_version, redactor, large=False)),
        ]
        if not init:
            return [*fields, ("logs", logs)]
        return [
            *fields,
            ("elapsed_s", _finite(error.elapsed, digits=3)),
            ("init_timeout", _finite(error.init_timeout, digits=6)),
        ]


def _closing(undelivered: Sequence[int], stop_pod: bool) -> dict[str, Any]:
    """The keys a final body ends with: the stream chunks never delivered (docs/protocol.md
    §3.4), their exact count and at most :data:`MAX_LISTED_CHUNKS` 0-based indexes; and the
    one ``stopPod`` any body carries, when it asks for the worker to be replaced."""
    keys: dict[str, Any] = {}
    if undelivered:
        keys["undelivered_chunk_count"] = len(undelivered)
        keys["undelivered_chunks"] = list(undelivered[:MAX_LISTED_CHUNKS])
    if stop_pod:
        keys["stopPod"] = True
    return keys


def result_body(value: object, redactor: Redactor, *, stop_pod: bool = False) -> dict[str, Any]:
    """The reference's body for a return value (docs/protocol.md §3.2), ``stopPod`` when it
    asks ``refresh_worker`` or *stop_pod* is set. A returned ``error`` is redacted, as every
    error the worker sends (docs/design.md §8); the output is sent as returned."""
    body: dict[str, Any]
    if not isinstance(value, dict):
        body = {"output": value}
    else:
        rest, error = value, None
        if "error" in value or "refresh_worker" in value:
            rest = dict(value)  # a copy: the user's dict is left as it was
            error = rest.pop("error", None)
            stop_pod = _truthy(rest.pop("refresh_worker", None)) or stop_pod
        body = {"output": rest} if len(rest) else {}
        if _truthy(error):
            body["error"] = redact_value(error, redactor)
    if stop_pod:
        body.update(_closing((), stop_pod=True))
    return body


_Copy = dict[object, object] | list[object]


def redact_value(value: object, redactor: Redactor) -> object:
    """*value* with every string in it, keys included, redacted; containers are copied,
    the user's value is left as it was. Anything JSON cannot hold is kept, for
    :func:`encode_body` to refuse. Iterative, so a deep value cannot exhaust the stack; a
    container met twice gets the same copy, so a cycle stays a cycle (refused likewise).
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


def _truthy(value: object) -> bool:
    try:
        return bool(value)
    except Exception:  # e.g. a numpy array: ambiguous, but certainly present
        return True


def _finite(value: float | None, *, digits: int) -> float | None:
    """A number the policy accepts: NaN and the infinities become null."""
    return round(value, digits) if value is not None and math.isfinite(value) else None
