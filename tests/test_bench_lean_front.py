"""The benchmark platform's lean HTTP front (``benchmarks/_lean_front.py``) serves its
clients as the ASGI path would.

Tested over real loopback with the real clock (MockClock's autojump does not count socket
latency), every wait bounded by ``trio.fail_after``. Answers are read with h11, a parser
the front does not use.
"""

from __future__ import annotations

import json
import sys
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import h11
import pytest
import trio
import trio.testing

# The benchmarks package is not installed (nor part of the wheel): it is imported from the
# checkout, found after everything installed, so trio_worker stays the installed one.
sys.path.append(str(Path(__file__).resolve().parents[1]))

from benchmarks._lean_front import KEEP_ALIVE_TIMEOUT, MAX_HEAD, LeanRequest, _Socket, serve_lean
from benchmarks.platform_server import BenchPlatform
from trio_worker.testing import Fault
from trio_worker.testing._http_server import serve_asgi

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from trio_worker.testing._http_server import Receive, Scope, Send

pytestmark = pytest.mark.timeout(10)


if TYPE_CHECKING:
    Answer = tuple[int, dict[str, str], bytes]
    Serve = Callable[..., Awaitable[None]]
    Connect = Callable[[], Awaitable[tuple[trio.SocketStream, "Reader"]]]


class CountingPlatform(BenchPlatform):
    """A BenchPlatform that notes the path of every request its ASGI side serves."""

    def __init__(self) -> None:
        super().__init__(take_hold=0.0, stop_hold=0.0, preload=0)
        self.asgi_paths: list[str] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.asgi_paths.append(scope["path"])
        await super().__call__(scope, receive, send)


@asynccontextmanager
async def serving(serve: Serve) -> AsyncIterator[tuple[CountingPlatform, Connect]]:
    """A BenchPlatform (recording every request) served by *serve* on loopback, and a
    way to open connections to it (closed on the way out)."""
    app = CountingPlatform()
    app.platform.record_requests = True
    streams: list[trio.SocketStream] = []
    async with trio.open_nursery() as nursery:
        if serve is serve_lean:
            port = await nursery.start(serve_lean, app, app.fast)
        else:
            port = await nursery.start(serve, app)

        async def connect() -> tuple[trio.SocketStream, Reader]:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            streams.append(stream)
            return stream, Reader(stream)

        try:
            yield app, connect
        finally:
            for stream in streams:
                await trio.aclose_forcefully(stream)
            nursery.cancel_scope.cancel()


def post(target: str, body: bytes, extra: bytes = b"") -> bytes:
    return (
        b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n%s\r\n" % (target.encode(), len(body), extra)
    ) + body


def stream_post(job_id: str, output: object, extra: bytes = b"") -> bytes:
    body = json.dumps({"output": output}).encode()
    return post(f"/v2/ep/job-stream/pod-1/{job_id}", body, extra)


def get(target: str, extra: bytes = b"") -> bytes:
    return b"GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n%s\r\n" % (target.encode(), extra)


