"""Test helpers: a fake Runpod platform to run a worker against.

:class:`FakePlatform` plays the platform side of the worker protocol as an ASGI app: the
local endpoint's own app (``trio-worker dev``), plus faults to inject and counters. Use
it in-process over :func:`memory_network` (the worker's own HTTP client on in-memory trio
streams, so virtual time under ``trio.testing.MockClock`` holds), or over loopback HTTP
with :func:`run_platform_server`::

    platform = FakePlatform(take_hold=1.0)
    async with run_platform_server(platform) as url:
        environ = platform.worker_env(url)
        job_id = platform.enqueue({"prompt": "hi"})
        ...  # start a worker with environ
        with trio.fail_after(10):
            job = await platform.wait_for_status(job_id)

:func:`serve` is :func:`trio_worker.serve` with the seams a test needs (a stream opener
such as :func:`memory_network`'s, a wrapper around the client's HTTP, a heartbeat on
trio's clock, transition observers, a capture of its own)::

    async with memory_network(platform) as opener:
        await trio_worker.testing.serve(handler, environ=env, open_stream=opener, ...)

:func:`serve_app` is :func:`trio_worker.start_app`'s worker inside a test's trio run,
on loopback ports it picks, with a handle (:class:`AppHandle`) to shut it down.

``python -m trio_worker.testing --port 0 --preload N`` runs it as its own process.
"""

from __future__ import annotations

from .._endpoint._records import (
    TERMINAL_STATUSES,
    Fault,
    JobRecord,
    PingRecord,
    PlatformStatistics,
    RecordedRequest,
    RequeueRecord,
)
from ._app import FakePlatform
from ._app_worker import AppHandle, serve_app
from ._faults import ConnectionDropped
from ._http_server import ServerThread, run_server_in_thread
from ._memory import memory_network
from ._server import run_platform_server
from ._worker import serve

__all__ = [
    "TERMINAL_STATUSES",
    "AppHandle",
    "ConnectionDropped",
    "FakePlatform",
    "Fault",
    "JobRecord",
    "PingRecord",
    "PlatformStatistics",
    "RecordedRequest",
    "RequeueRecord",
    "ServerThread",
    "memory_network",
    "run_platform_server",
    "run_server_in_thread",
    "serve",
    "serve_app",
]

# Public names report the module users import them from (as trio and httpx do).
for _name in __all__:
    _obj = globals()[_name]
    if hasattr(_obj, "__module__") and not isinstance(_obj, frozenset):
        _obj.__module__ = __name__
del _name, _obj
