"""Posting what the worker owes the platform for a job: the terminal report under a shield
with its own deadline (docs/design.md §4 I5), and progress updates in the background, never
after the final result (docs/protocol.md §3.5)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from ._config import Settings
    from ._platform._client import PlatformClient

log = logging.getLogger("trio_worker")


@dataclass
class _Progress:
    in_flight: int = 0
    idle: trio.Event = field(default_factory=trio.Event)


class Delivery:
    def __init__(self, settings: Settings, client: PlatformClient) -> None:
        self.settings = settings
        self.timings = settings.timings
        self.client = client
        self._progress: dict[str, _Progress] = {}

    async def deliver(self, job_id: str, body: bytes, *, is_stream: bool) -> bool:
        """Post a terminal report, shielded; False (logged loudly) when it was lost."""
        url = self.settings.platform.done_url(job_id, is_stream=is_stream)
        delivered, why = False, "report deadline passed"
        with trio.move_on_after(self.timings.report_deadline, shield=True):
            progress = self._progress.get(job_id)
            if progress is not None:
                await progress.idle.wait()
            outcome = await self.client.post_report(url, body, job_id=job_id)
            delivered, why = outcome.delivered, outcome.last_error or ""
        if not delivered:
            log.error("RESULT LOST for job %s: job-done not delivered (%s)", job_id, why)
        return delivered

    def spawn_progress(self, nursery: trio.Nursery, job_id: str, body: bytes) -> None:
        """Post a progress update in *nursery*; a later terminal report waits for it."""
        progress = self._progress.setdefault(job_id, _Progress())
        progress.in_flight += 1
        nursery.start_soon(self._post_progress, job_id, progress, body)

    async def _post_progress(self, job_id: str, progress: _Progress, body: bytes) -> None:
        url = self.settings.platform.done_url(job_id, is_stream=False)
        try:
            with trio.move_on_after(self.timings.report_deadline):
                await self.client.post_report(url, body, job_id=job_id)
        finally:
            progress.in_flight -= 1
            if progress.in_flight == 0:
                progress.idle.set()
                if self._progress.get(job_id) is progress:
                    del self._progress[job_id]
