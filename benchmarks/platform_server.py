"""The fake platform of ``trio_worker.testing`` as its own process, plus benchmark routes.

``python benchmarks/platform_server.py --port 0`` prints its base URL as the first line of
stdout and serves until SIGINT/SIGTERM, exactly like ``python -m trio_worker.testing``. The
worker routes and ``/_stats``/``/_env`` are the unmodified :class:`FakePlatform`; this
wrapper only adds what a benchmark needs and the stock ``/_stats`` does not give:

* wall-clock times: every time it reports is ``time.time()`` (the platform's
  ``trio.current_time()`` plus an offset computed *inside* this process, so there is no
  round-trip error), comparable with the harness's own ``time.time()`` readings;
* when each take answer was *sent* (handed to the socket), per job;
* when the first request of each kind (take, stop, ping, done) arrived;
* when a stop signal was delivered, and how many stream chunks arrived, per job;
* for each stream chunk carrying ``"t"`` (the wall-clock time of its ``yield``), the time
  from that ``yield`` to the chunk's arrival here, in ms (``chunk_latency_ms``).

Benchmark routes (all answer JSON):

==============================  ===================================================
``POST /_bench/reset?preload=N&take_hold=S&stop_hold=S``  a fresh FakePlatform with N queued jobs
``GET  /_bench/progress``       ``{"finished": n, "handed_out": n, "requests": n}``
``GET  /_bench/report``         first-request times and per-job wall-clock timestamps
``GET  /_bench/clock``          ``{"wall": time.time(), "trio": trio.current_time()}``
==============================  ===================================================

The job-done time is recorded by the platform when the report arrives, the take time when
the take answer is written to the socket; their difference is what the worker adds.

Served by ``benchmarks/_lean_front.py``, not by ``trio_worker.testing``'s h11 server: the
stream figures send one POST per chunk, and parsing each with h11 and passing it through
ASGI cost the platform more CPU per chunk than the workers it measures. Job-stream POSTs
go straight to :func:`answer_directly` (the platform's own request handling minus ASGI);
every other request reaches :class:`BenchPlatform` as ASGI, unchanged.

Its cyclic garbage collector runs between figures (at each reset), never during one: a
full collection of the platform's records stalled it for 30-50 ms, and every chunk then
waiting on it counted as the worker's latency (the paced-streams p99 read 36-41 ms with it
and 7-9 ms without, same code, same machine). Reference counting still frees everything
acyclic as it goes; the cycles of one figure wait for the next reset.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote

import trio

if __package__ in (None, ""):
    # Run as a script by the harness, whose environment has no PYTHONPATH: the checkout
    # this file lives in must be importable (its benchmarks package, and its trio_worker
    # rather than whatever the interpreter has installed).
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._lean_front import serve_lean
from trio_worker._endpoint._app import match_route as _match
from trio_worker._endpoint._records import RecordedRequest
from trio_worker._endpoint._routes import Request, parse_query
from trio_worker.testing import ConnectionDropped, FakePlatform

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, MutableMapping, Sequence

    from benchmarks._lean_front import Answer, LeanRequest
    from trio_worker._endpoint._routes import Response

    Message = MutableMapping[str, Any]
    Scope = MutableMapping[str, Any]
    Receive = Callable[[], Awaitable[Message]]
    Send = Callable[[Message], Awaitable[None]]

_KINDS = (("/job-take", "take"), ("/job-stop/", "stop"), ("/job-done/", "done"), ("/ping/", "ping"))


def _kind(path: str) -> str | None:
    """The worker route kind of *path* (take and batch take are both "take")."""
    if not path.startswith("/v2/"):
        return None
    for fragment, kind in _KINDS:
        if fragment in path:
            return kind
    return None


def _job_ids(body: bytes) -> list[str]:
    """The ids of the jobs in a take answer (one object or a list of them)."""
    try:
        value = json.loads(body)
    except ValueError:
        return []
    items = value if isinstance(value, list) else [value]
    return [item["id"] for item in items if isinstance(item, dict) and "id" in item]


def _stream_output(body: bytes) -> object:
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return value.get("output") if isinstance(value, dict) else None


class BenchPlatform:
    """An ASGI app: a swappable :class:`FakePlatform` plus the ``/_bench/`` routes."""

    def __init__(self, take_hold: float, stop_hold: float, preload: int) -> None:
        self.platform: FakePlatform
        self.first_request: dict[str, float] = {}
        self.sent: dict[str, float] = {}
        self.chunk_latency_ms: list[float] = []
        self.reset(preload, take_hold, stop_hold)

    def reset(self, preload: int, take_hold: float, stop_hold: float) -> None:
        gc.collect()  # the previous figure's cycles, while nobody is measured (see above)
        self.platform = FakePlatform(
            take_hold=take_hold, stop_hold=stop_hold, record_requests=False
        )
        self.first_request = {}
        self.sent = {}
        self.chunk_latency_ms = []
        for i in range(preload):
            self.platform.enqueue({"n": i})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.platform(scope, receive, send)
            return
        path: str = scope["path"]
        if path.startswith("/_bench/"):
            await self._bench(path, scope, send)
            return
        if self._note_kind(path) == "take":
            send = self._timed_send(send)
        if "/job-stream/" in path:
            receive = self._timed_receive(receive)
        await self.platform(scope, receive, send)

    async def fast(self, request: LeanRequest) -> Answer | None:
        """A job-stream POST, answered without ASGI; None (go to :meth:`__call__`) otherwise.

        The hot route of the stream figures: it gets what :meth:`__call__` gives it (the
        first-request time and the chunk latency) and FakePlatform's own answer.
        """
        raw_path = request.path
        if "/job-stream/" not in raw_path:
            return None
        route, args = _match(raw_path)
        if route != "stream":
            return None
        path = unquote(raw_path) if "%" in raw_path else raw_path
        self._note_kind(path)
        self._note_chunk(request.body)
        response = await answer_directly(self.platform, request, route, args, path)
        if response.status == 204:
            return 204, [], b""
        headers = [(b"content-type", response.content_type), *response.headers]
        return response.status, headers, response.body

    def _note_kind(self, path: str) -> str | None:
        kind = _kind(path)
        if kind is not None and kind not in self.first_request:
            self.first_request[kind] = trio.current_time()
        return kind

    def _note_chunk(self, body: bytes) -> None:
        now = time.time()
        output = _stream_output(body)
        if isinstance(output, dict) and isinstance(output.get("t"), float):
            self.chunk_latency_ms.append((now - output["t"]) * 1000)

    def _timed_receive(self, receive: Receive) -> Receive:
        body = bytearray()

        async def timed() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                body.extend(message.get("body", b""))
                if not message.get("more_body"):
                    self._note_chunk(bytes(body))
            return message

        return timed

    def _timed_send(self, send: Send) -> Send:
        sent = self.sent

        async def timed(message: Message) -> None:
            # The time is taken just before the body is handed to the socket: send_all
            # writes it at once and only then yields to the scheduler, and by the time this
            # task runs again the worker may already have reported the job.
            now = trio.current_time()
            await send(message)
            if message["type"] == "http.response.body" and message.get("body"):
                for job_id in _job_ids(message["body"]):
                    sent[job_id] = now

        return timed

    async def _bench(self, path: str, scope: Scope, send: Send) -> None:
        query = dict(parse_qsl(scope["query_string"].decode("latin-1")))
        answer: object
        if path == "/_bench/reset":
            self.reset(
                int(query.get("preload", "0")),
                float(query.get("take_hold", "5")),
                float(query.get("stop_hold", "5")),
            )
            answer = {"ok": True}
        elif path == "/_bench/progress":
            stats = self.platform.statistics()
            answer = {
                "finished": stats.completed + stats.failed,
                "handed_out": stats.jobs_handed_out,
                "requests": stats.requests,
            }
        elif path == "/_bench/report":
            answer = self._report()
        elif path == "/_bench/clock":
            answer = {"wall": time.time(), "trio": trio.current_time()}
        else:
            await _send_json(send, 404, {"error": f"no route {path}"})
            return
        await _send_json(send, 200, answer)

    def _report(self) -> dict[str, object]:
        offset = time.time() - trio.current_time()

        def wall(t: float | None) -> float | None:
            return None if t is None else t + offset

        jobs = [
            {
                "id": job.id,
                "status": job.status,
                "take": wall(job.take_time),
                "sent": wall(self.sent.get(job.id)),
                "done": wall(job.done_time),
                "stop_delivered": wall(job.stop_delivered_time),
                "stream": len(job.stream),
                "takes": job.takes,
            }
            for job in self.platform.jobs.values()
        ]
        stats = self.platform.statistics()
        return {
            "offset": offset,
            "first_request": {k: wall(t) for k, t in self.first_request.items()},
            "requests_by_route": stats.requests_by_route,
            "pings": stats.pings,
            "duplicate_reports": stats.duplicate_reports,
            "jobs": jobs,
            "chunk_latency_ms": self.chunk_latency_ms,
        }


async def answer_directly(
    platform: FakePlatform, request: LeanRequest, route: str, args: list[str], path: str
) -> Response:
    """``FakePlatform.__call__`` for a worker-route request already read whole, minus ASGI.

    The same steps in the same order, through the platform's own methods: the request is
    recorded and counted, deadlines checked, an armed fault applied, the method and key
    checked, and the route answers. Only for routes that never call ``receive`` (take and
    stop do, to notice a client that leaves during their long-poll).

    Raises:
        ConnectionDropped: an injected ``Fault(drop=True)``.
    """
    query = _parse_query(request.query)
    if args and "&" in args[-1]:
        # As FakePlatform: parameters appended to a template without "?" (docs/protocol.md §1.5).
        args[-1], _, extra = args[-1].partition("&")
        query.update(parse_qsl(extra, keep_blank_values=True))
    args = [unquote(arg) for arg in args]
    now = trio.current_time()
    record = RecordedRequest(now, request.method, route, path, query, request.fields, request.body)
    platform._record_request(record)
    platform._check_deadlines(now)
    try:
        response = await platform._answer(
            Request(record, args, _no_receive), platform._take_fault(route)
        )
    except ConnectionDropped:
        record.dropped = True
        raise
    # Set as FakePlatform sets them after its send; the answer goes out in the same pass.
    # No undo is lost: only take and stop answers carry one.
    record.status = response.status
    record.answer_time = trio.current_time()
    return response


@functools.lru_cache(maxsize=64)
def _parsed_query(query: str) -> tuple[tuple[str, str], ...]:
    # A worker sends every chunk with the same query: parse it once.
    return tuple(parse_query(query.encode("latin-1")).items())


def _parse_query(query: str) -> dict[str, str]:
    return dict(_parsed_query(query)) if query else {}


async def _no_receive() -> Message:
    raise RuntimeError("a route answered directly must not read the connection")


async def _send_json(send: Send, status: int, value: object) -> None:
    body = json.dumps(value, separators=(",", ":")).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--preload", type=int, default=0)
    parser.add_argument("--take-hold", type=float, default=5.0)
    parser.add_argument("--stop-hold", type=float, default=5.0)
    return parser.parse_args(argv)


async def _serve(args: argparse.Namespace) -> None:
    app = BenchPlatform(args.take_hold, args.stop_hold, args.preload)
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve_lean, app, app.fast, args.host, args.port)
            print(f"http://{args.host}:{port}", flush=True)
            async for _ in signals:
                break
            nursery.cancel_scope.cancel()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    gc.disable()  # collected at each reset instead (see the module's docstring)
    try:
        trio.run(_serve, args)
    except OSError as exc:
        print(f"cannot serve on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
