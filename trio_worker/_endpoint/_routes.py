"""HTTP plumbing of the endpoint app, and its endpoint (client) API routes.

The worker routes live on :class:`~._app.EndpointApp` itself; what is here is shared by
both: the request/response objects, the long-poll helper :func:`hold`, body parsing, and
the endpoint API (``/run``, ``/runsync``, ``/status``, ``/stream``, ``/cancel``,
``/health``, ``/purge-queue``).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Final, TypeVar
from urllib.parse import parse_qsl

import trio

from ._asgi import AbortConnection
from ._queue import encode_json
from ._rules import DISCARD_LIMIT, RequestRefused, check_submission, status_object

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._asgi import Message, Receive, Send
    from ._records import RecordedRequest
    from ._state import PlatformState

_T = TypeVar("_T")

JSON_TYPE: Final = b"application/json"


class ClientGone(Exception):
    """The client disconnected while its request was held; nothing is sent."""


class BodyTooLarge(Exception):
    """The request body passed its route's limit (it was read and dropped)."""


class Response:
    """What a route answers; ``undo`` runs if the answer cannot be delivered."""

    __slots__ = ("body", "content_type", "headers", "status", "undo")

    def __init__(
        self,
        status: int,
        body: bytes = b"",
        content_type: bytes = JSON_TYPE,
        undo: Callable[[], None] | None = None,
        headers: tuple[tuple[bytes, bytes], ...] = (),
    ) -> None:
        self.status = status
        self.body = body
        self.content_type = content_type
        self.undo = undo
        self.headers = headers  # extra headers, beyond the type and length


def json_response(status: int, value: object) -> Response:
    return Response(status, encode_json(value))


NO_CONTENT: Final = Response(204)
OK: Final = Response(200, b"{}")


class Request:
    """One parsed request, as the routes see it."""

    __slots__ = ("args", "body", "headers", "method", "query", "receive", "record", "route")

    def __init__(self, record: RecordedRequest, args: list[str], receive: Receive) -> None:
        self.record = record
        self.route = record.route
        self.method = record.method
        self.query = record.query
        self.headers = record.headers
        self.body = record.body
        self.args = args
        self.receive = receive


async def hold(
    request: Request,
    seconds: float,
    attempt: Callable[[], _T | None],
    lot: trio.lowlevel.ParkingLot,
) -> _T | None:
    """Long-poll: retry ``attempt()`` until it gives a result, *seconds* pass or the client
    leaves; None on timeout.

    *lot* must be unparked by every change that can make ``attempt()`` succeed; the
    predicate is checked and the task parked with no checkpoint in between, so no wake-up
    is lost and nothing polls. A second task watches ``receive()`` for
    ``http.disconnect``, so a client that gave up is never answered with a job it will
    not read. The fast path (``attempt()`` succeeds at once) starts no task.

    Raises:
        ClientGone: if the client disconnected before a result was found.
    """
    result = attempt()
    if result is not None or seconds <= 0:
        return result
    gone = False

    async def watch_disconnect(scope: trio.CancelScope) -> None:
        nonlocal gone
        message = await request.receive()
        if message["type"] != "http.disconnect":
            await trio.sleep_forever()  # nothing else is expected after the body
        gone = True
        scope.cancel()

    with trio.move_on_after(seconds):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_disconnect, nursery.cancel_scope)
            while (result := attempt()) is None:
                await lot.park()
            nursery.cancel_scope.cancel()
    if gone and result is None:
        raise ClientGone
    return result


def parse_query(query_string: bytes) -> dict[str, str]:
    if not query_string:
        return {}
    return dict(parse_qsl(query_string.decode("latin-1"), keep_blank_values=True))


def parse_json(body: bytes) -> object:
    """Parse *body* as JSON, whatever the Content-Type said (docs/protocol.md §2.3).

    Raises:
        ValueError: if it is not valid JSON.
    """
    return json.loads(body)


async def read_body(receive: Receive, limit: int | None = None) -> bytes:
    """The whole request body, at most *limit* bytes of it kept.

    A body past *limit* is still read to its end (up to ``DISCARD_LIMIT``) but not kept,
    so the client, which sends its whole body before it reads, gets the 413.

    Raises:
        ClientGone: if the client disconnected first.
        BodyTooLarge: past *limit*.
        AbortConnection: past ``DISCARD_LIMIT``: the connection is closed unanswered.
    """
    message = await receive()
    if message["type"] == "http.disconnect":
        raise ClientGone
    body: bytes = message.get("body", b"")
    if not message.get("more_body", False) and (limit is None or len(body) <= limit):
        return body
    chunks = [body]
    size = len(body)
    while message.get("more_body", False):
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if limit is not None and size > limit:
            chunks.clear()
            if size > DISCARD_LIMIT:
                raise AbortConnection("request body far past its limit")
        else:
            chunks.append(chunk)
    if limit is not None and size > limit:
        raise BodyTooLarge
    return b"".join(chunks)


async def lifespan(receive: Receive, send: Send) -> None:
    """Accept ASGI lifespan events, so the app also runs under other ASGI servers."""
    while True:
        message: Message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


# -- the endpoint API ----------------------------------------------------------------------


async def api_route(platform: PlatformState, request: Request) -> Response:
    """Answer one endpoint API request (any route name starting ``api_``)."""
    route = request.route
    if route in ("api_run", "api_runsync"):
        return await _run(platform, request, sync=route == "api_runsync")
    if route == "api_health":
        return json_response(200, _health(platform))
    if route == "api_purge_queue":
        return json_response(200, {"removed": platform.purge_queue(), "status": "completed"})
    job = platform.jobs.get(request.args[0])
    if job is None:
        return json_response(404, {"error": f"job {request.args[0]!r} not found"})
    if route == "api_cancel":
        platform.cancel(job.id)
    elif route == "api_stream":
        chunks = job.stream[job.stream_cursor :]
        job.stream_cursor = len(job.stream)
        answer = {"id": job.id, "status": job.status, "stream": [{"output": c} for c in chunks]}
        return json_response(200, answer)
    return json_response(200, status_object(job))


async def _run(platform: PlatformState, request: Request, *, sync: bool) -> Response:
    """Check the whole request (docs/protocol.md §4.1), and only then queue it."""
    try:
        body = parse_json(request.body)
    except ValueError:
        return json_response(400, {"error": "the body is not JSON"})
    try:
        submission = check_submission(body, request.query, sync=sync)
    except RequestRefused as refused:
        return json_response(refused.status, {"error": refused.message})
    job = platform.submit(submission)
    if submission.wait is None:
        return json_response(200, {"id": job.id, "status": "IN_QUEUE"})
    wait = submission.wait if "wait" in request.query else platform.runsync_wait
    await hold(request, wait, lambda: job if job.finished else None, platform.status_changed)
    return json_response(200, status_object(job))


def _health(platform: PlatformState) -> dict[str, object]:
    stats = platform.statistics()
    running = {job.taken_by for job in platform.held.values()}
    return {
        "jobs": {
            "completed": stats.completed,
            "failed": stats.failed,
            "inProgress": stats.in_progress,
            "inQueue": stats.in_queue,
            "cancelled": stats.cancelled,
            "retried": stats.requeues,
        },
        "workers": {"running": len(running), "idle": len(set(stats.workers) - running)},
    }
