"""EndpointApp: the Runpod side of the worker protocol and the endpoint API, as one ASGI app.

One app serves the local development endpoint (``--rp_serve_api``, with a
:class:`~._guard.Guard` and a per-run key) and, as
:class:`~trio_worker.testing.FakePlatform` (which adds fault injection and the ``/_stats``
and ``/_env`` routes), loopback integration tests, the in-process virtual-time property
suite (over :func:`~trio_worker.testing.memory_network` under ``trio.testing.MockClock``)
and the benchmarks. So it uses only trio primitives and ``trio.current_time()`` (no
threads, no wall clock), and the common path (a job ready when a take arrives) answers
with no task, nursery or wait.

Routes (the recommended wiring of docs/protocol.md §1.5; any endpoint id is accepted):

============================================  ==========  ==================================
path                                          route name  answer
============================================  ==========  ==================================
GET  /v2/{ep}/job-take/{worker}               take        one job, or 204 after ``take_hold``
GET  /v2/{ep}/job-take-batch/{worker}         take_batch  up to ``batch_size`` jobs, or 204
GET  /v2/{ep}/job-stop/{worker}               stop        ``{"jobsToStop": [...]}`` or 204
POST /v2/{ep}/job-done/{pod}/{job_id}         done        progress or terminal report
POST /v2/{ep}/job-stream/{pod}/{job_id}       stream      one ``{"output": chunk}``
GET  /v2/{ep}/ping/{pod}                      ping        heartbeat with ``job_id=a,b``
POST /run, /runsync                           api_run...  endpoint API, also under /v2/{ep}/
GET  /status/{id}, /stream/{id}, /health      api_...
POST /cancel/{id}, /purge-queue               api_...
GET  /, /docs, /openapi.json                  page, ...   a page to try the handler; the schema
============================================  ==========  ==================================

Worker routes check ``Authorization`` against ``api_key`` when one is configured (the
local endpoint always configures one, fresh for each run). With a ``guard``, every
request passes its checks first (docs/security.md). The key, the guard and a declared
``Content-Length`` past the route's limit are all checked on the head, before any body
is read.
"""

from __future__ import annotations

import hmac
import math
from typing import TYPE_CHECKING, Final
from urllib.parse import parse_qsl, unquote

import trio

from ._asgi import AbortConnection
from ._guard import Refusal
from ._page import PAGE_HEADERS, PAGE_HTML, openapi_document
from ._queue import encode_json
from ._records import JobRecord, RecordedRequest
from ._routes import (
    NO_CONTENT,
    OK,
    BodyTooLarge,
    ClientGone,
    Request,
    Response,
    api_route,
    hold,
    json_response,
    lifespan,
    parse_json,
    parse_query,
    read_body,
)
from ._rules import OTHER_BODY_LIMIT, RUN_BODY_LIMIT, RUNSYNC_BODY_LIMIT, RUNSYNC_WAIT
from ._state import PlatformState

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from ._asgi import Receive, Scope, Send
    from ._guard import Guard
    from ._queue import Handout

__all__ = ["EndpointApp", "match_route"]

# path segment -> (route name, number of path arguments after it)
_WORKER_ROUTES: Final = {
    "job-take": ("take", 1),
    "job-take-batch": ("take_batch", 1),
    "job-stop": ("stop", 1),
    "job-done": ("done", 2),
    "job-stream": ("stream", 2),
    "ping": ("ping", 1),
}
_WORKER_ROUTE_NAMES: Final = frozenset(name for name, _ in _WORKER_ROUTES.values())
# Request body limits of the endpoint API (docs/protocol.md §4.1); worker routes have none.
_BODY_LIMITS: Final = {"api_run": RUN_BODY_LIMIT, "api_runsync": RUNSYNC_BODY_LIMIT}
_API_ROUTES: Final = {
    "run": ("api_run", 0),
    "runsync": ("api_runsync", 0),
    "health": ("api_health", 0),
    "purge-queue": ("api_purge_queue", 0),
    "status": ("api_status", 1),
    "stream": ("api_stream", 1),
    "cancel": ("api_cancel", 1),
    "": ("page", 0),
    "docs": ("page", 0),
    "openapi.json": ("openapi", 0),
}
# No HEAD: a HEAD take would hand out a job in a response with no body.
_GET: Final = frozenset({"GET"})
_POST: Final = frozenset({"POST"})
_ANY: Final = frozenset({"GET", "POST"})
_METHODS: Final = {
    "take": _GET,
    "take_batch": _GET,
    "stop": _GET,
    "ping": _GET,
    "done": _POST,
    "stream": _POST,
    "api_run": _POST,
    "api_runsync": _POST,
    "api_status": _ANY,
    "api_stream": _ANY,
    "api_cancel": _POST,
    "api_health": _GET,
    "api_purge_queue": _POST,
    "page": _GET,
    "openapi": _GET,
}
_OPENAPI: Final = encode_json(openapi_document(_API_ROUTES, _METHODS))


