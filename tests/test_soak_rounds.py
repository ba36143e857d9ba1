"""scripts/soak_properties.py: its rounds, its verdict, and the example scale it sets.

The soak is a long exploratory run, not a CI test; these pin what its report is made of
(the seeds that reproduce a round, the properties reached, the memory verdict comparing
rounds) and run it end to end for a few seconds on two cheap properties.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from .properties import SOAK_SCALE_ENV

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "soak_properties.py"


def _load() -> ModuleType:
    # Under its own name: as "soak_properties" it would be the plugin of a soak round.
    spec = importlib.util.spec_from_file_location("soak_properties_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


soak = _load()


def a_round(number: int, *rss: float, started: tuple[str, ...] = ()) -> object:
    one = soak.Round(number, seed=number * 11)
    one.samples = [soak.Sample(60.0 * number + i, r, i, "t") for i, r in enumerate(rss)]
    one.collected = ["a", "b", "c"]
    one.started = list(started)
    return one


def test_the_first_round_runs_the_given_seed_and_the_later_ones_fresh_seeds_drawn_from_it() -> None:
    first = soak.round_seeds(2641324555)
    seeds = [first() for _ in range(5)]
    again = soak.round_seeds(2641324555)
    assert seeds[0] == 2641324555
    assert len(set(seeds)) == 5
    assert [again() for _ in range(5)] == seeds
    unseeded = soak.round_seeds(None)
    assert len({unseeded() for _ in range(5)}) == 5


def test_memory_is_flat_when_no_later_round_peaks_beyond_the_tolerance() -> None:
    flat, lines = soak.verdict([a_round(1, 80, 100), a_round(2, 90, 124), a_round(3, 95)], 0.25)
    assert flat
    assert "FLAT" in lines[-1]
    assert "peak RSS per round: 1: 100, 2: 124, 3: 95" in lines


def test_memory_grows_when_a_later_round_peaks_beyond_the_tolerance() -> None:
    flat, lines = soak.verdict([a_round(1, 100), a_round(2, 110), a_round(3, 126)], 0.25)
    assert not flat
    assert "GROWING" in lines[-1]


def test_one_round_is_inconclusive() -> None:
    flat, lines = soak.verdict([a_round(1, 100, 900)], 0.25)
    assert flat
    assert lines[-1].startswith("INCONCLUSIVE")


def test_a_property_no_round_started_is_named() -> None:
    rounds = [a_round(1, 100, started=("a",)), a_round(2, 100, started=("a", "c"))]
    assert soak.never_reached(rounds) == ["b"]
    rounds.append(a_round(3, 100, started=("b",)))
    assert soak.never_reached(rounds) == []


def test_the_scale_applies_to_every_property_of_the_soak_profile() -> None:
    code = (
        "from tests.properties import examples\n"
        "print(examples(240).max_examples, examples(20).max_examples, examples(1).max_examples)"
    )
    env = {**os.environ, "HYPOTHESIS_PROFILE": "soak", SOAK_SCALE_ENV: "0.05"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["12", "1", "1"]
    env.pop(SOAK_SCALE_ENV)
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert out.stdout.split() == ["9600", "800", "40"], out.stderr


@pytest.mark.parametrize("bad", ["0", "-1", "two", "nan", "inf"])
def test_a_bad_scale_is_a_clear_error(bad: str) -> None:
    env = {**os.environ, "HYPOTHESIS_PROFILE": "soak", SOAK_SCALE_ENV: bad}
    out = subprocess.run(
        [sys.executable, "-c", "import tests.properties"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 1
    assert f"{SOAK_SCALE_ENV}={bad!r}: expected a number above 0" in out.stderr


@pytest.mark.slow
def test_a_short_soak_runs_rounds_with_fresh_seeds_and_reports_each(tmp_path: Path) -> None:
    selected = "test_bodies_are_bounded or test_pings_list_exactly_the_held_ids"
    # Sampled often: on an idle machine a round of two properties this small takes 2 s.
    soak_for = ["--minutes=0.6", "--scale=0.05", "--interval=0.5", "--seed=7"]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *soak_for, "--", "-k", selected],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    out = done.stdout
    # Passed, every test reached; the memory verdict of rounds this short may read a sample
    # taken while a round's pytest is still importing (the unit tests above pin the verdict).
    assert done.returncode in (0, 2), out + done.stderr
    verdict = r"^soak: peak of round \d+ \d+ MiB, of the later rounds \d+ MiB: (FLAT|GROWING)"
    assert re.search(verdict, out, re.MULTILINE), out
    seeds = [int(s) for s in re.findall(r"^soak: round \d+, seed (\d+)$", out, re.MULTILINE)]
    assert len(seeds) >= 2, out
    assert seeds[0] == 7 and len(set(seeds)) == len(seeds)
    finished = r"^soak: round 1 \(seed 7, pytest status 0\): reached 2 of 2 tests; RSS start"
    assert re.search(finished, out, re.MULTILINE), out
    assert re.search(r"^soak:   test_bodies_are_bounded: passed, 4 examples$", out, re.MULTILINE)
    assert re.search(
        r"^soak:   test_pings_list_exactly_the_held_ids: passed, 6 examples$", out, re.MULTILINE
    )
    assert "every test reached at least once" in out
    assert re.search(r"^soak: peak RSS per round: 1: \d+", out, re.MULTILINE)
