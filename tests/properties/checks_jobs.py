"""The invariants of each job: its transitions, its one report, its result, its stream.

Each checker is a pure function of the finished `Run` returning its violations (I1, I5, I6
of docs/design.md, stops, results and stream chunks).
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from trio_worker._state import TRANSITIONS

from .usercode import error_type_of
from .views import EPS, E, S, failure_of, loads_or_none, parse_report, views

if TYPE_CHECKING:
    from .runner import Run


MAX_ERROR_BODY = 64 * 1024


# Not started: a stop reaching the job now must end it STOPPED.
WAITING = (S.TAKEN, S.WAITING_FOR_INIT, S.WAITING_FOR_SLOT, S.RELEASING, S.MALFORMED)


def check_transitions(run: Run) -> list[str]:
    """Every job's history replays against TRANSITIONS, from TAKEN, and ends terminal."""
    out = []
    for job in views(run).values():
        state = S.TAKEN
        for t in job.transitions:
            if t.before is not state:
                out.append(f"{job.id}: observer said before={t.before}, replay says {state}")
            expected = TRANSITIONS.get((t.before, t.event))
            if expected is None or expected is not t.after:
                out.append(f"{job.id}: illegal {t.before} --{t.event}--> {t.after}")
            state = t.after
        if job.delivered and not state.terminal:
            out.append(f"{job.id}: stuck in {state} (taken, never settled)")
    return out


def check_exactly_once(run: Run) -> list[str]:
    """I1: one acknowledged terminal report per taken job, none for stopped or released
    jobs, none for jobs the worker never took.

    An attempt the worker cut by its own timeout (``report_attempt_timeout``) is an answer
    lost in transit, like a dropped one: the platform may have acknowledged it while the
    worker went on to retry, so each such attempt may account for one extra acknowledgement
    on the platform's side (the platform keeps the first report, docs/protocol.md §2.3)."""
    out = []
    for job in views(run).values():
        seen = [ex for ex in job.reports if ex.outcome == "ok" and ex.status in range(200, 300)]
        cut = len([ex for ex in job.reports if ex.outcome == "cancelled"])
        final = job.final
        if final is S.DONE:
            if not 1 <= len(job.acked) <= 1 + cut or len(seen) != 1:
                out.append(
                    f"I1 {job.id}: DONE with {len(job.acked)} acknowledged reports "
                    f"({len(seen)} seen by the worker): {job.reports}"
                )
        elif final is S.UNDELIVERED:
            if seen or len(job.acked) > max(cut, 1):
                out.append(
                    f"I1 {job.id}: UNDELIVERED but {len(seen)} acknowledgements seen, "
                    f"{len(job.acked)} given: {job.reports}"
                )
        elif final in (S.STOPPED, S.RELEASED) or final is None:
            if job.reports or job.acked:
                out.append(f"I1 {job.id}: {final} yet reported: {job.reports}")
        if len(job.acked) > max(1, cut + (final is S.DONE)):
            out.append(f"I1 {job.id}: {len(job.acked)} acknowledged terminal reports")
    unknown = run.platform.statistics().unknown_job_reports
    if unknown:
        out.append(f"I1: {unknown} reports for jobs the platform does not know")
    return out


def check_shielded_reports(run: Run) -> list[str]:
    """I5: every job that reached REPORTING ends DONE or UNDELIVERED within its delivery
    budget (report_budget; cut when the worker stops, but never below report_deadline), and
    UNDELIVERED only when no attempt was acknowledged in a window of at least
    min(report_budget, report_deadline)."""
    timings = run.scenario.timings
    floor = min(timings.report_budget, timings.report_deadline)
    out = []
    for job in views(run).values():
        start = job.time_of(S.REPORTING)
        if start is None:
            continue
        final = job.final
        if final not in (S.DONE, S.UNDELIVERED):
            out.append(f"I5 {job.id}: reached REPORTING at {start:g} and ended {final}")
            continue
        end = job.transitions[-1].time
        if end - start > timings.report_budget + EPS:
            out.append(f"I5 {job.id}: report took {end - start:g}s > {timings.report_budget:g}")
        if final is S.UNDELIVERED:
            ok = [ex for ex in job.reports if ex.outcome == "ok" and ex.status in range(200, 300)]
            if ok or end - start < floor - EPS:
                out.append(
                    f"I5 {job.id}: UNDELIVERED after {end - start:g}s (window at least "
                    f"{floor:g}s), platform not faulted throughout: {job.reports}"
                )
    return out


def check_bounded_bodies(run: Run) -> list[str]:
    """I6: every job-done body is at most 64 KiB and is JSON with a string error, if any."""
    out = []
    for ex in run.rec.exchanges:
        if ex.route not in ("done", "stream"):
            continue
        if len(ex.body) > MAX_ERROR_BODY:
            out.append(f"I6 {ex.job_id}: {ex.route} body of {len(ex.body)} bytes > 64 KiB")
        body = loads_or_none(ex.body)
        if not isinstance(body, dict):
            out.append(f"I6 {ex.job_id}: {ex.route} body is not a JSON object: {ex.body[:200]!r}")
        elif "error" in body and not isinstance(body["error"], str):
            out.append(f"I6 {ex.job_id}: error is not a string: {body['error']!r:.200}")
    return out


