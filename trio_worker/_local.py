"""Local modes (docs/design.md §10): ``--test_input`` and the local endpoint.

``--test_input`` runs the initializer under the same supervision (deadline, failure record)
and then the handler once, printing the result as JSON. The local endpoint serves the
Runpod endpoint API on localhost from the embedded platform, and the real worker loop takes
from it over loopback HTTP, so a local run exercises the production code path.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
from typing import TYPE_CHECKING, Any

import trio

from ._capture import OutputCapture, install_python_stream_attribution, job_output, logs_for_job
from ._categories import classify
from ._config import CaptureMode, LocalArgs, Settings, Timings
from ._errors import (
    encode_body,
    generator_error_body,
    handler_error_body,
)
from ._exceptions import InitializationError
from ._handlers import Stream, ThreadWaits, call_handler, explain_backend, handler_kind
from ._initializer import init_failure_report, run_initializer, validate_init_timeout
from ._results import ResultEncodingError, encode_result, result_body, stream_final_body
from ._runner import worker_identity

if TYPE_CHECKING:
    from ._exceptions import InitFailure

log = logging.getLogger("trio_worker")
LOCAL_JOB_ID = "local_test"


def _print(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _init_failure_text(failure: InitFailure, settings: Settings) -> str:
    return init_failure_report(failure, worker_identity(settings), settings.redactor).decode()


async def run_test_input(
    kwargs: dict[str, Any], test_input: object, capture_logs: CaptureMode
) -> int:
    """Run the initializer, then the handler once on *test_input*; the exit status."""
    settings = Settings.from_environ(os.environ, capture_logs=capture_logs)
    capture = None
    if capture_logs == "on":
        capture = OutputCapture.install(redactor=settings.redactor)
        install_python_stream_attribution()
    try:
        return await _run_once(kwargs, test_input, settings, capture)
    finally:
        if capture is not None:
            capture.stop()


async def _run_once(
    kwargs: dict[str, Any], test_input: object, settings: Settings, capture: OutputCapture | None
) -> int:
    job: dict[str, Any] = (
        dict(test_input) if isinstance(test_input, dict) else {"input": test_input}
    )
    job_id = str(job.setdefault("id", LOCAL_JOB_ID))
    initializer = kwargs.get("initializer")
    if initializer is not None:
        timeout = validate_init_timeout(kwargs.get("init_timeout"))
        tail = capture.tail if capture is not None else (lambda limit=0: "")
        failure = await run_initializer(
            initializer, timeout, lambda: tail(settings.logs_tail_chars)
        )
        if failure is not None:
            log.error("initializer failed: %s: %s", failure.error_type, failure.message)
            _print(_init_failure_text(failure, settings))
            return 1
    handler = kwargs["handler"]
    mark = capture.mark() if capture is not None else 0
    with job_output(job_id) as output:
        try:
            result = await call_handler(
                handler, handler_kind(handler), job, trio.CapacityLimiter(math.inf), ThreadWaits()
            )
            if isinstance(result, Stream):
                return await _print_stream(result, kwargs, settings, capture, output, mark)
        except Exception as raised:
            exc = explain_backend(raised)
            logs = logs_for_job(capture, output, mark, shared_process=False)
            body = handler_error_body(
                exc,
                logs=logs,
                category=classify(exc, logs),
                identity=worker_identity(settings),
                redactor=settings.redactor,
            )
            _print(encode_body(body).decode())
            return 1
    return _print_result(result_body(result, refresh_worker=False))


def _print_result(body: dict[str, Any]) -> int:
    try:
        _print(encode_result(body).decode())
    except ResultEncodingError as err:
        log.error("handler output cannot be delivered: %s", err)
        return 1
    return 1 if "error" in body else 0


async def _print_stream(
    stream: Stream,
    kwargs: dict[str, Any],
    settings: Settings,
    capture: OutputCapture | None,
    output: Any,
    mark: int,
) -> int:
    chunks: list[object] = []
    try:
        async for chunk in stream:
            if isinstance(chunk, dict) and chunk.get("error"):
                return _print_result({"error": str(chunk["error"])})
            _print(json.dumps({"stream": chunk}, default=repr))
            chunks.append(chunk)
    except Exception as exc:
        logs = logs_for_job(capture, output, mark, shared_process=False)
        _print(
            encode_body(generator_error_body(exc, logs=logs, redactor=settings.redactor)).decode()
        )
        return 1
    aggregate = bool(kwargs.get("return_aggregate_stream"))
    return _print_result(
        stream_final_body(chunks if aggregate else None, aggregate=aggregate, refresh_worker=False)
    )


def run_dev_server(
    kwargs: dict[str, Any],
    args: LocalArgs,
    *,
    timings: Timings | None,
    capture_logs: CaptureMode = "on",
) -> int:
    """Serve the endpoint API on ``--rp_api_host:--rp_api_port`` with a real worker behind it."""
    return trio.run(_dev_server, kwargs, args, timings, capture_logs)


async def _dev_server(
    kwargs: dict[str, Any], args: LocalArgs, timings: Timings | None, capture_logs: CaptureMode
) -> int:
    from ._worker import serve
    from .testing._app import FakePlatform
    from .testing._http_server import serve_asgi

    platform = FakePlatform(take_hold=5.0, stop_hold=5.0)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_asgi, platform, args.api_host, args.api_port)
        base = f"http://{args.api_host}:{port}"
        environ = {**os.environ, **platform.worker_env(base, worker_id="local-worker")}
        log.info(
            "local endpoint on %s: POST /run, POST /runsync, GET /status/{id}, GET /stream/{id},"
            " POST /cancel/{id}, GET /health, POST /purge-queue",
            base,
        )
        _print(f"trio_worker local endpoint: {base}")
        status = 0
        try:
            await serve(**kwargs, environ=environ, timings=timings, capture_logs=capture_logs)
        except InitializationError:
            status = 1
        finally:
            nursery.cancel_scope.cancel()
    return status
