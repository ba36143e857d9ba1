"""Every log line the docs quote is one the code can write.

A user greps their container log for the line the docs promised; a doc that quotes a line
the code no longer writes (reworded, or never written) sends them nowhere. The lines are
read from the docs in two forms: console output (``WARNING trio_worker: <message>``) and
prose that says the worker logs a line (``logs the warning `<message>```). Each must match
a string of ``trio_worker/``: the format string of a ``log.<level>(...)`` call, its
``%s``-style fields matching anything (a doc's ``<id>`` placeholder included), or an
f-string, its fields the same.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONSOLE_LINE = re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) trio_worker: (?P<message>.+)$")
PROSE_LINE = re.compile(r"\blogs? (?:the (?:warning|error|line) )?`(?P<message>[^`]+)`")
MIN_FIXED_TEXT = 8
FIELD = re.compile(r"%[-#0 +]*\d*(?:\.\d+)?[sdrfgx]")


def code_templates(root: Path) -> list[re.Pattern[str]]:
    """What each string literal under *root* can become: a ``%s`` field (the format
    strings of ``log.<level>(...)``) or an f-string's ``{...}`` (a farewell written on the
    way out) matches any text."""
    patterns = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                parts = [re.escape(p.replace("%%", "%")) for p in FIELD.split(node.value)]
            elif isinstance(node, ast.JoinedStr):
                parts = [""]
                for value in node.values:
                    if isinstance(value, ast.Constant):
                        parts[-1] += re.escape(str(value.value))
                    else:
                        parts.append("")
            else:
                continue
            # "%s" or "{name}: {value}" alone would match any line: not a quotable one.
            if sum(len(part) for part in parts) >= MIN_FIXED_TEXT:
                patterns.append(re.compile(".+?".join(parts), re.DOTALL))
    return patterns


def quoted_lines(root: Path) -> list[tuple[str, str]]:
    """``(where, message)`` for each log line quoted in the docs and the README."""
    found = []
    for path in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            where = f"{path.relative_to(root)}:{number}"
            for pattern in (CONSOLE_LINE, PROSE_LINE):
                found += [(where, match["message"]) for match in pattern.finditer(line)]
    return found


def unknown_lines(root: Path) -> list[str]:
    patterns = code_templates(root / "trio_worker")
    return [
        f"{where}: {message!r}"
        for where, message in quoted_lines(root)
        if not any(pattern.fullmatch(message) for pattern in patterns)
    ]


def test_every_quoted_log_line_is_one_the_code_writes() -> None:
    assert unknown_lines(ROOT) == []


def test_the_docs_quote_log_lines_in_both_forms() -> None:
    # The check reads something: a rewording of the docs that hid every quote from it
    # would leave it passing with nothing to check.
    lines = quoted_lines(ROOT)
    assert len(lines) >= 5
    assert any(where.startswith("docs/tutorial.md") for where, _ in lines)
    assert any(where.startswith("docs/reference.md") for where, _ in lines)


@pytest.mark.parametrize(
    ("doc", "caught"),
    [
        ("2026-01-01 WARNING trio_worker: progress_update for job j1 went somewhere\n", True),
        ("It logs the warning `progress_update called with no worker running; ignored`.\n", True),
        ("It logs `fitness check <name> failed: <reason>`.\n", False),
        ("2026-01-01 ERROR trio_worker: fitness check gpu failed: no GPU\n", False),
    ],
)
def test_a_planted_line_the_code_does_not_write_is_caught(
    tmp_path: Path, doc: str, caught: bool
) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text(doc)
    (tmp_path / "README.md").write_text("")
    (tmp_path / "trio_worker").mkdir()
    (tmp_path / "trio_worker" / "mod.py").write_text(
        'log.warning("progress_update for job %s after the job ended; ignored", job_id)\n'
        'log.error("fitness check %s failed: %s", name, reason)\n'
    )
    assert bool(unknown_lines(tmp_path)) is caught
