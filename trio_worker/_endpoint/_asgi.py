"""The ASGI shapes the endpoint app speaks, and the one exception it raises to its server.

The same shapes as ``httpx.ASGITransport``'s, so one app type-checks against every server
that runs it: hypercorn for the local endpoint (``_serving``), and the fake platform's
in-memory server in :mod:`trio_worker.testing`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = ["ASGIApp", "AbortConnection", "Message", "Receive", "Scope", "Send"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class AbortConnection(Exception):
    """Raise from an ASGI app (before it responds) to close the connection unanswered.

    The fake platform's server closes the connection without a byte, which is what
    fault-injection tests need (the client sees "server disconnected without sending a
    response"); hypercorn, which has no such answer, sends a 500 and closes.
    """
