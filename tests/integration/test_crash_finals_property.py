"""Property: wherever a real watched worker dies, no job gets two different finals, and
every job it held gets one final, or the identical body twice (docs/design.md §13.2).

A job counts as held from its take answer; a job reported before the death counts too,
since its answer may still have been on its way.

Drawn: the concurrency (1-8), the platform's answer latency for each job-done (0-50 ms:
the result is stored first, then answered, the worst case for a death), how many jobs were
reported before, how many are held in the last batch and how long each runs, and the death
(SIGKILL, SIGSEGV, a native ``_exit(0)`` or ``_exit(3)``) at a random moment after the first
of them starts, once every one of them has started, so the death never falls on a take
answer still in transit (the platform requeues those, by its own rule).

Each example is a real worker process against the loopback fake platform; CI runs a few
(``TRIO_WORKER_FINALS_EXAMPLES`` raises it for a soak; ``--hypothesis-show-statistics``
prints the counts of each outcome).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from trio_worker.testing import FakePlatform, Fault, run_platform_server

from ..conftest import Platform
from .conftest import kill_all, open_worker

APP = Path(__file__).with_name("watched_app.py")
EXAMPLES = int(os.environ.get("TRIO_WORKER_FINALS_EXAMPLES", "8"))

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60 + 10 * EXAMPLES)]


@dataclass(frozen=True)
class Death:
    concurrency: int
    latencies: list[float]  # seconds, one per job-done answer, in order
    reported: int
    durations: list[float]  # one per held job
    how: str
    after: float  # seconds after the first held job starts


@st.composite
def deaths(draw: st.DrawFn) -> Death:
    concurrency = draw(st.integers(1, 8))
    held = draw(st.integers(1, concurrency))
    reported = draw(st.integers(0, 3))
    return Death(
        concurrency=concurrency,
        latencies=draw(st.lists(st.floats(0, 0.05), min_size=1, max_size=reported + held)),
        reported=reported,
        durations=draw(st.lists(st.floats(0, 0.1), min_size=held, max_size=held)),
        how=draw(st.sampled_from(["kill", "segv", "exit0", "exit3"])),
        after=draw(st.floats(0, 0.25)),
    )


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(death=deaths())
def test_no_job_gets_two_different_finals(death: Death) -> None:
    trio.run(_scenario, death)


async def _scenario(death: Death) -> None:
    fake = FakePlatform(take_hold=30.0, stop_hold=1.0)
    for latency in death.latencies:
        fake.inject(Fault("done", delay=latency, when="after"))
    async with run_platform_server(fake) as url, trio.open_nursery() as nursery:
        env = Platform(fake, url).env(CONCURRENCY=str(death.concurrency))
        env.pop("PYTHONPATH", None)
        held_count = death.reported + len(death.durations)
        worker = await open_worker(nursery, [sys.executable, "-u", str(APP)], env)
        try:
            await worker.until_output("worker pid ")
            before = [fake.enqueue({"n": n}) for n in range(death.reported)]
            with trio.fail_after(30):
                for job_id in before:
                    await fake.wait_for_status(job_id, "COMPLETED")
            # The death comes only once every held job has started: none is still in a
            # take answer on its way (the platform requeues those, by its own rule).
            plans: list[dict[str, object]] = [{"seconds": s} for s in death.durations]
            trigger = {"die": death.how, "after": death.after, "held": held_count}
            plans[0] = {**plans[0], **trigger}
            held = [fake.enqueue(plan) for plan in plans]
            status = await worker.wait(60)
        finally:
            await kill_all([worker])
        nursery.cancel_scope.cancel()
    for job_id in [*before, *held]:
        # A job reported before may still have had its answer on the way at the death:
        # then it is sent again, the same body.
        reports = fake.job(job_id).done_reports
        assert reports, (job_id, status, worker.output)
        assert all(report == reports[0] for report in reports), (job_id, reports)
        assert len(reports) <= 2, reports
        crashed = "WorkerCrashed" in json.dumps(reports[0])
        event(f"{'WorkerCrashed' if crashed else 'own final'}, sent {len(reports)}x")
    event(f"death: {death.how}")
