"""Every mutation of the mutation check (scripts/_mutations.py) still applies to today's source.

A mutation whose anchor text no longer occurs exactly once stops the mutation check at
that mutation (SystemExit 2), and the check is run by hand, long after the change that
broke it: this keeps the anchors in step with the code in every CI run instead.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_mutations", REPO / "scripts" / "_mutations.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("_mutations", module)
    spec.loader.exec_module(module)
    return module


mutations = _load()
MUTATIONS = mutations.all_mutations()


def test_there_is_a_mutation_for_every_shield() -> None:
    shields = sum(
        path.read_text().count("shield=True") for path in (REPO / "trio_worker").rglob("*.py")
    )
    assert len(mutations.shield_mutations()) == shields


@pytest.mark.parametrize("mutation", MUTATIONS, ids=[m.name for m in MUTATIONS])
def test_the_mutation_applies_to_todays_source(mutation: object, tmp_path: Path) -> None:
    shutil.copytree(REPO / "trio_worker", tmp_path / "trio_worker")
    patches = mutation.patches  # type: ignore[attr-defined]
    before = {p.path: (tmp_path / p.path).read_text() for p in patches}
    mutations.apply(tmp_path, patches)  # SystemExit(2) when an anchor is not found once
    assert any((tmp_path / path).read_text() != text for path, text in before.items())
