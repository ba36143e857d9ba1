"""Render the state diagrams in docs/how-it-works.md from the tables in trio_worker._state.

Each diagram sits between ``<!-- generated: NAME (scripts/state_diagrams.py) -->`` and
``<!-- end generated -->``; this script rewrites what is between them. ``--check`` only
reports (exit 1) when the docs differ; tests/test_state_lifecycle.py runs the same comparison.

    python scripts/state_diagrams.py [--check]
"""

from __future__ import annotations

import argparse
import re
import sys
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trio_worker._state import PHASE_TRANSITIONS, TRANSITIONS, JobState, WorkerPhase

if TYPE_CHECKING:
    import enum
    from collections.abc import Iterable, Mapping

DOCS = Path(__file__).resolve().parents[1] / "docs" / "how-it-works.md"


def mermaid_diagram(
    table: Mapping[tuple[Any, Any], enum.Enum],
    *,
    start: enum.Enum,
    ends: Iterable[enum.Enum],
    entry: str,
) -> str:
    """*table* as a Mermaid state diagram, one arrow per row, in the table's order."""
    lines = ["```mermaid", "stateDiagram-v2", f"    [*] --> {start.name} : {entry}"]
    lines += [f"    {a.name} --> {b.name} : {e.value}" for (a, e), b in table.items()]
    lines += [f"    {state.name} --> [*]" for state in ends]
    return "\n".join([*lines, "```"])


def job_diagram() -> str:
    ends = [state for state in JobState if state.terminal]
    return mermaid_diagram(TRANSITIONS, start=JobState.TAKEN, ends=ends, entry="take answer parsed")


def phase_diagram() -> str:
    ends = [WorkerPhase.INIT_FAILED, WorkerPhase.DRAINING]
    return mermaid_diagram(
        PHASE_TRANSITIONS, start=WorkerPhase.INITIALIZING, ends=ends, entry="serve() starts"
    )


DIAGRAMS = {"job states": job_diagram, "worker phases": phase_diagram}


def _between(match: re.Match[str], block: str) -> str:
    return f"{match[1]}{block}\n{match[2]}"


def render(text: str) -> str:
    for name, diagram in DIAGRAMS.items():
        pattern = re.compile(
            rf"(<!-- generated: {re.escape(name)} \(scripts/state_diagrams.py\) -->\n)"
            r".*?(<!-- end generated -->)",
            re.DOTALL,
        )
        text, found = pattern.subn(partial(_between, block=diagram()), text)
        if found != 1:
            raise SystemExit(f"{DOCS}: expected one generated {name!r} block, found {found}")
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the docs differ")
    args = parser.parse_args()
    text = DOCS.read_text()
    new = render(text)
    if args.check:
        if new != text:
            print(f"{DOCS} is out of date: run python scripts/state_diagrams.py")
            return 1
        return 0
    DOCS.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
