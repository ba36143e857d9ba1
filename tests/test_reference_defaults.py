"""docs/reference.md states the defaults the code has.

Every ``Timings`` field, and every keyword of ``start()``, ``serve()`` and
``trio_worker.testing.serve()``, must appear in the page with the code's default: in the
argument tables, and in the signature blocks where the page shows one. A default changed
in the code without the page fails here.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import trio_worker
import trio_worker.testing

REFERENCE = Path(__file__).resolve().parent.parent / "docs" / "reference.md"
ROW = re.compile(r"^\|\s*`(?P<name>\w+)`\s*\|\s*(?P<default>[^|]+?)\s*\|", re.M)
SIGNATURE_ARG = re.compile(r"^\s+(?P<name>\w+)=(?P<default>[^,#]+?),?\s*(?:#.*)?$", re.M)
REQUIRED = "required"
NOT_A_LITERAL = {"task_status": "trio.TASK_STATUS_IGNORED"}


def section(heading: str) -> str:
    """The text under *heading* up to the next heading of the same or a higher level."""
    text = REFERENCE.read_text(encoding="utf-8")
    level = heading.split(" ", 1)[0]
    start = text.index(f"\n{heading}\n") + len(heading) + 2
    following = re.compile(rf"^#{{1,{len(level)}}} ", re.M).search(text, start)
    return text[start : following.start() if following else len(text)]


def table_defaults(text: str) -> dict[str, str]:
    return {m["name"]: m["default"].strip("`") for m in ROW.finditer(text)}


def signature_defaults(text: str) -> dict[str, str]:
    block = re.search(r"```python\n(.*?)```", text, re.S)
    assert block is not None, "no signature block"
    return {m["name"]: m["default"].strip() for m in SIGNATURE_ARG.finditer(block.group(1))}


def same(documented: str, name: str, default: Any) -> bool:
    if default is inspect.Parameter.empty:
        return documented == REQUIRED
    if name in NOT_A_LITERAL:
        return documented == NOT_A_LITERAL[name]
    try:
        value = ast.literal_eval(documented)
    except (ValueError, SyntaxError):
        return False
    return type(value) is type(default) and value == default


def keyword_defaults(function: Callable[..., Any]) -> dict[str, Any]:
    parameters = inspect.signature(function).parameters.values()
    return {p.name: p.default for p in parameters}


def mismatches(documented: dict[str, str], code: dict[str, Any]) -> list[str]:
    problems = []
    for name, default in code.items():
        if name not in documented:
            problems.append(f"{name}: not documented (code default {default!r})")
        elif not same(documented[name], name, default):
            problems.append(f"{name}: documented {documented[name]!r}, code {default!r}")
    return problems


def test_the_page_is_read() -> None:
    # A parser that found nothing would pass every check below.
    assert len(table_defaults(section("## `Timings`"))) >= 10
    assert "handler" in table_defaults(section("### `trio_worker.start`"))
    assert "handle_signals" in signature_defaults(section("### `trio_worker.serve`"))


def test_every_timings_field_with_its_default() -> None:
    documented = table_defaults(section("## `Timings`"))
    code = {f.name: f.default for f in dataclasses.fields(trio_worker.Timings)}
    assert mismatches(documented, code) == []
    assert set(documented) <= set(code), "the page lists a field the code does not have"


@pytest.mark.parametrize("part", ["table", "signature"])
def test_every_start_keyword_with_its_default(part: str) -> None:
    text = section("### `trio_worker.start`")
    documented = table_defaults(text) if part == "table" else signature_defaults(text)
    code = keyword_defaults(trio_worker.start)
    if part == "signature":
        code.pop("handler")  # shown as a positional name with a comment
    assert mismatches(documented, code) == []


def test_every_serve_keyword_with_its_default() -> None:
    text = section("### `trio_worker.serve`")
    code = keyword_defaults(trio_worker.serve)
    code.pop("handler")
    assert mismatches(signature_defaults(text), code) == []
    # The table lists serve's own arguments; the shared ones are start()'s.
    tables = {**table_defaults(section("### `trio_worker.start`")), **table_defaults(text)}
    own = {name: d for name, d in code.items() if name != "task_status"}
    assert mismatches(tables, own) == []


def test_every_testing_serve_seam_with_its_default() -> None:
    text = section("### `trio_worker.serve`")
    documented = table_defaults(text)
    public = keyword_defaults(trio_worker.serve)
    seams = {
        name: default
        for name, default in keyword_defaults(trio_worker.testing.serve).items()
        if name not in public
    }
    assert seams, "testing.serve adds no seams?"
    assert mismatches(documented, seams) == []


def test_a_drifted_default_is_caught() -> None:
    assert mismatches({"claim_grace": "5.0"}, {"claim_grace": 10.0}) != []
    assert mismatches({"report_attempts": "6.0"}, {"report_attempts": 6}) != []
    assert mismatches({}, {"connect_timeout": 10.0}) != []
    assert mismatches({"handler": "required"}, {"handler": inspect.Parameter.empty}) == []


def test_start_docstring_describes_every_argument_with_its_type() -> None:
    # help(trio_worker.start) shows string annotations (postponed evaluation); the
    # docstring's Args give each argument's type and meaning in plain words.
    doc = inspect.getdoc(trio_worker.start) or ""
    for section_name in ("Args:", "Returns:", "Raises:", "Examples:"):
        assert section_name in doc
    for name in inspect.signature(trio_worker.start).parameters:
        assert re.search(rf"^    {name} \([^)]+\): \S", doc, re.M), name
