"""The network under the worker's real HTTP client: drawn faults, and the record of each request.

`RecordingBackend` wraps the client at its request boundary to record each exchange and
draw its network step (with ``data.draw``, as the requests happen); `ChaosOpener` and
`ChaosStream` apply the step below the client: checkpoints and delays before a request
leaves and after its answer arrives, a refused or hanging connect (a kept-alive connection
breaks first, so the client's own retry reaches the failing connect). So the client's
keep-alive pool, response parsing, stale-connection retry, cancellation and error mapping
are what run under the properties. `CrashRecordingApp` wraps the fake platform to record
any exception escaping it (the platform must never crash).
"""

from __future__ import annotations

import errno
import json
import time
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

import trio

from trio_worker._config import MAX_ANSWER_BYTES
from trio_worker.testing import FakePlatform
from trio_worker.testing._http_server import AbortConnection, ClientDisconnected

from .recorder import Exchange, Recorder, StopDelivery
from .scenario import PLAIN, NetStep

if TYPE_CHECKING:
    from collections.abc import Sequence

    from trio_worker._platform._http import HttpBackend, HttpResponse, StreamOpener


# Wall-clock guard against a busy loop inside one example: a hang guard, not a timing
# assertion. An example takes milliseconds; only a loop that never yields reaches this,
# however loaded the machine.
WALL_LIMIT = 300.0


_ROUTES = {
    "job-take": "take",
    "job-take-batch": "take_batch",
    "job-stop": "stop",
    "job-done": "done",
    "job-stream": "stream",
    "ping": "ping",
}


def route_of(url: str) -> tuple[str, str | None]:
    parts = urlsplit(url).path.strip("/").split("/")
    route = _ROUTES.get(parts[2], "other") if len(parts) > 2 else "other"
    job_id = unquote(parts[4]) if route in ("done", "stream") and len(parts) > 4 else None
    return route, job_id


def ids_in_take(body: bytes) -> tuple[str, ...]:
    try:
        data = json.loads(body) if body else None
    except ValueError:
        return ()
    items = data if isinstance(data, list) else [data]
    return tuple(i["id"] for i in items if isinstance(i, dict) and isinstance(i.get("id"), str))


def ids_in_stop(body: bytes) -> tuple[str, ...]:
    try:
        data = json.loads(body) if body else None
    except ValueError:
        return ()
    if not isinstance(data, dict) or not isinstance(data.get("jobsToStop"), list):
        return ()
    return tuple(i for i in data["jobsToStop"] if isinstance(i, str))


def only_cancelled(exc: BaseException) -> bool:
    """True for trio.Cancelled, or a group of nothing but (the platform's hold nursery)."""
    if isinstance(exc, BaseExceptionGroup):
        _, rest = exc.split(trio.Cancelled)
        return rest is None
    return isinstance(exc, trio.Cancelled)


@dataclass
class Chaos:
    """What the network does to the request in flight (its drawn `NetStep`), applied by
    `ChaosOpener` and `ChaosStream` below the real client: the checkpoints and delay
    before the request leaves, once, at its connect or its first write; the connect
    failure; the checkpoints and delay after its answer, once, at its first read."""

    step: NetStep
    pre_done: bool = False
    post_done: bool = False

    async def before_send(self) -> None:
        if self.pre_done:
            return
        self.pre_done = True
        for _ in range(self.step.pre_checkpoints):
            await trio.lowlevel.checkpoint()
        if self.step.pre_delay:
            await trio.sleep(self.step.pre_delay)

    async def after_answer(self) -> None:
        if self.post_done:
            return
        self.post_done = True
        for _ in range(self.step.post_checkpoints):
            await trio.lowlevel.checkpoint()
        if self.step.post_delay:
            await trio.sleep(self.step.post_delay)


# Set by `RecordingBackend` for the duration of one request, in the requesting task: the
# client's connects, writes and reads for that request all happen in that task.
_CHAOS: ContextVar[Chaos | None] = ContextVar("chaos", default=None)


