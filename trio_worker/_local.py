"""Local modes (docs/design.md §10): ``--test_input`` and the local endpoint.

``--test_input`` runs the job once through the queue worker's own
:class:`~._runner.JobRunner`, its chunks and report printed instead of posted, so what the
platform would reject fails here too.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import sys
from typing import TYPE_CHECKING, Any

import trio

from ._chunk_posts import LocalChunks
from ._exceptions import InitializationError
from ._exit import capture_output
from ._initializer import run_initializer
from ._payloads import JobError, Payloads
from ._runner import JobRunner, JobSpec
from ._scopes import Scopes
from ._state import HeldJob

if TYPE_CHECKING:
    from ._capture import OutputCapture
    from ._config import Settings
    from ._endpoint import EndpointApp
    from ._flags import LocalArgs
    from ._options import WorkerOptions
    from ._platform._http import StreamOpener

log = logging.getLogger("trio_worker")
LOCAL_JOB_ID = "local_test"


def _print(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


class StdoutChunks(LocalChunks):
    """The local stand-in for the job-stream route: each chunk as ``{"stream": chunk}``."""

    def take(self, job_id: str, body: bytes) -> None:
        # The body is what the platform would get, {"output": chunk}, already encoded and
        # checked; only its key changes for the terminal.
        _print(json.dumps({"stream": json.loads(body)["output"]}))


async def run_test_input(options: WorkerOptions, test_input: object) -> int:
    """Run the initializer, then the handler once on *test_input*; the exit status."""
    options.backend.check_host()
    settings = options.settings()
    capture = capture_output(settings, options)
    try:
        return await _run_once(options, test_input, settings, capture)
    finally:
        if capture is not None:
            capture.stop()


async def _run_once(
    options: WorkerOptions, test_input: object, settings: Settings, capture: OutputCapture | None
) -> int:
    payload: dict[str, Any] = (
        dict(test_input) if isinstance(test_input, dict) else {"input": test_input}
    )
    job = HeldJob(str(payload.setdefault("id", LOCAL_JOB_ID)), payload)
    payloads = Payloads.for_worker(settings, stop_pod=options.refresh_worker)
    waits = Scopes(options.timings)
    initializer = options.backend.initializer(options.initializer, waits)
    if initializer is not None:
        tail = capture.tail if capture is not None else (lambda limit=0: "")
        failure = await run_initializer(
            initializer, options.init_timeout, lambda: tail(settings.logs_tail_chars)
        )
        if failure is not None:
            log.error("initializer failed: %s: %s", failure.error_type, failure.message)
            _print(payloads.error(JobError.init_failed(failure)).decode())
            return 1
    runner = JobRunner(
        JobSpec.from_options(options),
        settings,
        payloads,
        StdoutChunks(),
        capture,
        waits,
        shared_process=lambda: False,
    )
    report = await runner.run(job)
    _print(report.body.decode())
    if report.exit_status is not None:
        # sys.exit(n) in the handler: the process exits with n, as in queue mode.
        return report.exit_status
    # The platform fails a job whose report carries "error"; so does local mode.
    return 1 if "error" in json.loads(report.body) else 0


def run_dev_server(options: WorkerOptions, args: LocalArgs) -> int:
    """Serve the endpoint API on ``--rp_api_host:--rp_api_port`` with a real worker behind it."""
    return options.backend.run(_dev_server, options, args)


def local_endpoint_app(api_host: str, allow_hosts: tuple[str, ...] = ()) -> EndpointApp:
    """The local endpoint's app: the platform's rules (docs/protocol.md §4.1), a guard
    answering this machine's host names and *allow_hosts*, and a key made for this run
    alone, given only to the embedded worker (docs/security.md).
    """
    from ._endpoint import EndpointApp, Guard
    from ._endpoint._rules import DEFAULT_EXECUTION_TIMEOUT, MAX_FINISHED

    return EndpointApp(
        api_key=secrets.token_urlsafe(32),
        take_hold=5.0,
        stop_hold=5.0,
        execution_timeout=DEFAULT_EXECUTION_TIMEOUT,
        expire_results=True,
        max_finished=MAX_FINISHED,
        record_requests=False,
        guard=Guard.for_host(api_host, allow_hosts),
    )


def loopback_opener(host: str, port: int) -> StreamOpener:
    """Connections straight to the local endpoint at *host*:*port*, for its embedded worker.

    Never through a proxy: a developer's ``HTTP_PROXY`` must not see the per-run key, and an
    unreachable proxy must not leave ``/runsync`` IN_QUEUE. An injected opener replaces the
    client's reading of the proxy variables for every route, the heartbeat included.
    """

    from ._platform._network import open_tcp_stream

    async def open_stream(_host: str, _port: int, tls: bool) -> trio.abc.Stream:
        # The stream production's plain-HTTP connects make, so local runs take its path.
        return await open_tcp_stream(host, port)

    return open_stream


async def _dev_server(options: WorkerOptions, args: LocalArgs) -> int:
    from ._endpoint import serve_endpoint
    from ._endpoint._serving import url_of
    from ._worker import Seams, run_worker

    platform = local_endpoint_app(args.api_host, args.allow_hosts)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_endpoint, platform, args.api_host, args.api_port)
        await nursery.start(platform.run_requeue_checker)
        await nursery.start(platform.run_webhook_sender)
        base = url_of(args.api_host, port)
        environ = {**os.environ, **platform.worker_env(base, worker_id="local-worker")}
        log.info(
            "local endpoint on %s: POST /run, POST /runsync, GET /status/{id}, GET /stream/{id},"
            " POST /cancel/{id}, GET /health, POST /purge-queue; a page to try it at /,"
            " its OpenAPI schema at /openapi.json",
            base,
        )
        _print(f"trio_worker local endpoint: {base}")
        # The heartbeat on the loop, through the same loopback opener (its own thread
        # would build a client that reads the proxy variables).
        seams = Seams(open_stream=loopback_opener(_dialable(args.api_host), port), heartbeat="task")
        status = 0
        try:
            await run_worker(options, environ=environ, seams=seams)
        except InitializationError:
            status = 1
        finally:
            nursery.cancel_scope.cancel()
    return status


def _dialable(host: str) -> str:
    """Where the embedded worker dials the endpoint listening on *host*."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "::1"
    return host.strip("[]")
