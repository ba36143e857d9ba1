"""trio_worker: a Runpod Serverless worker on trio's structured concurrency.

Who owns what (data flows one way, top to bottom; docs/how-it-works.md has the full map):

- ``_start`` (``start()``, the process and its exit) and ``_worker`` (``serve()``) assemble
  the rest from ``_config`` (every knob: environment, CLI, ``Timings``).
- ``_supervisor`` owns the nursery (init, take, run, stop) and ``_state`` the worker's
  rules, pure: the job table, the phase, the ledger, every deadline; ``_initializer``,
  ``_runner`` and ``_backends`` run the user's code.
- ``_platform/`` speaks the wire protocol (docs/protocol.md §2) and runs the heartbeat;
  ``_capture/`` captures and redacts output; ``_payloads`` (every body, one JSON policy;
  with ``_fitting``, ``_json_problems``), ``_tracebacks`` and ``_categories`` build the
  payloads. None of these imports anything above it.
- ``_fitness/`` runs the fitness checks before the first take (``register_fitness_check``,
  the built-in checks, the unhealthy ping; docs/reference.md, "Fitness checks").
- ``_backends`` is the one place the trio and asyncio backends differ; ``_scopes`` the
  one deadline registry every wait reads; ``_watch/`` the crash watchdog the process becomes at
  ``start()`` (docs/design.md §13).
- ``_app/`` is the load-balancing worker (``start_app()``: the user's ASGI app on
  hypercorn behind ``/ping``, its load supervised; docs/load-balancing.md).
- ``_endpoint/`` is the local endpoint (``trio-worker dev``, ``--rp_serve_api``), which
  imports nothing else of the package; ``testing/`` builds the fake platform on it, and no
  product module imports ``testing/``.

>>> import trio_worker
>>> def handler(job): return {"echo": job["input"]}
>>> # trio_worker.start(handler, initializer=load_model, init_timeout=600)
"""

from __future__ import annotations

import typing

from ._version import __version__ as __version__

if typing.TYPE_CHECKING:
    from ._app import start_app as start_app
    from ._backends import run_asyncio_host as run_asyncio_host
    from ._backends._handler_calls import check_cancelled as check_cancelled
    from ._config import Timings as Timings
    from ._exceptions import AsyncioUnderTrio as AsyncioUnderTrio
    from ._exceptions import ConfigurationError as ConfigurationError
    from ._exceptions import InitFailure as InitFailure
    from ._exceptions import InitializationError as InitializationError
    from ._exceptions import InitTimeout as InitTimeout
    from ._exceptions import MalformedJob as MalformedJob
    from ._exceptions import PlatformError as PlatformError
    from ._exceptions import RateLimited as RateLimited
    from ._exceptions import TransportError as TransportError
    from ._exceptions import TrioUnderAsyncio as TrioUnderAsyncio
    from ._exceptions import TrioWorkerError as TrioWorkerError
    from ._exceptions import WorkerInternalError as WorkerInternalError
    from ._fitness import register_fitness_check as register_fitness_check
    from ._progress_calls import progress_update as progress_update
    from ._start import start as start
    from ._worker import WorkerHandle as WorkerHandle
    from ._worker import serve as serve

__all__ = [
    "AsyncioUnderTrio",
    "ConfigurationError",
    "InitFailure",
    "InitTimeout",
    "InitializationError",
    "MalformedJob",
    "PlatformError",
    "RateLimited",
    "Timings",
    "TransportError",
    "TrioUnderAsyncio",
    "TrioWorkerError",
    "WorkerHandle",
    "WorkerInternalError",
    "__version__",
    "check_cancelled",
    "progress_update",
    "register_fitness_check",
    "run_asyncio_host",
    "serve",
    "start",
    "start_app",
]

# Where each public name is defined. They are imported on first use (PEP 562), not by
# ``import trio_worker``: the launcher (``python -m trio_worker``, ``trio-worker run``) and
# the crash watchdog import the package without trio or the rest of the SDK, which a
# worker's first ``trio_worker.start`` loads anyway (docs/design.md §13.1).
_DEFINED_IN = {
    "start_app": "._app",
    "run_asyncio_host": "._backends",
    "Timings": "._config",
    "AsyncioUnderTrio": "._exceptions",
    "ConfigurationError": "._exceptions",
    "InitFailure": "._exceptions",
    "InitializationError": "._exceptions",
    "InitTimeout": "._exceptions",
    "MalformedJob": "._exceptions",
    "PlatformError": "._exceptions",
    "RateLimited": "._exceptions",
    "TransportError": "._exceptions",
    "TrioUnderAsyncio": "._exceptions",
    "TrioWorkerError": "._exceptions",
    "WorkerInternalError": "._exceptions",
    "register_fitness_check": "._fitness",
    "check_cancelled": "._backends._handler_calls",
    "start": "._start",
    "WorkerHandle": "._worker",
    "progress_update": "._progress_calls",
    "serve": "._worker",
}

if not typing.TYPE_CHECKING:  # type checkers see the imports above, and no catch-all attribute

    def __getattr__(name: str) -> object:
        if name not in _DEFINED_IN:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        _load_public_names()
        return globals()[name]

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__})


def _load_public_names() -> None:
    from importlib import import_module

    found = {
        name: getattr(import_module(where, __name__), name) for name, where in _DEFINED_IN.items()
    }
    for obj in found.values():
        # Public names report the public module, as trio and httpx do.
        if getattr(obj, "__module__", "").startswith("trio_worker._"):
            try:
                obj.__module__ = "trio_worker"
            except (AttributeError, TypeError):
                pass
    globals().update(found)
