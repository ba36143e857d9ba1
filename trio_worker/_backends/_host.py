"""The asyncio loop that hosts the worker's trio run as its guest, through trio's public
guest-mode API only (docs/how-it-works.md, "The asyncio backend")."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any, TypeVar

import trio

from .._exceptions import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator

log = logging.getLogger("trio_worker")

T = TypeVar("T")


def host_run(
    async_fn: Callable[..., Awaitable[T]],
    *args: Any,
    clock: trio.abc.Clock | None = None,
    instruments: tuple[trio.abc.Instrument, ...] = (),
) -> T:
    """:func:`trio_worker.run_asyncio_host`, whose docstring is its contract."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        main = loop.create_task(_host_main(async_fn, args, clock, instruments))
        return _run_through_escapes(loop, main)
    finally:
        try:
            _end_leftovers(loop)
        finally:
            asyncio.set_event_loop(None)
            loop.close()


# Per host loop: what a worker served on it does with a SystemExit or KeyboardInterrupt
# that left the loop (see _run_through_escapes).
_EXIT_SINKS: dict[asyncio.AbstractEventLoop, list[Callable[[BaseException], bool]]] = {}


@contextlib.contextmanager
def escaped_exits_to(sink: Callable[[BaseException], bool]) -> Iterator[None]:
    """While the block runs, a SystemExit or KeyboardInterrupt raised in an asyncio task
    of the user's own (one a handler started, not the handler's coroutine) goes to *sink*,
    and the host loop goes on, rather than the loop ending under the worker. *sink* says
    whether it took the exit (a worker already ended cannot)."""
    loop = host_loop()
    sinks = _EXIT_SINKS.setdefault(loop, [])
    sinks.append(sink)
    try:
        yield
    finally:
        sinks.remove(sink)
        if not sinks:
            del _EXIT_SINKS[loop]


def _run_through_escapes(loop: asyncio.AbstractEventLoop, main: asyncio.Task[T]) -> T:
    """Run the loop until *main* is done.

    asyncio lets a SystemExit or KeyboardInterrupt raised in a task out of the loop at
    once. The handlers' own coroutines are wrapped against that (``_asyncio.py``), not a
    task a handler starts: the first such exit is handed to the worker serving on this
    loop, which shuts down within its grace and then raises it, and the loop resumes. A
    second one (a second Ctrl-C), or one with no worker to tell, ends the loop at once.
    """
    handed = False
    while True:
        try:
            return loop.run_until_complete(main)
        except (SystemExit, KeyboardInterrupt) as exc:
            if main.done() or handed:
                raise
            # Every sink is told (several workers may share a loop in tests).
            told = [sink(exc) for sink in _EXIT_SINKS.get(loop, ())]
            if not any(told):
                raise
            handed = True


# How long the tasks user code left on the loop get to finish once cancelled: asyncio.run()
# would wait for ever for one that swallows its cancellation.
LEFTOVER_BOUND = 1.0


def _end_leftovers(loop: asyncio.AbstractEventLoop) -> None:
    tasks = asyncio.all_tasks(loop)
    for task in tasks:
        task.cancel()
    if tasks:
        _, pending = loop.run_until_complete(asyncio.wait(tasks, timeout=LEFTOVER_BOUND))
        if pending:
            log.warning("%d asyncio task(s) ignored their cancellation at exit", len(pending))
    for task in tasks:
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: the worker is ending either way
    try:
        loop.run_until_complete(asyncio.wait_for(loop.shutdown_asyncgens(), LEFTOVER_BOUND))
    except TimeoutError:
        log.warning("async generators still closing at exit")


class _HostCancelled(Exception):
    """The guest run was cancelled because the host's main task was."""


async def _host_main(
    async_fn: Callable[..., Awaitable[T]],
    args: tuple[Any, ...],
    clock: trio.abc.Clock | None,
    instruments: tuple[trio.abc.Instrument, ...],
) -> T:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()
    guest_scope: list[trio.CancelScope] = []
    token: list[trio.lowlevel.TrioToken] = []

    async def guest_main() -> T:
        token.append(trio.lowlevel.current_trio_token())
        with trio.CancelScope() as scope:
            guest_scope.append(scope)
            return await async_fn(*args)
        raise _HostCancelled

    trio.lowlevel.start_guest_run(
        guest_main,
        run_sync_soon_threadsafe=loop.call_soon_threadsafe,
        run_sync_soon_not_threadsafe=loop.call_soon,
        done_callback=done.set_result,
        # asyncio installs its own wakeup fd when signal handlers are added to the loop.
        host_uses_signal_set_wakeup_fd=True,
        clock=clock,
        instruments=instruments,
    )
    while True:
        try:
            outcome = await asyncio.shield(done)
            break
        except asyncio.CancelledError:
            # The trio run must end before the host loop does: cancel it and keep waiting.
            if token and guest_scope:
                token[0].run_sync_soon(guest_scope[0].cancel)
    try:
        result: T = outcome.unwrap()
    except _HostCancelled:
        raise asyncio.CancelledError from None
    return result


def host_loop() -> asyncio.AbstractEventLoop:
    """The asyncio loop hosting this trio run.

    Raises:
        ConfigurationError: trio is not running as a guest of asyncio.
    """
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        raise ConfigurationError(
            'async_backend="asyncio" needs an asyncio event loop hosting trio: use '
            "trio_worker.start(), or run serve() with trio_worker.run_asyncio_host(...) "
            "instead of trio.run(...)"
        ) from None
