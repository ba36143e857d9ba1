"""What the user asked for: one value object, validated once, whatever the entry point.

``start()``, ``serve()``, ``--test_input`` and ``--rp_serve_api`` all build a
:class:`WorkerOptions` through :func:`worker_options`, so an argument is checked in exactly
one place and reaches the job runner as one typed value instead of a dict of keywords.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ._backends import BACKENDS, default_backend
from ._backends import AsyncBackend as AsyncBackend  # the options' own type, for callers
from ._config import CaptureMode, Timings
from ._exceptions import ConfigurationError
from ._initializer import validate_init_timeout

if TYPE_CHECKING:
    from ._backends import Backend
    from ._handlers import Handler
    from ._initializer import Initializer

# An int, or the reference's concurrency_modifier: f(current) -> wanted.
Concurrency = int | Callable[[int], int]

log = logging.getLogger("trio_worker")

# The reference's one-dict form: ``start({"handler": h, "concurrency_modifier": f})``.
_CONFIG_KEYS = frozenset(
    {
        "handler",
        "concurrency_modifier",
        "return_aggregate_stream",
        "refresh_worker",
        "initializer",
        "init_timeout",
        "concurrency",
    }
)


@dataclasses.dataclass(frozen=True)
class WorkerOptions:
    """The worker as the user configured it; build it with :func:`worker_options`."""

    handler: Handler
    initializer: Initializer | None = None
    init_timeout: float | None = None
    concurrency: Concurrency = 1
    return_aggregate_stream: bool = False
    refresh_worker: bool = False
    async_backend: AsyncBackend = "trio"
    capture_logs: CaptureMode = "on"
    timings: Timings = dataclasses.field(default_factory=Timings)
    crash_watch: bool = True  # docs/design.md §13

    @property
    def backend(self) -> Backend:
        """Where the user's async code runs, chosen once by :func:`worker_options`."""
        return BACKENDS[self.async_backend]


def worker_options(
    handler: Handler | Mapping[str, Any],
    *,
    initializer: Initializer | None = None,
    init_timeout: float | None = None,
    concurrency: Concurrency = 1,
    return_aggregate_stream: bool = False,
    refresh_worker: bool = False,
    async_backend: AsyncBackend | None = None,
    capture_logs: CaptureMode = "on",
    timings: Timings | None = None,
    crash_watch: bool = True,
) -> WorkerOptions:
    """Check every argument and bundle them; *handler* may be the reference's one dict.

    *async_backend* left unset, in either form, means "asyncio" when any of the user's
    code (handler, initializer, concurrency callable) is async, and "trio" when it is all
    sync (docs/design.md §2).

    Raises:
        ConfigurationError: for the first argument the worker cannot use.
    """
    if isinstance(handler, Mapping):
        config = _from_config_dict(handler)
        handler = config.pop("handler")
        initializer = config.get("initializer", initializer)
        init_timeout = config.get("init_timeout", init_timeout)
        concurrency = config.get("concurrency", concurrency)
        return_aggregate_stream = config.get("return_aggregate_stream", return_aggregate_stream)
        refresh_worker = config.get("refresh_worker", refresh_worker)
    if not callable(handler):
        raise ConfigurationError(f"handler must be callable, got {handler!r}")
    if initializer is not None and not callable(initializer):
        raise ConfigurationError(f"initializer must be callable or None, got {initializer!r}")
    concurrency = validate_concurrency(concurrency)
    if async_backend is None:
        async_backend = default_backend(handler, initializer, concurrency)
    validate_backend(async_backend)
    if capture_logs not in ("on", "off"):
        raise ConfigurationError(f"capture_logs must be 'on' or 'off', got {capture_logs!r}")
    if timings is not None and not isinstance(timings, Timings):
        raise ConfigurationError(f"timings must be a trio_worker.Timings, got {timings!r}")
    if not isinstance(crash_watch, bool):
        raise ConfigurationError(f"crash_watch must be True or False, got {crash_watch!r}")
    return WorkerOptions(
        handler=handler,
        initializer=initializer,
        init_timeout=validate_init_timeout(init_timeout),
        concurrency=concurrency,
        return_aggregate_stream=bool(return_aggregate_stream),
        refresh_worker=bool(refresh_worker),
        async_backend=async_backend,
        capture_logs=capture_logs,
        timings=timings or Timings(),
        crash_watch=crash_watch,
    )


def _from_config_dict(config: Mapping[str, Any]) -> dict[str, Any]:
    if "handler" not in config:
        raise ConfigurationError("start({...}) needs a 'handler' key")
    for key in config:
        if key not in _CONFIG_KEYS:
            log.warning("start(): ignoring unknown config key %r", key)
    known = {k: v for k, v in config.items() if k in _CONFIG_KEYS and k != "concurrency_modifier"}
    if "concurrency_modifier" in config:
        known["concurrency"] = config["concurrency_modifier"]
    return known


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
    """Raises ConfigurationError unless *async_backend* is "trio" or "asyncio"."""
    if async_backend in ("trio", "asyncio"):
        return
    raise ConfigurationError(f"async_backend must be 'trio' or 'asyncio', got {async_backend!r}")
