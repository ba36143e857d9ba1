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
from urllib.parse import quote_plus, urlencode

import httpx
import trio

from .._config import MAX_ANSWER_BYTES, MAX_PING_URL_BYTES, with_query
from .._exceptions import TransportError
from .._version import __version__
from ._lean import check_headers
from ._quiet import own_request
from ._tls import trust_context

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


class PingUrls:
    """Each ping's URL, at most *limit* bytes long (docs/protocol.md §2.6).

    With more held ids than fit, each ping lists as many as fit, starting where the
    previous one stopped, so every held job is listed every few pings; one warning per
    episode says so. Before this bound a URL past httpx's 64 KiB limit failed every ping,
    and the silent worker's jobs were handed to others.
    """

    def __init__(self, template: str, limit: int = MAX_PING_URL_BYTES) -> None:
        self._template = template
        self._limit = limit
        self._next = 0
        self._over = False
        # What a ping with ids adds to one without: "job_id=" and "&".
        self._base = len(ping_url(template, ())) + len("job_id=&")

    def __call__(self, held: tuple[str, ...]) -> str:
        url = ping_url(self._template, held)
        if len(url) <= self._limit:
            self._over = False
            return url
        start = self._next % len(held)
        room = self._limit - self._base
        chosen: list[str] = []
        for job_id in held[start:] + held[:start]:
            cost = len(quote_plus(job_id)) + (3 if chosen else 0)  # "%2C" between ids
            if cost > room:
                break
            room -= cost
            chosen.append(job_id)
        self._next = start + max(len(chosen), 1)  # one that never fits is skipped
        if not self._over:
            self._over = True
            log.warning(
                "the %d held job ids do not fit one ping URL of at most %d bytes; each ping "
                "lists as many as fit (%d now), taking turns",
                len(held),
                self._limit,
                len(chosen),
            )
        return ping_url(self._template, tuple(chosen))


class HeartbeatThread:
    """Pings from a daemon thread until :meth:`stop`."""

    def __init__(self, url: str, api_key: str, interval: float, held: HeldIds) -> None:
        check_headers({"Authorization": api_key})
        self._urls = PingUrls(url)
        self._interval = interval
        self._held = held
        self._stopping = threading.Event()
        self._client = httpx.Client(
            headers={"Authorization": api_key},
            # A ping that takes longer than two intervals is worth less than the next one.
            timeout=httpx.Timeout(max(2 * interval, 1.0)),
            verify=trust_context(),  # the worker's one trust store
        )
        self._thread = threading.Thread(
            target=self._loop, name="trio_worker heartbeat", daemon=True
        )
        self.sent = 0

    def start(self) -> None:
        self._thread.start()

    @own_request  # closing the client logs too
    def stop(self) -> None:
        """Stop pinging; returns at once even with a ping hung in flight."""
        self._stopping.set()
        # A hung ping must not delay the exit: the thread is a daemon, it ends with the
        # process. Its client is closed only when no ping is in flight on it.
        if self._thread.ident is not None:  # started
            self._thread.join(timeout=0.1)
        if not self._thread.is_alive():
            self._client.close()

    @own_request
    def ping_now(self) -> None:
        # Whatever one ping raises (httpx, a bad URL, a bug), the next one is still due:
        # a silent heartbeat gets the worker's jobs handed to another worker.
        try:
            with self._client.stream("GET", self._urls(self._held())) as response:
                size = 0
                for chunk in response.iter_raw():  # the answer is ignored, but bounded
                    size += len(chunk)
                    if size > MAX_ANSWER_BYTES:
                        raise TransportError(f"ping answer over {MAX_ANSWER_BYTES} bytes, not read")
            self.sent += 1
        except Exception as exc:
            log.warning("ping failed: %s: %s", type(exc).__name__, str(exc))

    def _loop(self) -> None:
        due = time.monotonic()
        while not self._stopping.is_set():
            try:
                self.ping_now()
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException:
                # Nothing may end this thread but stop(): its death would be silent.
                log.exception("heartbeat: unexpected error; the next ping still goes out")
            due += self._interval
            now = time.monotonic()
            if due < now:
                # Fell behind (a slow ping): ping again now rather than in a burst.
                due = now
            self._stopping.wait(due - now)


async def heartbeat_task(client: HttpBackend, url: str, interval: float, held: HeldIds) -> None:
    """The same pings as :class:`HeartbeatThread`, as a trio task on trio's clock."""
    urls = PingUrls(url)
    while True:
        try:
            await client.request("GET", urls(held()), max_body=MAX_ANSWER_BYTES)
        except Exception as exc:
            log.warning("ping failed: %s: %s", type(exc).__name__, str(exc))
        await trio.sleep(interval)