class ChaosStream(trio.abc.Stream):
    """One client connection of the in-memory network, under the request's `Chaos`."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self._inner = inner
        self.closed = False

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        chaos = _CHAOS.get()
        if chaos is not None:
            await chaos.before_send()
            if chaos.step.pre_error:
                # The kept-alive connection broke while idle: the real client retries on
                # a fresh connection, whose connect then fails as drawn.
                raise trio.BrokenResourceError("injected: connection broken")
        await self._inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        data = await self._inner.receive_some(max_bytes)
        chaos = _CHAOS.get()
        if chaos is not None and data:
            await chaos.after_answer()
        return data

    async def aclose(self) -> None:
        self.closed = True
        await self._inner.aclose()


class ChaosOpener:
    """The in-memory network's connect, failing or hanging as the request's step says."""

    def __init__(self, inner: StreamOpener, rec: Recorder) -> None:
        self._inner = inner
        self._rec = rec

    async def __call__(self, host: str, port: int, tls: bool) -> trio.abc.Stream:
        chaos = _CHAOS.get()
        if chaos is not None:
            await chaos.before_send()
            if chaos.step.pre_error == "connect":
                raise ConnectionRefusedError(errno.ECONNREFUSED, "injected: connection refused")
            if chaos.step.pre_error == "connect_timeout":
                await trio.sleep_forever()  # the client's connect_timeout ends it
        stream = ChaosStream(await self._inner(host, port, tls))
        self._rec.connections.append(stream)
        return stream


class RecordingBackend:
    """Wraps each of the worker's real HTTP clients: records every request as the worker
    made it and how it ended for the worker, and draws its network step. The step itself
    is applied below the client (`ChaosOpener`, `ChaosStream`), so the real client's
    keep-alive, stale-connection retry, cancellation and error mapping all run under it.
    Never loses an answer the platform gave (except when the worker's own deadline cuts
    the delay after it)."""

    def __init__(self, inner: HttpBackend, rec: Recorder) -> None:
        self._inner = inner
        self._rec = rec

    async def exchange(
        self,
        method: str,
        requests: Sequence[tuple[str, bytes]],
        answers: list[HttpResponse] | None = None,
        *,
        max_body: int = MAX_ANSWER_BYTES,
        keep_body: int | None = None,
    ) -> list[HttpResponse]:
        """The client's one entry point: a request alone, or stream chunks in one round."""
        answers = [] if answers is None else answers
        if len(requests) == 1:
            url, body = requests[0]
            answers.append(await self._one(method, url, body, max_body, keep_body))
        else:
            await self._round(method, requests, answers, max_body, keep_body)
        return answers

    async def _one(
        self, method: str, url: str, body: bytes, max_body: int, keep_body: int | None
    ) -> HttpResponse:
        rec = self._rec
        if time.monotonic() - rec.wall_start > WALL_LIMIT:
            raise RuntimeError(f"example exceeded {WALL_LIMIT}s of wall time (busy loop?)")
        route, job_id = route_of(url)
        query = parse_qs(urlsplit(url).query)
        batch = int(query.get("batch_size", ["1"])[0]) if route in ("take", "take_batch") else 0
        ping_ids = None
        if route == "ping":
            raw = query.get("job_id", [""])[0]
            ping_ids = tuple(i for i in raw.split(",") if i)
        seq, now = rec.tick()
        index = len(rec.exchanges)
        sent = body if route in ("done", "stream") else b""
        ex = Exchange(
            index, route, job_id, batch, sent, seq, now, rec.held, rec.concurrency, ping_ids, PLAIN
        )
        rec.exchanges.append(ex)
        ex.net = step = rec.next_step(route, index)
        token = _CHAOS.set(Chaos(step))
        try:
            [response] = await self._inner.exchange(
                method, [(url, body)], max_body=max_body, keep_body=keep_body
            )
        except BaseException as exc:
            ex.end_seq, ex.end_time = rec.tick()
            ex.outcome = "cancelled" if only_cancelled(exc) else "error"
            ex.error = type(exc).__name__
            raise
        finally:
            _CHAOS.reset(token)
        ex.end_seq, ex.end_time = rec.tick()
        ex.outcome, ex.status, ex.answer = "ok", response.status, response.body
        if 200 <= response.status < 300:
            if route in ("take", "take_batch"):
                ex.delivered_ids = ids_in_take(response.body)
            elif route == "stop":
                ex.delivered_ids = ids_in_stop(response.body)
                for stop_id in ex.delivered_ids:
                    rec.stops.append(
                        StopDelivery(ex.end_seq, ex.end_time, stop_id, rec.state_of(stop_id))
                    )
        return response

    async def _round(
        self,
        method: str,
        requests: Sequence[tuple[str, bytes]],
        answers: list[HttpResponse],
        max_body: int,
        keep_body: int | None,
    ) -> None:
        """Stream chunks written at once (of one job or several): one exchange per chunk,
        one network step for the batch (one write, its answers read back together)."""
        inner = self._inner
        rec = self._rec
        seq, now = rec.tick()
        first = len(rec.exchanges)
        step = rec.next_step(route_of(requests[0][0])[0], first)
        batch = [
            Exchange(
                first + n, *route_of(url), 0, body, seq, now, rec.held, rec.concurrency, None, step
            )
            for n, (url, body) in enumerate(requests)
        ]
        rec.exchanges += batch
        token = _CHAOS.set(Chaos(step))
        failure: BaseException | None = None
        try:
            await inner.exchange(method, requests, answers, max_body=max_body, keep_body=keep_body)
        except BaseException as exc:
            failure = exc
            raise
        finally:
            _CHAOS.reset(token)
            end_seq, end_time = rec.tick()
            for ex in batch:
                ex.end_seq, ex.end_time = end_seq, end_time
            for ex, answer in zip(batch, answers, strict=False):
                ex.outcome, ex.status, ex.answer = "ok", answer.status, answer.body
            if failure is not None:  # then some went unanswered
                for ex in batch[len(answers) :]:
                    ex.outcome = "cancelled" if only_cancelled(failure) else "error"
                    ex.error = type(failure).__name__

    async def aclose(self) -> None:
        await self._inner.aclose()


class CrashRecordingApp:
    """The fake platform, recording any exception escaping it (the platform must never
    crash); the server then answers 500, as any ASGI server would."""

    def __init__(self, app: FakePlatform, rec: Recorder) -> None:
        self._app = app
        self._rec = rec

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await self._app(scope, receive, send)
        except Exception as exc:
            # An injected drop (ConnectionDropped), or send() telling the app the worker hung
            # up (the ASGI way): the server handles both, neither is a crash.
            if isinstance(exc, (AbortConnection, ClientDisconnected)):
                raise
            self._rec.app_errors.append((trio.current_time(), str(scope.get("path")), exc))
            raise
