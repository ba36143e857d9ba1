"""Render the state diagrams in docs/how-it-works.md from the tables in trio_worker._lifecycle.

Each diagram sits between ``<!-- generated: NAME (scripts/state_diagrams.py) -->`` and
``<!-- end generated -->``; this script rewrites what is between them. ``--check`` only
reports (exit 1) when the docs differ; tests/test_lifecycle.py runs the same comparison.

    python scripts/state_diagrams.py [--check]
"""

from __future__ import annotations

import argparse
import re
import sys
from functools import partial
from pathlib import Path

from trio_worker._lifecycle import job_diagram, phase_diagram

DOCS = Path(__file__).resolve().parents[1] / "docs" / "how-it-works.md"
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
