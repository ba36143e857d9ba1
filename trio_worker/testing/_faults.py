"""Injected faults: what an armed :class:`~trio_worker.testing.Fault` answers instead.

:class:`~trio_worker.testing.FakePlatform` arms them (``inject``) and applies them around
its routes; the value object itself sits with the request records it is noted in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx

from .._endpoint._queue import encode_json
from .._endpoint._routes import NO_CONTENT, Response
from ._exchange import AbortConnection

if TYPE_CHECKING:
    from .._endpoint._records import Fault

__all__ = ["ArmedFault", "ConnectionDropped", "fault_response"]


class ConnectionDropped(AbortConnection, httpx.RemoteProtocolError):
    """An injected ``Fault(drop=True)``.

    Over a real socket the server closes the connection unanswered. Through
    ``httpx.ASGITransport`` this exception reaches the client itself, and since it is an
    ``httpx.RemoteProtocolError`` the worker handles it exactly as a real dropped
    connection ("Server disconnected without sending a response").
    """


class ArmedFault:
    """An injected fault and how many more requests it applies to."""

    __slots__ = ("fault", "remaining")

    def __init__(self, fault: Fault, remaining: int) -> None:
        self.fault = fault
        self.remaining = remaining


def fault_response(fault: Fault) -> Response:
    """The answer of an injected fault.

    Raises:
        ConnectionDropped: for ``drop=True``.
    """
    if fault.drop:
        raise ConnectionDropped("injected fault: connection dropped")
    assert fault.status is not None
    headers: tuple[tuple[bytes, bytes], ...] = ()
    if fault.retry_after is not None:
        headers = ((b"retry-after", b"%g" % fault.retry_after),)
    if fault.body is not None:
        return Response(fault.status, fault.body, headers=headers)
    if fault.status == 204:
        return NO_CONTENT
    body = encode_json({"error": f"injected fault {fault.status}"})
    return Response(fault.status, body, headers=headers)
