"""The load-balancing worker inside a trio run: the server, the load, the phases, the exit.

:class:`AppWorker` serves the :class:`~._gate.Gate` from the first moment, so ``/ping``
answers 204 while the load runs under the queue worker's initializer rules; what each
outcome and SIGTERM do is docs/load-balancing.md, "What it does". The failure's output
tail goes to the log only: it never leaves the process otherwise.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
from typing import TYPE_CHECKING

import trio

from .._backends import makes_coroutine
from .._categories import classify
from .._exceptions import ConfigurationError
from .._fitness import FitnessCheckFailed, check_fitness
from .._fitting import clip
from .._initializer import call_initializer, run_initializer
from .._scopes import Scopes
from ._gate import Gate
from ._health import Failure, Health, Phase
from ._lifespan import AppLifespan
from ._loops import SERVER_CLOSE_BOUND, app_loop

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from .._capture import OutputCapture
    from .._config import Settings
    from .._exit import ExitGuard
    from .._initializer import Initializer
    from .._options import WorkerOptions
    from ._gate import ASGIApp
    from ._loops import AppLoop

__all__ = ["AppWorker", "Ports", "bind_ports", "check_app", "serve_in_process"]

log = logging.getLogger("trio_worker")

DEFAULT_PORT = 80
#: Where the platform reaches a load-balancing worker: every interface.
BIND_HOST = "0.0.0.0"
# After the grace, how long cancelled requests get to send their 503.
_UNWIND_BOUND = 1.0
# The failure's message as callers see it, through Runpod's proxy.
_MESSAGE_CHARS = 1000


@dataclasses.dataclass(frozen=True)
class Ports:
    """``PORT`` (the app) and ``PORT_HEALTH`` (``/ping``; None: on ``PORT``)."""

    app: int = DEFAULT_PORT
    health: int | None = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], default: int = DEFAULT_PORT) -> Ports:
        """Read them; 0 picks a free port (tests).

        Raises:
            ConfigurationError: a value that is not a port number.
        """
        app = _port(environ, "PORT", default)
        health = _port(environ, "PORT_HEALTH", app)
        return cls(app, None if health == app else health)


def _port(environ: Mapping[str, str], name: str, default: int) -> int:
    raw = (environ.get(name) or "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise ConfigurationError(f"{name} must be a port number (0-65535), got {raw!r}")
    return value


def check_app(app: object) -> None:
    """Raises ConfigurationError unless *app* is an ASGI 3 app: ``async app(scope, receive,
    send)``, a function or an object with an async ``__call__`` (FastAPI, Starlette, any
    ASGI middleware). A WSGI app (Flask) or an ASGI 2 one would fail every request."""
    if not callable(app) or not makes_coroutine(app):
        raise ConfigurationError(
            f"app must be an ASGI 3 application, async app(scope, receive, send), got {app!r}"
            " (a WSGI app such as Flask's needs an ASGI adapter: asgiref's WsgiToAsgi)"
        )


def bind_ports(ports: Ports, host: str = BIND_HOST) -> list[socket.socket]:
    """One listening socket per distinct port (the app's first).

    Raises:
        OSError: a port cannot be bound (in use, or privileged).
    """
    wanted = [ports.app] if ports.health is None else [ports.app, ports.health]
    sockets: list[socket.socket] = []
    try:
        for port in wanted:
            sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(1024)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


class AppWorker:
    """One load-balancing worker: :meth:`run` it in a nursery, or through ``start_app``."""

    def __init__(
        self,
        app: ASGIApp,
        options: WorkerOptions,
        settings: Settings,
        sockets: list[socket.socket],
        *,
        capture: OutputCapture | None = None,
        environ: Mapping[str, str] | None = None,
        fitness: bool = True,
        loop: AppLoop | None = None,
    ) -> None:
        self.health = Health()
        self._options = options
        self._settings = settings
        self._capture = capture
        self._environ = environ
        self._fitness = fitness
        self._waits = Scopes(options.timings)
        self._loop = loop or app_loop(options.backend, self._waits)
        # The ports bound (0 picks one): the app's, and /ping's.
        self.ports = Ports(sockets[0].getsockname()[1], sockets[-1].getsockname()[1])
        self._sockets = sockets
        self._lifespan = AppLifespan(app, self._loop, options.backend, self._waits)
        self._idle = trio.Event()
        self.gate = Gate(
            app,
            self.health,
            self._loop,
            app_port=None if len(sockets) == 1 else self.ports.app,
            health_port=None if len(sockets) == 1 else self.ports.health,
            on_idle=lambda: self._idle.set(),
            state=self._lifespan.state,
        )
        self._shutdown = trio.Event()
        self._load_scope = trio.CancelScope()
        self._finishing = False
        self._status = 0

    def request_shutdown(self, reason: str, *, status: int = 0) -> None:
        """Begin the shutdown, as SIGTERM does (on the trio thread); *status*: the exit
        status once it is over (a handler's ``sys.exit(n)`` in the realtime route)."""
        if self._shutdown.is_set():
            return
        self._status = status
        log.info("%s: shutting down (/ping no longer answers 200)", reason)
        if self.health.phase in (Phase.LOADING, Phase.READY):
            self.health.become(Phase.DRAINING)
        self._shutdown.set()
        self._load_scope.cancel()

    @property
    def finishing(self) -> bool:
        """Whether the app's lifespan shutdown is running (bounded by ``shutdown_grace``):
        the exit guard's watchdog waits for it rather than cut it."""
        return self._finishing

    async def run(
        self, *, task_status: trio.TaskStatus[AppWorker] = trio.TASK_STATUS_IGNORED
    ) -> int:
        """Serve until the worker is done; the process's exit status (0, 1 after a failed
        load, or the status :meth:`request_shutdown` was given)."""
        server_stop = self._loop.event()
        server_done = trio.Event()

        async def serve() -> None:
            try:
                await self._loop.serve(self.gate, self._sockets, server_stop)
            finally:
                server_done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve)
            log.info(
                "load-balancing worker: the app on port %d, /ping on port %d",
                self.ports.app,
                self.ports.health,
            )
            task_status.started(self)
            status = await self._live(nursery)
            server_stop.set()
            with trio.move_on_after(SERVER_CLOSE_BOUND * 2):
                await server_done.wait()
            if self.health.phase is not Phase.FAILED:
                self._finishing = True
                with trio.move_on_after(self._options.timings.shutdown_grace):
                    await self._lifespan.shutdown()
                self._finishing = False
            # What is left (a lifespan still starting, the server's task on asyncio) is
            # cancelled; code of the app that ignores it is not waited for past this.
            self._waits.end_by(trio.current_time() + _UNWIND_BOUND)
            nursery.cancel_scope.cancel()
        return status

    async def _live(self, nursery: trio.Nursery) -> int:
        with self._load_scope:
            failure = await self._load(nursery)
        if self._shutdown.is_set():
            if self.health.phase is Phase.FAILED:
                return 1
            await self._drain()
            return self._status
        if failure is not None:
            self.health.fail(failure)
            with trio.move_on_after(self._options.timings.failure_hold):
                await self._shutdown.wait()
            return 1
        self.health.become(Phase.READY)
        await self._shutdown.wait()
        await self._drain()
        return self._status

    async def _load(self, nursery: trio.Nursery) -> Failure | None:
        started = trio.current_time()
        if self._fitness:
            failure = await self._check_fitness()
            if failure is not None:
                return failure
        initializer = self._options.backend.initializer(self._options.initializer, self._waits)
        load = _loader(initializer, self._lifespan, nursery)
        capture, chars = self._capture, self._settings.logs_tail_chars
        init = await run_initializer(
            load,
            self._options.init_timeout,
            lambda: capture.tail(chars) if capture is not None else "",
        )
        if init is None:
            log.info("ready in %.2fs: /ping answers 200", trio.current_time() - started)
            return None
        redact = self._settings.redactor.redact
        message = redact(clip(init.message, _MESSAGE_CHARS))
        tail = redact(init.logs)
        log.error(
            "the model failed to load after %.1fs (%s): %s: %s%s",
            init.elapsed,
            init.category,
            init.error_type,
            message,
            f"\n{redact(init.traceback)}" if init.traceback else "",
        )
        if tail:
            log.error("its output before the failure (the tail):\n%s", tail)
        return Failure(init.category, init.error_type, message)

    async def _check_fitness(self) -> Failure | None:
        environ = os.environ if self._environ is None else self._environ
        try:
            await check_fitness(self._settings, self._options.backend, environ)
        except FitnessCheckFailed as failed:  # already logged
            return Failure(classify(failed, ""), "FitnessCheckFailed", str(failed))
        return None

    async def _drain(self) -> None:
        grace = self._options.timings.shutdown_grace
        with trio.move_on_after(grace):
            await self._until_idle()
        cut = self.gate.cancel_in_flight()
        if cut:
            log.warning(
                "%d request(s) still running %.1fs after SIGTERM: cancelled, answered 503",
                cut,
                grace,
            )
            with trio.move_on_after(_UNWIND_BOUND):
                await self._until_idle()

    async def _until_idle(self) -> None:
        while self.gate.in_flight:
            self._idle = trio.Event()
            await self._idle.wait()


def _loader(
    initializer: Initializer | None, lifespan: AppLifespan, nursery: trio.Nursery
) -> Initializer:
    """The supervised load: the initializer (if any), then the app's lifespan startup."""

    async def load() -> None:
        if initializer is not None:
            await call_initializer(initializer)
        nursery.start_soon(lifespan.run)
        await lifespan.startup()

    return load


def serve_in_process(
    app: ASGIApp,
    options: WorkerOptions,
    settings: Settings,
    sockets: list[socket.socket],
    capture: OutputCapture | None,
    guard: ExitGuard,
    *,
    fitness: bool = True,
    loop: AppLoop | None = None,
    attach: Callable[[AppWorker], None] | None = None,
) -> int:
    """Run an :class:`AppWorker` as this process's event loop, under ``start()``'s signal
    handling and exit watchdog (*guard*, installed here); its exit status. *attach* is
    handed the worker first."""
    guard.install()

    async def main() -> int:
        worker = AppWorker(
            app, options, settings, sockets, capture=capture, fitness=fitness, loop=loop
        )
        if attach is not None:
            attach(worker)
        token = trio.lowlevel.current_trio_token()
        guard.attach(token, worker.request_shutdown, lambda: worker.finishing)
        return await worker.run()

    return options.backend.run(main)
