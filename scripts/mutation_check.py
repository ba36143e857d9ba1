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

from _mutations import SUITE, Mutation, all_mutations, apply

REPO = Path(__file__).resolve().parents[1]
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


@dataclasses.dataclass
class Outcome:
    mutation: Mutation | None
    caught: bool
    broken: bool
    seconds: float
    failed_tests: list[str]
    first_violation: str
    output: str


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
