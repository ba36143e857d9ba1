"""The docs cite only code that exists (docs/design.md §12).

The reliability table, the module map and the benchmark notes name files, modules and
tests by path; when code moves, a stale name sends a reader to nothing. Every backticked
citation of a repository file (`trio_worker/_platform/_lean.py`, `_delivery.py`,
`benchmarks/run.py`) must name a file that exists, and every test citation
(`test_delivery.py::test_a_503_outage...`) a test function defined in that file.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The changelog records names as they were when each entry was written.
PAGES = ("README.md", "docs")
# Written by a run of the benchmarks, not committed.
GENERATED = "benchmarks/results/"

CODE = re.compile(r"`([^`\n]+)`")
REPO_PATH = re.compile(
    r"^(?:trio_worker|tests|scripts|benchmarks|examples)/[\w./-]*\w\.(?:py|md|json|toml)$"
)
MODULE_FILE = re.compile(r"^(?:[\w]+/)*_\w+\.py$")
TEST_CITATION = re.compile(r"^(?P<file>(?:[\w]+/)*test_\w+\.py)(?:::(?P<name>\w+))?")


def pages(root: Path) -> list[Path]:
    found: list[Path] = []
    for name in PAGES:
        path = root / name
        found += sorted(path.rglob("*.md")) if path.is_dir() else [path]
    return found


def _test_file(root: Path, cited: str) -> Path | None:
    direct = root / "tests" / cited
    if direct.is_file():
        return direct
    matches = [p for p in (root / "tests").rglob(Path(cited).name) if p.as_posix().endswith(cited)]
    return matches[0] if len(matches) == 1 else None


def _module(root: Path, cited: str) -> bool:
    package = root / "trio_worker"
    return any(p.as_posix().endswith("/" + cited) for p in package.rglob(Path(cited).name))


def stale_citations(root: Path) -> list[str]:
    problems: list[str] = []
    for page in pages(root):
        where = page.relative_to(root)
        for token in CODE.findall(page.read_text(encoding="utf-8")):
            token = token.strip()
            test = TEST_CITATION.match(token)
            if test is not None:
                path = _test_file(root, test["file"])
                if path is None:
                    problems.append(f"{where}: no test file {test['file']}")
                elif test["name"] and not re.search(
                    rf"^\s*(?:async\s+)?def\s+{test['name']}\b",
                    path.read_text(encoding="utf-8"),
                    re.M,
                ):
                    problems.append(f"{where}: no {test['name']} in {test['file']}")
            elif REPO_PATH.match(token) and not token.startswith(GENERATED):
                if not (root / token).exists():
                    problems.append(f"{where}: no file {token}")
            elif MODULE_FILE.match(token) and not _module(root, token):
                problems.append(f"{where}: no module {token}")
    return problems


def test_the_docs_cite_only_code_that_exists() -> None:
    assert stale_citations(ROOT) == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("see `trio_worker/_http.py`", "no file trio_worker/_http.py"),
        ("held by `_gone.py`", "no module _gone.py"),
        ("`test_real.py::test_missing`", "no test_missing in test_real.py"),
        ("`test_absent.py::test_x`", "no test file test_absent.py"),
    ],
)
def test_a_planted_stale_citation_is_caught(tmp_path: Path, text: str, expected: str) -> None:
    (tmp_path / "trio_worker").mkdir()
    (tmp_path / "trio_worker" / "_here.py").write_text("")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_real.py").write_text("async def test_present():\n    pass\n")
    (tmp_path / "docs").mkdir()
    good = "`trio_worker/_here.py`, `_here.py`, `test_real.py::test_present`\n"
    (tmp_path / "README.md").write_text(good)
    assert stale_citations(tmp_path) == []
    (tmp_path / "docs" / "page.md").write_text(text + "\n")
    assert [p.split(": ", 1)[1] for p in stale_citations(tmp_path)] == [expected]
