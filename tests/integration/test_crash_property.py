"""Property: wherever a real worker process dies, every job it held is reported exactly
once, and no job it had already reported is reported again (docs/design.md §13).

Drawn: the concurrency, how many jobs were already reported (k), how many jobs are held
when it dies, which of them kills the process, and how (a segfault, an abort, SIGKILL, an
exit status). Each example is a real worker against the loopback fake platform, so the
examples are few.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_worker.testing import FakePlatform, run_platform_server

from ..conftest import Platform
from .conftest import kill_all, open_worker
from .test_crash import CRASH_APP

pytestmark = pytest.mark.slow

STATUS = {"segv": 139, "abort": 134, "kill": 137, "exit3": 3}


@st.composite
def deaths(draw: st.DrawFn) -> tuple[int, int, int, int, str]:
    concurrency = draw(st.integers(1, 3))
    reported = draw(st.integers(0, 4))
    held = draw(st.integers(1, concurrency))
    crasher = draw(st.integers(0, held - 1))
    how = draw(st.sampled_from(sorted(STATUS)))
    return concurrency, reported, held, crasher, how


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(death=deaths())
def test_every_held_job_is_reported_exactly_once(
    death: tuple[int, int, int, int, str], tmp_path: Path
) -> None:
    app = tmp_path / "crash_app.py"
    app.write_text(CRASH_APP)
    trio.run(_scenario, app, *death)


async def _scenario(
    app: Path, concurrency: int, reported: int, held: int, crasher: int, how: str
) -> None:
    fake = FakePlatform(take_hold=1.0, stop_hold=1.0)
    async with run_platform_server(fake) as url, trio.open_nursery() as nursery:
        platform = Platform(fake, url)
        env = platform.env(CONCURRENCY=str(concurrency))
        worker = await open_worker(nursery, [sys.executable, "-u", str(app)], env)
        try:
            done = [fake.enqueue({"seconds": 0}) for _ in range(reported)]
            with trio.fail_after(30):
                for job_id in done:
                    await fake.wait_for_status(job_id, "COMPLETED")
            # The crasher waits until every one of the `held` jobs has started.
            need = reported + held
            plans: list[dict[str, object]] = [{"seconds": 60, "held": need} for _ in range(held)]
            plans[crasher] = {"crash": how, "held": need}
            victims = [fake.enqueue(plan) for plan in plans]
            waiting = fake.enqueue({"seconds": 0}) if held == concurrency else None
            assert await worker.wait() == STATUS[how], worker.output
        finally:
            await kill_all([worker])
        for job_id in done:
            record = fake.job(job_id)
            assert record.status == "COMPLETED" and len(record.done_reports) == 1
        for job_id in victims:
            record = fake.job(job_id)
            assert len(record.done_reports) == 1, (job_id, record.done_reports, worker.output)
            assert "WorkerCrashed" in str(record.done_reports[0])
        if waiting is not None:  # never taken: nothing to report
            assert fake.job(waiting).done_reports == []
        nursery.cancel_scope.cancel()
