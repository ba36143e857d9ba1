"""The heartbeat: a ping every ``RUNPOD_PING_INTERVAL`` with the held job ids.

See docs/protocol.md §2.6.

It runs in a daemon thread of its own, not in the event loop, so a handler that blocks the
loop does not silence it, and not in a second process, so it can never outlive the worker
and report a dead worker as alive (docs/protocol.md §8 item 16). The cadence is fixed-rate (each
ping is due one interval after the previous one was due), so a slow ping does not stretch
the gap (item 18). The held ids are read from the ledger's snapshot tuple, which the event
loop replaces atomically, so no lock is needed.

For the virtual-time suite, :func:`heartbeat_task` runs the same pings as a trio task.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING
from urllib.parse import urlencode

import httpx
import trio

from .._config import with_query
from .._version import __version__
from ._quiet import own_request

if TYPE_CHECKING:
    from ._http import HttpBackend

log = logging.getLogger("trio_worker")

HeldIds = Callable[[], tuple[str, ...]]


def ping_url(template: str, held: tuple[str, ...]) -> str:
    """The ping URL: the template's own query (``?gpu=...``) kept, ours appended.

    httpx's ``params=`` would replace the template's query instead of adding to it.
    """
    return with_query(template, urlencode(ping_params(held)))


def ping_params(held: tuple[str, ...]) -> dict[str, str]:
    """The ping's query: ``job_id`` omitted when no job is held, as the reference."""
    params = {"runpod_version": __version__}
    if held:
        params = {"job_id": ",".join(held), **params}
    return params


class HeartbeatThread:
    """Pings from a daemon thread until :meth:`stop`."""

    def __init__(self, url: str, api_key: str, interval: float, held: HeldIds) -> None:
        self._url = url
        self._interval = interval
        self._held = held
        self._stopping = threading.Event()
        self._client = httpx.Client(
            headers={"Authorization": api_key},
            # A ping that takes longer than two intervals is worth less than the next one.
            timeout=httpx.Timeout(max(2 * interval, 1.0)),
        )
        self._thread = threading.Thread(
            target=self._loop, name="trio_worker heartbeat", daemon=True
        )
        self.sent = 0

    def start(self) -> None:
        self._thread.start()

    @own_request  # closing the client logs too
    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=2 * self._interval + 1.0)
        self._client.close()

    @own_request
    def ping_now(self) -> None:
        # Whatever one ping raises (httpx, a bad URL, a bug), the next one is still due:
        # a silent heartbeat gets the worker's jobs handed to another worker.
        try:
            self._client.get(ping_url(self._url, self._held()))
            self.sent += 1
        except Exception as exc:
            log.warning("ping failed: %s: %s", type(exc).__name__, exc)

    def _loop(self) -> None:
        due = time.monotonic()
        while not self._stopping.is_set():
            self.ping_now()
            due += self._interval
            now = time.monotonic()
            if due < now:
                # Fell behind (a slow ping): ping again now rather than in a burst.
                due = now
            self._stopping.wait(due - now)


async def heartbeat_task(client: HttpBackend, url: str, interval: float, held: HeldIds) -> None:
    """The same pings as :class:`HeartbeatThread`, as a trio task on trio's clock."""
    while True:
        try:
            await client.request("GET", ping_url(url, held()))
        except Exception as exc:
            log.warning("ping failed: %s: %s", type(exc).__name__, exc)
        await trio.sleep(interval)
