"""TLS: one trust store, handshakes within the connect timeout, failures that say why."""

from __future__ import annotations

import contextlib
import pathlib
import ssl
from functools import partial

import pytest
import trio
import trustme

from trio_worker import ConfigurationError, TransportError
from trio_worker._platform._http import (
    HttpPool,
    make_backend,
)
from trio_worker._platform._network import trust_context
from trio_worker._platform._proxy import HttpxHttp, ProxyRoutes

from .scripted_server import (
    TIMEOUT,
    Peer,
    Server,
    response,
    send_one,
    server_fixture,  # noqa: F401 (a fixture)
)

pytestmark = pytest.mark.timeout(20)

# --------------------------------------------------------------------------------------
# TLS: one trust store, handshakes within the connect timeout, failures that say why
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


async def serve_tls(nursery: trio.Nursery, ca: trustme.CA, hostname: str = "127.0.0.1") -> int:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(hostname).configure_cert(context)

    async def handler(stream: trio.SSLStream[trio.SocketStream]) -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    return
                data += chunk
            await stream.send_all(response(b"secure", headers=("Connection: close",)))
            await stream.aclose()

    listeners = await nursery.start(
        partial(trio.serve_ssl_over_tcp, host="127.0.0.1"), handler, 0, context
    )
    port: int = listeners[0].transport_listener.socket.getsockname()[1]
    return port


async def test_tls_with_a_trusted_certificate(nursery: trio.Nursery, ca: trustme.CA) -> None:
    port = await serve_tls(nursery, ca)
    context = ssl.create_default_context()
    ca.configure_trust(context)
    lean = HttpPool({}, ssl_context=context)
    with trio.fail_after(TIMEOUT):
        assert (await send_one(lean, "GET", f"https://127.0.0.1:{port}/")).body == b"secure"
    await lean.aclose()


async def test_tls_failure_says_why(nursery: trio.Nursery, ca: trustme.CA) -> None:
    port = await serve_tls(nursery, ca)
    lean = HttpPool({}, ssl_context=ssl.create_default_context())  # does not trust the CA
    with trio.fail_after(TIMEOUT), pytest.raises(TransportError) as caught:
        await send_one(lean, "GET", f"https://127.0.0.1:{port}/")
    message = str(caught.value)
    assert message.startswith("TLS handshake with 127.0.0.1 failed: ")
    assert "certificate" in message


async def test_tls_wrong_hostname_says_why(nursery: trio.Nursery, ca: trustme.CA) -> None:
    port = await serve_tls(nursery, ca, hostname="other.test")
    context = ssl.create_default_context()
    ca.configure_trust(context)
    lean = HttpPool({}, ssl_context=context)
    with trio.fail_after(TIMEOUT), pytest.raises(TransportError, match="TLS handshake with"):
        await send_one(lean, "GET", f"https://127.0.0.1:{port}/")


async def test_a_server_that_never_handshakes_times_out_within_connect_timeout(
    server: Server,
) -> None:
    async def silent(peer: Peer) -> None:
        await peer.client_closed.wait()  # accepts TCP, never answers the ClientHello

    server.handler = silent
    lean = HttpPool({}, connect_timeout=0.05)
    with trio.fail_after(TIMEOUT), pytest.raises(TransportError, match="timed out"):
        await send_one(lean, "GET", f"https://127.0.0.1:{server.port}/")
    assert server.requests == []


async def test_a_plain_http_server_behind_https_says_why(server: Server) -> None:
    async def plain(peer: Peer) -> None:
        await peer.stream.receive_some(65536)  # a ClientHello, answered in plain HTTP
        await peer.send([b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"])
        await peer.close()

    server.handler = plain
    lean = HttpPool({})
    with trio.fail_after(TIMEOUT), pytest.raises(TransportError, match="TLS handshake with"):
        await send_one(lean, "GET", f"https://127.0.0.1:{server.port}/")


async def test_ssl_cert_file_is_honoured_by_every_client(
    nursery: trio.Nursery,
    ca: trustme.CA,
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    port = await serve_tls(nursery, ca)
    bundle = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    trust_context.cache_clear()
    try:
        lean = HttpPool({})
        with trio.fail_after(TIMEOUT):
            assert (await send_one(lean, "GET", f"https://127.0.0.1:{port}/")).body == b"secure"
        await lean.aclose()
        proxied = make_backend({}, environ={"HTTPS_PROXY": "http://unused"})
        assert isinstance(proxied, ProxyRoutes)
        httpx_backend = proxied.route("https://platform.test/")
        assert isinstance(httpx_backend, HttpxHttp)
        # httpx's own internals (test-only): the proxy transport's TLS context.
        [transport] = httpx_backend._client._mounts.values()
        assert transport._pool._ssl_context is trust_context()  # type: ignore[union-attr]
        await proxied.aclose()
    finally:
        trust_context.cache_clear()


@pytest.mark.parametrize("environ", [{}, {"HTTPS_PROXY": "http://proxy.test:3128"}])
def test_make_backend_refuses_a_key_that_cannot_be_sent_on_either_path(
    environ: dict[str, str],
) -> None:
    with pytest.raises(ConfigurationError, match="Authorization") as caught:
        make_backend({"Authorization": "rpa_key\nX: y"}, environ=environ)
    assert "rpa_key" not in str(caught.value)
