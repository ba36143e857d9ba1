"""What the user asked for: the keyword arguments of every entry point, spelled out once.

The entry points take ``**given`` typed by the ``TypedDict`` classes below (PEP 692);
:func:`spelled_out` builds the signature and docs ``help()`` shows from the same classes,
and :func:`worker_options` checks every value once into a :class:`WorkerOptions`.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, NoReturn, TypedDict, TypeVar, Unpack

from ._backends import BACKENDS, default_backend
from ._backends import AsyncBackend as AsyncBackend  # the options' own type, for callers
from ._config import CaptureMode, Settings, Timings
from ._exceptions import ConfigurationError

if TYPE_CHECKING:
    from types import UnionType

    from ._backends import Backend
    from ._backends._handler_calls import Handler
    from ._initializer import Initializer

# An int, or the reference's concurrency_modifier: f(current) -> wanted.
Concurrency = int | Callable[[int], int]
Entry = Literal["start", "serve", "start_app"]
_F = TypeVar("_F", bound=Callable[..., Any])

log = logging.getLogger("trio_worker")


class _LoadOptions(TypedDict, total=False):
    """
    initializer (callable or None): called once with no arguments before any job runs or
        the app serves (a sync one in a thread of its own, an async one on the loop); load
        the model here. If it raises or outlasts *init_timeout*, every request the worker
        holds is failed with ``"event": "init_failed"``, then ``start()`` exits 1 and
        ``serve()`` raises ``InitializationError``; an app's ``/ping`` answers 503.
    init_timeout (float or None): seconds the initializer (and an app's lifespan startup)
        may take; ``None``: no bound from the SDK. Negative, NaN or a bool:
        ``ConfigurationError``.
    async_backend ("trio", "asyncio" or None): where the async handler, initializer and
        concurrency callable run. ``None``, in either form: ``"asyncio"`` when any of them
        is async (every async handler written for the reference is asyncio code),
        ``"trio"`` when they are all sync. ``serve()`` defaults to ``"trio"``: it runs in
        your trio run, so ``"asyncio"`` needs that run to be a guest of an asyncio loop.
    capture_logs ("on" or "off"): capture fds 1 and 2 so error reports carry the output
        tail (secrets redacted).
    timings (Timings or None): the worker's internal timeouts (shutdown grace, report
        deadline, ...); ``None``: ``Timings()``.
    """

    initializer: Initializer | None
    init_timeout: float | None
    async_backend: AsyncBackend | None
    capture_logs: CaptureMode
    timings: Timings | None


class _JobOptions(TypedDict, total=False):
    """
    concurrency (int or callable): jobs held at once, an ``int >= 1``, or
        ``f(current) -> int`` asked before every take (default 1).
    return_aggregate_stream (bool): for a streaming handler, the final result is the list
        of every chunk instead of ``[]``.
    refresh_worker (bool): shut down after the first job's result is delivered; every
        result carries ``"stopPod": true``.
    """

    concurrency: Concurrency
    return_aggregate_stream: bool
    refresh_worker: bool


class _ProcessOptions(TypedDict, total=False):
    """
    argv (sequence of str or None): the flags to parse instead of ``sys.argv[1:]``.
    crash_watch (bool): run the worker in a child process under a watchdog that reports
        the jobs it held if it dies (a segfault, the OOM killer), or logs why an app died:
        docs/how-it-works.md. ``False`` (or ``TRIO_WORKER_CRASH_WATCH=0``) runs it in this
        process.
    """

    argv: Sequence[str] | None
    crash_watch: bool


class _RunOptions(TypedDict, total=False):
    """
    environ (mapping or None): where to read ``RUNPOD_*`` from; ``os.environ`` by default.
    handle_signals (bool): SIGTERM/SIGINT start a graceful shutdown; a second SIGINT
        raises KeyboardInterrupt.
    """

    environ: Mapping[str, str] | None
    handle_signals: bool


class StartOptions(_LoadOptions, _JobOptions, _ProcessOptions, total=False):
    """The keyword arguments of ``start()``."""


class ServeOptions(_LoadOptions, _JobOptions, _RunOptions, total=False):
    """The keyword arguments of ``serve()`` (and ``trio_worker.testing.serve()``)."""


class AppOptions(_LoadOptions, _ProcessOptions, total=False):
    """The keyword arguments of ``start_app()``."""


class _AllOptions(StartOptions, _RunOptions, total=False):
    pass


# Each option's default, in the order the entry points list them (docs/reference.md).
_DEFAULTS: _AllOptions = {
    "initializer": None,
    "init_timeout": None,
    "concurrency": 1,
    "return_aggregate_stream": False,
    "refresh_worker": False,
    "async_backend": None,
    "capture_logs": "on",
    "timings": None,
    "argv": None,
    "crash_watch": True,
    "environ": None,
    "handle_signals": True,
}
# Each entry point: its options, the parts they are made of (a TypedDict keeps no bases at
# run time, and the parts' docstrings are the options' documentation), its own defaults.
_ENTRIES: dict[Entry, tuple[type, tuple[type, ...], _AllOptions]] = {
    "start": (StartOptions, (_LoadOptions, _JobOptions, _ProcessOptions), {}),
    "serve": (ServeOptions, (_LoadOptions, _JobOptions, _RunOptions), {"async_backend": "trio"}),
    "start_app": (AppOptions, (_LoadOptions, _ProcessOptions), {}),
}


def spelled_out(entry: Entry) -> Callable[[_F], _F]:
    """Give the entry point the signature and the "Keyword arguments" of its docstring that
    ``inspect.signature`` and ``help()`` show: each of its options in place of
    ``**given``, with its default and its documentation."""
    accepted, parts, own = _ENTRIES[entry]
    defaults = {**_DEFAULTS, **own}

    def spell(fn: _F) -> _F:
        given = inspect.signature(fn).parameters.values()
        keywords = [
            inspect.Parameter(
                name,
                inspect.Parameter.KEYWORD_ONLY,
                default=default,
                annotation=getattr(accepted.__annotations__[name], "__forward_arg__", None),
            )
            for name, default in defaults.items()
            if name in accepted.__annotations__
        ]
        positional = [p for p in given if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
        own_keywords = [p for p in given if p.kind is inspect.Parameter.KEYWORD_ONLY]
        fn.__signature__ = inspect.signature(fn).replace(  # type: ignore[attr-defined]
            parameters=[*positional, *keywords, *own_keywords]
        )
        documented = "".join(inspect.cleandoc(part.__doc__ or "") + "\n" for part in parts)
        lines = "".join(f"        {line}\n" for line in documented.splitlines())
        fn.__doc__ = f"{(fn.__doc__ or '').rstrip()}\n\n    Keyword arguments:\n{lines}"
        return fn

    return spell


@dataclasses.dataclass(frozen=True)
class WorkerOptions:
    """The worker as the user configured it, checked; built by :func:`worker_options`."""

    handler: Handler
    initializer: Initializer | None
    init_timeout: float | None
    concurrency: Concurrency
    return_aggregate_stream: bool
    refresh_worker: bool
    async_backend: AsyncBackend
    capture_logs: CaptureMode
    timings: Timings
    crash_watch: bool  # docs/design.md §13

    @property
    def backend(self) -> Backend:
        """Where the user's async code runs, chosen once by :func:`worker_options`."""
        return BACKENDS[self.async_backend]

    def settings(self, environ: Mapping[str, str] | None = None) -> Settings:
        """The settings read from *environ* (``os.environ`` by default) with these options.

        Raises:
            ConfigurationError: a variable is invalid.
        """
        return Settings.from_environ(environ, timings=self.timings, capture_logs=self.capture_logs)


