"""A TCP stream for the lean client that yields to the loop only when it has to wait.

``trio.SocketStream`` makes every send and receive a full checkpoint: a cancellation check
before, and after an operation that did not need to wait, a trip through the scheduler
(``cancel_shielded_checkpoint``), inside several layers of context managers. A platform
request is a send that never waits and a receive that usually does, so half of those
trips buy nothing: on a 2-core machine a request/answer round trip cost 74 µs of the
loop's CPU through ``SocketStream`` against 41 µs here (docs/benchmarks.md).

:class:`LeanSocketStream` tries the operation on the non-blocking socket first and parks
the task (``trio.lowlevel.wait_readable`` / ``wait_writable``, which are checkpoints) only
when the socket is not ready. The exception is the first receive after a send: the answer
needs the peer to run first, so a receive then finds nothing (an exception and a system
call, once per request); that receive waits first. What keeps this safe:

* every request waits for its answer (that first receive parks the task), and
  :meth:`~._lean.LeanHttp.round` checks for a cancellation before it starts, so a
  request's deadline is honoured as before;
* a receive that fills the whole buffer (more may be waiting: a large answer arriving
  faster than it is read) ends with a checkpoint, so no answer can keep other tasks from
  running;
* closing tells trio first (``notify_closing``), so a task parked on the socket wakes with
  ``ClosedResourceError`` instead of waiting on a reused file descriptor.
"""

from __future__ import annotations

import socket

import trio


class LeanSocketStream(trio.abc.Stream):
    """A connected, non-blocking TCP socket as a trio stream (see the module doc)."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.socket = sock  # the quiet check (_connection) polls it before a reuse
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
                # Just sent: the answer cannot be here yet (it needs the peer to run), so a
                # receive now would only find nothing (an exception and a system call).
                # Wait for it first; the wait is the receive's checkpoint, as before.
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
