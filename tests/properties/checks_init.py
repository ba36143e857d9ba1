"""The invariants of the initializer: the gate, its failure, the claim take, timeouts.

Each checker is a pure function of the finished `Run` returning its violations (I2, I3,
§6.2 and I4 of docs/design.md); `expected_init` says, from the drawn plan alone, when the
initializer must fail.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .scenario import TIMEOUT_LOOKALIKES
from .usercode import error_type_of
from .views import EPS, E, S, failure_of, parse_report, views

if TYPE_CHECKING:
    from .runner import Run


@dataclass(frozen=True)
class InitExpectation:
    """When (if ever) the initializer fails, by the drawn plan; ``either`` on ties."""

    fails_at: float | None  # None: never fails
    timeout: bool
    either: bool  # a tie: success/other outcome is also allowed
    # A tie on the asyncio backend between init_timeout and an initializer with a cleanup:
    # if the initializer had returned already, nothing is left to wait for.
    or_at: float | None = None


# How long the worker waits for a cancelled asyncio initializer (await_on_asyncio's
# cancel_bound in trio_worker/_backends/_asyncio.py) before giving up on it.
ASYNCIO_INIT_CANCEL_BOUND = 5.0


def expected_init(run: Run) -> InitExpectation:
    plan = run.scenario.init
    sigterm = run.rec.sigterm[1] if run.rec.sigterm is not None else None
    if plan.outcome == "none":
        return InitExpectation(None, False, False)
    limit = plan.timeout
    end = math.inf if plan.outcome == "hang" else plan.duration
    # An asyncio initializer cut by init_timeout: the failure comes once its cleanup is over.
    cleanup = min(plan.cleanup, ASYNCIO_INIT_CANCEL_BOUND)
    or_at = None
    if limit is not None and limit == 0:
        fails_at, timeout, tie = 0.0, True, False  # cut before it is even called
    elif limit is not None and limit < end:
        fails_at, timeout, tie = limit + cleanup, True, False
    elif limit is not None and limit == end:
        fails_at, timeout, tie = limit + cleanup, True, True
        or_at = limit if cleanup else None
    elif plan.outcome == "raise":
        fails_at, timeout, tie = end, False, False
    else:
        return InitExpectation(None, False, False)
    if sigterm is not None and sigterm <= fails_at:
        # SIGTERM cancels the initializer: not a failure (a tie may go either way).
        tied = sigterm == fails_at or (or_at is not None and sigterm >= or_at)
        return InitExpectation(None, False, tied)
    return InitExpectation(fails_at, timeout, tie, or_at)


def check_gate(run: Run) -> list[str]:
    """I2: no handler starts before the initializer returned successfully, none after an
    init failure (or while it hangs)."""
    rec = run.rec
    if run.scenario.init.outcome == "none":
        return []
    out = []
    for job_id, handler in rec.handlers.items():
        if rec.init_end is None:
            out.append(
                f"I2 {job_id}: handler started at {handler.start_time:g}, init never succeeded"
            )
        elif handler.start_seq < rec.init_end[0]:
            out.append(
                f"I2 {job_id}: handler started at {handler.start_time:g}, before init "
                f"returned at {rec.init_end[1]:g}"
            )
    return out


def check_init_failure(run: Run) -> list[str]:
    """I3: on init failure every held job (running intake included) is failed with it, and
    serve() raises InitializationError within report_deadline + claim_grace."""
    rec = run.rec
    expect = expected_init(run)
    failure = failure_of(run)
    timings = run.scenario.timings
    out = []
    if failure is None:
        if expect.fails_at is not None and not expect.either:
            out.append(f"I3: init should fail at {expect.fails_at:g}; serve: {rec.serve_outcome!r}")
        for job in views(run).values():
            for ex in job.reports:
                if parse_report(ex.body).kind == "init_failed":
                    out.append(f"I3 {job.id}: init_failed reported with no init failure")
        return out
    if expect.fails_at is None and not expect.either:
        out.append(f"I3: init failed ({failure.error_type}) but the plan says it cannot")
    elif expect.fails_at is not None and all(
        abs(failure.failed_at - at) > EPS
        for at in (expect.fails_at, expect.or_at)
        if at is not None
    ):
        out.append(f"I3: init failed at {failure.failed_at:g}, expected {expect.fails_at:g}")
    bound = failure.failed_at + timings.report_deadline + timings.claim_grace
    if rec.serve_end > bound + EPS:
        out.append(
            f"I3: serve() raised at {rec.serve_end:g}, after failure at {failure.failed_at:g} "
            f"+ report_deadline + claim_grace = {bound:g}"
        )
    stopped = {s.job_id for s in rec.stops}
    for job in views(run).values():
        if not job.delivered or (job.plan is not None and job.plan.outcome == "malformed"):
            continue
        fails = [t for t in job.transitions if t.event is E.FAIL]
        held_then = job.delivered[0].end_time <= failure.failed_at + EPS
        if fails and held_then and fails[0].time > failure.failed_at + 1.0 + EPS:
            out.append(f"§6.4 {job.id}: held at the failure, failed only at {fails[0].time:g}")
        final = job.final
        if final is S.STOPPED and job.id in stopped:
            continue
        if E.FAIL not in job.events():
            out.append(f"I3 {job.id}: held at init failure but not failed: {job.events()}")
        for ex in job.reports:
            if parse_report(ex.body).kind != "init_failed":
                out.append(f"I3 {job.id}: reported {parse_report(ex.body)} instead of init_failed")
        if final not in (S.DONE, S.UNDELIVERED):
            out.append(f"I3 {job.id}: ended {final} after the init failure")
    return out


def check_claim(run: Run) -> list[str]:
    """§6.2: after an init failure no new take starts, except one claim take when no job was
    ever delivered, bounded by claim_grace (its cut is checked by I8)."""
    failure = failure_of(run)
    if failure is None:
        return []
    takes = [ex for ex in run.rec.exchanges if ex.route in ("take", "take_batch")]
    after = [ex for ex in takes if ex.time > failure.failed_at + EPS]
    delivered_before = any(ex.delivered_ids and ex.end_time <= failure.failed_at for ex in takes)
    out = []
    if len(after) > 1:
        out.append(f"§6.2: {len(after)} takes started after the init failure: {after}")
    if after and delivered_before:
        out.append(f"§6.2: a claim take although jobs had been held: {after}")
    for ex in after:
        if ex.batch != 1:
            out.append(f"§6.2: the claim take asked for {ex.batch} jobs")
    return out


def check_timeouts(run: Run) -> list[str]:
    """I4: only the SDK's own deadline yields InitTimeout / category "timeout"; a user
    TimeoutError, TooSlowError, asyncio/socket timeout keeps its own type."""
    out = []
    expect = expected_init(run)
    failure = failure_of(run)
    plan = run.scenario.init
    if failure is not None:
        sdk = failure.error_type == "InitTimeout"
        if sdk != (failure.category == "timeout"):
            out.append(f"I4: error_type {failure.error_type} with category {failure.category}")
        if not expect.either and sdk != expect.timeout:
            out.append(f"I4: expected timeout={expect.timeout}, got {failure.error_type}")
        if not sdk and failure.error_type != error_type_of(plan.error):
            out.append(f"I4: user {plan.error} recorded as {failure.error_type}")
        if not sdk and plan.error in TIMEOUT_LOOKALIKES and failure.category == "timeout":
            out.append(f"I4: user {plan.error} categorised as the SDK timeout")
        for job in views(run).values():
            for ex in job.reports:
                report = parse_report(ex.body)
                if report.kind == "init_failed" and (
                    report.error_type != failure.error_type or report.category != failure.category
                ):
                    out.append(f"I4 {job.id}: init_failed body says {report}, serve says {failure}")
    for job in views(run).values():
        for ex in job.reports:
            report = parse_report(ex.body)
            if report.kind == "json_error" and report.category == "timeout":
                out.append(f"I4 {job.id}: a job error categorised as the SDK timeout: {report}")
    return out
