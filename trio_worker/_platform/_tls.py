"""TLS for every client of the worker: one trust store, and handshakes that say why they fail.

One trust store: :func:`trust_context` is built once per process and used by the lean
client, the httpx client (proxies) and the heartbeat thread, so a certificate the worker
trusts for a take it also trusts for a ping. It is :func:`ssl.create_default_context`, so
OpenSSL's own rules apply: ``SSL_CERT_FILE`` and ``SSL_CERT_DIR`` when set, else the
system's store. Only when OpenSSL finds no store at all (a slim image without
``ca-certificates`` and neither variable set) does it fall back to certifi's bundle, which
httpx already installs; before, the lean client trusted the system and the heartbeat
certifi, so one of them could fail where the other worked.

A handshake is done inside the connect (:func:`open_tls_stream`), so it is bounded by the
connect timeout, and its failure reads ``TLS handshake with HOST failed: <reason>`` instead
of trio's lazy ``BrokenResourceError()`` on the first send.
"""

from __future__ import annotations

import functools
import ssl

import trio

from .._exceptions import TransportError
from ._socket import LeanSocketStream


def make_trust_context() -> ssl.SSLContext:
    """A verifying client context over the process's trust store (see the module doc)."""
    context = ssl.create_default_context()
    paths = ssl.get_default_verify_paths()
    if paths.cafile is None and paths.capath is None:
        # No store anywhere OpenSSL looks (and no SSL_CERT_* variable naming one).
        import certifi

        context.load_verify_locations(cafile=certifi.where())
    return context


@functools.cache
def trust_context() -> ssl.SSLContext:
    """The one context every client of this process uses (an SSLContext is thread-safe)."""
    return make_trust_context()


def tls_failure(host: str, exc: BaseException) -> TransportError:
    """``TLS handshake with HOST failed: <reason>`` from an ssl error or trio's wrapper."""
    cause = exc if isinstance(exc, ssl.SSLError) else exc.__cause__
    if isinstance(cause, ssl.SSLCertVerificationError):
        reason = cause.verify_message or cause.reason or str(cause)
    elif isinstance(cause, ssl.SSLError):
        reason = cause.reason or str(cause)
    else:
        reason = f"connection lost during the handshake ({type(exc).__name__})"
    return TransportError(f"TLS handshake with {host} failed: {reason}")


async def open_tls_stream(
    host: str, port: int, context: ssl.SSLContext
) -> trio.SSLStream[LeanSocketStream]:
    """TCP connect, then the whole TLS handshake, so both fall under the caller's timeout.

    Raises:
        TransportError: when the handshake fails (certificate, protocol, reset).
        OSError: when the TCP connect fails.
    """
    tcp = LeanSocketStream.adopt(await trio.open_tcp_stream(host, port))
    stream = trio.SSLStream(tcp, context, server_hostname=host)
    try:
        await stream.do_handshake()
    except (trio.BrokenResourceError, ssl.SSLError) as exc:
        await trio.aclose_forcefully(tcp)
        raise tls_failure(host, exc) from exc
    except BaseException:
        await trio.aclose_forcefully(tcp)
        raise
    return stream
