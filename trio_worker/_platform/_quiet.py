"""The worker's own HTTP requests stay out of the application's log.

httpx logs one ``HTTP Request: GET ...`` line at INFO per request, and httpcore a trace at
DEBUG, on loggers that inherit the root logger's level. An application that sets the root
logger to INFO (``import runpod`` does, through ``logging.basicConfig``) would then get a
line per heartbeat and per take from the worker's plumbing.

Requests the SDK makes run under :func:`own_requests` (a context variable, so it follows
the heartbeat thread and each trio task, never the user's own requests made beside them).
A filter on httpx's and httpcore's loggers drops their records below WARNING while that
variable is set, unless the user configured one of those loggers' levels explicitly
(``logging.getLogger("httpx").setLevel(logging.INFO)``): then the user asked for them.
"""

from __future__ import annotations

import contextvars
import functools
import logging
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine

P = ParamSpec("P")
R = TypeVar("R")

# The loggers httpx and httpcore log requests on (a filter acts only on the logger a
# record is made on, not on records that propagate through it, so each is named).
HTTP_LOGGERS = (
    "httpx",
    "httpcore.connection",
    "httpcore.http11",
    "httpcore.http2",
    "httpcore.proxy",
    "httpcore.socks",
)

_own_request: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "trio_worker_own_request", default=False
)


class DropOwnRequests(logging.Filter):
    """Drops the per-request records of the SDK's own requests (see the module docstring)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING or not _own_request.get():
            return True
        return level_set_by_user(record.name)


def level_set_by_user(name: str) -> bool:
    """Whether *name* or one of its ancestors below the root has a level of its own."""
    logger: logging.Logger | None = logging.getLogger(name)
    root = logging.getLogger()
    while logger is not None and logger is not root:
        if logger.level != logging.NOTSET:
            return True
        logger = logger.parent
    return False


_FILTER = DropOwnRequests()
_installed = False


def install() -> None:
    """Put the filter on httpx's and httpcore's loggers (idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True
    for name in HTTP_LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)


def own_request(function: Callable[P, R]) -> Callable[P, R]:
    """Decorate a sync function whose requests are the SDK's own."""

    @functools.wraps(function)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        install()
        token = _own_request.set(True)
        try:
            return function(*args, **kwargs)
        finally:
            _own_request.reset(token)

    return wrapper


def own_request_async(
    function: Callable[P, Coroutine[Any, Any, R]],
) -> Callable[P, Coroutine[Any, Any, R]]:
    """Decorate an async function whose requests are the SDK's own."""

    @functools.wraps(function)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        install()
        token = _own_request.set(True)
        try:
            return await function(*args, **kwargs)
        finally:
            _own_request.reset(token)

    return wrapper
