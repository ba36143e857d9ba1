"""``serve()``: the queue worker inside a trio run (``start()`` wraps it for a process).

No ExceptionGroup leaves ``serve()``: what its nursery raises becomes one exception
(:func:`_outside`; docs/reference.md, ``trio_worker.serve``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from typing import TYPE_CHECKING, Literal, Unpack

import trio

from ._chunk_convoy import ChunkConvoy
from ._config import Settings, without_credentials
from ._delivery import Delivery
from ._exceptions import (
    ConfigurationError,
    InitializationError,
    WorkerInternalError,
    exception_leaves,
)
from ._exit import capture_output, watch_signals
from ._options import ServeOptions, WorkerOptions, spelled_out, worker_options
from ._payloads import Payloads
from ._platform._client import PlatformClient
from ._platform._heartbeat import HeartbeatThread, heartbeat_task
from ._progress_calls import ProgressTarget, running_worker
from ._runner import JobRunner, JobSpec
from ._scopes import Scopes
from ._state import WorkerPhase
from ._supervisor import Supervisor
from ._watch import records as crash_records

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable, Mapping

    from ._backends._handler_calls import Handler
    from ._capture import OutputCapture
    from ._exit import ExitGuard
    from ._platform._http import BackendWrapper, StreamOpener
    from ._state import TransitionHook

log = logging.getLogger("trio_worker")

HeartbeatMode = Literal["thread", "task", "off"]


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
        supervisor = self._supervisor
        return {
            "held": len(supervisor.ledger),
            "ever_held": supervisor.ledger.ever_held,
            "concurrency": supervisor.concurrency,
            "gate_open": supervisor.state.gate_open,
            "shutting_down": supervisor.shutting_down,
            "init_failed": supervisor.phase is WorkerPhase.INIT_FAILED,
        }


@dataclasses.dataclass(frozen=True)
class Seams:
    """What a test may put in place of production parts (``trio_worker.testing.serve``)."""

    open_stream: StreamOpener | None = None  # (host, port, tls) -> stream, instead of TCP
    wrap_backend: BackendWrapper | None = None  # wraps the client's HTTP (to record requests)
    heartbeat: HeartbeatMode = "thread"  # "task" runs on trio's clock; "off" sends none
    observers: Iterable[TransitionHook] = ()  # called after every job state transition
    capture: OutputCapture | None = None  # an installed capture, instead of our own
    exit_guard: ExitGuard | None = None  # start()'s signals and exit watchdog


@spelled_out("serve")
async def serve(
    handler: Handler,
    *,
    task_status: trio.TaskStatus[WorkerHandle] = trio.TASK_STATUS_IGNORED,
    **given: Unpack[ServeOptions],
) -> None:
    """Run the worker inside the current trio run until it shuts down.

    Started with ``await nursery.start(serve, handler, ...)``, it hands back a
    :class:`WorkerHandle` once the worker is set up (before the first take).

    Args:
        handler: called with each job dict; sync, async, or a (sync or async) generator.
        task_status: given by ``nursery.start``.
        **given: the keyword arguments below.

    Raises:
        TypeError: a keyword it does not take.
        ConfigurationError: a setting is invalid (before anything runs).
        InitializationError: the initializer failed; every held job has been failed.
        KeyboardInterrupt: a second SIGINT arrived during the shutdown, or a handler
            raised KeyboardInterrupt (raised once the worker has shut down, as below).
        SystemExit: a handler called ``sys.exit(n)``; its job was reported failed, the
            worker shut down as on SIGTERM, then this is raised with the exit status.
        WorkerInternalError: a bug in trio_worker (chained from what the nursery raised).
    """
    environ = given.pop("environ", None)
    handle_signals = given.pop("handle_signals", True)
    options = worker_options(handler, "serve", **given)
    await run_worker(
        options, environ=environ, handle_signals=handle_signals, task_status=task_status
    )


async def run_worker(
    options: WorkerOptions,
    *,
    environ: Mapping[str, str] | None = None,
    handle_signals: bool = True,
    seams: Seams = Seams(),  # frozen: one shared default is safe
    task_status: trio.TaskStatus[WorkerHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """:func:`serve` for options already checked, with the test seams (see ``serve``)."""
    options.backend.check_host()
    settings = options.settings(environ)
    if not settings.platform.queue_mode:
        raise ConfigurationError(
            "RUNPOD_WEBHOOK_GET_JOB is not set: serve() needs the platform's job-take URL "
            "(use --test_input or --rp_serve_api for local runs)"
        )
    owns_capture = seams.capture is None
    if owns_capture:
        capture = capture_output(settings, options)
    else:
        capture = seams.capture if options.capture_logs == "on" else None
    try:
        await _serve(options, settings, capture, seams, handle_signals, task_status)
    finally:
        if owns_capture and capture is not None:
            capture.stop()


async def _serve(
    options: WorkerOptions,
    settings: Settings,
    capture: OutputCapture | None,
    seams: Seams,
    handle_signals: bool,
    task_status: trio.TaskStatus[WorkerHandle],
) -> None:
    client = PlatformClient(
        settings.platform,
        settings.timings,
        open_stream=seams.open_stream,
        wrap_backend=seams.wrap_backend,
    )
    supervisor, progress = _build(options, settings, client, capture, seams)
    guard = seams.exit_guard
    if guard is not None:
        token = trio.lowlevel.current_trio_token()
        guard.attach(token, supervisor.request_shutdown, supervisor.ledger.reporting)
        supervisor.shutdown_hook = functools.partial(guard.stop, on_loop=True)
        supervisor.settled = guard.settled
    pinger = _start_heartbeat_thread(settings, supervisor) if seams.heartbeat == "thread" else None
    task_status.started(WorkerHandle(supervisor))
    failure: BaseException | None = None
    try:
        with (
            running_worker(progress),
            options.backend.exits_from_user_tasks(supervisor.request_exit),
        ):
            async with trio.open_nursery() as outer:
                if handle_signals:
                    outer.start_soon(
                        watch_signals, supervisor.request_shutdown, lambda: supervisor.shutting_down
                    )
                if seams.heartbeat == "task" and settings.platform.ping_url:
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
    except BaseExceptionGroup as group:
        # Raised below, outside this handler, so a leaf raised as itself does not get the
        # group that holds it as its __context__.
        failure = _outside(group)
    finally:
        if pinger is not None:
            pinger.stop()
        await client.aclose()
    if failure is not None:
        raise failure
    if supervisor.exit_request is not None:
        # A handler called sys.exit() (or raised KeyboardInterrupt): its job has been
        # reported failed and the worker has shut down; now the caller gets it.
        raise supervisor.exit_request


def _build(
    options: WorkerOptions,
    settings: Settings,
    client: PlatformClient,
    capture: OutputCapture | None,
    seams: Seams,
) -> tuple[Supervisor, ProgressTarget]:
    """The worker's parts, and where its jobs' ``progress_update`` calls go."""
    supervisor: Supervisor | None = None

    def shared_process() -> bool:
        return supervisor is not None and supervisor.concurrency > 1

    def beside_the_jobs(task: Callable[[], Awaitable[None]]) -> bool:
        return supervisor is not None and supervisor.spawn_beside_jobs(task)

    def post_progress(job_id: str, body: bytes) -> None:
        assert supervisor is not None
        supervisor.spawn_progress(job_id, body)

    payloads = Payloads.for_worker(settings, stop_pod=options.refresh_worker)
    waits = Scopes(settings.timings)
    delivery = Delivery(settings, client, waits, payloads)
    records = crash_records.installed()  # this process is a watched worker
    delivery.finals = records
    token = trio.lowlevel.current_trio_token()
    progress = ProgressTarget(
        post_progress,
        token,
        options.backend.thread_handoff(token),
        holds=lambda job_id: supervisor is not None and job_id in supervisor.ledger,
        ended=delivery.progress.ended,
    )
    runner = JobRunner(
        JobSpec.from_options(options),
        settings,
        payloads,
        ChunkConvoy(
            client.post,
            beside_the_jobs,
            delivery=delivery,
            linger=options.backend.round_linger,
        ),
        capture,
        waits,
        shared_process,
        progress,
    )
    supervisor = Supervisor(
        settings=settings,
        client=client,
        delivery=delivery,
        runner=runner,
        initializer=options.backend.initializer(options.initializer, waits),
        init_timeout=options.init_timeout,
        concurrency=options.concurrency,
        capture=capture,
        refresh_worker=options.refresh_worker,
        observers=seams.observers,
        records=records,
    )
    return supervisor, progress


def _outside(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one exception ``serve()``'s caller sees for what its nursery raised.

    The nursery is an implementation detail, so no group leaves ``serve()``: a second
    SIGINT is a plain KeyboardInterrupt, a cancellation from outside stays a Cancelled for
    the caller's scope, one of our documented errors is itself, anything else is a bug.
    """
    outside: BaseException
    leaves = exception_leaves(group)
    if any(isinstance(leaf, KeyboardInterrupt) for leaf in leaves):
        outside = KeyboardInterrupt()
    elif all(isinstance(leaf, trio.Cancelled) for leaf in leaves):
        return leaves[0]
    elif len(leaves) == 1 and isinstance(leaves[0], InitializationError | ConfigurationError):
        return leaves[0]
    else:
        outside = WorkerInternalError(f"trio_worker failed: {group!r}")
    outside.__cause__ = group
    return outside


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
        proxies=platform.proxies,
    )
    pinger.start()
    return pinger


def describe_settings(settings: Settings) -> str:
    """One log line with the wiring (never the API key, nor a password in a URL)."""
    platform = settings.platform
    take, ping = platform.take_url, platform.ping_url
    return json.dumps(
        {
            "worker_id": platform.worker_id,
            "take": take and without_credentials(take),
            "ping": ping and without_credentials(ping),
            "ping_interval_s": platform.ping_interval,
        }
    )
