"""An in-memory network: the worker's own HTTP client talks to an ASGI app over trio streams.

:func:`memory_network` yields a stream opener for the lean client
(``PlatformClient(..., open_stream=opener)``): every connection the client opens is a
:func:`trio.testing.memory_stream_pair`, and the other end is served by the fake platform's
h11 server (:func:`~trio_worker.testing._http_server.serve_stream`), exactly as a socket
would be. So a test under ``MockClock(autojump_threshold=0)`` runs the production client
(keep-alive pool, response parsing, stale-connection retry, cancellation closing its
connection, error mapping) against the fake platform, with no socket and no thread:
memory streams are plain trio, so the clock jumps whenever every task waits.

The host, port and TLS flag of a connect are ignored: whatever URL the worker was given,
the app answers it.
"""

from __future__ import annotations

import functools
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import trio
import trio.testing

from ._http_server import KEEP_ALIVE_TIMEOUT, serve_stream

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from .._platform._http import StreamOpener
    from ._http_server import ASGIApp

__all__ = ["memory_network"]


@asynccontextmanager
async def memory_network(
    app: ASGIApp, *, keep_alive_timeout: float = KEEP_ALIVE_TIMEOUT
) -> AsyncIterator[StreamOpener]:
    """Serve *app* to every stream the yielded opener opens, while the block runs.

    Each call of the opener returns the client end of a fresh in-memory connection; a
    task of this block's nursery serves the server end until either side closes it.
    Leaving the block cancels the server tasks and closes their ends, so a client still
    holding a connection sees it closed by the server, as after a server restart. An
    exception out of the block leaves it as it came, not in an ExceptionGroup.
    """
    async with trio.open_nursery() as nursery:
        serve = functools.partial(serve_stream, app, keep_alive_timeout=keep_alive_timeout)

        async def open_stream(host: str, port: int, tls: bool) -> trio.abc.Stream:
            client, server = trio.testing.memory_stream_pair()
            nursery.start_soon(serve, server)
            await trio.lowlevel.checkpoint()  # a connect is a checkpoint, as over TCP
            return client

        # What the block raises passes through as is, never wrapped in the nursery's
        # ExceptionGroup: a caller catches InitializationError, not a group holding it.
        failure: BaseException | None = None
        try:
            yield open_stream
        except BaseException as exc:
            failure = exc
        finally:
            nursery.cancel_scope.cancel()
    if failure is not None:
        raise failure
