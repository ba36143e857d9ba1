"""The fake platform's HTTP server, and a way to run it from code with no trio loop.

The server itself is :mod:`trio_worker.testing._h11_server`, which serves the local
endpoint's own app (the local endpoint itself runs it on hypercorn) over sockets and over
in-memory streams alike, and can drop a connection unanswered for the fault injection
(docs/property-suite.md says why it is not hypercorn). :class:`ServerThread` runs it on a
daemon thread for sync tests and the benchmark harness.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, TypeVar, TypeVarTuple

import trio

from ._exchange import (
    AbortConnection,
    ASGIApp,
    ClientDisconnected,
    Message,
    Receive,
    Scope,
    Send,
)
from ._h11_server import (
    KEEP_ALIVE_TIMEOUT,
    ServerLimits,
    serve_asgi,
    serve_stream,
    url_of,
)

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "KEEP_ALIVE_TIMEOUT",
    "ASGIApp",
    "AbortConnection",
    "ClientDisconnected",
    "Message",
    "Receive",
    "Scope",
    "Send",
    "ServerLimits",
    "ServerThread",
    "run_server_in_thread",
    "serve_asgi",
    "serve_stream",
    "url_of",
]

_T = TypeVar("_T")
_Ts = TypeVarTuple("_Ts")


class ServerThread:
    """A :func:`serve_asgi` running in its own ``trio.run`` on a daemon thread.

    For sync tests and the benchmark harness, which have no trio loop of their own. The
    app runs on that thread's trio loop, so touch its state only through
    :meth:`run_sync`. Usable as a context manager, which calls :meth:`stop`.
    """

    def __init__(
        self,
        thread: threading.Thread,
        host: str,
        port: int,
        token: trio.lowlevel.TrioToken,
        scope: trio.CancelScope,
    ) -> None:
        self._thread = thread
        self._token = token
        self._scope = scope
        self.host = host
        self.port = port
        self.url = url_of(host, port)

    def run_sync(self, fn: Callable[[*_Ts], _T], *args: *_Ts) -> _T:
        """Call ``fn(*args)`` on the server's trio thread and return its result."""
        return trio.from_thread.run_sync(fn, *args, trio_token=self._token)

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel the server, close its sockets and wait for the thread to end.

        Raises:
            TimeoutError: if the thread has not ended after *timeout* seconds.
        """
        try:
            trio.from_thread.run_sync(self._scope.cancel, trio_token=self._token)
        except trio.RunFinishedError:
            pass
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError("the server thread did not stop")

    def __enter__(self) -> ServerThread:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def run_server_in_thread(app: ASGIApp, host: str = "127.0.0.1", port: int = 0) -> ServerThread:
    """Start :func:`serve_asgi` in a daemon thread and return once it is listening.

    Raises:
        RuntimeError: chained from the cause, if the server failed to start.
    """
    ready = threading.Event()
    started: dict[str, Any] = {}

    async def main() -> None:
        with trio.CancelScope() as scope:
            started["scope"] = scope
            started["token"] = trio.lowlevel.current_trio_token()
            async with trio.open_nursery() as nursery:
                try:
                    started["port"] = await nursery.start(serve_asgi, app, host, port)
                except OSError as exc:  # caught here, so it is not wrapped in a group
                    started["error"] = exc
                    return
                ready.set()

    def target() -> None:
        try:
            trio.run(main)
        except BaseException as exc:
            started["error"] = exc
        finally:
            ready.set()

    thread = threading.Thread(target=target, name=f"asgi-server-{host}:{port}", daemon=True)
    thread.start()
    ready.wait()
    if "error" in started or "port" not in started:
        thread.join()
        raise RuntimeError("the ASGI server failed to start") from started.get("error")
    return ServerThread(thread, host, started["port"], started["token"], started["scope"])
