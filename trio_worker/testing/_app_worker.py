"""``trio_worker.testing.serve_app``: a load-balancing worker inside a test's trio run.

``trio_worker.start_app`` owns a process (ports from the environment, the crash watchdog,
signals, the exit); a test wants the same worker in its own nursery, on loopback ports it
picks, with a handle to send it a SIGTERM's shutdown and read its phase::

    async with trio.open_nursery() as nursery:
        worker = await nursery.start(functools.partial(serve_app, app, initializer=load))
        async with httpx.AsyncClient() as client:
            assert (await client.get(worker.url + "/ping")).status_code == 204
        worker.shutdown()
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, cast

import trio

from .._app._serve import AppWorker, Ports, bind_ports, check_app
from .._config import Settings
from .._options import worker_options

if TYPE_CHECKING:
    from collections.abc import Mapping

    from .._app._gate import ASGIApp
    from .._app._loops import AppLoop
    from .._backends._handler_calls import Handler
    from .._config import Timings
    from .._initializer import Initializer
    from .._options import AsyncBackend

__all__ = ["AppHandle", "serve_app"]


class AppHandle:
    """A running load-balancing worker, as ``nursery.start(serve_app, ...)`` hands it back."""

    def __init__(self, worker: AppWorker, host: str) -> None:
        self._worker = worker
        base = f"http://{host}"
        self.url = f"{base}:{worker.ports.app}"
        self.health_url = f"{base}:{worker.ports.health}"
        self.status: int | None = None  # the process's exit status, once it has ended
        self._changed = trio.Event()
        worker.health.observers.append(lambda _: self._note_change())

    def _note_change(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_phase(self, phase: str) -> None:
        """Until the worker is in *phase* ("ready", "failed", "draining")."""
        while self.phase != phase:
            await self._changed.wait()

    async def wait_ended(self) -> int:
        """Until the worker has ended; its exit status."""
        while self.status is None:
            await self._changed.wait()
        return self.status

    @property
    def phase(self) -> str:
        """ "loading", "ready", "failed" or "draining"."""
        return self._worker.health.phase.value

    @property
    def in_flight(self) -> int:
        """Requests the app is serving now."""
        return self._worker.gate.in_flight

    def shutdown(self, reason: str = "SIGTERM received") -> None:
        """Begin the shutdown a SIGTERM begins."""
        self._worker.request_shutdown(reason)


async def serve_app(
    app: ASGIApp,
    *,
    initializer: Initializer | None = None,
    init_timeout: float | None = None,
    async_backend: AsyncBackend = "trio",
    timings: Timings | None = None,
    environ: Mapping[str, str] | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    health_port: int | None = None,
    fitness: bool = False,
    loop: AppLoop | None = None,
    task_status: trio.TaskStatus[AppHandle] = trio.TASK_STATUS_IGNORED,
) -> int:
    """Serve *app* as ``start_app`` would, until it would exit; the exit status.

    *port* 0 picks a free port; *health_port* None serves ``/ping`` on the app's port
    (0: on a free port of its own).
    *fitness* runs the fitness checks first, as in production. *loop*, where the app and
    the server run (``_app._loops``), may be replaced by a test's own.

    Raises:
        ConfigurationError: an invalid argument.
        OSError: a port cannot be bound.
    """
    check_app(app)
    env = os.environ if environ is None else environ
    options = worker_options(
        cast("Handler", app),
        "start_app",
        initializer=initializer,
        init_timeout=init_timeout,
        async_backend=async_backend,
        capture_logs="off",
        timings=timings,
    )
    settings = Settings.from_environ(env, timings=options.timings, capture_logs="off")
    sockets = bind_ports(Ports(port, health_port), host)
    worker = AppWorker(app, options, settings, sockets, environ=env, fitness=fitness, loop=loop)
    handle = AppHandle(worker, host)

    async def run(task_status: trio.TaskStatus[AppWorker]) -> None:
        handle.status = await worker.run(task_status=task_status)
        handle._note_change()

    async with trio.open_nursery() as nursery:
        await nursery.start(run)
        task_status.started(handle)
    assert handle.status is not None
    return handle.status