def check_keywords(entry: Entry, given: Mapping[str, object]) -> None:
    """Raises TypeError, as Python would, for a keyword *entry* does not take."""
    accepted = _ENTRIES[entry][0].__annotations__
    for name in given:
        if name not in accepted:
            raise TypeError(f"{entry}() got an unexpected keyword argument {name!r}")


def worker_options(
    handler: Handler | Mapping[str, Any],
    entry: Entry = "start",
    /,
    **given: Unpack[_AllOptions],
) -> WorkerOptions:
    """Check every option *entry* was given and bundle them; *handler* may be the
    reference's one dict, whose values win. The options that are not the worker's
    (``argv``, ``environ``, ``handle_signals``) are the entry point's to read.

    Raises:
        TypeError: for a keyword *entry* does not take, as Python says it.
        ConfigurationError: for the first option the worker cannot use.
    """
    check_keywords(entry, given)
    options: _AllOptions = {**_DEFAULTS, **_ENTRIES[entry][2], **given}
    if isinstance(handler, Mapping):
        config = _from_config_dict(handler)
        handler = config.pop("handler")
        options.update(config)  # type: ignore[typeddict-item]
    initializer, concurrency = options["initializer"], options["concurrency"]
    init_timeout, async_backend = options["init_timeout"], options["async_backend"]
    capture_logs, timings = options["capture_logs"], options["timings"]
    crash_watch = options["crash_watch"]
    if not callable(handler):
        _refuse("handler must be callable", handler)
    if initializer is not None and not callable(initializer):
        _refuse("initializer must be callable or None", initializer)
    if not callable(concurrency) and not (_is_number(concurrency, int) and concurrency >= 1):
        _refuse("concurrency must be an int >= 1 or a callable", concurrency)
    if init_timeout is not None and not _is_number(init_timeout, int | float):
        _refuse("init_timeout must be a number of seconds or None", init_timeout)
    if init_timeout is not None and not init_timeout >= 0:  # NaN is not >= 0 either
        _refuse("init_timeout must be >= 0 or None", init_timeout)
    if async_backend is None:
        async_backend = default_backend(handler, initializer, concurrency)
    if async_backend not in ("trio", "asyncio"):
        _refuse("async_backend must be 'trio' or 'asyncio'", async_backend)
    if capture_logs not in ("on", "off"):
        _refuse("capture_logs must be 'on' or 'off'", capture_logs)
    if timings is not None and not isinstance(timings, Timings):
        _refuse("timings must be a trio_worker.Timings", timings)
    if not isinstance(crash_watch, bool):
        _refuse("crash_watch must be True or False", crash_watch)
    return WorkerOptions(
        handler=handler,
        initializer=initializer,
        init_timeout=None if init_timeout is None else float(init_timeout),
        concurrency=concurrency,
        return_aggregate_stream=bool(options["return_aggregate_stream"]),
        refresh_worker=bool(options["refresh_worker"]),
        async_backend=async_backend,
        capture_logs=capture_logs,
        timings=timings or Timings(),
        crash_watch=crash_watch,
    )


def _is_number(value: object, kind: type | UnionType) -> bool:
    return isinstance(value, kind) and not isinstance(value, bool)


def _refuse(what: str, given: object) -> NoReturn:
    raise ConfigurationError(f"{what}, got {given!r}")


# The reference's one-dict form: ``start({"handler": h, "concurrency_modifier": f})``.
_CONFIG_KEYS = {"handler", "concurrency_modifier", "initializer", "init_timeout"}
_CONFIG_KEYS.update(_JobOptions.__annotations__)


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
