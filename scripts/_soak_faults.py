"""The faults of scripts/soak_delivery.py: route faults at the platform, refusals at a proxy.

:class:`FaultyPlatform` wraps the fake platform's ASGI app and answers the requests of a
route with the fault of its open :class:`Window` (5xx, 429 + Retry-After, drop, hang,
slow), always *before* the route runs, but for ``slow`` whose answer is dripped after it.
Hostile answers (docs/security.md) come after the route runs: ``deep`` nests one job's input
of a take answer 5,000 deep, ``oversize`` makes a take answer 65 MiB (its jobs are then
owed an "input too large" error), ``flood`` answers a stop poll with 100,000 unknown ids;
a 429's ``Retry-After`` is now and then ``0``, ``-5`` or ``nan``.
:class:`Proxy` sits between the worker and the platform and, while refusing, closes its
listener (connects are refused) and every connection between requests, as a platform that
stops listening does, never in the middle of an answer.
"""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import trio

from trio_worker.testing import ConnectionDropped, FakePlatform

if TYPE_CHECKING:
    import random
    from collections.abc import Awaitable, Callable, MutableMapping

    Message = MutableMapping[str, Any]
    Receive = Callable[[], Awaitable[Message]]
    Send = Callable[[Message], Awaitable[None]]

HOST = "127.0.0.1"
ROUTES = ("take", "stop", "done", "stream", "ping")
ROUTE_FAULTS = ("5xx", "429", "drop", "hang", "slow", "deep", "oversize", "flood")
# The hostile answers, and the one route each applies to.
HOSTILE = {"deep": "take", "oversize": "take", "flood": "stop"}
HOSTILE_RETRY_AFTER = ("0", "-5", "nan")
DEEP = b"[" * 5_000 + b"]" * 5_000
OVERSIZE = 65 * 1024 * 1024  # over the worker's 64 MiB bound on a take answer
FLOOD = 100_000
_PLACEHOLDER = "\u0000soak-placeholder"
_SEGMENTS = {
    "job-take": "take",
    "job-take-batch": "take",
    "job-stop": "stop",
    "job-done": "done",
    "job-stream": "stream",
    "ping": "ping",
}


# -- faults at the platform ---------------------------------------------------------------


@dataclass
class Window:
    kind: str
    until: float


@dataclass
class FaultState:
    """What is failing now, and what the faults did (for the report)."""

    windows: dict[str, Window] = field(default_factory=dict)
    refusing: bool = False
    applied: dict[str, int] = field(default_factory=dict)
    opened: dict[str, int] = field(default_factory=dict)
    ambiguous: set[str] = field(default_factory=set)  # jobs whose report answer may be lost
    # Jobs handed out in a hostile answer: owed a MalformedJob error, not a result.
    poisoned: set[str] = field(default_factory=set)
    oversize_left: int = 3  # 65 MiB answers are costly: a few per run

    def active(self, route: str) -> Window | None:
        window = self.windows.get(route)
        if window is None or window.until <= trio.current_time():
            return None
        return window


def route_of(path: str) -> tuple[str | None, str]:
    """(route, job id or "") of a worker request path."""
    parts = path.strip("/").split("/")
    if len(parts) < 4 or parts[0] != "v2":
        return None, ""
    route = _SEGMENTS.get(parts[2])
    return route, unquote(parts[-1]) if route in ("done", "stream") else ""


