"""Every checker by name, and running them all on one `Run`.

The checkers are pure functions of the finished `Run`; each returns a list of
violations, so one failing example reports everything it broke. The mutation check
(``scripts/mutation_check.py``) proves each can fail. `describe` labels what an example
exercised, for ``pytest --hypothesis-show-statistics``.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING

from .checks_init import check_claim, check_gate, check_init_failure, check_timeouts
from .checks_jobs import (
    check_bounded_bodies,
    check_exactly_once,
    check_results,
    check_shielded_reports,
    check_stops,
    check_stream_chunks,
    check_transitions,
)
from .checks_worker import (
    check_capacity,
    check_connections,
    check_generators_closed,
    check_held_and_pings,
    check_in_transit,
    check_phases,
    check_platform,
    check_run_ended,
    check_shutdown,
    check_thread_slots,
)
from .scenario import PLAIN
from .views import E, failure_of, views

if TYPE_CHECKING:
    from .runner import Run


CHECKS: dict[str, Callable[[Run], list[str]]] = {
    "ended": check_run_ended,
    "platform": check_platform,
    "transitions": check_transitions,
    "I1": check_exactly_once,
    "I2": check_gate,
    "I3": check_init_failure,
    "claim": check_claim,
    "I4": check_timeouts,
    "I5": check_shielded_reports,
    "I6": check_bounded_bodies,
    "I7": check_capacity,
    "I8": check_in_transit,
    "pings": check_held_and_pings,
    "stops": check_stops,
    "results": check_results,
    "chunks": check_stream_chunks,
    "shutdown": check_shutdown,
    "connections": check_connections,
    "phases": check_phases,
    "threads": check_thread_slots,
    "closed": check_generators_closed,
}


def describe(run: Run) -> list[str]:
    """Coverage labels for ``hypothesis.event``: which paths an example exercised (see
    ``pytest --hypothesis-show-statistics``)."""
    rec = run.rec
    labels = [f"{run.scenario.async_backend} backend"]
    failure = failure_of(run)
    if failure is not None:
        held = sum(1 for t in rec.transitions if t.event is E.FAIL)
        labels.append(f"init failed ({'timeout' if failure.category == 'timeout' else 'raise'})")
        labels.append(f"init failure failed {min(held, 3)}{'+' if held > 3 else ''} job(s)")
    elif run.scenario.init.outcome != "none":
        labels.append("init succeeded" if rec.init_end is not None else "init cancelled/hung")
    finals = {job.final for job in views(run).values() if job.final is not None}
    labels += [f"a job ended {state.value}" for state in sorted(finals, key=lambda s: s.value)]
    states = {stop.state.value if stop.state else "unheld" for stop in rec.stops}
    labels += [f"stop reached a {state} job" for state in sorted(states)]
    if any(ex.outcome == "cancelled" for ex in rec.exchanges if ex.route.startswith("take")):
        labels.append("a take in flight was cut")
    if any(ex.net != PLAIN for ex in rec.exchanges):
        labels.append("network steps injected")
    if any(req.fault is not None for req in run.platform.requests):
        labels.append("platform faults hit")
    if any(len(t.held) > 1 for t in rec.transitions):
        labels.append("several jobs held at once")
    if run.scenario.threads:
        labels.append(f"sync code ({run.scenario.handler} handler)")
    if any(h.thread and h.end_seq < 0 for h in rec.handlers.values()):
        labels.append("a handler thread was abandoned")
    if rec.init_abandoned_end is not None or (run.scenario.init.sync and rec.init_interrupted):
        labels.append("a sync initializer was abandoned")
    if any(h.closed == "worker" for h in rec.handlers.values()):
        labels.append("a generator left at a yield was closed")
    plans = {f"j{k}": p for k, p in enumerate(run.scenario.jobs)}
    cut = [(h, plans[h.job_id]) for h in rec.handlers.values() if h.task and h.interrupted]
    if any(plan.cleanup for _, plan in cut) or (
        run.scenario.init.cleanup and rec.init_interrupted is not None
    ):
        labels.append("asyncio code awaited its cleanup once cancelled")
    if any(plan.ignores_cancel for _, plan in cut):
        labels.append("an asyncio handler swallowed its cancellation")
    # The chunks of one pipelined write are recorded together, at one seq.
    batches = [ex.seq for ex in rec.exchanges if ex.route == "stream"]
    if len(batches) != len(set(batches)):
        labels.append("stream chunks went out pipelined")
    return labels


def check_all(run: Run) -> None:
    """Run every checker; raise AssertionError listing every violation and the trace."""
    violations = [v for name, check in CHECKS.items() for v in check(run)]
    if violations:
        listing = "\n".join(f"- {v}" for v in violations[:40])
        raise AssertionError(f"{len(violations)} violation(s):\n{listing}\n\n{run.report()}")


def drop_frames(exc: BaseException) -> None:
    """Clear the locals of the finished frames *exc* (and its causes, contexts and group
    members) passed through, so the exception no longer keeps the example's run alive.

    Hypothesis keeps the exception of every failing example it runs (``expected_exception``
    of each cached result, up to 10,000 a test, until the test ends), and its traceback holds
    the frames of ``run_and_check`` and ``check_all``, whose ``run`` holds the whole
    `Recorder`, the fake platform's records and the worker's state: about 520 KiB an
    example. While a failure shrinks (thousands of failing examples) that was about 1 GiB.
    The traceback's text (file, line, code) is kept; only ``--showlocals`` loses anything.
    Frames still executing (the caller's) are skipped by ``traceback.clear_frames``.
    """
    seen: set[int] = set()
    stack: list[BaseException] = [exc]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        traceback.clear_frames(current.__traceback__)
        stack += [e for e in (current.__cause__, current.__context__) if e is not None]
        if isinstance(current, BaseExceptionGroup):
            stack += current.exceptions
