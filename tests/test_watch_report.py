"""The watchdog's reports after a death (``trio_worker._watch._report.report_held``): the
kept bodies go again, byte for byte and to their own route, and a worker that held a huge
number of jobs costs neither a connection nor a body each at once (docs/design.md §13.4)."""

from __future__ import annotations

import json
from typing import NoReturn

from trio_worker import Timings
from trio_worker._config import Settings
from trio_worker._payloads import JobError
from trio_worker._watch import _report
from trio_worker.testing import FakePlatform, Fault, run_platform_server


def _never() -> NoReturn:
    raise AssertionError("a second signal was not sent")


def _max_overlap(fake: FakePlatform, route: str) -> int:
    spans = [(r.time, r.answer_time) for r in fake.requests if r.route == route and r.answer_time]
    return max(sum(1 for a, b in spans if a <= t < b) for t, _ in spans)


async def test_kept_bodies_are_resent_as_they_were_and_crashed_jobs_reported() -> None:
    fake = FakePlatform(take_hold=0.1)
    stream_job, plain_job, crashed_job = (fake.enqueue({}) for _ in range(3))
    async with run_platform_server(fake) as url:
        settings = Settings.from_environ(
            fake.worker_env(url), timings=Timings(), capture_logs="off"
        )
        finals = {
            stream_job: (b'{"output": [1, 2]}', True),
            plain_job: (b'{"output": {"n": 1}}', False),
        }
        built: list[str] = []

        def error(job_id: str) -> JobError:
            built.append(job_id)
            return JobError("WorkerCrashed", "crashed", category="segfault")

        outcome = await _report.report_held(
            settings, finals, [crashed_job], error, leave_now=_never
        )
    assert outcome == {stream_job: True, plain_job: True, crashed_job: True}
    assert built == [crashed_job]
    assert fake.job(stream_job).done_reports == [{"output": [1, 2]}]
    assert fake.job(stream_job).is_stream is True
    assert fake.job(plain_job).done_reports == [{"output": {"n": 1}}]
    [crashed] = fake.job(crashed_job).done_reports
    assert isinstance(crashed, dict)
    assert list(crashed) == ["error"]
    inner = json.loads(crashed["error"])
    assert (inner["error_type"], inner["error_message"]) == ("WorkerCrashed", "crashed")
    assert inner["error_category"] == "segfault"
    assert inner["worker_id"] == settings.platform.worker_id


async def test_many_held_jobs_are_reported_a_bounded_number_at_a_time() -> None:
    fake = FakePlatform(take_hold=0.1)
    jobs = [fake.enqueue({}) for _ in range(120)]
    fake.inject(Fault("done", delay=0.02, times=len(jobs)))
    async with run_platform_server(fake) as url:
        settings = Settings.from_environ(
            fake.worker_env(url), timings=Timings(), capture_logs="off"
        )
        outcome = await _report.report_held(
            settings, {}, jobs, lambda job_id: JobError("WorkerCrashed", "x"), leave_now=_never
        )
    assert all(outcome[job_id] for job_id in jobs)
    assert all(len(fake.job(job_id).done_reports) == 1 for job_id in jobs)
    assert 1 < _max_overlap(fake, "done") <= _report.REPORTS_AT_ONCE
