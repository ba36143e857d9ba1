"""The fitness checks users register, and the runner that runs every check in order.

How each check is bounded, where it runs, what fails it and what becomes of the processes
it leaves: docs/reference.md, "Fitness checks".
"""

from __future__ import annotations

import functools
import inspect
import logging
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import trio

from .._backends import makes_coroutine
from .._backends._handler_calls import in_thread, is_cancellation
from .._config import Timings
from .._exceptions import AsyncioUnderTrio, ConfigurationError
from .._scopes import Scopes
from .._tracebacks import safe_str
from ._children import descendants, end_left_behind

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from .._backends import Backend

log = logging.getLogger("trio_worker")

F = TypeVar("F", bound="Callable[..., Any]")

# Registration order is run order, as in the reference.
_registered: list[Callable[[], Any]] = []

# How long a cancelled asyncio check may take to wind down once its bound is spent.
_ASYNCIO_CANCEL_BOUND = 1.0


def register_fitness_check(func: F) -> F:
    """Register *func* as a fitness check: run once, before the worker takes its first job.

    The decorator of ``runpod.serverless.register_fitness_check``. *func* takes no
    arguments and may be sync or async; it fails the check by raising. Checks run in
    registration order, before the built-in ones, each bounded by
    ``Timings.fitness_check_timeout``. On the first failure the worker sends one unhealthy
    ping naming the check and exits 1 without taking a job. Checks do not run in local
    modes (``--test_input``, the local endpoint) or under ``serve()``.

    Returns:
        *func* itself, so decorators stack.

    Raises:
        TypeError: *func* is not callable.

    Example::

        @trio_worker.register_fitness_check
        def model_files_present():
            if not os.path.exists("/models/model.safetensors"):
                raise RuntimeError("model file not found")
    """
    if not callable(func):
        raise TypeError(f"register_fitness_check expects a callable, got {func!r}")
    _registered.append(func)
    log.debug("fitness check registered: %s", check_name(func))
    return func


def check_name(fn: Callable[..., Any]) -> str:
    """The name a check is reported under: its ``__name__``, as the reference's."""
    target: object = fn
    while isinstance(target, functools.partial):
        target = target.func
    name = getattr(target, "__name__", None)
    # A callable object has no name of its own: its class names it.
    return name if isinstance(name, str) and name else type(target).__name__


@dataclass(frozen=True)
class Check:
    """One check: *fn* takes no arguments and raises to fail. *native*: trio code of ours,
    awaited on trio whatever the backend."""

    name: str
    fn: Callable[[], Any]
    native: bool = False


@dataclass(frozen=True)
class Failure:
    """The first check that failed, and why (``"<ErrorType>: <message>"``, not redacted)."""

    check: str
    reason: str


def registered_checks() -> list[Check]:
    return [Check(check_name(fn), fn) for fn in _registered]


def warn_about_runpod_checks() -> None:
    """One warning when checks were registered with runpod's decorator: they never run here.

    Only looks at what is already imported; runpod is never imported for it.
    """
    if "runpod" not in sys.modules:
        return
    module = sys.modules.get("runpod.serverless.modules.rp_fitness")
    theirs = getattr(module, "_fitness_checks", None)
    if not isinstance(theirs, list) or not theirs:
        return
    names = ", ".join(check_name(fn) for fn in theirs if callable(fn))
    log.warning(
        "%d fitness check(s) registered with runpod's register_fitness_check will not run "
        "(%s): register them with trio_worker.register_fitness_check instead",
        len(theirs),
        names,
    )


async def run_checks(checks: Sequence[Check], *, bound: float, backend: Backend) -> Failure | None:
    """Run *checks* in order until one fails; that failure, or None when all passed.

    The processes a user's check started and left running are ended once it is over,
    whatever its outcome (``_children``); the built-in checks end their own.
    """
    waits = Scopes(Timings())  # no grace here: each check has its own bound
    for check in checks:
        started = time.perf_counter()
        before = set() if check.native else descendants()
        try:
            failure = await run_check(check, bound=bound, backend=backend, waits=waits)
        finally:
            if not check.native:
                with trio.CancelScope(shield=True):
                    await end_left_behind(check.name, before)
        if failure is not None:
            return failure
        elapsed = (time.perf_counter() - started) * 1000
        log.debug("fitness check passed: %s (%.1f ms)", check.name, elapsed)
    return None


async def run_check(
    check: Check, *, bound: float, backend: Backend, waits: Scopes
) -> Failure | None:
    """One check under *bound* seconds; its failure, or None when it passed.

    Raises:
        ConfigurationError: an async check ran asyncio code on the trio backend.
    """
    error: BaseException | None = None
    with trio.move_on_after(bound) as scope:
        try:
            await _call(check, backend, waits)
        except BaseException as exc:
            # Whatever the check raises is its verdict (SystemExit, a BaseException of its
            # own), but a cancellation (the bound's, or the worker's) and an interrupt.
            if is_cancellation(exc) or isinstance(exc, KeyboardInterrupt):
                raise
            error = exc
    if scope.cancelled_caught:
        # Only our bound: a TimeoutError the check raised itself is its own failure below.
        return Failure(check.name, f"FitnessCheckTimeout: did not finish within {bound:g}s")
    if error is None:
        return None
    if not check.native and isinstance(error, Exception):
        explained = backend.explain(error)
        if isinstance(explained, AsyncioUnderTrio):
            # The check's code, not the host: no unhealthy ping, or every host of the
            # endpoint would be reported broken for one missing argument.
            raise ConfigurationError(
                f"fitness check {check.name} ran asyncio code on trio: pass "
                f'start(..., async_backend="asyncio") ({safe_str(error)})'
            ) from error
    return Failure(check.name, f"{type(error).__name__}: {safe_str(error)}")


async def _call(check: Check, backend: Backend, waits: Scopes) -> None:
    fn = check.fn
    if check.native:
        await fn()
        return
    if makes_coroutine(fn):
        await _await_on(backend, fn(), waits)
        return
    # Boxed, so a coroutine returned by a sync callable (a wrapped async check) reaches us.
    # A kept thread of its own: a hung check's thread never holds one anything else needs.
    (result,) = await in_thread(lambda: (fn(),), name=f"trio_worker fitness check {check.name}")
    if inspect.isawaitable(result):
        await _await_on(backend, result, waits)


async def _await_on(backend: Backend, awaitable: Awaitable[Any], waits: Scopes) -> None:
    await backend.await_result(awaitable, waits, cancel_bound=_ASYNCIO_CANCEL_BOUND)
