"""FakePlatform: the local endpoint's app, with faults to inject and counters to read.

The queue, the worker routes and the endpoint API are the local endpoint's own
(:class:`trio_worker._endpoint._app.EndpointApp`), so tests drive the code developers
run. What only tests need is added here: :meth:`FakePlatform.inject` arms a
:class:`~trio_worker.testing.Fault` for the next requests of a route, and two routes
report on the platform:

============================================  ==========  ==================================
path                                          route name  answer
============================================  ==========  ==================================
GET  /_stats                                  stats       counters and per-job timings
GET  /_env                                    env         the ``RUNPOD_*`` wiring of a worker
============================================  ==========  ==================================

Neither is served by the local endpoint: ``/_env`` hands out the worker key.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import trio

from .._endpoint._app import EndpointApp, match_route
from .._endpoint._routes import Response, json_response
from .._endpoint._rules import RUNSYNC_WAIT
from ._faults import ArmedFault, ConnectionDropped, fault_response
from ._stats import stats_body

if TYPE_CHECKING:
    from .._endpoint._records import Fault
    from .._endpoint._routes import Request

__all__ = ["ConnectionDropped", "FakePlatform"]

# first path segment -> route name, of the routes only the fake platform serves
_REPORT_ROUTES: Final = {"_stats": "stats", "_env": "env"}


class FakePlatform(EndpointApp):
    """The Runpod platform, faked: a job queue behind the worker protocol, as an ASGI app.

    The local endpoint's app with no guard: its arguments are those of
    :class:`~trio_worker._endpoint.EndpointApp` but ``guard`` (``api_key`` None: the
    worker routes take any key), plus :meth:`inject` and the ``/_stats`` and ``/_env``
    routes. Finished jobs with a ``webhook`` URL have their final status POSTed to it
    while :meth:`run_webhook_sender` runs (:func:`run_platform_server` runs it).

    Sync methods (:meth:`enqueue`, :meth:`job`, ...) must be called from the trio thread
    that serves the app; with :func:`run_server_in_thread` use ``ServerThread.run_sync``.
    """

    def __init__(
        self,
        *,
        api_key: str | None = None,
        take_hold: float = 5.0,
        stop_hold: float = 5.0,
        requeue_after: float | None = None,
        endpoint_id: str = "test-ep",
        runsync_wait: float = RUNSYNC_WAIT,
        record_requests: bool = True,
        execution_timeout: float | None = None,
        expire_results: bool = False,
        max_finished: int | None = None,
    ) -> None:
        super().__init__(
            api_key=api_key,
            take_hold=take_hold,
            stop_hold=stop_hold,
            requeue_after=requeue_after,
            endpoint_id=endpoint_id,
            runsync_wait=runsync_wait,
            record_requests=record_requests,
            execution_timeout=execution_timeout,
            expire_results=expire_results,
            max_finished=max_finished,
        )
        self._faults: list[ArmedFault] = []

    def inject(self, fault: Fault) -> None:
        """Apply *fault* to the next ``fault.times`` requests of ``fault.route``.

        Faults are matched in the order they were injected.
        """
        self._faults.append(ArmedFault(fault, fault.times))

    # -- the hooks of EndpointApp ---------------------------------------------------------

    def _match(self, path: str) -> tuple[str, list[str]]:
        route = _REPORT_ROUTES.get(path.strip("/"))
        return (route, []) if route is not None else match_route(path)

    async def _respond(self, request: Request) -> Response:
        return await self._answer(request, self._take_fault(request.route))

    async def _route(self, request: Request) -> Response:
        if request.route == "stats" and request.method == "GET":
            return Response(200, stats_body(self, request.query))
        if request.route == "env" and request.method == "GET":
            base = f"http://{request.headers.get('host', '127.0.0.1')}"
            worker_id = request.query.get("worker_id", "w1")
            return json_response(200, self.worker_env(base, worker_id=worker_id))
        return await super()._route(request)

    # -- faults ---------------------------------------------------------------------------

    async def _answer(self, request: Request, fault: Fault | None) -> Response:
        """The route's answer, with *fault* applied before or after it."""
        if fault is not None:
            request.record.fault = fault
            if fault.when == "before":
                if fault.delay:
                    await trio.sleep(fault.delay)
                if fault.drop or fault.status is not None:
                    return fault_response(fault)
        response = await self._route(request)
        if fault is not None and fault.when == "after":
            try:
                if fault.delay:
                    await trio.sleep(fault.delay)
            except BaseException:
                if response.undo is not None:
                    response.undo()
                raise
            if fault.drop or fault.status is not None:
                # The effect stays applied (job handed out, result recorded): no undo.
                return fault_response(fault)
        return response

    def _take_fault(self, route: str) -> Fault | None:
        if not self._faults:
            return None
        now = trio.current_time()
        self._faults = [a for a in self._faults if a.fault.until is None or now < a.fault.until]
        for index, armed in enumerate(self._faults):
            if armed.fault.route == route or armed.fault.route == "*":
                armed.remaining -= 1
                if armed.remaining <= 0:
                    del self._faults[index]
                return armed.fault
        return None
