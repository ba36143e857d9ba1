"""Webhook calls of the endpoint API: the final status POSTed to the job's ``webhook``.

As the platform does (docs/protocol.md §4.1): one POST of the ``/status`` object when the
job finishes, acknowledged by a 2xx answer; on any other answer or a transport error, up
to 2 more attempts 10 s apart. Each call runs in its own task of the sender's nursery, so
a slow receiver delays nothing else, and only the URL the request gave is ever called.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from ._rules import WEBHOOK_ATTEMPTS, WEBHOOK_RETRY_DELAY, WEBHOOK_TIMEOUT

if TYPE_CHECKING:
    from collections.abc import Callable

    import httpx

__all__ = ["WebhookCall", "WebhookSender"]

#: Webhook calls remembered for tests and the page (the oldest are forgotten).
KEPT_CALLS = 1000


@dataclass
class WebhookCall:
    """One job's webhook delivery: its attempts (status code or error text) and outcome."""

    job_id: str
    url: str
    body: bytes
    attempts: list[int | str] = field(default_factory=list)
    delivered: bool | None = None  # None while attempts remain

    @property
    def finished(self) -> bool:
        return self.delivered is not None


class WebhookSender:
    """The outbox of webhook calls and the task that sends them.

    :meth:`submit` is synchronous (the state calls it when a job finishes); :meth:`run`
    sends. Without a running sender, calls wait in the outbox, where a test can read them.
    """

    def __init__(self) -> None:
        self.calls: deque[WebhookCall] = deque(maxlen=KEPT_CALLS)
        self._outbox: deque[WebhookCall] = deque()
        self._lot = trio.lowlevel.ParkingLot()
        self._changed = trio.lowlevel.ParkingLot()

    def submit(self, job_id: str, url: str, body: bytes) -> None:
        """Queue a POST of *body* (the final status object) to *url*."""
        call = WebhookCall(job_id, url, body)
        self.calls.append(call)
        self._outbox.append(call)
        self._lot.unpark_all()

    async def wait_finished(self, job_id: str) -> WebhookCall:
        """Wait until *job_id*'s webhook call has succeeded or given up."""
        while True:
            for call in self.calls:
                if call.job_id == job_id and call.finished:
                    return call
            await self._changed.park()

    async def run(
        self,
        *,
        client_factory: Callable[[], httpx.AsyncClient] | None = None,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Send every submitted call, each in its own task, until cancelled."""
        task_status.started()
        while not self._outbox:
            await self._lot.park()
        # httpx once the first job asks for a webhook: about 30 ms of start-up (python -X
        # importtime) that a local endpoint whose jobs name none never needs.
        import httpx

        failures = (httpx.HTTPError, httpx.InvalidURL, trio.TooSlowError)
        factory = client_factory or (lambda: httpx.AsyncClient(timeout=WEBHOOK_TIMEOUT))
        async with factory() as client, trio.open_nursery() as nursery:
            while True:
                while not self._outbox:
                    await self._lot.park()
                nursery.start_soon(self._deliver, client, self._outbox.popleft(), failures)

    async def _deliver(
        self,
        client: httpx.AsyncClient,
        call: WebhookCall,
        failures: tuple[type[Exception], ...],
    ) -> None:
        headers = {"Content-Type": "application/json"}
        for attempt in range(WEBHOOK_ATTEMPTS):
            if attempt:
                await trio.sleep(WEBHOOK_RETRY_DELAY)
            try:
                with trio.fail_after(WEBHOOK_TIMEOUT):
                    response = await client.post(call.url, content=call.body, headers=headers)
                call.attempts.append(response.status_code)
                if response.is_success:
                    call.delivered = True
                    break
            except failures as exc:
                call.attempts.append(f"{type(exc).__name__}: {exc}")
        else:
            call.delivered = False
        self._changed.unpark_all()
