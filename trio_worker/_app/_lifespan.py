"""The app's own lifespan, driven by the worker: startup is the supervised load.

The server's lifespan cannot carry the load: hypercorn serves nothing until its startup
completes, so ``/ping`` could not answer 204 meanwhile. The worker runs the app's lifespan
itself, on the app's loop, beside the server (docs/load-balancing.md, "What it does"). An
app without lifespan support is served without it, as ASGI servers do.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import trio

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, MutableMapping

    from .._backends import Backend, Holds
    from ._loops import AppLoop

    Message = MutableMapping[str, Any]
    ASGIApp = Callable[..., Awaitable[None]]

__all__ = ["AppLifespan", "LifespanStartupFailed"]

log = logging.getLogger("trio_worker")

# After the app reported a failed startup, how long it gets to raise the exception behind
# it (a better error type and traceback than the message it sent).
_RAISE_BOUND = 1.0


class LifespanStartupFailed(Exception):
    """The app answered ``lifespan.startup.failed`` (its message is this error's)."""


class AppLifespan:
    """The lifespan of *app*, run on *loop* by a task of the worker's nursery."""

    def __init__(self, app: ASGIApp, loop: AppLoop, backend: Backend, waits: Holds) -> None:
        self._app = app
        self._backend = backend
        self._waits = waits
        self.state: dict[str, Any] = {}
        self._shutdown_asked = loop.event()
        self._started = trio.Event()
        self._stopped = trio.Event()
        self._ended = trio.Event()
        self._received = 0
        self._startup_failure: str | None = None
        self._startup_complete = False
        self._error: BaseException | None = None

    async def run(self) -> None:
        """The app's lifespan call, to its end (a task of the worker's nursery)."""
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}}
        scope["state"] = self.state
        try:
            await self._backend.await_result(
                self._app(scope, self._receive, self._send), self._waits
            )
        except Exception as exc:
            self._error = exc
        finally:
            self._ended.set()
            self._started.set()
            self._stopped.set()

    async def startup(self) -> None:
        """Until the app's startup completed (at once when it has no lifespan).

        Raises:
            Exception: what the app raised during its startup, or
                :class:`LifespanStartupFailed` with the message it sent.
        """
        await self._started.wait()
        if self._startup_complete:
            return
        if self._startup_failure is not None:
            with trio.move_on_after(_RAISE_BOUND):
                await self._ended.wait()
            if self._error is not None:
                raise self._error
            raise LifespanStartupFailed(self._startup_failure or "lifespan startup failed")
        if self._received == 0:
            log.debug("the app has no lifespan: %r", self._error)
            return
        if self._error is not None:
            raise self._error
        raise LifespanStartupFailed("the app's lifespan ended before its startup completed")

    async def shutdown(self) -> None:
        """Ask the app to shut down, and wait until it has (nothing if it never started)."""
        if not self._startup_complete or self._ended.is_set():
            return
        self._shutdown_asked.set()
        await self._stopped.wait()
        if self._error is not None:
            log.error(
                "the app's lifespan shutdown failed: %s: %s",
                type(self._error).__name__,
                self._error,
            )

    # -- the ASGI pair, called on the app's loop ------------------------------------------

    async def _receive(self) -> Message:
        self._received += 1
        if self._received == 1:
            return {"type": "lifespan.startup"}
        await self._shutdown_asked.wait()
        return {"type": "lifespan.shutdown"}

    async def _send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "lifespan.startup.complete":
            self._startup_complete = True
            self._started.set()
        elif kind == "lifespan.startup.failed":
            self._startup_failure = str(message.get("message", ""))
            self._started.set()
        elif kind == "lifespan.shutdown.failed":
            if self._shutdown_asked.is_set():  # not a cancellation of the whole worker
                log.error("the app's lifespan shutdown failed: %s", message.get("message", ""))
            self._stopped.set()
        elif kind == "lifespan.shutdown.complete":
            self._stopped.set()
