"""The network under the pool: TCP streams that yield only when they must, and TLS with
one trust store (docs/protocol.md §2.0, "TLS").

``trio.SocketStream`` makes every send and receive a full checkpoint; a platform request
is a send that never waits and a receive that usually does, so half of those buy nothing
(docs/benchmarks.md). :class:`LeanSocketStream` parks the task (a checkpoint) only when the
socket is not ready, and the first receive after a send waits first. Still safe: every
request waits for its answer and ``HttpPool.exchange`` checks for a cancellation first, so
deadlines hold; a receive that fills the buffer ends with a checkpoint, so no answer
starves other tasks; closing tells trio first (``notify_closing``), so a parked task wakes
with ``ClosedResourceError`` rather than wait on a reused fd.
"""

from __future__ import annotations

import functools
import socket
import ssl
from typing import TYPE_CHECKING, Protocol

import trio

from .._exceptions import TransportError

if TYPE_CHECKING:
    from collections.abc import Sequence


class LeanSocketStream(trio.abc.Stream):
    """A connected, non-blocking TCP socket as a trio stream."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.socket = sock  # the pool's quiet check (._http) polls it before a reuse
        self._sending = False
        self._receiving = False
        # Set by a send, cleared by the next receive: see receive_some.
        self._answer_pending = False

    @classmethod
    def adopt(cls, stream: trio.SocketStream) -> LeanSocketStream:
        """Take over the socket of a stream trio just connected (its options, such as
        ``TCP_NODELAY``, stay set); *stream* must not be used afterwards."""
        fd = stream.socket.detach()
        return cls(socket.socket(fileno=fd))

    def __repr__(self) -> str:
        return f"<LeanSocketStream fd={self.socket.fileno()}>"

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._sending:
            raise trio.BusyResourceError("another task is sending on this stream")
        sock = self.socket
        if sock.fileno() < 0:
            raise trio.ClosedResourceError("the stream was closed")
        self._sending = True
        try:
            with memoryview(data) as view:
                total, sent = len(view), 0
                while sent < total:
                    try:
                        sent += sock.send(view[sent:])
                    except BlockingIOError:
                        await trio.lowlevel.wait_writable(sock)
                    except OSError as exc:
                        raise _broken(sock, exc) from exc
            self._answer_pending = True
        finally:
            self._sending = False

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.wait_writable(self.socket)

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._receiving:
            raise trio.BusyResourceError("another task is receiving on this stream")
        size = 65536 if max_bytes is None else max_bytes
        if size < 1:
            raise ValueError("max_bytes must be >= 1")
        sock = self.socket
        self._receiving = True
        try:
            if self._answer_pending and sock.fileno() >= 0:
                # Just sent: the answer needs the peer to run first, so a receive now only
                # costs an exception and a system call. The wait is the checkpoint.
                self._answer_pending = False
                await trio.lowlevel.wait_readable(sock)
            while True:
                if sock.fileno() < 0:
                    raise trio.ClosedResourceError("the stream was closed")
                try:
                    data = sock.recv(size)
                except BlockingIOError:
                    await trio.lowlevel.wait_readable(sock)
                    continue
                except OSError as exc:
                    raise _broken(sock, exc) from exc
                if len(data) == size:
                    # More may be waiting: let the other tasks run before it is read.
                    await trio.lowlevel.checkpoint()
                return data
        finally:
            self._receiving = False

    async def aclose(self) -> None:
        sock = self.socket
        if sock.fileno() >= 0:
            trio.lowlevel.notify_closing(sock)
            sock.close()
        await trio.lowlevel.checkpoint()


def _broken(sock: socket.socket, exc: OSError) -> BaseException:
    if sock.fileno() < 0:
        return trio.ClosedResourceError("the stream was closed")
    return trio.BrokenResourceError(f"socket error: {exc!r}")


@functools.cache
def trust_context() -> ssl.SSLContext:
    """The one verifying context of every client of this process (an SSLContext is
    thread-safe): OpenSSL's defaults (``SSL_CERT_FILE``, ``SSL_CERT_DIR``, the system's
    store), certifi's bundle only when OpenSSL finds none."""
    context = ssl.create_default_context()
    paths = ssl.get_default_verify_paths()
    if paths.cafile is None and paths.capath is None:
        import certifi

        context.load_verify_locations(cafile=certifi.where())
    return context


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


async def open_tcp_stream(host: str, port: int) -> LeanSocketStream:
    """A TCP connection to *host*:*port* (trio's happy eyeballs), as a lean stream."""
    return LeanSocketStream.adopt(await trio.open_tcp_stream(host, port))


async def open_tls_stream(
    host: str, port: int, context: ssl.SSLContext
) -> trio.SSLStream[LeanSocketStream]:
    """TCP connect, then the whole TLS handshake, so both fall under the caller's timeout.

    Raises:
        TransportError: when the handshake fails (certificate, protocol, reset).
        OSError: when the TCP connect fails.
    """
    tcp = await open_tcp_stream(host, port)
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


class Closable(Protocol):
    async def aclose(self) -> None: ...


async def close_all(closables: Sequence[Closable]) -> None:
    """Close every one (connections, clients), even when cancelled part-way: each close
    still happens, and the cancellation is raised once they all have."""
    for index, closable in enumerate(closables):
        try:
            await closable.aclose()
        except BaseException:
            await close_all(closables[index + 1 :])
            raise
