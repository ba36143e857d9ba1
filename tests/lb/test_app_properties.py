"""A property over the orderings of requests, the load's outcome and SIGTERM.

The worker (:class:`trio_worker._app._serve.AppWorker`: its gate, phases, load and drain)
runs in virtual time (``MockClock``, autojump) with the server replaced by direct ASGI
calls into its gate, so Hypothesis can try thousands of schedules: requests and pings
arriving at drawn times, a load that succeeds, fails or outlasts ``init_timeout``, and a
SIGTERM at any point (a worker that loaded serves until one). For every schedule:

* ``/ping`` only ever moves 204 -> 200 -> not-200, or 204 -> not-200;
* the app never runs before the load has returned;
* every request in flight at SIGTERM is answered within the grace: 200 if it could finish
  within it, 503 if the grace cut it.
"""

from __future__ import annotations

import functools
import itertools
import socket
from typing import TYPE_CHECKING, Any

import trio
import trio.testing
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

import trio_worker
from trio_worker._app._loops import _TrioLoop
from trio_worker.testing import AppHandle, serve_app

if TYPE_CHECKING:
    from collections.abc import MutableMapping

GRACE = 2.0
INIT_TIMEOUT = 5.0


class DirectLoop(_TrioLoop):
    """The worker's trio loop, with no server: the test calls the gate itself."""

    async def serve(self, app: Any, sockets: list[socket.socket], shutdown: Any) -> None:
        self.gate = app
        for sock in sockets:
            sock.close()
        await shutdown.wait()


times = st.floats(min_value=0.0, max_value=10.0, allow_nan=False)
schedules = st.fixed_dictionaries(
    {
        "load_time": times,
        "outcome": st.sampled_from(["ok", "fail"]),
        "sigterm": st.floats(min_value=0.0, max_value=12.0, allow_nan=False),
        "requests": st.lists(st.tuples(times, st.floats(0.0, 4.0)), max_size=6),
        "pings": st.lists(times, max_size=8),
    }
)

_RANK = {204: 0, 200: 1}


@settings(max_examples=200, deadline=None)
@given(schedule=schedules)
# Found by CI: two pings and the SIGTERM in one instant, answered in another order.
@example(
    schedule={
        "load_time": 0.0,
        "outcome": "ok",
        "sigterm": 1.0,
        "requests": [],
        "pings": [1.0, 1.0],
    }
)
def test_ping_moves_forward_the_app_waits_for_the_load_and_sigterm_answers_all(
    schedule: dict[str, Any],
) -> None:
    # A load ending at the very instant of the SIGTERM may be seen either side of it.
    assume(min(schedule["load_time"], INIT_TIMEOUT) != schedule["sigterm"])
    trio.run(_scenario, schedule, clock=trio.testing.MockClock(autojump_threshold=0))


async def _scenario(schedule: dict[str, Any]) -> None:
    loaded_at: list[float] = []
    app_calls: list[float] = []
    pings: list[tuple[float, int, int]] = []
    arrivals = itertools.count()
    answers: dict[int, tuple[float, int]] = {}
    entered: dict[int, float] = {}
    sigterm_at: list[float] = []

    async def load() -> None:
        await trio.sleep(schedule["load_time"])
        if schedule["outcome"] == "fail":
            raise RuntimeError("the weights are corrupt")
        loaded_at.append(trio.current_time())

    async def app(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return  # no lifespan
        app_calls.append(trio.current_time())
        assert loaded_at, "the app ran before the load returned"
        await trio.sleep(float(scope["query_string"] or 0))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    loop = DirectLoop()
    timings = trio_worker.Timings(shutdown_grace=GRACE, failure_hold=3.0)

    async def call(path: str, query: bytes, index: int | None) -> int:
        status: list[int] = []

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])

        async def receive() -> dict[str, Any]:
            await trio.sleep_forever()
            raise AssertionError

        scope = {"type": "http", "path": path, "query_string": query, "headers": []}
        if index is not None and worker.phase == "ready":
            entered[index] = trio.current_time()
        await loop.gate(scope, receive, send)
        return status[0]

    async def request(index: int, at: float, duration: float) -> None:
        await trio.sleep(at)
        status = await call("/work", repr(duration).encode(), index)
        answers[index] = (trio.current_time(), status)

    async def ping(at: float) -> None:
        await trio.sleep(at)
        # Stamped as it arrives: pings of one instant may be answered in another order.
        arrived = (trio.current_time(), next(arrivals))
        pings.append((*arrived, await call("/ping", b"", None)))

    async def sigterm(at: float) -> None:
        await trio.sleep(at)
        sigterm_at.append(trio.current_time())
        worker.shutdown()

    async with trio.open_nursery() as nursery:
        worker: AppHandle = await nursery.start(
            functools.partial(
                serve_app,
                app,
                initializer=load,
                init_timeout=INIT_TIMEOUT,
                timings=timings,
                loop=loop,
            )
        )
        async with trio.open_nursery() as clients:
            for index, (at, duration) in enumerate(schedule["requests"]):
                clients.start_soon(request, index, at, duration)
            for at in schedule["pings"]:
                clients.start_soon(ping, at)
            clients.start_soon(sigterm, schedule["sigterm"])
            status = await worker.wait_ended()
            clients.cancel_scope.cancel()  # what arrives after the exit is never served

    # /ping moves forward only: 204 -> 200 -> not-200, or 204 -> not-200, in the order the
    # pings arrived (one instant's by their arrival): a ping reads the phase as it arrives.
    ranks = [_RANK.get(status, 2) for _, _, status in sorted(pings)]
    assert ranks == sorted(ranks), pings
    # The app ran only after the load returned, and never after a failed load.
    assert all(loaded_at and at >= loaded_at[0] for at in app_calls)
    if schedule["outcome"] == "fail" or schedule["load_time"] >= INIT_TIMEOUT:
        assert not app_calls
    # Every request in flight at SIGTERM was answered within the grace.
    if sigterm_at:
        for index, at in entered.items():
            if at <= sigterm_at[0]:
                answered, code = answers[index]
                assert answered <= sigterm_at[0] + GRACE + 1.0
                # One that could finish within the grace did; the others got a 503.
                fits = at + schedule["requests"][index][1] < sigterm_at[0] + GRACE
                assert code == (200 if fits else 503), (at, code)
    # Status 1 when the load failed first (its hold cut short by a SIGTERM), else 0.
    assert status == (1 if _failed_first(schedule) else 0)


def _failed_first(schedule: dict[str, Any]) -> bool:
    """Whether the load failed (or timed out) before the SIGTERM arrived."""
    failed = schedule["outcome"] == "fail" or schedule["load_time"] >= INIT_TIMEOUT
    return bool(failed) and min(schedule["load_time"], INIT_TIMEOUT) < schedule["sigterm"]
