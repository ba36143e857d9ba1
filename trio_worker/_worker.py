"""The public entry points: ``serve()`` inside a trio run, ``start()`` for a whole process.

``serve()`` keeps the nursery's ExceptionGroups inside: it returns after a shutdown, raises
:class:`InitializationError` after an init failure has been reported, and raises
:class:`WorkerInternalError` (chained from the group) if trio_worker itself has a bug.
"""

from __future__ import annotations

import json
import logging
import math
import signal
from typing import TYPE_CHECKING, Any, Literal

import trio

from ._capture import OutputCapture, install_python_stream_attribution
from ._config import CaptureMode, Settings, Timings
from ._exceptions import ConfigurationError, InitializationError, WorkerInternalError
from ._handlers import Handler, ThreadWaits, handler_kind
from ._initializer import Initializer, validate_init_timeout
from ._platform._client import PlatformClient
from ._platform._heartbeat import HeartbeatThread, heartbeat_task
from ._results import ResultEncodingError, encode_result
from ._runner import JobRunner, JobSpec
from ._supervisor import Concurrency, Supervisor

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    import httpx

    from ._lifecycle import TransitionHook
    from ._platform._http import BackendWrapper, StreamOpener

log = logging.getLogger("trio_worker")

AsyncBackend = Literal["trio", "asyncio"]
HeartbeatMode = Literal["thread", "task", "off"]

_active: list[tuple[Supervisor, trio.lowlevel.TrioToken]] = []
# Set by start(): what a second SIGINT does (exit the process at once). serve() alone
# raises KeyboardInterrupt instead.
on_second_interrupt: Callable[[], None] | None = None


class WorkerHandle:
    """A running worker, as handed back by ``nursery.start(serve, ...)``."""

    def __init__(self, supervisor: Supervisor) -> None:
        self._supervisor = supervisor

    def shutdown(self, reason: str = "requested") -> None:
        """Begin a graceful shutdown, as SIGTERM does (docs/design.md §9)."""
        self._supervisor.request_shutdown(reason)

    def stop_job(self, job_id: str) -> None:
        """Stop one job as a platform stop signal would."""
        self._supervisor.stop_job(job_id)

    @property
    def held_ids(self) -> tuple[str, ...]:
        """The ids the worker holds now (what the next ping will list)."""
        return self._supervisor.ledger.held_ids

    @property
    def concurrency(self) -> int:
        return self._supervisor.concurrency

    @property
    def gate_open(self) -> bool:
        return self._supervisor.gate.is_set()

    def statistics(self) -> dict[str, object]:
        return self._supervisor.statistics()


def validate_concurrency(concurrency: Concurrency) -> Concurrency:
    """Check *concurrency*: an int >= 1, or a callable ``f(current) -> int``.

    Raises:
        ConfigurationError: for anything else.
    """
    if callable(concurrency):
        return concurrency
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ConfigurationError(
            f"concurrency must be an int >= 1 or a callable, got {concurrency!r}"
        )
    return concurrency


def validate_backend(async_backend: str) -> None:
    """Raises ConfigurationError unless *async_backend* is one this release runs."""
    if async_backend == "trio":
        return
    if async_backend == "asyncio":
        raise ConfigurationError(
            'async_backend="asyncio" is not available in this release of trio_worker; async '
            "handlers run on trio. Use a sync handler (it runs in a thread, where asyncio.run "
            "works) until the asyncio backend lands."
        )
    raise ConfigurationError(f"async_backend must be 'trio' or 'asyncio', got {async_backend!r}")