def check_stops(run: Run) -> list[str]:
    """A stop that reached the worker while the job could still be stopped ends the job
    STOPPED with nothing reported: at the gate or queued in the worker, running with work
    left, or not yet held (the worker remembers it for the take that brings the job)."""
    out = []
    jobs = views(run)
    failure = failure_of(run)
    for stop in run.rec.stops:
        job = jobs.get(stop.job_id)
        if job is None or not job.delivered:
            continue
        if failure is not None and stop.time >= failure.failed_at - EPS:
            continue  # the stop channel is gone once init failed
        handler = run.rec.handlers.get(stop.job_id)
        must_stop = False
        if stop.state is None:
            # Not held yet: the take that brings the job must find the stop remembered.
            must_stop = all(ex.end_seq > stop.seq for ex in job.delivered)
        elif stop.state in WAITING:
            must_stop = True
        elif stop.state is S.RUNNING:
            must_stop = handler is not None and handler.planned_end > stop.time + EPS
        if must_stop and job.final is not S.STOPPED:
            out.append(
                f"stop {stop.job_id} at t={stop.time:g} in state {stop.state}: ended "
                f"{job.final}, reports {job.reports}"
            )
    return out


def check_results(run: Run) -> list[str]:
    """What a DONE job reported matches what happened to it: the handler's own result or
    error (non-JSON output and a generator failing mid-stream included), init_failed,
    malformed, or worker_shutdown only for a job still running when the grace ran out."""
    out = []
    scn = run.scenario
    grace_end = math.inf
    if run.rec.sigterm is not None:
        grace_end = run.rec.sigterm[1] + scn.timings.shutdown_grace
    for job in views(run).values():
        if job.final is not S.DONE or not job.reports or job.plan is None:
            continue
        report = parse_report(job.reports[-1].body)
        plan = job.plan
        events = job.events()
        handler = run.rec.handlers.get(job.id)
        start = job.time_of(S.REPORTING)
        if report.category == "worker_shutdown":
            if start is None or start < grace_end - EPS:
                out.append(
                    f"{job.id}: reported worker_shutdown at {start}, grace ends {grace_end:g}"
                )
            continue
        if E.FAIL in events:
            # A malformed job says so; after an init failure it may carry that instead.
            want = {"init_failed"} if failure_of(run) is not None else set()
            if plan.outcome == "malformed":
                want.add("json_error")
            if report.kind not in want:
                out.append(f"{job.id}: failed without running, reported {report}, wanted {want}")
            continue
        if handler is None or handler.interrupted:
            out.append(f"{job.id}: handler interrupted or never ran, reported {report}")
            continue
        want_kind, want_type = {
            "return": ("output", ""),
            "raise": ("json_error", error_type_of(plan.error)),
            "nonjson": ("json_error", "OutputNotSerializable"),
            "stream": ("output", ""),
            "stream_raise": ("plain_error", ""),
            "stream_nonjson": ("json_error", "OutputNotSerializable"),
            "stream_error_chunk": ("plain_error", ""),
        }[plan.outcome]
        if report.kind != want_kind or (want_type and not report.error_type.endswith(want_type)):
            out.append(f"{job.id}: {plan!r} reported {report}")
        if report.category == "timeout":
            out.append(f"{job.id}: a handler error categorised timeout")
    return out


def check_stream_chunks(run: Run) -> list[str]:
    """A stream that ended well lost no chunk silently: each chunk its generator yielded
    reached the platform or is named in the final report's ``undelivered_chunks``, and the
    platform got no chunk the generator did not yield (docs/protocol.md §2.4)."""
    out = []
    for job in views(run).values():
        plan = job.plan
        if job.final is not S.DONE or not job.reports or plan is None or plan.outcome != "stream":
            continue
        body = loads_or_none(job.reports[-1].body)
        if not isinstance(body, dict) or "error" in body:
            continue  # stopped, shut down, failed: check_results judges those
        chunks = run.platform.job(job.id).stream
        arrived = {c.get("chunk") for c in chunks if isinstance(c, dict) and c.get("k") == job.id}
        named = set(body.get("undelivered_chunks", []))
        yielded = set(range(plan.chunks))
        if len(arrived) != len(chunks) - _duplicates(chunks) or not arrived <= yielded:
            out.append(f"{job.id}: the platform got chunks not yielded: {chunks}")
        if yielded - arrived - named:
            out.append(
                f"{job.id}: chunks {sorted(yielded - arrived - named)} neither arrived nor "
                f"named (arrived {chunks}, report {body})"
            )
    return out


def _duplicates(chunks: list[Any]) -> int:
    """Chunks that arrived twice: a chunk whose answer was lost is sent again, so the
    platform may hold it twice (at least once, as without pipelining)."""
    keys = [json.dumps(c, sort_keys=True) for c in chunks]
    return len(keys) - len(set(keys))
