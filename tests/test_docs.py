"""The docs stand alone (docs/design.md §12): citations resolve, links resolve, nothing points
outside the repository.

Each check is a function of the repository root that returns its problems, so the tests at
the bottom can plant a bad citation in a scratch tree and watch the check catch it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SKIP_DIRS = {".git", ".tox", ".venv", "venv", "__pycache__", "build", "dist", "node_modules"}
SKIP_PATHS = {Path("benchmarks/results")}  # generated measurement output
TEXT_SUFFIXES = {".py", ".md", ".toml", ".txt", ".cfg", ".ini", ".yml", ".yaml", ".sh", ".rst"}
# Notes kept outside the repository; spelled in pieces so this file does not cite them.
FORBIDDEN = (
    "TRIO_" + "NOTES",
    "PROTOCOL" + ".md",
    "DESIGN" + ".md",
    "../" + "shared",
    "STYLE" + ".md",
)

# "docs/protocol.md §2.3", "protocol §1.5", "[design §4](design.md)", "docs/design.md I6",
# "§8 item 15", "§8 items 17 and 22", "§8 #32", "§1.1 and §1.5", "§2.1 / §2.5".
CITATION = re.compile(
    r"(?<![\w-])(?:docs/)?(?P<doc>protocol|design)(?:\.md)?\s+(?=§|I\d)"
    r"(?P<refs>(?:§\s?\d+(?:\.\d+)*|items?\b|#\d+|I\d+\b|\d+\b|and\b|[ \t,/])+)"
)
REF_TOKEN = re.compile(
    r"§\s?(?P<section>\d+(?:\.\d+)*)|items?\s+(?P<item>\d+)|#(?P<hash>\d+)|"
    r"(?P<invariant>I\d+)\b|(?P<more>\d+)\b"
)
HEADING = re.compile(r"^(?P<level>#{1,6})\s+(?P<text>.+?)\s*#*\s*$")
NUMBERED_HEADING = re.compile(r"§?(?P<num>\d+(?:\.\d+)*|I\d+)\b")
LIST_ITEM = re.compile(r"^(?P<num>\d+)\.\s")
LINK = re.compile(r"!?\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1\s*$", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")


def repo_files(root: Path, suffixes: set[str]) -> list[Path]:
    found = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if any(part in SKIP_DIRS or part.endswith(".egg-info") for part in rel.parts):
            continue
        if any(rel.is_relative_to(skip) for skip in SKIP_PATHS):
            continue
        if path.is_file() and path.suffix in suffixes:
            found.append(path)
    return found


def strip_code(markdown: str) -> str:
    """Markdown without fenced blocks (lines kept, so line numbers stay right)."""
    return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), markdown)


@dataclass
class DocIndex:
    """What a page can be cited by: numbered headings, and numbered items per section."""

    sections: set[str]
    items: dict[str, set[str]]
    slugs: set[str]


def github_slug(heading: str) -> str:
    text = LINK.sub(lambda m: m.group("text"), heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def index_doc(path: Path) -> DocIndex:
    sections: set[str] = set()
    items: dict[str, set[str]] = {}
    slugs: set[str] = set()
    seen: dict[str, int] = {}
    top: str | None = None
    for line in strip_code(path.read_text(encoding="utf-8")).splitlines():
        heading = HEADING.match(line)
        if heading:
            slug = github_slug(heading["text"])
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            slugs.add(slug if count == 0 else f"{slug}-{count}")
            numbered = NUMBERED_HEADING.match(heading["text"])
            if numbered:
                sections.add(numbered["num"])
                if not numbered["num"].startswith("I"):
                    top = numbered["num"].split(".")[0]
            continue
        item = LIST_ITEM.match(line)
        if item and top is not None:
            items.setdefault(top, set()).add(item["num"])
    return DocIndex(sections, items, slugs)


def _source_text(path: Path) -> str:
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix == ".py":
        # A citation may continue on the next comment line: "(docs/protocol.md\n  # §8 item 15)".
        text = re.sub(r"\n[ \t]*#[ \t]?(?=\S)", " ", text)
    return text


def citation_problems(root: Path) -> list[str]:
    """Every "docs/<page>.md §X" (or item, or invariant) that names no existing section."""
    indexes: dict[str, DocIndex] = {}
    problems = []
    for path in repo_files(root, {".py", ".md"}):
        if path.resolve() == Path(__file__).resolve():
            continue  # the planted examples below
        rel = path.relative_to(root)
        for match in CITATION.finditer(_source_text(path)):
            doc = root / "docs" / f"{match['doc']}.md"
            where = f"{rel}: {match.group(0).strip()!r}"
            if not doc.is_file():
                problems.append(f"{where}: docs/{doc.name} does not exist")
                continue
            index = indexes.setdefault(doc.name, index_doc(doc))
            section: str | None = None
            after_item = False
            for token in REF_TOKEN.finditer(match["refs"]):
                if token["section"]:
                    section, after_item = token["section"], False
                    if section not in index.sections:
                        problems.append(f"{where}: no section §{section} in docs/{doc.name}")
                elif token["invariant"]:
                    if token["invariant"] not in index.sections:
                        problems.append(f"{where}: no {token['invariant']} in docs/{doc.name}")
                else:
                    number = token["item"] or token["hash"] or (after_item and token["more"])
                    if not number:
                        continue
                    after_item = True
                    top = section.split(".")[0] if section else None
                    if top is None or number not in index.items.get(top, set()):
                        problems.append(f"{where}: no item {number} in §{top} of docs/{doc.name}")
    return problems


def outside_reference_problems(root: Path) -> list[str]:
    problems = []
    for path in repo_files(root, TEXT_SUFFIXES):
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for name in FORBIDDEN:
                if name in line:
                    problems.append(f"{path.relative_to(root)}:{number}: cites {name}")
    return problems


def link_problems(root: Path) -> list[str]:
    """Relative links in README.md and docs/*.md that point at no file or no heading."""
    pages = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    problems = []
    for page in pages:
        if not page.is_file():
            continue
        text = INLINE_CODE.sub("", strip_code(page.read_text(encoding="utf-8")))
        for match in LINK.finditer(text):
            target = match["target"]
            if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):
                continue  # http:, https:, mailto:
            file_part, _, anchor = target.partition("#")
            linked = (page.parent / file_part).resolve() if file_part else page
            where = f"{page.relative_to(root)}: ({target})"
            if not linked.exists():
                problems.append(f"{where}: {file_part} does not exist")
            elif anchor and linked.suffix == ".md" and anchor not in index_doc(linked).slugs:
                problems.append(f"{where}: no heading #{anchor} in {linked.name}")
    return problems


# -- the repository -----------------------------------------------------------------------


def test_every_citation_names_an_existing_section() -> None:
    problems = citation_problems(ROOT)
    assert not problems, "\n".join(problems)


def test_nothing_cites_notes_outside_the_repository() -> None:
    problems = outside_reference_problems(ROOT)
    assert not problems, "\n".join(problems)


def test_every_relative_link_resolves() -> None:
    problems = link_problems(ROOT)
    assert not problems, "\n".join(problems)


def test_the_citations_found_include_the_known_forms() -> None:
    # Guards the pattern itself: if it stopped matching, the first test would pass vacuously.
    found = [
        m.group(0) for p in repo_files(ROOT, {".py"}) for m in CITATION.finditer(_source_text(p))
    ]
    assert len(found) > 50
    assert any("§8 item" in f for f in found)
    assert any(re.search(r"I\d", f) for f in found)


# -- the checks themselves can fail ------------------------------------------------------

PROTOCOL = "# P\n\n## 1. One\n\n### 1.5 Sub\n\n## 8. Weak\n\n1. first\n2. second\n"
DESIGN = "# D\n\n## §4 Invariants\n\n### I1 exactly once\n\n## §6 Init\n\n### §6.2 Fail\n"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "protocol.md").write_text(PROTOCOL)
    (tmp_path / "docs" / "design.md").write_text(DESIGN)
    (tmp_path / "README.md").write_text("[p](docs/protocol.md#15-sub)\n")
    return tmp_path


def test_good_citations_pass(tree: Path) -> None:
    (tree / "m.py").write_text(
        '"""See docs/protocol.md §1.5, §8 item 2 (docs/design.md §4 I1, §6.2).\n'
        '(docs/protocol.md §8 items 1 and 2, §8 #1; [design I1](design.md))"""\n'
        "x = 1  # (docs/protocol.md\n# §8 item 2)\n"
    )
    assert citation_problems(tree) == []
    assert link_problems(tree) == []
    assert outside_reference_problems(tree) == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("docs/protocol.md §2.7", "no section §2.7"),
        ("[protocol §9](protocol.md)", "no section §9"),
        ("docs/protocol.md §8 item 3", "no item 3"),
        ("docs/protocol.md §8 items 1 and 7", "no item 7"),
        ("docs/protocol.md §8 #9", "no item 9"),
        ("docs/design.md I9", "no I9"),
        ("docs/design.md §6.3", "no section §6.3"),
        ("docs/nowhere.md §1", None),  # not a page the citations name: ignored
    ],
)
def test_a_planted_bad_citation_is_caught(tree: Path, text: str, expected: str | None) -> None:
    (tree / "m.py").write_text(f"# {text}\n")
    problems = citation_problems(tree)
    if expected is None:
        assert problems == []
    else:
        assert len(problems) == 1
        assert expected in problems[0]


def test_a_missing_page_is_caught(tree: Path) -> None:
    (tree / "docs" / "design.md").unlink()
    (tree / "m.md").write_text("see [design §4](design.md)\n")
    assert any("does not exist" in p for p in citation_problems(tree))


@pytest.mark.parametrize("name", FORBIDDEN)
def test_a_planted_outside_reference_is_caught(tree: Path, name: str) -> None:
    (tree / "docs" / "x.md").write_text(f"as {name} says\n")
    assert outside_reference_problems(tree) == [f"docs/x.md:1: cites {name}"]


@pytest.mark.parametrize(
    ("link", "expected"),
    [
        ("[a](missing.md)", "missing.md does not exist"),
        ("[a](protocol.md#no-such-heading)", "no heading #no-such-heading"),
        ("[a](#8-weak-nope)", "no heading #8-weak-nope"),
    ],
)
def test_a_planted_broken_link_is_caught(tree: Path, link: str, expected: str) -> None:
    (tree / "docs" / "x.md").write_text(
        f"## Top\n\n{link} and [fine](#top) and [ok](design.md#i1-exactly-once)\n"
    )
    problems = link_problems(tree)
    assert len(problems) == 1
    assert expected in problems[0]


def test_links_in_code_are_not_links(tree: Path) -> None:
    (tree / "docs" / "x.md").write_text("```\n[a](missing.md)\n```\n`[b](gone.md)`\n")
    assert link_problems(tree) == []
