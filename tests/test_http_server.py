"""The h11-based ASGI server, over real loopback sockets.

These use the real clock (MockClock's autojump jumps only when no task is runnable and no
I/O is ready; a real socket's latency does not count, so virtual timeouts fire before the
server answers; see trio.testing.MockClock in
https://trio.readthedocs.io/en/stable/reference-testing.html), so every wait is on an
event, bounded by ``trio.fail_after``, never a sleep.
"""

from __future__ import annotations

import json
from functools import partial
from typing import TYPE_CHECKING

import httpx
import pytest
import trio

from trio_worker.testing._http_server import AbortConnection, run_server_in_thread, serve_asgi

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from trio_worker.testing._http_server import Message, Receive, Scope, Send

    App = Callable[[Scope, Receive, Send], Awaitable[None]]

pytestmark = pytest.mark.timeout(10)


async def read_all(receive: Receive) -> tuple[bytes, int]:
    """The request body, and how many ``http.request`` messages carried it."""
    body = b""
    messages = 0
    while True:
        message = await receive()
        assert message["type"] == "http.request"
        messages += 1
        body += message.get("body", b"")
        if not message.get("more_body", False):
            return body, messages


async def respond(
    send: Send, status: int, body: bytes, content_type: bytes = b"text/plain"
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", content_type)],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def echo_app(scope: Scope, receive: Receive, send: Send) -> None:
    """Answer with the request as JSON, so tests can check the ASGI scope."""
    body, messages = await read_all(receive)
    answer = {
        "type": scope["type"],
        "asgi": scope["asgi"],
        "http_version": scope["http_version"],
        "method": scope["method"],
        "scheme": scope["scheme"],
        "path": scope["path"],
        "raw_path": scope["raw_path"].decode(),
        "query_string": scope["query_string"].decode(),
        "root_path": scope["root_path"],
        "headers": [[k.decode(), v.decode()] for k, v in scope["headers"]],
        "client": list(scope["client"]),
        "server": list(scope["server"]),
        "body": body.decode(),
        "messages": messages,
    }
    await respond(send, 200, json.dumps(answer).encode(), b"application/json")


async def start_server(nursery: trio.Nursery, app: App) -> str:
    port = await nursery.start(serve_asgi, app)
    return f"http://127.0.0.1:{port}"


@pytest.fixture
async def echo_url(nursery: trio.Nursery) -> str:
    return await start_server(nursery, echo_app)


async def test_get_and_post_round_trip(echo_url: str) -> None:
    async with httpx.AsyncClient(base_url=echo_url) as client:
        got = (await client.get("/some%20where/x?a=1&b=two", headers={"X-Thing": "Yes"})).json()
        posted = await client.post("/submit", content=b"payload bytes")

    assert got["type"] == "http"
    assert got["asgi"]["version"] == "3.0"
    assert got["http_version"] == "1.1"
    assert got["method"] == "GET"
    assert got["scheme"] == "http"
    assert got["path"] == "/some where/x"
    assert got["raw_path"] == "/some%20where/x"
    assert got["query_string"] == "a=1&b=two"
    assert got["root_path"] == ""
    assert ["x-thing", "Yes"] in got["headers"]  # names lowercased, values kept
    assert got["client"][0] == "127.0.0.1"
    assert got["server"] == ["127.0.0.1", int(echo_url.rsplit(":", 1)[1])]
    assert posted.status_code == 200
    assert posted.headers["content-length"] == str(len(posted.content))
    assert posted.json()["method"] == "POST"
    assert posted.json()["body"] == "payload bytes"


async def test_keep_alive_reuses_one_connection(echo_url: str) -> None:
    async with httpx.AsyncClient(base_url=echo_url) as client:
        ports = {(await client.get(f"/n/{i}")).json()["client"][1] for i in range(5)}
    assert len(ports) == 1


async def test_chunked_request_body(echo_url: str) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for part in (b"first,", b"second,", b"third"):
            yield part

    async with httpx.AsyncClient(base_url=echo_url) as client:
        answer = (await client.post("/chunked", content=chunks())).json()
    assert ["transfer-encoding", "chunked"] in answer["headers"]
    assert answer["body"] == "first,second,third"


async def test_streamed_response_body(nursery: trio.Nursery) -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await read_all(receive)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for part in (b"a", b"b", b"c"):
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    url = await start_server(nursery, app)
    async with httpx.AsyncClient(base_url=url) as client:
        first = await client.get("/")
        second = await client.get("/")  # the chunked framing left the connection usable
    assert first.content == second.content == b"abc"
    assert first.headers["transfer-encoding"] == "chunked"


async def test_app_exception_gives_500_and_server_survives(nursery: trio.Nursery) -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await read_all(receive)
        if scope["path"] == "/boom":
            raise RuntimeError("app bug")
        if scope["path"] == "/silent":
            return  # no response at all
        await respond(send, 200, b"fine")

    url = await start_server(nursery, app)
    async with httpx.AsyncClient(base_url=url) as client:
        boom = await client.get("/boom")
        silent = await client.get("/silent")
        fine = await client.get("/ok")
    assert boom.status_code == 500
    assert boom.headers["connection"] == "close"
    assert silent.status_code == 500
    assert fine.status_code == 200


async def test_abort_connection_drops_without_answer(nursery: trio.Nursery) -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await read_all(receive)
        raise AbortConnection

    url = await start_server(nursery, app)
    async with httpx.AsyncClient(base_url=url) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            await client.get("/")


async def test_concurrent_clients_are_served_concurrently(nursery: trio.Nursery) -> None:
    clients = 12
    arrived = 0
    all_here = trio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        nonlocal arrived
        await read_all(receive)
        arrived += 1
        if arrived == clients:
            all_here.set()
        await all_here.wait()  # nobody is answered until every request is in flight
        await respond(send, 200, scope["path"].encode())

    url = await start_server(nursery, app)
    results: dict[int, bytes] = {}

    async def one(i: int) -> None:
        async with httpx.AsyncClient(base_url=url) as client:
            results[i] = (await client.get(f"/{i}")).content

    with trio.fail_after(5):
        async with trio.open_nursery() as inner:
            for i in range(clients):
                inner.start_soon(one, i)
    assert results == {i: f"/{i}".encode() for i in range(clients)}


async def test_disconnect_reaches_a_waiting_app(nursery: trio.Nursery) -> None:
    waiting = trio.Event()
    seen: list[Message] = []
    noticed = trio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await read_all(receive)
        waiting.set()
        seen.append(await receive())  # blocks until the client goes away
        noticed.set()

    url = await start_server(nursery, app)
    async with httpx.AsyncClient(base_url=url) as client:
        with trio.move_on_after(5) as scope:  # cancelled below as soon as the app waits
            nursery.start_soon(_cancel_when_set, waiting, scope)
            await client.get("/hold")
        assert scope.cancelled_caught
    with trio.fail_after(5):
        await noticed.wait()
    assert seen == [{"type": "http.disconnect"}]


async def _cancel_when_set(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


async def test_cancelling_serve_asgi_closes_everything() -> None:
    in_app = trio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await read_all(receive)
        in_app.set()
        await trio.sleep_forever()

    errors: list[BaseException] = []
    async with httpx.AsyncClient() as client:
        async with trio.open_nursery() as outer:
            server_scope = trio.CancelScope()

            async def run_server(task_status: trio.TaskStatus[int]) -> None:
                with server_scope:
                    await serve_asgi(app, task_status=task_status)

            port = await outer.start(run_server)

            async def request() -> None:
                try:
                    await client.get(f"http://127.0.0.1:{port}/")
                except httpx.HTTPError as exc:
                    errors.append(exc)

            outer.start_soon(request)
            with trio.fail_after(5):
                await in_app.wait()
            server_scope.cancel()  # the request is in flight, the app blocked
        assert server_scope.cancelled_caught
        assert len(errors) == 1
        assert isinstance(errors[0], httpx.RemoteProtocolError)
        with pytest.raises(httpx.ConnectError):
            await client.get(f"http://127.0.0.1:{port}/")


async def test_malformed_request_gets_400(echo_url: str) -> None:
    port = int(echo_url.rsplit(":", 1)[1])
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(b"NOT HTTP AT ALL\r\n\r\n")
        data = b""
        with trio.fail_after(5):
            while chunk := await stream.receive_some(4096):
                data += chunk
    assert data.startswith(b"HTTP/1.1 400 ")


async def test_pipelined_requests_are_answered_in_order(echo_url: str) -> None:
    port = int(echo_url.rsplit(":", 1)[1])
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(
            b"GET /one HTTP/1.1\r\nHost: x\r\n\r\n"
            b"GET /two HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        data = b""
        with trio.fail_after(5):
            while chunk := await stream.receive_some(4096):
                data += chunk
    assert data.count(b"HTTP/1.1 200 ") == 2
    assert data.index(b'"path": "/one"') < data.index(b'"path": "/two"')


async def test_idle_keep_alive_connection_is_closed(nursery: trio.Nursery) -> None:
    port = await nursery.start(partial(serve_asgi, echo_app, keep_alive_timeout=0.01))
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(b"GET /once HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        with trio.fail_after(5):  # EOF arrives only because the server closes the idle socket
            while chunk := await stream.receive_some(4096):
                data += chunk
    assert data.startswith(b"HTTP/1.1 200 ")
    assert b"connection: close" not in data.lower()


def test_run_server_in_thread_serves_and_stops() -> None:
    calls: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await read_all(receive)
        calls.append(scope["path"])
        await respond(send, 200, b"threaded")

    server = run_server_in_thread(app)
    with server, httpx.Client(base_url=server.url) as client:
        assert client.get("/t").text == "threaded"
        assert server.run_sync(len, calls) == 1
    assert not server._thread.is_alive()
    with httpx.Client() as client, pytest.raises(httpx.ConnectError):
        client.get(server.url)


def test_run_server_in_thread_reports_bind_failure() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        raise AssertionError("never called")

    with run_server_in_thread(app) as first:
        with pytest.raises(RuntimeError, match="failed to start") as info:
            run_server_in_thread(app, port=first.port)
        assert isinstance(info.value.__cause__, OSError)
