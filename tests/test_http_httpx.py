"""The httpx backend (kept for proxies only) and :func:`make_backend`'s choice."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import pytest
import trio

from trio_worker import TransportError
from trio_worker._platform._http import (
    HttpPool,
    HttpResponse,
    make_backend,
)
from trio_worker._platform._proxy import HttpxHttp, ProxyRoutes
from trio_worker._proxies import any_proxy_configured

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

from .scripted_server import (
    STATIC_HEADERS,
    TIMEOUT,
    Server,
    response,
    send_one,
    server_fixture,  # noqa: F401 (a fixture)
)

pytestmark = pytest.mark.timeout(20)

# --------------------------------------------------------------------------------------
# HttpxHttp
# --------------------------------------------------------------------------------------


@pytest.fixture
def seen() -> list[httpx.Request]:
    return []


def mock_backend(
    handler: Callable[[httpx.Request], httpx.Response],
    headers: dict[str, str] | None = None,
) -> HttpxHttp:
    client = httpx.AsyncClient(transport=httpx.MockTransport(handler), headers=headers)
    return HttpxHttp(client)


async def test_httpx_returns_status_lowercased_headers_and_raw_body(
    seen: list[httpx.Request],
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(
            202,
            headers={"X-Request-Id": "abc", "Content-Type": "application/json"},
            content=b'{"ok": true}',
        )

    backend = mock_backend(handler, {"Authorization": "Bearer k"})
    try:
        answer = await send_one(backend, "POST", "http://platform.test/v2/done?x=1", b'{"a": 1}')
    finally:
        await backend.aclose()
    assert answer.status == 202
    assert answer.body == b'{"ok": true}'
    assert answer.headers["x-request-id"] == "abc"
    assert answer.headers["content-type"] == "application/json"
    assert all(name == name.lower() for name in answer.headers)
    [request] = seen
    assert (request.method, str(request.url)) == ("POST", "http://platform.test/v2/done?x=1")
    assert request.content == b'{"a": 1}'
    assert request.headers["authorization"] == "Bearer k"


async def test_httpx_empty_body_sends_no_content(seen: list[httpx.Request]) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(204)

    backend = mock_backend(handler)
    try:
        answer = await send_one(backend, "GET", "http://platform.test/take")
    finally:
        await backend.aclose()
    assert (answer.status, answer.body) == (204, b"")
    assert seen[0].content == b""
    assert "content-length" not in seen[0].headers


async def test_httpx_bogus_gzip_stream_is_returned_raw() -> None:
    raw = b"this is not gzip at all"

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200,
            headers={"Content-Encoding": "gzip", "Content-Length": str(len(raw))},
            stream=httpx.ByteStream(raw),
        )

    backend = mock_backend(handler)
    try:
        answer = await send_one(backend, "GET", "http://platform.test/x")
    finally:
        await backend.aclose()
    assert answer == HttpResponse(
        200, {"content-encoding": "gzip", "content-length": str(len(raw))}, raw
    )


async def test_httpx_streamed_body_in_chunks() -> None:
    class Chunks(httpx.AsyncByteStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            for part in (b"a", b"bc", b"", b"def"):
                yield part

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, stream=Chunks())

    backend = mock_backend(handler)
    try:
        answer = await send_one(backend, "GET", "http://platform.test/x")
    finally:
        await backend.aclose()
    assert (answer.status, answer.body) == (500, b"abcdef")


@pytest.mark.parametrize(
    "error",
    [httpx.ConnectError("refused"), httpx.ReadTimeout("slow"), httpx.RemoteProtocolError("bad")],
)
async def test_httpx_transport_errors_become_transport_error(error: httpx.HTTPError) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise error

    backend = mock_backend(handler)
    try:
        with pytest.raises(TransportError, match=type(error).__name__) as caught:
            await send_one(backend, "GET", "http://platform.test/x")
    finally:
        await backend.aclose()
    assert caught.value.__cause__ is error


async def test_httpx_bad_url_is_transport_error() -> None:
    backend = mock_backend(lambda request: httpx.Response(200))
    try:
        with pytest.raises(TransportError):
            await send_one(backend, "GET", "http://platform.test:notaport/x")
    finally:
        await backend.aclose()


async def test_httpx_over_loopback_bogus_gzip_is_raw(server: Server) -> None:
    raw = b"\x00not gzip"
    server.reply(response(raw, headers=("Content-Encoding: gzip",)))
    backend = HttpxHttp(httpx.AsyncClient(trust_env=False))
    try:
        with trio.fail_after(TIMEOUT):
            answer = await send_one(backend, "POST", server.url("/x?y=1"), b"body")
    finally:
        await backend.aclose()
    assert (answer.status, answer.body, answer.headers["content-encoding"]) == (200, raw, "gzip")
    [request] = server.requests
    assert (request.method, request.target, request.body) == ("POST", "/x?y=1", b"body")


# --------------------------------------------------------------------------------------
# make_backend / proxy_configured
# --------------------------------------------------------------------------------------


@pytest.fixture
def clean_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No proxy variables in os.environ, so httpx clients built here do not pick any up."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


async def test_make_backend_defaults_to_lean() -> None:
    backend = make_backend(STATIC_HEADERS, environ={})
    try:
        assert isinstance(backend, HttpPool)
    finally:
        await backend.aclose()


async def test_make_backend_ignores_empty_proxy_variables() -> None:
    env = {"HTTPS_PROXY": "", "http_proxy": "", "NO_PROXY": "*"}
    backend = make_backend(STATIC_HEADERS, environ=env)
    try:
        assert isinstance(backend, HttpPool)
    finally:
        await backend.aclose()


async def test_make_backend_uses_os_environ_by_default(
    monkeypatch: pytest.MonkeyPatch, clean_proxy_env: None
) -> None:
    lean = make_backend({})
    await lean.aclose()
    assert isinstance(lean, HttpPool)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.test:3128")
    proxied = make_backend({})
    try:
        assert isinstance(proxied, ProxyRoutes)
        assert isinstance(proxied.route("https://platform.test/x"), HttpxHttp)
    finally:
        await proxied.aclose()


async def test_behind_a_proxy_httpx_carries_the_request_to_it(
    server: Server, monkeypatch: pytest.MonkeyPatch, clean_proxy_env: None
) -> None:
    # The one place httpx still carries the worker's requests: a configured proxy (here
    # the scripted server, which receives the request in absolute form).
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{server.port}")
    server.reply(response(b"pong"))
    backend = make_backend(STATIC_HEADERS, max_connections=3)
    try:
        assert isinstance(backend, ProxyRoutes)
        with trio.fail_after(TIMEOUT):
            answer = await send_one(backend, "POST", "http://platform.test/ping", b"ping")
    finally:
        await backend.aclose()
    assert (answer.status, answer.body) == (200, b"pong")
    [request] = server.requests
    assert request.target == "http://platform.test/ping"
    assert request.body == b"ping"
    assert request.header("Authorization") == "Bearer secret-key"
    assert request.header("User-Agent") == "trio-worker-test/1"


@pytest.mark.parametrize(
    "name", ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"]
)
async def test_make_backend_with_proxy_variable_routes_through_httpx(
    name: str, clean_proxy_env: None
) -> None:
    env = {name: "http://proxy.test:3128"}
    assert any_proxy_configured(env)
    backend = make_backend(STATIC_HEADERS, environ=env)
    try:
        assert isinstance(backend, ProxyRoutes)
        scheme = "http" if name.lower() == "http_proxy" else "https"
        assert isinstance(backend.route(f"{scheme}://platform.test/x"), HttpxHttp)
        # Loopback is never proxied, whatever the variables say.
        assert isinstance(backend.route(f"{scheme}://127.0.0.1:8000/x"), HttpPool)
    finally:
        await backend.aclose()


def test_any_proxy_configured() -> None:
    assert not any_proxy_configured({})
    assert not any_proxy_configured({"NO_PROXY": "*", "no_proxy": "*", "FTP_PROXY": "x"})
    assert not any_proxy_configured({"HTTPS_PROXY": ""})
    assert any_proxy_configured({"HTTPS_PROXY": "", "https_proxy": "http://p:1"})
