"""Proof that the property suite has teeth: plant one bug at a time, see the suite fail.

For each mutation below this script copies the repository to a scratch directory
(``tempfile``), applies ONE source patch to the scratch copy of ``trio_worker`` (exact string
replacements: an anchor that is not found exactly once fails loudly), runs

    python -m pytest tests/test_properties.py -p no:cacheprovider -x -q

in the scratch directory with ``PYTHONPATH`` pointing at it, and records whether the suite
caught the bug. The repository is installed editable, so the suite is told where the copy
is (``TRIO_WORKER_EXPECT_ROOT``) and refuses to run against any other ``trio_worker``. An
unmutated baseline runs first and must pass, so a "caught" is never a broken setup.

Usage::

    python scripts/mutation_check.py                 # all mutations, then the table
    python scripts/mutation_check.py --only capacity-off-by-one
    python scripts/mutation_check.py --list --shields # one per shield=True in the package
    python scripts/mutation_check.py --only shield:_platform/_http.py:203:request
    python scripts/mutation_check.py --jobs 2        # run two pytest processes at once
    python scripts/mutation_check.py --markdown      # the table as Markdown

Exit status: 0 when every mutation was caught, 1 otherwise, 2 on a setup error.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SUITE = "tests/test_properties.py"
# Where the property suite cannot make a shield's work observable, the tests that do run
# first (pytest paths, space-separated), by "<file>" or "<file>:<function>". None now: the
# suite draws the asyncio backend (its shields in _asyncio_host.py and _handlers.py are
# caught by properties, docs/property-suite.md), and test_stopped_code_keeps_its_slot stops
# running streams often enough to see a generator's close lose its shield.
SUITES_BY_FILE: dict[str, str] = {}
IGNORE = shutil.ignore_patterns(
    ".git",
    ".venv",
    ".tox",
    "__pycache__",
    ".hypothesis",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    "*.egg-info",
)


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
                "with trio.CancelScope(shield=True, deadline=self._deadline(started)) as scope:",
                "with trio.CancelScope(deadline=self._deadline(started)) as scope:",
            ),
        ),
    ),
    Mutation(
        "gate-opened-early",
        "_supervisor.py _init_task: the gate is set before the initializer runs",
        (
            Patch(
                "trio_worker/_supervisor.py",
                "        with self._init_scope:\n            failure = await run_initializer(",
                "        with self._init_scope:\n"
                "            self.gate.set()\n"
                "            failure = await run_initializer(",
            ),
        ),
    ),
    Mutation(
        "report-posted-twice",
        "_platform/_client.py _attempt: after a 2xx answer the report is posted once more",
        (
            Patch(
                "trio_worker/_platform/_client.py",
                "        if 200 <= status < 300:\n"
                "            outcome.delivered, outcome.last_error = True, None",
                "        if 200 <= status < 300:\n"
                '            await self._reports.request("POST", url, body)\n'
                "            outcome.delivered, outcome.last_error = True, None",
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
        "_supervisor.py _shorten_take: the take's deadline is set to now, not shortened",
        (
            Patch(
                "trio_worker/_supervisor.py",
                "self._take_scope.deadline = min(self._take_scope.deadline, deadline)",
                "self._take_scope.deadline = trio.current_time()",
            ),
        ),
    ),
    Mutation(
        "stopped-job-reported",
        "_driver.py _prepare: a stopped running job is reported instead of STOP",
        (
            Patch(
                "trio_worker/_driver.py",
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
        "_platform/_client.py post_report: one attempt only, whatever the budget allows",
        (
            Patch(
                "trio_worker/_platform/_client.py",
                "if outcome.delivered or (status is not None and not is_retryable(status)):",
                "if True:",
            ),
        ),
        required=False,
    ),
    Mutation(
        "error-body-unbounded",
        "_errors.py: error bodies may grow to 256 KiB",
        (
            Patch(
                "trio_worker/_errors.py",
                "MAX_ERROR_BODY_BYTES = 64 * 1024",
                "MAX_ERROR_BODY_BYTES = 256 * 1024",
            ),
        ),
        required=False,
    ),
    Mutation(
        "released-job-still-held",
        "_lifecycle.py Ledger.fire: a RELEASED job stays in the ledger (and in pings)",
        (
            Patch(
                "trio_worker/_lifecycle.py",
                "        if state.terminal:\n            with self._lock:",
                "        if state.terminal and state is not JobState.RELEASED:\n"
                "            with self._lock:",
            ),
        ),
        required=False,
    ),
    Mutation(
        "claim-grace-tripled",
        "_supervisor.py _fail_init: the take in flight gets 3 x claim_grace",
        (
            Patch(
                "trio_worker/_supervisor.py",
                "self._claim_deadline = failure.failed_at + self.timings.claim_grace",
                "self._claim_deadline = failure.failed_at + 3 * self.timings.claim_grace",
            ),
        ),
        required=False,
    ),
    Mutation(
        "failed-request-leaks-connection",
        "_platform/_lean.py LeanHttp._on_a_connection: a failed or cancelled request (or "
        "pipeline) leaves its connection open",
        (
            Patch(
                "trio_worker/_platform/_lean.py",
                "                # request goes again on a fresh connection.\n"
                "                await trio.aclose_forcefully(connection.stream)\n"
                "                continue\n"
                "            except BaseException:\n"
                "                await trio.aclose_forcefully(connection.stream)\n"
                "                raise",
                "                # request goes again on a fresh connection.\n"
                "                await trio.aclose_forcefully(connection.stream)\n"
                "                continue\n"
                "            except BaseException:\n                raise",
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
    ),
    Mutation(
        "shutdown-waits-on-take",
        "_supervisor.py request_shutdown: the take in flight is not shortened",
        (
            Patch(
                "trio_worker/_supervisor.py",
                "        self._shorten_take(now + min(self.timings.take_drain, "
                "self.timings.shutdown_grace))\n",
                "",
            ),
        ),
        required=False,
    ),
    # The shields of sync code (threads) and of generator cleanup: caught only because the
    # suite draws sync handlers, sync generators and generators left at a yield.
    Mutation(
        "thread-wait-unshielded",
        "_handlers.py run_in_thread: a cancelled job stops waiting for its thread at once",
        (
            Patch(
                "trio_worker/_handlers.py",
                "        except trio.Cancelled:\n"
                "            await waits.hold(finished)\n"
                "            raise",
                "        except trio.Cancelled:\n            raise",
            ),
        ),
        required=False,
    ),
    Mutation(
        "async-close-unshielded",
        "_handlers.py Stream: an async generator's aclose() runs unshielded when cancelled",
        (
            Patch(
                "trio_worker/_handlers.py",
                "with trio.CancelScope(shield=True):\n                        await aclose()",
                "with trio.CancelScope():\n                        await aclose()",
            ),
        ),
        required=False,
    ),
    Mutation(
        "sync-close-unshielded",
        "_handlers.py Stream: a sync generator's close() thread is not started when cancelled",
        (
            Patch(
                "trio_worker/_handlers.py",
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


@dataclasses.dataclass
class Outcome:
    mutation: Mutation | None
    caught: bool
    broken: bool
    seconds: float
    failed_tests: list[str]
    first_violation: str
    output: str


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


def run_suite(mutation: Mutation | None, extra: list[str]) -> Outcome:
    """Copy the repository, apply *mutation*, run the property suite there."""
    with tempfile.TemporaryDirectory(prefix="tw-mutation-") as tmp:
        root = Path(tmp) / "repo"
        shutil.copytree(REPO, root, ignore=IGNORE)
        if mutation is not None:
            apply(root, mutation.patches)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
        env.update(
            PYTHONPATH=str(root),
            TRIO_WORKER_EXPECT_ROOT=str(root),
            HYPOTHESIS_PROFILE=os.environ.get("HYPOTHESIS_PROFILE", "default"),
            PYTHONDONTWRITEBYTECODE="1",
        )
        suite = SUITE if mutation is None else mutation.suite
        command = [sys.executable, "-m", "pytest", *suite.split(), "-p", "no:cacheprovider"]
        command.append("-q")
        command += ["-x", "-p", "no:logging", "-rf", *extra]
        started = time.monotonic()
        done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True)
        seconds = time.monotonic() - started
    output = done.stdout + done.stderr
    failed = re.findall(r"^FAILED \S+::(\w+)", output, flags=re.MULTILINE)
    violation = re.search(r"^E\s+- (.*)$", output, flags=re.MULTILINE)
    # Exit 1: tests failed. Anything else (errors, interrupted, usage) is a broken run.
    broken = done.returncode not in (0, 1) or (done.returncode == 1 and not failed)
    return Outcome(
        mutation,
        caught=done.returncode == 1 and bool(failed),
        broken=broken,
        seconds=seconds,
        failed_tests=failed,
        first_violation=violation.group(1)[:160] if violation else "",
        output=output,
    )


def table(outcomes: list[Outcome], *, markdown: bool) -> str:
    rows = [("mutation", "planted bug", "result", "caught by", "first violation", "time")]
    for o in outcomes:
        assert o.mutation is not None
        result = "BROKEN RUN" if o.broken else ("caught" if o.caught else "NOT CAUGHT")
        rows.append(
            (
                o.mutation.name + ("" if o.mutation.required else " (extra)"),
                o.mutation.bug,
                result,
                ", ".join(o.failed_tests) or "-",
                o.first_violation or "-",
                f"{o.seconds:.0f}s",
            )
        )
    if markdown:
        lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
        for row in rows[1:]:
            cells = [c.replace("|", "\\|") for c in row]
            cells[4] = f"`{cells[4]}`" if cells[4] != "-" else "-"
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines)
    widths = [max(len(r[i]) for r in rows) for i in (0, 2, 3, 5)]
    out = []
    for row in rows:
        name, _, result, by, _, secs = row
        shown = (name, result, by, secs)
        out.append("  ".join(c.ljust(w) for c, w in zip(shown, widths, strict=True)))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", help="run only this mutation (repeatable)")
    parser.add_argument(
        "--required",
        action="store_true",
        help="only the required bugs (the six, and every shield), not the extras",
    )
    parser.add_argument("--shields", action="store_true", help="only the shield removals")
    parser.add_argument("--list", action="store_true", help="print the mutation names and exit")
    parser.add_argument("--jobs", type=int, default=1, help="pytest processes at once")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unmutated run")
    parser.add_argument("--verbose", action="store_true", help="print each run's output")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)

    mutations = all_mutations()
    chosen = [m for m in mutations if not args.only or m.name in args.only]
    if args.required:
        chosen = [m for m in chosen if m.required]
    if args.shields:
        chosen = [m for m in chosen if m.name.startswith("shield:")]
    if args.list:
        for mutation in chosen:
            print(f"{mutation.name}\t{mutation.bug}")
        return 0
    unknown = set(args.only or ()) - {m.name for m in mutations}
    if unknown:
        parser.error(f"unknown mutation(s): {', '.join(sorted(unknown))}")
    # Every anchor is checked before anything runs, so a stale one fails in a second.
    with tempfile.TemporaryDirectory(prefix="tw-anchors-") as tmp:
        for mutation in chosen:
            probe = Path(tmp) / mutation.name
            for patch in mutation.patches:
                (probe / patch.path).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(REPO / patch.path, probe / patch.path)
            apply(probe, mutation.patches)

    if not args.no_baseline:
        print("baseline (no mutation) ...", flush=True)
        base = run_suite(None, args.pytest_args)
        if not (base.output and not base.caught and not base.broken):
            print(base.output[-4000:])
            print("the unmutated suite does not pass: fix that first", file=sys.stderr)
            return 2
        print(f"baseline passed in {base.seconds:.0f}s", flush=True)

    outcomes: list[Outcome] = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
        futures = {pool.submit(run_suite, m, args.pytest_args): m for m in chosen}
        for future in concurrent.futures.as_completed(futures):
            outcome = future.result()
            outcomes.append(outcome)
            assert outcome.mutation is not None
            verdict = "BROKEN" if outcome.broken else ("caught" if outcome.caught else "NOT CAUGHT")
            print(f"{outcome.mutation.name}: {verdict} ({outcome.seconds:.0f}s)", flush=True)
            if args.verbose or outcome.broken:
                print(outcome.output[-6000:])
    outcomes.sort(key=lambda o: chosen.index(o.mutation) if o.mutation else -1)
    print()
    print(table(outcomes, markdown=args.markdown))
    return 0 if all(o.caught and not o.broken for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