class EndpointApp(PlatformState):
    """A Runpod platform in one process: a job queue behind the worker protocol, as an ASGI app.

    Args:
        api_key: when set, worker routes answer 401 unless ``Authorization`` equals it.
        guard: the local endpoint's checks of Host, origin and content type, applied to
            every request before its route (None: none, as a test platform needs).
        take_hold: seconds a take long-polls for a job before answering 204 (0: at once).
        stop_hold: seconds a job-stop long-polls for stop signals before 204.
        requeue_after: the requeue rule (docs/protocol.md §2.7 leaves it open). A taken,
            unfinished job goes back to the head of the queue once this many seconds have
            passed since the later of its take and the last ping *from its holder* that
            listed it; each requeue is recorded in ``job(id).requeues``. None (the
            default) never requeues.
        endpoint_id: used by :meth:`worker_env` (requests may use any endpoint id).
        runsync_wait: how long ``/runsync`` waits for a result (``?wait=ms`` overrides);
            the platform's 90 s by default.
        record_requests: keep every request in :attr:`requests` and every ping in
            :attr:`pings`; turn off for long runs (the counters are kept either way).
        execution_timeout: seconds a take may hold a job before it is TIMED_OUT and its
            worker told to stop it; a job's ``policy.executionTimeout`` overrides it.
            None (the default): only jobs with a policy are timed.
        expire_results: forget finished jobs as the platform does, ``/run`` jobs 30
            minutes and ``/runsync`` jobs 1 minute after they finish (docs/protocol.md
            §4.1); ``/status`` then answers 404. Off by default: tests read old jobs.
        max_finished: keep at most this many finished jobs, forgetting the oldest first.

    Finished jobs with a ``webhook`` URL have their final status POSTed to it while
    :meth:`run_webhook_sender` runs. Sync methods (:meth:`enqueue`, :meth:`job`, ...)
    must be called from the trio thread that serves the app.
    """

    def __init__(
        self,
        *,
        api_key: str | None = None,
        take_hold: float = 5.0,
        stop_hold: float = 5.0,
        requeue_after: float | None = None,
        endpoint_id: str = "test-ep",
        runsync_wait: float = RUNSYNC_WAIT,
        record_requests: bool = True,
        execution_timeout: float | None = None,
        expire_results: bool = False,
        max_finished: int | None = None,
        guard: Guard | None = None,
    ) -> None:
        self.guard = guard
        super().__init__(
            api_key=api_key,
            take_hold=take_hold,
            stop_hold=stop_hold,
            requeue_after=requeue_after,
            endpoint_id=endpoint_id,
            runsync_wait=runsync_wait,
            record_requests=record_requests,
            execution_timeout=execution_timeout,
            expire_results=expire_results,
            max_finished=max_finished,
        )
        self._routes: dict[str, Callable[[Request], Awaitable[Response]]] = {
            "take": self._take,
            "take_batch": self._take_batch,
            "stop": self._stop,
            "done": self._done,
            "stream": self._stream,
            "ping": self._ping,
        }

    # -- ASGI ---------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                await lifespan(receive, send)
            return
        # Matched on the raw path, each segment decoded after the split: a job id sent
        # percent-encoded (``w%2Fx``, docs/protocol.md §2.3) stays one argument.
        raw_path = scope.get("raw_path")
        path = raw_path.decode("latin-1") if raw_path is not None else scope["path"]
        route, args = self._match(path)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        # Checked on the head, before the body is read: a refused request (another
        # origin, no key, a declared size past the limit) costs no body read.
        refusal = None
        if self.guard is not None:
            server = scope.get("server")
            port = server[1] if server else None
            refusal = self.guard.check(route, scope["method"], headers, port)
        if refusal is None and route in _WORKER_ROUTE_NAMES and self.api_key is not None:
            if not _key_matches(headers, self.api_key):
                refusal = Refusal(401, "missing or wrong API key (Authorization)")
        limit = _BODY_LIMITS.get(route, None if route in _WORKER_ROUTE_NAMES else OTHER_BODY_LIMIT)
        too_large = refusal is None and _declared_size(headers) > (limit or math.inf)
        try:
            skip = refusal is not None or too_large
            body = b"" if skip else await read_body(receive, limit)
        except ClientGone:
            return
        except BodyTooLarge:
            body, too_large = b"", True
        query = parse_query(scope["query_string"])
        if args and route in _WORKER_ROUTE_NAMES and "&" in args[-1]:
            # A GET_JOB template without "?" puts the appended parameters in the path
            # (docs/protocol.md §1.5); accept them rather than answer 404.
            args[-1], _, extra = args[-1].partition("&")
            query.update(parse_qsl(extra, keep_blank_values=True))
        args = [unquote(arg) for arg in args]
        now = trio.current_time()
        record = RecordedRequest(now, scope["method"], route, scope["path"], query, headers, body)
        self._record_request(record)
        self._check_deadlines(now)
        if refusal is not None:
            answer = json_response(refusal.status, {"error": refusal.reason})
            await self._send(send, answer, record)
            return
        if too_large:
            message = f"request body larger than {limit} bytes"
            await self._send(send, json_response(413, {"error": message}), record)
            return
        try:
            response = await self._respond(Request(record, args, receive))
        except ClientGone:
            return
        except AbortConnection:
            record.dropped = True
            raise
        await self._send(send, response, record)

    def _match(self, path: str) -> tuple[str, list[str]]:
        """(route name, path arguments) for *path*; a subclass may add routes."""
        return match_route(path)

    async def _respond(self, request: Request) -> Response:
        """The answer to *request* (the fake platform applies its faults here)."""
        return await self._route(request)

    async def _route(self, request: Request) -> Response:
        route = request.route
        allowed = _METHODS.get(route)
        if allowed is None:
            return json_response(404, {"error": f"no route for {request.record.path}"})
        if request.method not in allowed:
            return json_response(405, {"error": f"{request.method} not allowed"})
        handler = self._routes.get(route)
        if handler is None:
            if route == "page":
                return Response(200, PAGE_HTML, b"text/html; charset=utf-8", headers=PAGE_HEADERS)
            if route == "openapi":
                return Response(200, _OPENAPI)
            return await api_route(self, request)
        return await handler(request)

    async def _send(self, send: Send, response: Response, record: RecordedRequest) -> None:
        body = response.body
        if response.status == 204:
            headers: list[tuple[bytes, bytes]] = []
        else:
            headers = [
                (b"content-type", response.content_type),
                (b"content-length", str(len(body)).encode()),
                *response.headers,
            ]
        try:
            await send(
                {"type": "http.response.start", "status": response.status, "headers": headers}
            )
            await send({"type": "http.response.body", "body": body})
        except BaseException:
            if response.undo is not None:
                response.undo()
            raise
        record.status = response.status
        record.answer_time = trio.current_time()

    # -- worker routes ------------------------------------------------------------------

    async def _take(self, request: Request) -> Response:
        return await self._take_jobs(request, 1, batch=False)

    async def _take_batch(self, request: Request) -> Response:
        try:
            batch_size = int(request.query.get("batch_size", "1"))
        except ValueError:
            return json_response(400, {"error": "batch_size must be an integer"})
        return await self._take_jobs(request, max(batch_size, 1), batch=True)

    async def _take_jobs(self, request: Request, limit: int, *, batch: bool) -> Response:
        worker = request.args[0]
        self._workers[worker] = request.record.time

        def attempt() -> Handout | None:
            return self._take_nowait(worker, limit, batch)

        self._takes_waiting += 1
        try:
            handout = await hold(request, self.take_hold, attempt, self._queue_changed)
        finally:
            self._takes_waiting -= 1
        if handout is None:
            return NO_CONTENT
        return Response(
            200,
            handout.body,
            handout.content_type.encode(),
            undo=lambda: self._undo_handout(handout),
        )

    async def _stop(self, request: Request) -> Response:
        worker = request.args[0]

        def attempt() -> list[str] | None:
            return self._deliverable_stops(worker) or None

        self._stops_waiting += 1
        try:
            job_ids = await hold(request, self.stop_hold, attempt, self._stops_changed)
        finally:
            self._stops_waiting -= 1
        if job_ids is None:
            return NO_CONTENT
        delivered = self._mark_stops_delivered(job_ids)
        return Response(
            200,
            encode_json({"jobsToStop": job_ids}),
            undo=lambda: self._restore_stops(delivered),
        )

    def _report_target(self, request: Request) -> tuple[str, JobRecord | None, object]:
        """(pod, job, parsed body) of a job-done/job-stream POST.

        Raises:
            ValueError: if the body is not JSON.
        """
        pod, job_id = request.args
        return pod, self._jobs.get(job_id), parse_json(request.body)

    async def _done(self, request: Request) -> Response:
        try:
            pod, job, body = self._report_target(request)
        except ValueError:
            return json_response(400, {"error": "body is not JSON"})
        if job is None:
            self._unknown_reports += 1
            return json_response(404, {"error": "unknown job"})
        if isinstance(body, dict) and body.get("status") == "IN_PROGRESS":
            self._record_progress(job, body.get("output"))
        else:
            self._finish(job, body, pod, request.query.get("isStream") == "true")
        return OK

    async def _stream(self, request: Request) -> Response:
        try:
            _, job, body = self._report_target(request)
        except ValueError:
            return json_response(400, {"error": "body is not JSON"})
        if job is None:
            self._unknown_reports += 1
            return json_response(404, {"error": "unknown job"})
        job.stream.append(body["output"] if isinstance(body, dict) and "output" in body else body)
        return OK

    async def _ping(self, request: Request) -> Response:
        ids = request.query.get("job_id", "")
        job_ids = tuple(i for i in ids.split(",") if i) if ids else ()
        self._record_ping(request.args[0], job_ids, request.query)
        return OK


def _declared_size(headers: dict[str, str]) -> int:
    """The body size a request's head declares (0 when it declares none or garbage: the
    read then enforces the limit as the body arrives)."""
    try:
        return int(headers.get("content-length", "0"))
    except ValueError:
        return 0


def _key_matches(headers: dict[str, str], api_key: str) -> bool:
    sent = headers.get("authorization", "")
    # In constant time, so the key cannot be guessed a byte at a time from the timings.
    return hmac.compare_digest(sent.encode("latin-1"), api_key.encode("latin-1"))


def match_route(path: str) -> tuple[str, list[str]]:
    """(route name, path arguments) for *path*; ``("not_found", [])`` if none."""
    parts = path.strip("/").split("/")
    if len(parts) >= 3 and parts[0] == "v2":
        spec = _WORKER_ROUTES.get(parts[2])
        if spec is not None:
            name, arity = spec
            if len(parts) == 3 + arity:
                return name, parts[3:]
            return "not_found", []
        parts = parts[2:]  # the endpoint API under /v2/{ep}/
    spec = _API_ROUTES.get(parts[0])
    if spec is not None and len(parts) == 1 + spec[1]:
        return spec[0], parts[1:]
    return "not_found", []
