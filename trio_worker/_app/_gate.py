"""The ASGI layer in front of the user's app: ``/ping``, the phases, the requests in flight.

hypercorn serves :class:`Gate`, never the user's app directly; what ``/ping`` and the
app's routes answer in each phase, and on which port: docs/load-balancing.md, "What it
does". The server's own lifespan events are answered at once: the worker drives the app's
lifespan itself (``_lifespan``), so that ``/ping`` can answer 204 while it starts up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._health import Answer
from ._loops import Cancellable

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, MutableMapping

    from ._health import Health
    from ._loops import AppLoop

    Message = MutableMapping[str, Any]
    Scope = MutableMapping[str, Any]
    Receive = Callable[[], Awaitable[Message]]
    Send = Callable[[Message], Awaitable[None]]
    ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

__all__ = ["Gate", "send_answer"]

_NOT_FOUND = Answer(404, b'{"error": "only /ping is served on the health port"}')
_GRACE_OVER = Answer(
    503,
    b'{"error": "the worker shut down before this request finished", "status": "draining"}',
    ((b"connection", b"close"),),
)
# What an app answers for a route it does not have: then the worker's own /ping answers.
_NO_ROUTE = frozenset({404, 405})
# "Try again later" (RFC 6455): a websocket refused while the app may not run.
_WS_TRY_AGAIN = 1013


async def send_answer(send: Send, answer: Answer) -> None:
    """Send *answer* as a whole HTTP response."""
    if answer.status == 204:
        headers: list[tuple[bytes, bytes]] = []
    else:
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(answer.body)).encode()),
        ]
    headers.extend(answer.headers)
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    await send({"type": "http.response.body", "body": answer.body})


class Gate:
    """The user's *app* behind the worker's health.

    *on_idle* is called (on the thread of both loops) whenever the last request in flight
    ends, so a shutdown waiting for them wakes without polling.
    """

    def __init__(
        self,
        app: ASGIApp,
        health: Health,
        loop: AppLoop,
        *,
        app_port: int | None,
        health_port: int | None,
        on_idle: Callable[[], None],
        state: dict[str, Any] | None = None,
    ) -> None:
        self.app = app
        # What the app's lifespan yielded: each request gets a shallow copy, as servers do.
        self._state = state
        self.health = health
        self._loop = loop
        self._app_port = app_port
        self._health_port = health_port
        self._on_idle = on_idle
        self._in_flight: set[Cancellable] = set()

    @property
    def in_flight(self) -> int:
        """Requests the app is serving now."""
        return len(self._in_flight)

    def cancel_in_flight(self) -> int:
        """End every request still in flight (the grace is over); how many there were."""
        handles = list(self._in_flight)
        for handle in handles:
            handle.cancel()
        return len(handles)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await _answer_lifespan(receive, send)
            return
        if kind not in ("http", "websocket"):
            return
        server = scope.get("server")
        port = server[1] if server else None
        on_health = self._health_port is None or port == self._health_port
        on_app = self._app_port is None or port == self._app_port
        if kind == "http" and on_health and scope["path"] == "/ping":
            await self._ping(scope, receive, send)
            return
        if not on_app:
            await send_answer(send, _NOT_FOUND)
            return
        if not self.health.ready:
            await self._refuse(kind, receive, send, self.health.refusal())
            return
        await self._serve(scope, receive, send)

    async def _ping(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self.health.ready:
            await send_answer(send, self.health.ping())
            return
        ours = False

        async def app_or_ours(message: Message) -> None:
            nonlocal ours
            if message["type"] == "http.response.start" and message["status"] in _NO_ROUTE:
                ours = True
                await send_answer(send, self.health.ping())
            elif not ours:
                await send(message)

        await self._serve(scope, receive, app_or_ours)

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._state:
            scope["state"] = {**scope.get("state", {}), **self._state}
        handle = Cancellable()
        started = False

        async def tracking(message: Message) -> None:
            nonlocal started
            if message["type"] in ("http.response.start", "websocket.accept"):
                started = True
            await send(message)

        self._in_flight.add(handle)
        try:
            cancelled = await self._loop.run_cancellable(
                lambda: self.app(scope, receive, tracking), handle
            )
        finally:
            self._in_flight.discard(handle)
            if not self._in_flight:
                self._on_idle()
        if cancelled and not started and scope["type"] == "http":
            await send_answer(send, _GRACE_OVER)

    async def _refuse(self, kind: str, receive: Receive, send: Send, answer: Answer) -> None:
        if kind == "websocket":
            await receive()  # websocket.connect
            await send({"type": "websocket.close", "code": _WS_TRY_AGAIN})
            return
        await send_answer(send, answer)


async def _answer_lifespan(receive: Receive, send: Send) -> None:
    # The server's lifespan, not the app's: the worker runs the app's (``_lifespan``).
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
