"""``trio_worker.testing.serve``: the real worker with its test seams exposed.

The public :func:`trio_worker.serve` takes only what a deployment needs; a test also wants
the platform in process (an ASGI app on the in-memory network, or a stream opener for
the lean client), a
heartbeat on trio's clock, observers of every job transition, and a capture it installed
itself. Same worker, same checks, same contract.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Unpack

import trio

from .._exceptions import ConfigurationError
from .._options import ServeOptions, spelled_out, worker_options
from .._worker import HeartbeatMode, Seams, WorkerHandle, run_worker
from ._memory import memory_network

if TYPE_CHECKING:
    from collections.abc import Iterable

    from .._backends._handler_calls import Handler
    from .._capture import OutputCapture
    from .._platform._http import BackendWrapper, StreamOpener
    from .._state import TransitionHook
    from ._http_server import ASGIApp


@spelled_out("serve")
async def serve(
    handler: Handler,
    *,
    open_stream: StreamOpener | None = None,
    wrap_backend: BackendWrapper | None = None,
    app: ASGIApp | None = None,
    heartbeat: HeartbeatMode = "thread",
    observers: Iterable[TransitionHook] = (),
    capture: OutputCapture | None = None,
    task_status: trio.TaskStatus[WorkerHandle] = trio.TASK_STATUS_IGNORED,
    **given: Unpack[ServeOptions],
) -> None:
    """:func:`trio_worker.serve`, plus the seams a test needs.

    Args:
        open_stream: ``(host, port, tls) -> stream`` used instead of TCP/TLS connects
            (:func:`trio_worker.testing.memory_network` gives one to the fake platform).
        wrap_backend: wraps each HTTP backend of the platform client, e.g. to record or
            disturb every request while the production client still does the work.
        app: an ASGI app (the fake platform) in place of the network, served on the
            in-memory network (:func:`trio_worker.testing.memory_network`); not with
            *open_stream*.
        heartbeat: "thread" (production), "task" (on trio's clock, for virtual time), "off".
        observers: called after every job state transition.
        capture: an already installed capture to use instead of installing one.
        **given: :func:`trio_worker.serve`'s keyword arguments, below.

    Raises:
        Whatever :func:`trio_worker.serve` raises.
    """
    if heartbeat not in ("thread", "task", "off"):
        raise ConfigurationError(f"heartbeat must be 'thread', 'task' or 'off', got {heartbeat!r}")
    environ = given.pop("environ", None)
    handle_signals = given.pop("handle_signals", True)
    options = worker_options(handler, "serve", **given)
    if app is not None and open_stream is not None:
        raise ConfigurationError("give serve() an app or an open_stream, not both")

    async def run(opener: StreamOpener | None) -> None:
        seams = Seams(
            open_stream=opener,
            wrap_backend=wrap_backend,
            heartbeat=heartbeat,
            observers=tuple(observers),
            capture=capture,
        )
        await run_worker(
            options,
            environ=environ,
            handle_signals=handle_signals,
            seams=seams,
            task_status=task_status,
        )

    if app is None:
        await run(open_stream)
        return
    async with memory_network(app) as opener:
        await run(opener)
