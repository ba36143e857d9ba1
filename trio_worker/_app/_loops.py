"""The loop an ASGI app runs on: trio, or asyncio with the worker's trio run as its guest.

The app runs on the loop it was written for, by the backend rule (docs/load-balancing.md,
"The loop your app runs on"); the supervision around it is the same trio code either way.
What differs is here, behind :class:`AppLoop`. Both loops share one thread, so setting an
event from the other loop's task is a plain call.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Final, Protocol

import trio

if TYPE_CHECKING:
    import socket
    from collections.abc import Awaitable, Callable

    from hypercorn.config import Config

    from .._backends import Backend, Holds

__all__ = ["SERVER_CLOSE_BOUND", "AppEvent", "AppLoop", "Cancellable", "app_loop", "server_config"]

# Once the requests are over, the server's own close (idle keep-alive connections).
SERVER_CLOSE_BOUND: Final = 1.0


def server_config(sockets: list[socket.socket]) -> Config:
    """hypercorn's configuration for *sockets*, which it takes over."""
    from hypercorn.config import Config

    config = Config()
    # fd:// hands hypercorn sockets bound here, so the ports are known (and a bind
    # error reported) before anything is served.
    config.bind = [f"fd://{sock.detach()}" for sock in sockets]
    config.accesslog = None
    config.errorlog = logging.getLogger("trio_worker.server")
    config.graceful_timeout = SERVER_CLOSE_BOUND
    config.include_server_header = False
    return config


class AppEvent(Protocol):
    """Set from either loop's tasks (one thread); waited on by the app's loop."""

    def set(self) -> None: ...

    def is_set(self) -> bool: ...

    async def wait(self) -> Any: ...


class Cancellable:
    """One request in flight: :meth:`cancel` ends it where it is waiting."""

    __slots__ = ("_cancel", "cancelled")

    def __init__(self) -> None:
        self.cancelled = False
        self._cancel: Callable[[], object] | None = None

    def cancel(self) -> None:
        self.cancelled = True
        if self._cancel is not None:
            self._cancel()


class AppLoop(ABC):
    """What the load-balancing worker asks of the loop its app runs on."""

    @abstractmethod
    def event(self) -> AppEvent:
        """A new event the app's loop can wait on."""

    @abstractmethod
    async def run_cancellable(
        self, call: Callable[[], Awaitable[None]], handle: Cancellable
    ) -> bool:
        """Run *call* in the current (app) task; True if ``handle.cancel()`` ended it."""

    @abstractmethod
    async def serve(self, app: Any, sockets: list[socket.socket], shutdown: AppEvent) -> None:
        """hypercorn serving *app* on *sockets* (it takes them over) until *shutdown* is
        set; awaited from trio."""


class _TrioLoop(AppLoop):
    def event(self) -> AppEvent:
        return trio.Event()

    async def run_cancellable(
        self, call: Callable[[], Awaitable[None]], handle: Cancellable
    ) -> bool:
        with trio.CancelScope() as scope:
            handle._cancel = scope.cancel
            if handle.cancelled:
                scope.cancel()
            await call()
        return scope.cancelled_caught and handle.cancelled

    async def serve(self, app: Any, sockets: list[socket.socket], shutdown: AppEvent) -> None:
        # Imported here: a queue worker never needs the server.
        from hypercorn.trio import serve

        config = server_config(sockets)
        await serve(app, config, shutdown_trigger=shutdown.wait, mode="asgi")


class _AsyncioLoop(AppLoop):
    def __init__(self, backend: Backend, waits: Holds) -> None:
        self._backend = backend
        self._waits = waits

    def event(self) -> AppEvent:
        import asyncio

        return asyncio.Event()

    async def run_cancellable(
        self, call: Callable[[], Awaitable[None]], handle: Cancellable
    ) -> bool:
        import asyncio

        task = asyncio.current_task()
        assert task is not None
        handle._cancel = task.cancel
        if handle.cancelled:
            task.cancel()
        try:
            await call()
        except asyncio.CancelledError:
            if not handle.cancelled:
                raise
            task.uncancel()  # ours, not the server's: the request is answered below
            return True
        return False

    async def serve(self, app: Any, sockets: list[socket.socket], shutdown: AppEvent) -> None:
        from hypercorn.asyncio import serve

        config = server_config(sockets)
        server = serve(app, config, shutdown_trigger=shutdown.wait, mode="asgi")
        await self._backend.await_result(server, self._waits)


def app_loop(backend: Backend, waits: Holds) -> AppLoop:
    """The app's loop for the worker's *backend* (its ``name``: "trio" or "asyncio")."""
    if backend.name == "asyncio":
        return _AsyncioLoop(backend, waits)
    return _TrioLoop()