class FaultyPlatform:
    """An ASGI app: the fake platform behind the route faults of :class:`FaultState`."""

    def __init__(self, platform: FakePlatform, faults: FaultState, rng: random.Random) -> None:
        self.platform = platform
        self.faults = faults
        self.rng = rng

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        route, job_id = route_of(scope.get("path", "")) if scope["type"] == "http" else (None, "")
        window = self.faults.active(route) if route else None
        if window is None:
            await self._answer(scope, receive, send, route, job_id, drip=False)
            return
        if window.kind in HOSTILE:
            await self._hostile(scope, receive, send, route, job_id, window.kind)
            return
        self.faults.applied[window.kind] = self.faults.applied.get(window.kind, 0) + 1
        body = await _read_body(receive)
        if body is None:
            return  # the client left before its request was read
        if window.kind == "drop":
            raise ConnectionDropped("soak: connection dropped")
        if window.kind in ("5xx", "429"):
            await self._status(send, window.kind)
            return
        delay = window.until - trio.current_time() if window.kind == "hang" else 0.0
        if window.kind == "slow":
            delay = self.rng.uniform(0.1, 3.0)
        if await _client_leaves_within(receive, delay):
            return
        if window.kind == "hang":
            raise ConnectionDropped("soak: hung, then dropped")
        await self._answer(scope, _replay(body, receive), send, route, job_id, drip=True)

    async def _answer(
        self,
        scope: Message,
        receive: Receive,
        send: Send,
        route: str | None,
        job_id: str,
        *,
        drip: bool,
    ) -> None:
        if drip and route == "done":
            self.faults.ambiguous.add(job_id)
        try:
            await self.platform(scope, receive, _dripping(send) if drip else send)
        except OSError:
            if route == "done":
                self.faults.ambiguous.add(job_id)
            raise

    async def _hostile(
        self,
        scope: Message,
        receive: Receive,
        send: Send,
        route: str | None,
        job_id: str,
        kind: str,
    ) -> None:
        if route != HOSTILE[kind] or (kind == "oversize" and self.faults.oversize_left <= 0):
            await self._answer(scope, receive, send, route, job_id, drip=False)
            return
        # Counted first: the worker closes the connection on a 65 MiB answer mid-send.
        self.faults.applied[kind] = self.faults.applied.get(kind, 0) + 1
        if kind == "flood":
            await _send_json(send, 200, _flood(self.rng))
        else:
            await self.platform(scope, receive, _rewritten(send, self._poison_take, kind))

    def _poison_take(self, body: bytes, kind: str) -> bytes:
        """The take answer *body* with one job's input nested too deep (``deep``), or made
        65 MiB by its last job's input (``oversize``); the jobs it fails are noted."""
        try:
            answer = json.loads(body)
        except ValueError:
            return body
        jobs = answer if isinstance(answer, list) else [answer] if answer else []
        if not jobs:
            return body
        if kind == "deep":
            victim = self.rng.choice(jobs)
            self.faults.poisoned.add(victim["id"])
            filling = DEEP
        else:
            self.faults.oversize_left -= 1
            self.faults.poisoned.update(job["id"] for job in jobs)
            victim = jobs[-1]
            filling = b'"' + b"x" * OVERSIZE + b'"'
        victim["input"] = _PLACEHOLDER
        encoded = json.dumps(answer).encode()
        return encoded.replace(json.dumps(_PLACEHOLDER).encode(), filling, 1)

    async def _status(self, send: Send, kind: str) -> None:
        headers = [(b"content-type", b"application/json")]
        if kind == "429":
            status = 429
            wait = str(self.rng.randint(1, 12))
            if self.rng.random() < 0.5:
                wait = self.rng.choice(HOSTILE_RETRY_AFTER)
            headers.append((b"retry-after", wait.encode()))
        else:
            status = self.rng.choice((500, 502, 503, 504))
        body = json.dumps({"error": f"soak: injected {status}"}).encode()
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _flood(rng: random.Random) -> dict[str, list[str]]:
    """A stop answer naming FLOOD ids no worker holds, under the 1 MiB answer bound."""
    base = rng.randrange(1 << 32)
    return {"jobsToStop": [f"f{base + n:x}" for n in range(FLOOD)]}


