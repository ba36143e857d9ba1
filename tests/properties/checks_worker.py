"""The invariants of the worker as a whole: its end, capacity, takes, pings, shutdown.

Each checker is a pure function of the finished `Run` returning its violations (I7, I8,
§9 of docs/design.md, the ledger and pings, connections, the worker phase, thread slots
and generator cleanup).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from trio_worker._state import PHASE_TRANSITIONS, PhaseEvent, WorkerPhase

from .recorder import Exchange
from .runner import HANG_LIMIT
from .views import EPS, E, S, cut_limit, failure_of, held_model, views

if TYPE_CHECKING:
    from trio_worker.testing import RecordedRequest

    from .runner import Run


def check_run_ended(run: Run) -> list[str]:
    """serve() ends: returns after shutdown, raises InitializationError, or raises
    SystemExit iff a handler's SystemExit was reported (docs/design.md §9); never hangs,
    never raises anything else (WorkerInternalError: an illegal transition, a crash)."""
    rec = run.rec
    out = []
    if rec.hung:
        out.append(f"serve() did not return: hung until {HANG_LIMIT}s after the last action")
    exit_reported = any(ex.route == "done" and EXIT_REPORTED in ex.body for ex in rec.exchanges)
    if isinstance(rec.serve_outcome, SystemExit) != exit_reported:
        out.append(f"serve() ended with {rec.serve_outcome!r}, exit reported: {exit_reported}")
    elif not (
        rec.serve_outcome == "returned"
        or failure_of(run) is not None
        or isinstance(rec.serve_outcome, SystemExit)
    ):
        out.append(f"serve() ended with {rec.serve_outcome!r}")
    if rec.handle is not None and rec.handle.held_ids:
        out.append(f"serve() ended still holding {rec.handle.held_ids}")
    return out


# What every report of a handler's SystemExit says (inside the escaped error text too).
EXIT_REPORTED = b"handler called sys.exit("


def check_platform(run: Run) -> list[str]:
    """The fake platform itself never crashed while serving the worker."""
    return [
        f"platform crashed at t={at:g} on {path}: {exc!r}" for at, path, exc in run.rec.app_errors
    ]


def check_capacity(run: Run) -> list[str]:
    """I7: held + requested batch <= concurrency at every take; held <= the concurrency in
    force (that of the latest take) at every transition."""
    out = []
    events: list[tuple[int, int, str]] = []
    for ex in run.rec.exchanges:
        if ex.route in ("take", "take_batch"):
            if ex.batch < 1 or len(ex.held) + ex.batch > ex.concurrency:
                out.append(
                    f"I7: take of {ex.batch} sent at {ex.time:g} holding {len(ex.held)} "
                    f"with concurrency {ex.concurrency}"
                )
            events.append((ex.seq, ex.concurrency, "take"))
    for t in run.rec.transitions:
        events.append((t.seq, len(t.held), t.job_id))
    events.sort()
    limit = 0
    for _, value, what in events:
        if what == "take":
            limit = value
        elif value > limit:
            out.append(f"I7: {value} jobs held (at a transition of {what}), concurrency {limit}")
    return out


def check_in_transit(run: Run) -> list[str]:
    """I8: a take in flight is abandoned only by its own deadline; every job a delivered
    take carried reaches a terminal state; every job the platform handed out was
    delivered, or went out in a take the platform faulted or the worker legitimately cut."""
    out = []
    rec = run.rec
    cuts: list[Exchange] = []
    faulted: list[RecordedRequest] = []
    for ex in rec.exchanges:
        if ex.route not in ("take", "take_batch"):
            continue
        if ex.outcome == "cancelled":
            limit = cut_limit(run, ex)
            if ex.end_time < limit - EPS:
                out.append(
                    f"I8: take #{ex.index} sent at {ex.time:g} abandoned at {ex.end_time:g}, "
                    f"before its deadline {limit:g}"
                )
            cuts.append(ex)
    # Takes the platform answered only after the worker had legitimately cut them (an
    # injected delay before the route): the answer went into a closed connection, a loss
    # in transit on the platform's side that its requeue rule covers, as a cut's is.
    late: list[float] = []
    for req in run.platform.requests:
        if req.route in ("take", "take_batch") and req.fault is not None:
            if req.fault.when == "after" and (req.fault.drop or req.fault.status is not None):
                faulted.append(req)
            answered = req.time + req.fault.delay
            if req.fault.when == "before" and any(
                abs(ex.time - req.time) <= EPS and ex.end_time < answered - EPS for ex in cuts
            ):
                late.append(answered)
    jobs = views(run)
    for job in jobs.values():
        if job.delivered and (job.final is None or not job.final.terminal):
            out.append(f"I8 {job.id}: delivered by a take, then dropped ({job.final})")
    for record in run.platform.jobs.values():
        # Handed out and still held by the worker as far as the platform knows (a handout
        # whose answer never left the platform was put back in the queue: not a loss).
        if record.status != "IN_PROGRESS" or record.taken_by != "w1" or record.take_time is None:
            continue
        view = jobs.get(record.id)
        if view is not None and view.delivered:
            continue
        take_time = record.take_time
        explained = (
            any(ex.time - EPS <= take_time <= ex.end_time + EPS for ex in cuts)
            or any(
                req.time - EPS <= take_time <= (req.answer_time or math.inf) + EPS
                for req in faulted
            )
            or any(abs(take_time - answered) <= EPS for answered in late)
        )
        if not explained:
            out.append(f"I8 {record.id}: handed out at {take_time:g}, never reached the worker")
    return out


def check_held_and_pings(run: Run) -> list[str]:
    """The ledger holds exactly the jobs delivered and not yet settled, at every transition;
    every ping lists exactly those ids at the instant it is sent."""
    held = held_model(run)
    out = []
    for t in run.rec.transitions:
        expected = held(t.seq)
        if set(t.held) != expected or len(t.held) != len(set(t.held)):
            out.append(
                f"held ids at t={t.time:g} ({t.job_id} {t.event.value}): worker "
                f"{sorted(t.held)}, delivered and unsettled {sorted(expected)}"
            )
    for ex in run.rec.exchanges:
        if ex.route != "ping" or ex.ping_ids is None:
            continue
        expected = held(ex.seq)
        if set(ex.ping_ids) != expected or len(ex.ping_ids) != len(set(ex.ping_ids)):
            out.append(f"ping at t={ex.time:g} listed {list(ex.ping_ids)}, held {sorted(expected)}")
    return out


def check_shutdown(run: Run) -> list[str]:
    """§9: after SIGTERM serve() returns within shutdown_grace + report_deadline; only jobs
    never started are released, and only after a shutdown request with the gate closed (or
    while waiting for a handler slot)."""
    rec = run.rec
    scn = run.scenario
    out = []
    if rec.sigterm is not None and failure_of(run) is None:
        bound = rec.sigterm[1] + scn.timings.shutdown_grace + scn.timings.report_deadline
        if rec.serve_end > bound + EPS:
            out.append(f"§9: serve() returned at {rec.serve_end:g}, bound {bound:g}")
    # The gate is the worker's: it opens when the worker has seen the initializer return.
    # On trio that is the same step; on the asyncio backend the initializer's task ends on
    # the loop first, and a SIGTERM in between may still find the gate closed (the
    # `phases` checker holds the gate to opening only after the return). A release is
    # decided when it is requested (design §9): one requested while the gate was closed
    # stands, even when the initializer returns before the job's task has unwound.
    opened = next((c for c in rec.phases if c.event is PhaseEvent.INIT_OK), None)
    for job in views(run).values():
        if job.final is not S.RELEASED:
            continue
        release = job.transitions[-1]
        if rec.sigterm is None or release.seq < rec.sigterm[0]:
            out.append(f"§9 {job.id}: released without a shutdown request")
        # A job waiting for a handler slot (§4 I7) is released like one at the gate.
        waited = any(t.after is S.WAITING_FOR_SLOT for t in job.transitions)
        decided = next((t for t in job.transitions if t.after is S.RELEASING), release)
        if opened is not None and opened.seq < decided.seq and not waited:
            out.append(f"§9 {job.id}: released although the gate opened at {opened.time:g}")
        if job.id in rec.handlers:
            out.append(f"§9 {job.id}: released after its handler started")
    return out


def check_connections(run: Run) -> list[str]:
    """The worker's HTTP client closed every connection it opened by the time ``serve``
    returned: a cancelled or failed request closes its own, the pool the idle ones."""
    left = [c for c in run.rec.connections if not c.closed]
    if not left:
        return []
    return [f"{len(left)} of {len(run.rec.connections)} connections left open by the client"]


def check_phases(run: Run) -> list[str]:
    """The worker phase replays against PHASE_TRANSITIONS and agrees with what happened:
    the gate opens only after the initializer returned, INIT_FAILED iff serve() raised it,
    DRAINING at the SIGTERM; a job starts only behind an open gate, is released only while
    draining, and is failed without running only after the init failure (or as malformed)."""
    rec = run.rec
    out = []
    phase = WorkerPhase.INITIALIZING
    for change in rec.phases:
        if change.before is not phase or PHASE_TRANSITIONS.get((phase, change.event)) is not (
            change.after
        ):
            out.append(f"phase: illegal {change.before} --{change.event}--> {change.after}")
        phase = change.after
    if (phase is WorkerPhase.INIT_FAILED) != (failure_of(run) is not None):
        out.append(f"phase: ended {phase}, serve: {rec.serve_outcome!r}")
    opened = next((c for c in rec.phases if c.event is PhaseEvent.INIT_OK), None)
    if opened is not None and run.scenario.init.outcome != "none":
        if rec.init_end is None or opened.seq < rec.init_end[0]:
            out.append(f"phase: gate opened at {opened.time:g}, init returned {rec.init_end}")
    drains = [c for c in rec.phases if c.event is PhaseEvent.DRAIN]
    if (rec.sigterm is None) != (not drains) or len(drains) > 1:
        out.append(f"phase: drained {len(drains)} time(s), SIGTERM {rec.sigterm}")

    def phase_at(seq: int) -> tuple[WorkerPhase, bool]:
        before = [c for c in rec.phases if c.seq < seq]
        gate = any(c.event is PhaseEvent.INIT_OK for c in before)
        return (before[-1].after if before else WorkerPhase.INITIALIZING), gate

    for t in rec.transitions:
        now, gate = phase_at(t.seq)
        failed_early = t.event is E.FAIL and t.before is not S.MALFORMED
        bad = (
            (t.event is E.START and not gate)
            or (t.event in (E.RELEASE, E.REQUEST_RELEASE) and now is not WorkerPhase.DRAINING)
            or (failed_early and now is not WorkerPhase.INIT_FAILED)
        )
        if bad:
            out.append(f"phase: {t.job_id} {t.event.value} at {t.time:g} in {now}, gate {gate}")
    return out


def check_thread_slots(run: Run) -> list[str]:
    """§9 for code outside trio: a stopped job keeps its slot until its thread (or, on the
    asyncio backend, its asyncio task) returns, so at every handler start the handlers
    still running fit the concurrency in force; serve() never returns while a handler
    thread or task runs, unless the end of the shutdown grace abandoned it."""
    rec = run.rec
    out = []
    events: list[tuple[int, str, int]] = []
    for ex in rec.exchanges:
        if ex.route in ("take", "take_batch"):
            events.append((ex.seq, "take", ex.concurrency))
    for h in rec.handlers.values():
        events.append((h.start_seq, "start", 0))
        if h.end_seq >= 0:
            events.append((h.end_seq, "end", 0))
    events.sort()
    limit, live = 0, 0
    for seq, what, value in events:
        if what == "take":
            limit = value
        elif what == "end":
            live -= 1
        else:
            live += 1
            if live > limit:
                running = [h.job_id for h in rec.handlers.values() if h.start_seq <= seq]
                out.append(
                    f"threads: {live} handlers running at [{seq}], concurrency {limit}: {running}"
                )
    grace_end = math.inf
    if rec.sigterm is not None:
        grace_end = rec.sigterm[1] + run.scenario.timings.shutdown_grace
    for h in rec.handlers.values():
        if (h.thread or h.task) and h.end_seq < 0 and rec.serve_end < grace_end - EPS:
            where = "thread" if h.thread else "asyncio task"
            out.append(
                f"threads {h.job_id}: serve() returned at {rec.serve_end:g} with its handler "
                f"{where} running, before the shutdown grace ended ({grace_end:g})"
            )
    return out


def check_generators_closed(run: Run) -> list[str]:
    """A generator the worker stopped consuming at a yield (an error or non-JSON chunk, a
    stop, the shutdown grace) is closed by the worker, its cleanup run to the end: in a
    worker thread for a sync generator, never left to the garbage collector."""
    rec = run.rec
    grace_end = math.inf
    if rec.sigterm is not None:
        grace_end = rec.sigterm[1] + run.scenario.timings.shutdown_grace
    out = []
    for h in rec.handlers.values():
        if h.yielded_at >= grace_end - EPS:
            # A step still running in its thread at the end of the grace was abandoned; a
            # running generator cannot be closed, it yields into the void.
            continue
        if h.at_yield:
            out.append(f"generator {h.job_id}: left suspended at a yield, never closed")
        elif h.closed not in ("", "worker"):
            out.append(f"generator {h.job_id}: closed by {h.closed!r}, not by the worker")
    return out
