"""The bugs the mutation check plants (``scripts/mutation_check.py``), and how they are planted.

Each `Mutation` is one bug: exact string replacements (`Patch`) in a copy of
``trio_worker``, each anchor found exactly once or the check stops. Besides the named ones
below, `shield_mutations` makes one per ``shield=True`` in the package, found by scanning
the source. ``tests/test_mutation_anchors.py`` applies every one of them to today's source
in CI, so an anchor that goes stale fails there.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SUITE = "tests/test_properties.py"
# Where the property suite cannot make a shield's work observable, the tests that do run
# first (pytest paths, space-separated), by "<file>" or "<file>:<function>". None now: the
# suite draws the asyncio backend (its shields in _backends/_asyncio.py and
# _backends/_handler_calls.py are caught by properties, docs/property-suite.md), and
# test_stopped_code_keeps_its_slot stops
# running streams often enough to see a generator's close lose its shield.
STREAM_CLEANUP = (
    "tests/test_supervisor.py::test_a_stream_stopped_at_a_yield_runs_its_whole_cleanup_before_its_slot_is_free"
    " tests/test_asyncio_backend.py::"
    "test_a_stopped_stream_finishes_its_cleanup_before_its_slot_is_given_again"
)
SUITES_BY_FILE: dict[str, str] = {
    # The GPU checks' children run before the worker exists: the property suite never
    # reaches them, their own reaping tests do.
    "_fitness/_gpu.py": "tests/test_fitness_gpu_reap.py",
    # A stopped stream's cleanup, shielded: the unit tests that stop a stream at a yield
    # see it on both backends at once; the property suite reaches it only by chance.
    "_backends/_handler_calls.py:_chunks": f"{STREAM_CLEANUP} {SUITE}",
    # What a user's check left running is ended even when the checks are cancelled.
    "_fitness/_registry.py": (
        "tests/test_fitness_hostile.py::test_a_check_cancelled_from_outside_still_has_its_processes_ended"
    ),
}


@dataclasses.dataclass(frozen=True)
class Patch:
    """Replace *old* (which must occur exactly once) by *new* in *path*.

    With *line*, only that line (1-based) is searched: for a string that occurs in many
    places, such as ``shield=True``, the one occurrence meant.
    """

    path: str
    old: str
    new: str
    line: int | None = None


@dataclasses.dataclass(frozen=True)
class Mutation:
    name: str
    bug: str
    patches: tuple[Patch, ...]
    required: bool = True  # one of the six bugs the suite must catch (else: an extra probe)
    # The tests that must catch it: the property suite, except where it cannot reach the
    # code (the asyncio backend runs on a real loop, outside the suite's virtual time; see
    # docs/property-suite.md), where that code's own behaviour tests stand in.
    suite: str = SUITE


MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "report-shield-removed",
        "_delivery.py deliver: the report's CancelScope(shield=True) loses its shield",
        (
            Patch(
                "trio_worker/_delivery.py",
                "with trio.CancelScope(shield=True, deadline=deadline) as scope:",
                "with trio.CancelScope(deadline=deadline) as scope:",
            ),
        ),
    ),
    Mutation(
        "gate-opened-early",
        "_supervisor.py _init_task: the gate is opened before the initializer runs",
        (
            Patch(
                "trio_worker/_supervisor.py",
                "        with self.scopes.open_scope(when_stopping):\n"
                "            failure = await run_initializer(",
                "        with self.scopes.open_scope(when_stopping):\n"
                "            self._open_gate()\n"
                "            failure = await run_initializer(",
            ),
        ),
    ),
    Mutation(
        "report-posted-twice",
        "_platform/_client.py post: after a 2xx answer the report is posted once more",
        (
            Patch(
                "trio_worker/_platform/_client.py",
                "                if 200 <= status < 300:\n"
                "                    outcome.delivered, outcome.last_error = True, None",
                "                if 200 <= status < 300:\n"
                '                    await self._reports.exchange("POST", requests)\n'
                "                    outcome.delivered, outcome.last_error = True, None",
            ),
        ),
    ),
    Mutation(
        "take-unshielded",
        "_supervisor.py _take_once: the take runs with shield=False (cancelled on init failure)",
        (
            Patch(
                "trio_worker/_supervisor.py",
                "with trio.CancelScope(shield=True, deadline=deadline) as scope:",
                "with trio.CancelScope(shield=False, deadline=deadline) as scope:",
            ),
        ),
    ),
    Mutation(
        "take-cut-now",
        "_state.py WorkerState.drain: the take's deadline is set to now, not shortened",
        (
            Patch(
                "trio_worker/_state.py",
                "self.take_end = min(self.take_end, now + min(timings.take_drain, "
                "timings.shutdown_grace))",
                "self.take_end = now",
            ),
        ),
    ),
    Mutation(
        "stopped-job-reported",
        "_job.py _prepare: a stopped running job is reported instead of STOP",
        (
            Patch(
                "trio_worker/_job.py",
                "if not is_cancellation(exc) or self._outcome(job) is not Outcome.REPORT_SHUTDOWN:",
                "if not is_cancellation(exc) or self._outcome(job) is Outcome.PROPAGATE:",
            ),
        ),
    ),
    Mutation(
        "capacity-off-by-one",
        "_supervisor.py _take_task: free = capacity - held + 1",
        (
            Patch(
                "trio_worker/_supervisor.py",
                "free = self.capacity.evaluate() - len(self.ledger)",
                "free = self.capacity.evaluate() - len(self.ledger) + 1",
            ),
        ),
    ),
    # Extra probes: one per remaining checker, to show each can fail.
    Mutation(
        "user-timeout-is-sdk-timeout",
        "_initializer.py run_initializer: a user TimeoutError/TooSlowError counts as InitTimeout",
        (
            Patch(
                "trio_worker/_initializer.py",
                "    if scope.cancelled_caught:\n        assert init_timeout is not None\n",
                "    if scope.cancelled_caught or isinstance(\n"
                "        error, (TimeoutError, trio.TooSlowError)\n"
                "    ):\n        init_timeout = init_timeout or 0.0\n",
            ),
        ),
        required=False,
    ),
    Mutation(
        "report-not-retried",
        "_delivery.py Delivery.post: one attempt only, whatever the budget allows",
        (
            Patch(
                "trio_worker/_delivery.py",
                "if outcome.delivered or (status is not None and not is_retryable(status)):",
                "if True:",
            ),
        ),
        required=False,
    ),
    Mutation(
        "error-body-unbounded",
        "_fitting.py: error bodies may grow to 256 KiB",
        (
            Patch(
                "trio_worker/_fitting.py",
                "MAX_ERROR_BODY_BYTES = 64 * 1024",
                "MAX_ERROR_BODY_BYTES = 256 * 1024",
            ),
        ),
        required=False,
    ),
    Mutation(
        "released-job-still-held",
        "_state.py Ledger.fire: a RELEASED job stays in the ledger (and in pings)",
        (
            Patch(
                "trio_worker/_state.py",
                "        if state.terminal:\n            with self._lock:",
                "        if state.terminal and state is not JobState.RELEASED:\n"
                "            with self._lock:",
            ),
        ),
        required=False,
    ),
    Mutation(
        "claim-grace-tripled",
        "_state.py WorkerState.fail_init: the take in flight gets 3 x claim_grace",
        (
            Patch(
                "trio_worker/_state.py",
                "self.take_end = min(failed_at + self.timings.claim_grace, self.grace_end)",
                "self.take_end = min(failed_at + 3 * self.timings.claim_grace, self.grace_end)",
            ),
        ),
        required=False,
    ),
    Mutation(
        "failed-request-leaks-connection",
        "_platform/_http.py HttpPool._exchange: a failed or cancelled request (or pipelined "
        "round) leaves its connection open",
        (
            Patch(
                "trio_worker/_platform/_http.py",
                "            except BaseException:\n"
                "                self._servers.note(connection, answered=False)\n"
                "                await connection.aclose()\n"
                "                raise",
                "            except BaseException:\n"
                "                self._servers.note(connection, answered=False)\n"
                "                raise",
            ),
        ),
        required=False,
    ),
    Mutation(
        "abandoned-round-runs-on",
        "_chunk_convoy.py ChunkConvoy._abandon: a round of stream chunks nobody waits for any "
        "more is not cancelled (it holds the jobs' nursery open past a shutdown)",
        (
            Patch(
                "trio_worker/_chunk_convoy.py",
                "            self._round_scope.cancel()\n",
                "            pass\n",
            ),
        ),
        required=False,
        # Since a calm stream has no task of its own (docs/protocol.md §2.4), the suite's
        # shutdowns no longer end with a round nobody waits for; the convoy's own test of
        # that round does (test_a_round_nobody_waits_for_any_more_ends_at_once).
        suite="tests/test_chunk_convoy.py::test_a_round_nobody_waits_for_any_more_ends_at_once",
    ),
    Mutation(
        "stopped-reader-takes-chunks",
        "_backends/_asyncio.py AsyncioChunks._offered: the pump hands a chunk off although the "
        "trio reader's wait was cancelled (a stopped stream's chunk is posted)",
        (
            Patch(
                "trio_worker/_backends/_asyncio.py",
                "            and reader.statistics().tasks_waiting > 0\n",
                "            and True\n",
            ),
        ),
        required=False,
        # The window (between the reader's cancellation and the pump's) is one step of the
        # asyncio loop, which the suite's stops do not aim at; the hand-off's own test does.
        suite="tests/test_backends_asyncio_chunks.py::"
        "test_a_chunk_yielded_after_its_reader_was_cancelled_is_not_handed_off",
    ),
    Mutation(
        "shutdown-waits-on-take",
        "_state.py WorkerState.drain: the take in flight is not shortened",
        (
            Patch(
                "trio_worker/_state.py",
                "        self.take_end = min(self.take_end, now + min(timings.take_drain, "
                "timings.shutdown_grace))\n",
                "",
            ),
        ),
        required=False,
    ),
    # The shields of sync code (threads) and of generator cleanup: caught only because the
    # suite draws sync handlers, sync generators and generators left at a yield.
    Mutation(
        "thread-wait-unshielded",
        "_handler_calls.py run_in_thread: a cancelled job stops waiting for its thread at once",
        (
            Patch(
                "trio_worker/_backends/_handler_calls.py",
                "        if call.ended is not None:\n            await waits.hold(call.ended)\n",
                "",
            ),
        ),
        required=False,
    ),
    Mutation(
        "async-close-unshielded",
        "_handler_calls.py Stream: an async generator's aclose() runs unshielded when cancelled",
        (
            Patch(
                "trio_worker/_backends/_handler_calls.py",
                "with trio.CancelScope(shield=True):\n                        await aclose()",
                "with trio.CancelScope():\n                        await aclose()",
            ),
        ),
        suite=f"{STREAM_CLEANUP} {SUITE}",
        required=False,
    ),
    Mutation(
        "sync-close-unshielded",
        "_handler_calls.py Stream: a sync generator's close() thread is not started when cancelled",
        (
            Patch(
                "trio_worker/_backends/_handler_calls.py",
                "with self._waits.shielded(self._close_bound):",
                "with trio.move_on_after(self._close_bound):",
            ),
        ),
        required=False,
    ),
)


_DEF = re.compile(r"^\s*(?:async\s+)?def\s+(\w+)", re.MULTILINE)


def shield_mutations(root: Path = REPO) -> tuple[Mutation, ...]:
    """One mutation per ``shield=True`` in the package: that one becomes ``shield=False``.

    Every cancellation shield must be load-bearing: removing any one of them must make the
    property suite fail (otherwise the shield goes). Found by scanning the source, so a new
    shield is checked without editing this script; named ``shield:<file>:<line>:<function>``.
    """
    found = []
    for path in sorted((root / "trio_worker").rglob("*.py")):
        text = path.read_text()
        relative = path.relative_to(root).as_posix()
        for match in re.finditer(r"\bshield=True\b", text):
            line = text.count("\n", 0, match.start()) + 1
            functions = [m.group(1) for m in _DEF.finditer(text, 0, match.start())]
            function = functions[-1] if functions else "<module>"
            short = relative.removeprefix("trio_worker/")
            found.append(
                Mutation(
                    f"shield:{short}:{line}:{function}",
                    f"{short} {function}: the shield=True at line {line} becomes shield=False",
                    (Patch(relative, "shield=True", "shield=False", line=line),),
                    suite=SUITES_BY_FILE.get(
                        f"{short}:{function}", SUITES_BY_FILE.get(short, SUITE)
                    ),
                )
            )
    return tuple(found)


def all_mutations() -> tuple[Mutation, ...]:
    return MUTATIONS + shield_mutations()


def apply(root: Path, patches: tuple[Patch, ...]) -> None:
    """Apply *patches* under *root*; raise SystemExit(2) if an anchor is not found once."""
    for patch in patches:
        target = root / patch.path
        text = target.read_text()
        start, end = 0, len(text)
        if patch.line is not None:
            lines = text.splitlines(keepends=True)
            start = sum(len(line) for line in lines[: patch.line - 1])
            end = start + (len(lines[patch.line - 1]) if patch.line <= len(lines) else 0)
        count = text.count(patch.old, start, end)
        if count != 1:
            where = patch.path if patch.line is None else f"{patch.path}:{patch.line}"
            raise SystemExit(
                f"mutation anchor found {count} times (need exactly 1) in {where}:\n"
                f"{patch.old}\n-- the source changed: update scripts/mutation_check.py"
            )
        at = text.index(patch.old, start, end)
        target.write_text(text[:at] + patch.new + text[at + len(patch.old) :])