async def _send_json(send: Send, status: int, value: object) -> None:
    body = json.dumps(value, separators=(",", ":")).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _rewritten(send: Send, rewrite: Callable[[bytes, str], bytes], kind: str) -> Send:
    """A send that holds the route's answer and sends ``rewrite(body, kind)`` instead."""
    start: list[Message] = []
    chunks: list[bytes] = []

    async def hold(message: Message) -> None:
        if message["type"] == "http.response.start":
            start.append(message)
            return
        chunks.append(message.get("body", b""))
        if message.get("more_body", False):
            return
        body = b"".join(chunks)
        if start[0]["status"] == 200:
            body = rewrite(body, kind)
        headers = [(k, v) for k, v in start[0].get("headers", []) if k.lower() != b"content-length"]
        headers.append((b"content-length", b"%d" % len(body)))
        await send({**start[0], "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return hold


async def _client_leaves_within(receive: Receive, seconds: float) -> bool:
    """Wait *seconds*; True as soon as the client disconnects (nothing is applied then)."""
    if seconds <= 0:
        return False
    with trio.move_on_after(seconds):
        while (await receive())["type"] != "http.disconnect":
            pass
        return True
    return False


async def _read_body(receive: Receive) -> bytes | None:
    """The whole request body, None if the client disconnected first."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that gives the already read body again, then the client's own."""
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> Message:
        return pending.pop() if pending else await receive()

    return replay


def _dripping(send: Send) -> Send:
    async def drip(message: Message) -> None:
        body: bytes = message.get("body", b"")
        if message["type"] != "http.response.body" or len(body) < 4:
            await trio.sleep(0.2)
            await send(message)
            return
        step = math.ceil(len(body) / 4)
        for start in range(0, len(body), step):
            await trio.sleep(0.2)
            more = start + step < len(body)
            await send(
                {
                    "type": "http.response.body",
                    "body": body[start : start + step],
                    "more_body": more,
                }
            )

    return drip


# -- faults below HTTP: the proxy ----------------------------------------------------------


@dataclass(eq=False)
class Link:
    scope: trio.CancelScope
    pending: bool = False  # a request went up and its answer has not come back yet


class Proxy:
    """Forwards the worker's connections to the platform; refuses them on demand."""

    def __init__(self, upstream: int, faults: FaultState) -> None:
        self.upstream = upstream
        self.faults = faults
        self.port = 0
        self.links: set[Link] = set()
        self.changed = trio.Event()

    async def run(self, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            while True:
                [listener] = await trio.open_tcp_listeners(self.port, host=HOST)
                self.port = listener.socket.getsockname()[1]
                task_status.started(self.port)
                task_status = trio.TASK_STATUS_IGNORED
                async with listener:
                    with trio.CancelScope() as accepting:
                        nursery.start_soon(self._cancel_when_refusing, accepting)
                        while True:
                            stream = await listener.accept()
                            nursery.start_soon(self._link, stream)
                while self.faults.refusing:  # closed: connects are refused now
                    await self._wait_change()

    async def _wait_change(self) -> None:
        self.changed = trio.Event()
        await self.changed.wait()

    def set_refusing(self, refusing: bool) -> None:
        self.faults.refusing = refusing
        if refusing:
            for link in list(self.links):
                if not link.pending:
                    link.scope.cancel()
        self.changed.set()

    async def _cancel_when_refusing(self, scope: trio.CancelScope) -> None:
        while not self.faults.refusing:
            await self._wait_change()
        scope.cancel()

    async def _link(self, client: trio.SocketStream) -> None:
        try:
            upstream = await trio.open_tcp_stream(HOST, self.upstream)
        except OSError:
            await client.aclose()
            return
        async with client, upstream, trio.open_nursery() as nursery:
            link = Link(nursery.cancel_scope)
            self.links.add(link)
            nursery.start_soon(self._up, client, upstream, link)
            nursery.start_soon(self._down, upstream, client, link)
        self.links.discard(link)

    async def _up(self, client: trio.SocketStream, upstream: trio.SocketStream, link: Link) -> None:
        with contextlib.suppress(OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            async for data in client:
                if self.faults.refusing:
                    break  # a new request during the outage: never forwarded
                link.pending = True
                await upstream.send_all(data)
        link.scope.cancel()

    async def _down(
        self, upstream: trio.SocketStream, client: trio.SocketStream, link: Link
    ) -> None:
        with contextlib.suppress(OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            async for data in upstream:
                await client.send_all(data)
                link.pending = False
        link.scope.cancel()
