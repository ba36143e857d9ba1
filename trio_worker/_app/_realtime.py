"""runpod's realtime mode: ``start(handler)`` with ``RUNPOD_REALTIME_PORT`` set.

The route runpod 1.12 serves (docs/load-balancing.md, "runpod's realtime mode"), served by
the load-balancing worker: the initializer is the supervised load behind ``/ping``, and each
job runs through the queue worker's own :class:`~trio_worker._runner.JobRunner`, so the
answer is the body a job-done report would carry.
"""

from __future__ import annotations

import json
import logging
import os
from typing import TYPE_CHECKING, Any

import trio

from .._backends import BACKENDS
from .._chunk_posts import LocalChunks
from .._exceptions import ConfigurationError
from .._exit import watched_process
from .._payloads import Payloads
from .._runner import JobRunner, JobSpec
from .._scopes import Scopes
from .._state import HeldJob
from ._gate import send_answer
from ._health import Answer
from ._loops import app_loop
from ._serve import Ports, bind_ports, serve_in_process

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from .._options import WorkerOptions
    from ._gate import Message, Receive, Scope, Send
    from ._serve import AppWorker

__all__ = ["RealtimeApp", "realtime_port", "serve_realtime"]

log = logging.getLogger("trio_worker")

# A job's body, at most: the platform's /runsync limit (docs/protocol.md §4.1).
_BODY_LIMIT = 20 * 1024 * 1024
_NOT_FOUND = Answer(404, b'{"detail": "Not Found"}')
_NOT_ALLOWED = Answer(405, b'{"detail": "Method Not Allowed"}', ((b"allow", b"POST"),))
_TOO_LARGE = Answer(
    413, b'{"detail": "the job is larger than 20 MiB"}', ((b"connection", b"close"),)
)


def realtime_port(environ: Mapping[str, str]) -> int | None:
    """``RUNPOD_REALTIME_PORT``, or None when unset (or 0, as the reference reads it).

    Raises:
        ConfigurationError: not a port number.
    """
    raw = (environ.get("RUNPOD_REALTIME_PORT") or "").strip()
    if not raw:
        return None
    ports = Ports.from_environ({"PORT": raw})
    return ports.app or None


def _concurrency(environ: Mapping[str, str]) -> int:
    raw = (environ.get("RUNPOD_REALTIME_CONCURRENCY") or "1").strip()
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigurationError(
            f"RUNPOD_REALTIME_CONCURRENCY must be an integer >= 1, got {raw!r}"
        )
    return value


class RealtimeApp:
    """The realtime route as an ASGI app, running each job with *runner* (trio code)."""

    def __init__(self, runner: JobRunner, endpoint_id: str | None, concurrency: int) -> None:
        self._runner = runner
        self._path = None if endpoint_id is None else f"/{endpoint_id}/realtime"
        self._slots = trio.CapacityLimiter(concurrency)
        self._exit: Callable[..., None] | None = None

    def attach(self, worker: AppWorker) -> None:
        """A handler's ``sys.exit(n)`` shuts *worker* down, to exit with *n* (as the queue
        worker does once the job's report is out: here, once its answer is sent)."""
        self._exit = worker.request_shutdown

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # no lifespan of its own; websockets are not served
        if self._path is None or scope["path"] != self._path:
            await send_answer(send, _NOT_FOUND)
            return
        if scope["method"] != "POST":
            await send_answer(send, _NOT_ALLOWED)
            return
        body = await _read(receive)
        if body is None:
            await send_answer(send, _TOO_LARGE)
            return
        job, problem = _job(body)
        if job is None:
            await send_answer(send, Answer(422, json.dumps({"detail": problem}).encode()))
            return
        async with self._slots:
            report = await self._runner.run(job)
        await send_answer(send, Answer(200, report.body))
        if report.exit_status is not None and self._exit is not None:
            status = report.exit_status
            self._exit(f"the handler of job {job.id} exited ({status})", status=status)


async def _read(receive: Receive) -> bytes | None:
    """The request body, or None past the limit (what was sent is dropped)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message: Message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks)
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > _BODY_LIMIT:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _job(body: bytes) -> tuple[HeldJob | None, list[dict[str, Any]]]:
    """The job in *body*, or None and FastAPI's shape of what is wrong with it."""
    try:
        payload = json.loads(body)
    except ValueError as exc:
        return None, [{"loc": ["body"], "msg": f"the body is not JSON: {exc}", "type": "json"}]
    if not isinstance(payload, dict):
        return None, [{"loc": ["body"], "msg": "a job is an object", "type": "dict_type"}]
    missing = [
        {"loc": ["body", field], "msg": "Field required", "type": "missing"}
        for field in ("id", "input")
        if field not in payload
    ]
    if missing:
        return None, missing
    if not isinstance(payload["id"], str):
        return None, [{"loc": ["body", "id"], "msg": "a string", "type": "string_type"}]
    return HeldJob(payload["id"], payload), []


class _Discarded(LocalChunks):
    """Where a streaming handler's chunks go: its answer is the final report."""

    def take(self, job_id: str, body: bytes) -> None:
        pass


def serve_realtime(options: WorkerOptions, port: int) -> int:
    """The realtime worker as this process: watchdog, capture, the route; exit status."""
    concurrency = _concurrency(os.environ)
    settings = options.settings()
    endpoint_id = settings.platform.endpoint_id
    if endpoint_id is None:
        log.warning("RUNPOD_ENDPOINT_ID is not set: the realtime route is not served")
    sockets = bind_ports(Ports(port))
    capture, guard = watched_process(settings, options)
    waits = Scopes(options.timings)
    runner = JobRunner(
        JobSpec.from_options(options),
        settings,
        Payloads.for_worker(settings, stop_pod=options.refresh_worker),
        _Discarded(),
        capture,
        waits,
        shared_process=lambda: concurrency > 1,
    )
    log.info("realtime: POST /%s/realtime, %d job(s) at once", endpoint_id, concurrency)
    app = RealtimeApp(runner, endpoint_id, concurrency)
    # The route runs the queue worker's trio code, so it is served on trio whatever the
    # backend; the handler itself runs where the backend says.
    loop = app_loop(BACKENDS["trio"], waits)
    return serve_in_process(
        app, options, settings, sockets, capture, guard, loop=loop, attach=app.attach
    )
