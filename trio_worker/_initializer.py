"""Running the initializer under the SDK's deadline, and the record of its failure.

Only the SDK's own deadline is an ``InitTimeout``, told apart by ``cancelled_caught``: a
timeout the user's code raises stays the user's error (docs/design.md §4 I4, §6). A sync
initializer's thread is abandoned at the deadline or a shutdown; ``os._exit`` ends it.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any

import trio

from ._backends import makes_coroutine as is_async_initializer
from ._backends._handler_calls import INITIALIZER_THREAD, in_thread
from ._categories import classify
from ._exceptions import InitFailure, InitTimeout
from ._tracebacks import format_traceback, safe_str

Initializer = Callable[[], Any]


async def call_initializer(initializer: Initializer) -> None:
    """Run *initializer* once: awaited when async, in an abandonable thread when sync."""
    if is_async_initializer(initializer):
        await initializer()
        return
    # A kept thread of its own: a hung initializer never holds one a handler needs.
    result = await in_thread(initializer, name=INITIALIZER_THREAD)
    if inspect.isawaitable(result):
        # A sync function returning a coroutine (a wrapped async initializer).
        await result


async def run_initializer(
    initializer: Initializer,
    init_timeout: float | None,
    logs: Callable[[], str],
) -> InitFailure | None:
    """Run the initializer under the SDK's deadline; None on success, else the failure.

    *logs* is called only on failure, for the tail of the captured output. Cancellation
    from outside (shutdown) propagates: it is not a failure.
    """
    started = trio.current_time()
    deadline = math.inf if init_timeout is None else started + init_timeout
    error: BaseException | None = None
    with trio.move_on_at(deadline) as scope:
        try:
            # A checkpoint inside the scope makes init_timeout=0 time out at once, even for an
            # initializer that would raise before its first await.
            await trio.lowlevel.checkpoint()
            await call_initializer(initializer)
        except trio.Cancelled:
            raise
        except BaseException as exc:
            error = exc
    now = trio.current_time()
    if scope.cancelled_caught:
        assert init_timeout is not None
        timeout = InitTimeout(init_timeout)
        output = logs()
        return InitFailure(
            error_type="InitTimeout",
            message=str(timeout),
            traceback="",
            category="timeout",
            logs=output,
            elapsed=now - started,
            init_timeout=init_timeout,
            failed_at=now,
        )
    if error is None:
        return None
    output = logs()
    return InitFailure(
        error_type=type(error).__name__,
        message=safe_str(error),
        traceback=format_traceback(error),
        category=classify(error, output),
        logs=output,
        elapsed=now - started,
        init_timeout=init_timeout,
        failed_at=now,
    )