class Reader:
    """Reads answers off a connection with h11, counting the reads it took."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.conn = h11.Connection(h11.CLIENT)
        self.reads = 0

    async def answer(self, method: str = "POST") -> Answer:
        conn = self.conn
        if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
            conn.start_next_cycle()
        # h11 reads an answer only for a request it has sent: it is told the method, and
        # the bytes it would send are dropped (the test wrote its own).
        headers = [("host", "127.0.0.1"), ("content-length", "0")]
        conn.send(h11.Request(method=method, target="/", headers=headers))
        conn.send(h11.EndOfMessage())
        status, fields, body = 0, {}, b""
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                self.reads += 1
                conn.receive_data(await self.stream.receive_some(1 << 20))
            elif isinstance(event, h11.Response):
                status = event.status_code
                fields = {k.decode(): v.decode() for k, v in event.headers}
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                return status, fields, body
            elif not isinstance(event, h11.InformationalResponse):
                raise AssertionError(f"unexpected {event!r}")


async def test_pipelined_requests_are_answered_in_order_in_one_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    writes: list[bytes] = []
    send_all = _Socket.send_all

    async def recording_send_all(self: _Socket, data: bytes) -> None:
        writes.append(data)
        await send_all(self, data)

    monkeypatch.setattr(_Socket, "send_all", recording_send_all)
    async with serving(serve_lean) as (app, connect):
        app.platform.enqueue({}, job_id="job-a")
        outputs = [{"i": i, "t": time.time()} for i in range(5)]
        requests = [stream_post("job-a", output) for output in outputs[:3]]
        requests += [stream_post("nope", 9), *(stream_post("job-a", o) for o in outputs[3:])]
        with trio.fail_after(5):
            stream, reader = await connect()
            await stream.send_all(b"".join(requests))
            answers = [await reader.answer() for _ in requests]

    assert [(status, body) for status, _, body in answers] == [
        (200, b"{}"),
        (200, b"{}"),
        (200, b"{}"),
        (404, b'{"error":"unknown job"}'),
        (200, b"{}"),
        (200, b"{}"),
    ]
    assert len(writes) == 1  # in one send_all
    assert reader.reads == 1  # and so in the first read
    assert app.asgi_paths == []  # all answered by the fast path
    assert app.platform.job("job-a").stream == outputs  # recorded in request order
    assert len(app.chunk_latency_ms) == 5  # one per output with a float "t"
    stats = app.platform.statistics()
    assert stats.requests_by_route == {"stream": 6}
    assert stats.unknown_job_reports == 1


async def test_a_request_split_across_reads_is_answered_once_complete() -> None:
    request = stream_post("job-a", {"i": 1})
    body_start = request.index(b"\r\n\r\n") + 4
    # Inside the request line, inside the head's terminator, inside the body.
    cuts = [10, body_start - 2, body_start + 5, len(request)]
    async with serving(serve_lean) as (app, connect):
        job = app.platform.job(app.platform.enqueue({}, job_id="job-a"))
        with trio.fail_after(5):
            stream, reader = await connect()
            start = 0
            for cut in cuts[:-1]:
                await stream.send_all(request[start:cut])
                start = cut
                # The server has read and parsed this piece once every task is blocked.
                await trio.testing.wait_all_tasks_blocked(0.01)
                assert job.stream == []
            # The rest arrives with the next request's head and the start of its body.
            second = stream_post("job-a", {"i": 2})
            cut = second.index(b"\r\n\r\n") + 7
            await stream.send_all(request[start:] + second[:cut])
            first_answer = await reader.answer()
            await trio.testing.wait_all_tasks_blocked(0.01)
            assert job.stream == [{"i": 1}]
            await stream.send_all(second[cut:])
            second_answer = await reader.answer()

    assert first_answer[0] == second_answer[0] == 200
    assert job.stream == [{"i": 1}, {"i": 2}]


async def test_expect_100_continue_is_answered_before_the_body() -> None:
    request = stream_post("job-a", {"i": 1}, extra=b"Expect: 100-continue\r\n")
    body_start = request.index(b"\r\n\r\n") + 4
    async with serving(serve_lean) as (app, connect):
        job = app.platform.job(app.platform.enqueue({}, job_id="job-a"))
        with trio.fail_after(5):
            stream, reader = await connect()
            await stream.send_all(request[:body_start])
            assert await stream.receive_some(1 << 20) == b"HTTP/1.1 100 Continue\r\n\r\n"
            await stream.send_all(request[body_start:])
            status, _, _ = await reader.answer()
    assert status == 200
    assert job.stream == [{"i": 1}]


@pytest.mark.parametrize(
    "head",
    [
        pytest.param(b"NOT A REQUEST\r\n\r\n", id="request-line"),
        pytest.param(b"GET x HTTP/1.1\r\n\r\n", id="target"),
        pytest.param(b"GET /x HTTP/2.0\r\n\r\n", id="version"),
        pytest.param(b"GET /x HTTP/1.1\r\nBad Name : 1\r\n\r\n", id="space-in-name"),
        pytest.param(b"GET /x HTTP/1.1\r\nA: 1\r\n folded\r\n\r\n", id="obs-fold"),
        pytest.param(b"GET /x HTTP/1.1\r\nA: 1\x00\r\n\r\n", id="control-character"),
        pytest.param(b"GET /x HTTP/1.1\nA: 1\r\n\r\n", id="bare-lf"),
        pytest.param(
            b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", id="chunked"
        ),
        pytest.param(
            b"POST /x HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nab",
            id="conflicting-lengths",
        ),
        pytest.param(b"POST /x HTTP/1.1\r\nContent-Length: \xb2\r\n\r\n", id="non-ascii-digit"),
        pytest.param(b"POST /x HTTP/1.1\r\nContent-Length: -1\r\n\r\n", id="negative-length"),
        pytest.param(b"GET /x HTTP/1.1\r\nA: " + b"a" * MAX_HEAD, id="oversized"),
    ],
)
async def test_a_malformed_head_is_answered_400_and_the_connection_closed(head: bytes) -> None:
    async with serving(serve_lean) as (app, connect):
        app.platform.enqueue({}, job_id="job-a")
        with trio.fail_after(5):
            stream, reader = await connect()
            # A good request ahead of it in the same write is still answered.
            await stream.send_all(stream_post("job-a", 1) + head)
            good = await reader.answer()
            bad = await reader.answer("GET")
            rest = await stream.receive_some(1 << 20)
    assert good[0] == 200
    assert bad[0] == 400
    assert bad[1]["connection"] == "close"
    assert rest == b""  # closed
    assert app.platform.statistics().requests == 1


async def test_injected_faults_apply_to_the_fast_path() -> None:
    async with serving(serve_lean) as (app, connect):
        job = app.platform.job(app.platform.enqueue({}, job_id="job-a"))
        with trio.fail_after(5):
            stream, reader = await connect()
            await stream.send_all(stream_post("job-a", 0))
            first = await reader.answer()
            app.platform.inject(Fault("stream", status=503))
            app.platform.inject(Fault("stream", drop=True))
            await stream.send_all(b"".join(stream_post("job-a", i) for i in range(1, 4)))
            second = await reader.answer()
            rest = await stream.receive_some(1 << 20)

    assert (first[0], second[0]) == (200, 503)
    assert rest == b""  # the answer before the drop went out, then the connection closed
    assert job.stream == [0]
    assert [(r.status, r.dropped) for r in app.platform.requests] == [
        (200, False),
        (503, False),
        (None, True),
    ]


async def test_other_routes_pass_through_to_the_asgi_app() -> None:
    async with serving(serve_lean) as (app, connect):
        app.platform.enqueue({"n": 1}, job_id="job-a")
        with trio.fail_after(5):
            stream, reader = await connect()
            await stream.send_all(get("/v2/ep/job-take/w1"))
            take = await reader.answer("GET")
            # Hot and pass-through routes pipelined together stay in order.
            await stream.send_all(
                stream_post("job-a", 1)
                + get("/_bench/progress")
                + stream_post("job-a", 2)
                + post("/v2/ep/job-done/pod-1/job-a", b'{"output": 3}')
                + get("/nope")
            )
            answers = [await reader.answer(m) for m in ("POST", "GET", "POST", "POST", "GET")]
            await stream.send_all(get("/_bench/report"))
            report = json.loads((await reader.answer("GET"))[2])

    assert app.asgi_paths == [
        "/v2/ep/job-take/w1",
        "/_bench/progress",
        "/v2/ep/job-done/pod-1/job-a",
        "/nope",
        "/_bench/report",
    ]
    assert take[0] == 200
    assert json.loads(take[2]) == {"id": "job-a", "input": {"n": 1}}
    assert [status for status, _, _ in answers] == [200, 200, 200, 200, 404]
    assert json.loads(answers[1][2]) == {"finished": 0, "handed_out": 1, "requests": 2}
    assert app.platform.job("job-a").stream == [1, 2]
    assert app.platform.job("job-a").status == "COMPLETED"
    assert [job["stream"] for job in report["jobs"]] == [2]
    assert set(report["first_request"]) == {"take", "done"}


async def test_a_request_pipelined_behind_a_long_poll_waits_for_its_answer() -> None:
    async with serving(serve_lean) as (app, connect):
        app.reset(0, take_hold=5.0, stop_hold=0.0)
        platform = app.platform
        with trio.fail_after(4):  # before the take's hold ends: answered by the enqueue
            stream, reader = await connect()
            await stream.send_all(get("/v2/ep/job-take/w1"))
            await platform.wait_for_requests("take", 1)
            await stream.send_all(stream_post("job-1", "chunk"))
            await trio.testing.wait_all_tasks_blocked(0.01)
            assert platform.statistics().requests_by_route == {"take": 1}  # it waits
            platform.enqueue({"n": 1}, job_id="job-1")
            take = await reader.answer("GET")
            chunk = await reader.answer()
    assert json.loads(take[2]) == {"id": "job-1", "input": {"n": 1}}
    assert chunk[0] == 200
    assert platform.job("job-1").stream == ["chunk"]


async def test_a_client_leaving_during_a_long_poll_ends_it() -> None:
    async with serving(serve_lean) as (app, connect):
        app.reset(0, take_hold=5.0, stop_hold=0.0)
        platform = app.platform
        with trio.fail_after(4):
            stream, _ = await connect()
            await stream.send_all(get("/v2/ep/job-take/w1"))
            await platform.wait_for_requests("take", 1)
            assert platform.statistics().takes_waiting == 1
            await stream.aclose()
            await trio.testing.wait_all_tasks_blocked(0.01)
        assert platform.statistics().takes_waiting == 0
        platform.enqueue({}, job_id="job-1")
    assert platform.job("job-1").status == "IN_QUEUE"  # never handed to the client that left


async def test_an_injected_drop_on_a_passed_through_route_closes_unanswered() -> None:
    async with serving(serve_lean) as (app, connect):
        app.platform.inject(Fault("take", drop=True))
        with trio.fail_after(5):
            stream, _ = await connect()
            await stream.send_all(get("/v2/ep/job-take/w1") + stream_post("job-a", 1))
            rest = await stream.receive_some(1 << 20)
    assert rest == b""
    assert app.platform.statistics().requests_by_route == {"take": 1}  # nothing after it


async def test_an_app_that_fails_gets_a_500_and_a_closed_connection() -> None:
    async def failing_app(scope: Scope, receive: Receive, send: Send) -> None:
        raise RuntimeError("the app failed")

    async def declining(request: LeanRequest) -> None:
        return None

    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_lean, failing_app, declining)
        with trio.fail_after(5):
            async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
                reader = Reader(stream)
                await stream.send_all(get("/x") + get("/y"))
                status, fields, _ = await reader.answer("GET")
                rest = await stream.receive_some(1 << 20)
        nursery.cancel_scope.cancel()
    assert status == 500
    assert fields["connection"] == "close"
    assert rest == b""


async def test_one_request_at_a_time_on_a_kept_alive_connection() -> None:
    """What aiohttp does: head and body written apart, each answer read before the next."""
    async with serving(serve_lean) as (app, connect):
        app.platform.enqueue({"n": 1}, job_id="job-a")
        with trio.fail_after(5):
            stream, reader = await connect()
            answers = []
            for method, request in [
                ("GET", get("/v2/ep/job-take/w1")),
                *(("POST", stream_post("job-a", i)) for i in range(3)),
                ("POST", post("/v2/ep/job-done/pod-1/job-a?isStream=true", b"{}")),
                ("GET", get("/_bench/report", b"Connection: close\r\n")),
            ]:
                body_start = request.index(b"\r\n\r\n") + 4
                await stream.send_all(request[:body_start])
                if body_start < len(request):
                    await stream.send_all(request[body_start:])
                answers.append(await reader.answer(method))
            rest = await stream.receive_some(1 << 20)

    assert [status for status, _, _ in answers] == [200] * 6
    assert all("connection" not in fields for _, fields, _ in answers[:-1])
    assert answers[-1][1]["connection"] == "close"
    assert rest == b""  # closed after the answer to "Connection: close"
    report = json.loads(answers[-1][2])
    assert [(job["stream"], job["status"]) for job in report["jobs"]] == [(3, "COMPLETED")]


async def test_an_idle_connection_is_closed(virtual_clock: trio.testing.MockClock) -> None:
    """Under MockClock: once every task waits, the clock jumps to the idle deadline."""
    async with serving(serve_lean) as (app, connect):
        app.platform.enqueue({}, job_id="job-a")
        stream, reader = await connect()
        await stream.send_all(stream_post("job-a", 1))
        answer = await reader.answer()
        answered = trio.current_time()
        rest = await stream.receive_some(1 << 20)
    assert answer[0] == 200
    assert rest == b""
    assert KEEP_ALIVE_TIMEOUT / 2 <= trio.current_time() - answered <= KEEP_ALIVE_TIMEOUT


async def test_stream_answers_and_records_match_the_asgi_path() -> None:
    """The same requests through ``serve_asgi`` and the front leave the same traces."""
    requests = [
        ("POST", stream_post("job-a", {"i": 0, "t": 1.5})),
        ("POST", stream_post("job-a", "text", b"Authorization: key\r\n")),
        ("POST", stream_post("nope", 1)),
        ("POST", post("/v2/ep/job-stream/pod-1/job-a", b"not json")),
        ("GET", get("/v2/ep/job-stream/pod-1/job-a")),
        ("POST", stream_post("job%2Fb", 2)),
        ("POST", stream_post("job-a?gpu=x&isStream=true", 3)),
        ("POST", stream_post("job-a&gpu=y", 4)),
        ("POST", post("/v2/ep/job-stream/pod-1", b"{}")),
    ]
    seen: list[dict[str, Any]] = []
    for serve in (serve_asgi, serve_lean):
        async with serving(serve) as (app, connect):
            app.platform.enqueue({}, job_id="job-a")
            app.platform.enqueue({}, job_id="job/b")
            with trio.fail_after(5):
                stream, reader = await connect()
                answers = []
                for method, request in requests:
                    await stream.send_all(request)
                    status, fields, body = await reader.answer(method)
                    answers.append((status, fields.get("content-type"), body))
        platform = app.platform
        stats = platform.statistics()
        seen.append(
            {
                "answers": answers,
                "streams": {job.id: job.stream for job in platform.jobs.values()},
                "routes": stats.requests_by_route,
                "unknown": stats.unknown_job_reports,
                "records": [
                    (r.method, r.route, r.path, r.query, r.headers, r.body, r.status)
                    for r in platform.requests
                ],
                "answered": all(r.answer_time is not None for r in platform.requests),
                "latencies": len(app.chunk_latency_ms),
                "first": set(app.first_request),
            }
        )
        paths = app.asgi_paths
    asgi, lean = seen
    assert lean == asgi
    assert paths == ["/v2/ep/job-stream/pod-1"]  # the front answered all the others
    statuses = [status for status, _, _ in lean["answers"]]
    assert statuses == [200, 200, 404, 400, 405, 200, 200, 200, 404]
    assert lean["streams"] == {"job-a": [{"i": 0, "t": 1.5}, "text", 3, 4], "job/b": [2]}