async def serve(
    handler: Handler,
    *,
    initializer: Initializer | None = None,
    init_timeout: float | None = None,
    concurrency: Concurrency = 1,
    return_aggregate_stream: bool = False,
    refresh_worker: bool = False,
    async_backend: AsyncBackend = "trio",
    capture_logs: CaptureMode = "on",
    timings: Timings | None = None,
    environ: Mapping[str, str] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    open_stream: StreamOpener | None = None,
    wrap_backend: BackendWrapper | None = None,
    heartbeat: HeartbeatMode = "thread",
    handle_signals: bool = True,
    observers: Iterable[TransitionHook] = (),
    capture: OutputCapture | None = None,
    task_status: trio.TaskStatus[WorkerHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the worker inside the current trio run until it shuts down.

    Started with ``await nursery.start(serve, handler, ...)``, it hands back a
    :class:`WorkerHandle` once the worker is set up (before the first take).

    Args:
        handler: called with each job dict; sync, async, or a (sync or async) generator.
        initializer: run once (sync in a thread, or async) before any handler starts.
        init_timeout: seconds the initializer may take; None means no SDK bound.
        concurrency: jobs held at once, or a callable ``f(current) -> int``.
        capture_logs: "on" captures fds 1 and 2 for error reports; "off" does not.
        timings: the worker's internal timeouts (shutdown grace, report deadline, ...).
        environ: where to read ``RUNPOD_*`` from; ``os.environ`` by default.
        transport: an httpx transport in place of the network (the in-process fake).
        open_stream: the lean client's connect, replaced (in-memory streams to the fake).
        wrap_backend: wraps the platform client's HTTP backends (to record requests).
        heartbeat: "thread" (production), "task" (on trio's clock, for virtual-time tests).
        handle_signals: SIGTERM/SIGINT start a graceful shutdown.
        observers: called after every job state transition (for tests).
        capture: an already installed capture to use (``start()`` installs its own).

    Raises:
        ConfigurationError: a setting is invalid (before anything runs).
        InitializationError: the initializer failed; every held job has been failed.
        WorkerInternalError: a bug in trio_worker.
    """
    validate_backend(async_backend)
    concurrency = validate_concurrency(concurrency)
    init_timeout = validate_init_timeout(init_timeout)
    if not callable(handler):
        raise ConfigurationError(f"handler must be callable, got {handler!r}")
    settings = Settings.from_environ(environ, timings=timings, capture_logs=capture_logs)
    if not settings.platform.queue_mode:
        raise ConfigurationError(
            "RUNPOD_WEBHOOK_GET_JOB is not set: serve() needs the platform's job-take URL "
            "(use --test_input or --rp_serve_api for local runs)"
        )
    owns_capture = capture is None and capture_logs == "on"
    if owns_capture:
        capture = OutputCapture.install(redactor=settings.redactor)
        install_python_stream_attribution()
    elif capture_logs == "off":
        capture = None
    try:
        await _serve(
            handler,
            settings,
            capture,
            initializer=initializer,
            init_timeout=init_timeout,
            concurrency=concurrency,
            return_aggregate_stream=return_aggregate_stream,
            refresh_worker=refresh_worker,
            transport=transport,
            open_stream=open_stream,
            wrap_backend=wrap_backend,
            heartbeat=heartbeat,
            handle_signals=handle_signals,
            observers=observers,
            task_status=task_status,
        )
    finally:
        if owns_capture and capture is not None:
            capture.stop()


async def _serve(
    handler: Handler,
    settings: Settings,
    capture: OutputCapture | None,
    *,
    initializer: Initializer | None,
    init_timeout: float | None,
    concurrency: Concurrency,
    return_aggregate_stream: bool,
    refresh_worker: bool,
    transport: httpx.AsyncBaseTransport | None,
    open_stream: StreamOpener | None,
    wrap_backend: BackendWrapper | None,
    heartbeat: HeartbeatMode,
    handle_signals: bool,
    observers: Iterable[TransitionHook],
    task_status: trio.TaskStatus[WorkerHandle],
) -> None:
    client = PlatformClient(
        settings.platform,
        settings.timings,
        transport=transport,
        open_stream=open_stream,
        wrap_backend=wrap_backend,
    )
    waits = ThreadWaits()
    spec = JobSpec(handler, handler_kind(handler), return_aggregate_stream, refresh_worker)
    supervisor: Supervisor | None = None

    def shared_process() -> bool:
        return supervisor is not None and supervisor.concurrency > 1

    # Capacity is the ledger's business; the limiter only lifts trio's default of 40 threads.
    runner = JobRunner(
        spec, settings, client, capture, trio.CapacityLimiter(math.inf), waits, shared_process
    )
    supervisor = Supervisor(
        settings=settings,
        client=client,
        runner=runner,
        waits=waits,
        initializer=initializer,
        init_timeout=init_timeout,
        concurrency=concurrency,
        capture=capture,
        refresh_worker=refresh_worker,
        observers=observers,
    )
    pinger = _start_heartbeat_thread(settings, supervisor) if heartbeat == "thread" else None
    task_status.started(WorkerHandle(supervisor))
    entry = (supervisor, trio.lowlevel.current_trio_token())
    _active.append(entry)
    failure: InitializationError | None = None
    try:
        async with trio.open_nursery() as outer:
            if handle_signals:
                outer.start_soon(_watch_signals, supervisor)
            if heartbeat == "task" and settings.platform.ping_url:
                outer.start_soon(
                    heartbeat_task,
                    client.polls,
                    settings.platform.ping_url,
                    settings.platform.ping_interval,
                    lambda: supervisor.ledger.held_ids,
                )
            try:
                await supervisor.run()
            except InitializationError as exc:
                failure = exc
            finally:
                outer.cancel_scope.cancel()
    except ExceptionGroup as group:
        raise WorkerInternalError(f"trio_worker failed: {group!r}") from group
    finally:
        _active.remove(entry)
        if pinger is not None:
            pinger.stop()
        await client.aclose()
    if failure is not None:
        raise failure


def _start_heartbeat_thread(settings: Settings, supervisor: Supervisor) -> HeartbeatThread | None:
    platform = settings.platform
    if not platform.ping_url:
        log.warning("RUNPOD_WEBHOOK_PING is not set; no heartbeat will be sent")
        return None
    pinger = HeartbeatThread(
        platform.ping_url,
        platform.api_key,
        platform.ping_interval,
        lambda: supervisor.ledger.held_ids,
    )
    pinger.start()
    return pinger


async def _watch_signals(supervisor: Supervisor) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            name = signal.Signals(signum).name
            if supervisor.shutting_down and signum == signal.SIGINT:
                log.warning("second SIGINT: exiting at once")
                if on_second_interrupt is not None:
                    on_second_interrupt()
                raise KeyboardInterrupt
            supervisor.request_shutdown(f"{name} received")


def progress_update(job: Mapping[str, Any], progress: object) -> None:
    """Send a non-terminal progress update for *job* (docs/protocol.md §3.5).

    Callable from an async handler or from a sync handler's thread. Unlike the reference,
    updates never arrive after the job's final result. Does nothing (with a warning) when no
    worker is running, or when *progress* is not JSON-serializable.
    """
    if not _active:
        log.warning("progress_update called with no worker running; ignored")
        return
    supervisor, token = _active[-1]
    job_id = str(job.get("id"))
    try:
        body = encode_result({"status": "IN_PROGRESS", "output": progress})
    except ResultEncodingError as err:
        log.error("progress_update for job %s not sent: %s", job_id, err)
        return
    try:
        current = trio.lowlevel.current_trio_token()
    except RuntimeError:
        current = None
    if current is token:
        supervisor.spawn_progress(job_id, body)
    else:
        token.run_sync_soon(supervisor.spawn_progress, job_id, body)


def describe_settings(settings: Settings) -> str:
    """One log line with the wiring (never the API key)."""
    platform = settings.platform
    return json.dumps(
        {
            "worker_id": platform.worker_id,
            "take": platform.take_url,
            "ping": platform.ping_url,
            "ping_interval_s": platform.ping_interval,
        }
    )
