"""The heartbeat: a ping every ``RUNPOD_PING_INTERVAL`` with the held job ids, from a
daemon thread on a trio loop of its own (docs/protocol.md §2.6, docs/how-it-works.md "The
heartbeat"); :func:`heartbeat_task` runs the same pings as a trio task, in virtual time.
The held ids come from the ledger's snapshot tuple, safe to read from this thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING
from urllib.parse import quote_plus, urlencode

import trio

from .._config import MAX_PING_URL_BYTES, with_query
from .._version import __version__
from ._http import make_backend
from ._request import check_headers

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ._http import HttpBackend

log = logging.getLogger("trio_worker")

HeldIds = Callable[[], tuple[str, ...]]


def ping_url(template: str, held: tuple[str, ...]) -> str:
    """The ping URL: the template's own query (``?gpu=...``) kept, ours appended."""
    return with_query(template, urlencode(ping_params(held)))


def ping_params(held: tuple[str, ...]) -> dict[str, str]:
    """The ping's query: ``job_id`` omitted when no job is held, as the reference."""
    params = {"runpod_version": __version__}
    if held:
        params = {"job_id": ",".join(held), **params}
    return params


class PingUrls:
    """Each ping's URL, at most *limit* bytes long: past it, the held ids take turns
    (docs/protocol.md §2.6, "Length"), with one warning per episode."""

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


class Pinger:
    """The pings themselves, on whichever loop runs :meth:`run`; *sent* counts those
    answered."""

    def __init__(self, url: str, interval: float, held: HeldIds) -> None:
        self.urls = PingUrls(url)
        self.interval = interval
        self.held = held
        self.sent = 0

    async def ping_once(self, backend: HttpBackend) -> None:
        # Whatever one ping raises (a bad URL, a bug), the next one is still due: a
        # silent heartbeat gets the worker's jobs handed to another worker.
        try:
            url = self.urls(self.held())
            # One deadline for the whole ping: when the next one is due.
            with trio.move_on_after(self.interval) as scope:
                await backend.exchange("GET", [(url, b"")])
            if scope.cancelled_caught:
                log.warning("ping failed: no whole answer within %.2fs", self.interval)
            else:
                self.sent += 1
        except Exception as exc:
            log.warning("ping failed: %s: %s", type(exc).__name__, str(exc))

    async def run(self, backend: HttpBackend, stopped: trio.Event) -> None:
        """Ping at a fixed rate until cancelled, or until *stopped* is set (a ping in
        flight then ends first, within its deadline)."""
        due = trio.current_time()
        while not stopped.is_set():
            await self.ping_once(backend)
            due = max(due + self.interval, trio.current_time())  # fell behind: now
            with trio.move_on_at(due):
                await stopped.wait()


class HeartbeatThread:
    """Pings from a daemon thread, on a trio loop of its own, until :meth:`stop`."""

    def __init__(
        self,
        url: str,
        api_key: str,
        interval: float,
        held: HeldIds,
        *,
        proxies: Mapping[str, str] | None = None,
    ) -> None:
        """*proxies*: the proxy variables to follow (``PlatformConfig.proxies``; by
        default, the process's environment)."""
        self._headers = {"Authorization": api_key}
        self._proxies = proxies
        check_headers(self._headers)
        self._pinger = Pinger(url, interval, held)
        self._stopping = threading.Event()
        self._cancel: Callable[[], None] | None = None  # ends the loop, from any thread
        self._thread = threading.Thread(
            target=self._loop, name="trio_worker heartbeat", daemon=True
        )

    def __repr__(self) -> str:
        state = "stopping" if self._stopping.is_set() else "pinging"
        return f"<HeartbeatThread {state}, {self.sent} answered, every {self._pinger.interval}s>"

    @property
    def sent(self) -> int:
        return self._pinger.sent

    def make_backend(self) -> HttpBackend:
        """The thread's own client (its own connection): one per trio loop."""
        return make_backend(self._headers, environ=self._proxies)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop pinging; returns at once even with a ping hung in flight."""
        self._stopping.set()
        cancel = self._cancel
        if cancel is not None:
            cancel()
        # A hung ping must not delay the exit: a daemon thread ends with the process.
        if self._thread.ident is not None:  # started
            self._thread.join(timeout=0.1)

    def ping_now(self) -> None:
        """One ping, on a loop and a connection of its own (for tests and tools)."""

        async def once() -> None:
            backend = self.make_backend()
            try:
                await self._pinger.ping_once(backend)
            finally:
                await backend.aclose()

        trio.run(once)

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                trio.run(self._serve)
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException:
                # Nothing may end this thread but stop(): its death would be silent.
                log.exception("heartbeat: unexpected error; the next ping still goes out")
                self._stopping.wait(self._pinger.interval)

    async def _serve(self) -> None:
        backend = self.make_backend()
        token = trio.lowlevel.current_trio_token()
        stopped = trio.Event()

        def stop() -> None:
            try:
                token.run_sync_soon(stopped.set)
            except trio.RunFinishedError:
                pass

        self._cancel = stop
        if self._stopping.is_set():  # stop() came before the line above
            stopped.set()
        try:
            await self._pinger.run(backend, stopped)
        finally:
            self._cancel = None
            await backend.aclose()


async def heartbeat_task(client: HttpBackend, url: str, interval: float, held: HeldIds) -> None:
    """The same pings as :class:`HeartbeatThread`, as a trio task on trio's clock."""
    await Pinger(url, interval, held).run(client, trio.Event())  # until cancelled
