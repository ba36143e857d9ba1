"""``benchmarks/run.py --check`` compares figures with the committed table
(docs/benchmarks.md, "--check"); the ratio targets and the marginal CPU are arithmetic on
the run's results. All pure functions on fabricated dicts: no process is started."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

# The benchmarks package is not installed: imported from the checkout, after everything
# installed (as tests/test_benchmarks_smoke.py does).
sys.path.append(str(Path(__file__).resolve().parents[1]))

from benchmarks._check import NOT_COMPARABLE, PASS, WORSE, compare, render
from benchmarks._cpu_figures import marginal_us
from benchmarks._procs import LoadMonitor
from benchmarks._targets import build_targets

MACHINE = {"cpu": "AMD EPYC", "cores": 2}


def payload(
    cpu_us: float, jobs_per_s: float, machine: dict[str, Any] | None = None, quick: bool = False
) -> dict[str, Any]:
    """A latest.json with one lower-is-better figure (a target's) and one
    higher-is-better figure (a row's)."""
    return {
        "machine": MACHINE if machine is None else machine,
        "settings": {"quick": quick},
        "targets": [
            {
                "key": "cpu_job_sync",
                "label": "CPU per no-op job",
                "better": "lower",
                "trio_worker": cpu_us,
            }
        ],
        "rows": [
            {
                "key": "jobs_c8",
                "label": "no-op jobs/s, c=8",
                "better": "higher",
                "trio_worker": jobs_per_s,
            }
        ],
    }


BASELINE = payload(cpu_us=500.0, jobs_per_s=2000.0)


def test_a_cpu_figure_25_percent_worse_fails() -> None:
    comparison = compare(BASELINE, payload(cpu_us=625.0, jobs_per_s=2000.0))
    assert comparison.exit_code == WORSE
    assert [line.key for line in comparison.failed] == ["cpu_job_sync"]
    assert "**worse**" in render(comparison)


def test_a_cpu_figure_15_percent_worse_passes() -> None:
    comparison = compare(BASELINE, payload(cpu_us=575.0, jobs_per_s=2000.0))
    assert comparison.exit_code == PASS
    assert comparison.failed == []


def test_a_rate_is_worse_when_lower() -> None:
    assert compare(BASELINE, payload(500.0, jobs_per_s=1500.0)).exit_code == WORSE
    assert compare(BASELINE, payload(500.0, jobs_per_s=1700.0)).exit_code == PASS


@pytest.mark.parametrize(("cpu_us", "jobs_per_s"), [(250.0, 2000.0), (500.0, 4000.0)])
def test_a_better_figure_passes(cpu_us: float, jobs_per_s: float) -> None:
    assert compare(BASELINE, payload(cpu_us, jobs_per_s)).exit_code == PASS


@pytest.mark.parametrize(
    "machine",
    [{"cpu": "Intel Xeon", "cores": 2}, {"cpu": "AMD EPYC", "cores": 4}, {}],
)
def test_another_machine_class_cannot_be_compared(machine: dict[str, Any]) -> None:
    # Even a figure far worse is not judged: exit 2, not a pass and not a failure.
    comparison = compare(BASELINE, payload(5000.0, 10.0, machine=machine))
    assert comparison.exit_code == NOT_COMPARABLE
    assert "cannot compare" in render(comparison)


def test_a_quick_run_is_no_baseline() -> None:
    quick = payload(500.0, 2000.0, quick=True)
    assert compare(quick, payload(500.0, 2000.0)).exit_code == NOT_COMPARABLE


def test_a_figure_not_measured_this_time_is_skipped_not_failed() -> None:
    current = payload(500.0, 2000.0)
    current["targets"] = []
    comparison = compare(BASELINE, current)
    assert comparison.exit_code == PASS
    assert "skipped" in render(comparison)


def test_marginal_cpu_takes_out_what_both_runs_share() -> None:
    # 0.3 s of start-up in both; 0.5 s more for 1,000 more units: 500 µs each.
    assert marginal_us((0.35, 100), (0.85, 1100)) == pytest.approx(500.0)
    assert marginal_us((0.35, 100), (0.85, 100)) is None


def test_targets_hold_on_the_ratio_measured_in_the_run() -> None:
    trio = {
        "paced": {"cpu_us_per_chunk": 70.0, "latency_ms": {"p50": 1.0, "p99": 8.0}},
        "noop_cpu": {"cpu_us_per_job": 300.0},
        "floor": {"cpu_us_per_job": 90.0},
        "startup": {"first_take_s": 0.3},
        "against": {"commit": "6e386a1", "current_jobs_per_s": 900.0, "old_jobs_per_s": 1000.0},
    }
    reference = {
        "paced": {"cpu_us_per_chunk": 220.0, "latency_ms": {"p50": 5.0, "p99": 22.0}},
        "startup": {"first_take_s": 1.6},
    }
    rows = {row["key"]: row for row in build_targets({"trio_worker": trio, "reference": reference})}
    assert rows["cpu_chunk_asyncio"]["holds"] is True  # 220 / 70 >= 3
    assert rows["paced_p99"]["holds"] is False  # 22 / 8 < 3
    assert rows["cpu_job_sync"]["holds"] is False  # 300 > 3 x 90
    assert rows["first_take"]["holds"] is True  # 1.6 / 0.3 >= 5
    assert rows["jobs_c8_against"]["holds"] is False  # 900 < 1000
    assert rows["cpu_chunk_trio"]["holds"] is None  # not measured
    assert "6e386a1" in rows["jobs_c8_against"]["target"]
    # Without the reference, a ratio to it cannot be taken; the floor's still can.
    alone = {row["key"]: row for row in build_targets({"trio_worker": trio})}
    assert alone["cpu_chunk_asyncio"]["holds"] is None
    assert alone["cpu_job_sync"]["holds"] is False


def test_a_figure_shorter_than_one_load_sample_gets_the_sample_covering_it() -> None:
    """A sample covers the half second before it was taken: a figure of 0.2 s between two
    samples is reported with the later one (it was reported as no reading at all)."""
    monitor = LoadMonitor(interval=0.5)
    monitor.samples = [(10.0, 5.0), (10.5, 40.0), (11.0, 7.0)]
    assert monitor.summary(10.1, 10.3) == {"mean_pct": 40.0, "max_pct": 40.0}
    assert monitor.summary(10.0, 11.0) == {"mean_pct": 23.5, "max_pct": 40.0}
    assert monitor.summary() == {"mean_pct": 17.3, "max_pct": 40.0}


def test_a_ratio_measured_in_rounds_is_the_median_of_the_rounds_ratios() -> None:
    """Not the ratio of the two sides' medians: each round's two figures were measured
    minutes apart at most (benchmarks/_paired.py)."""
    trio = {"paced": {"cpu_us_per_chunk": 70.0}, "noop_cpu": {"cpu_us_per_job": 300.0}}
    trio["floor"] = {"cpu_us_per_job": 90.0}
    reference = {"paced": {"cpu_us_per_chunk": 200.0}}
    # Medians 200/70 = 2.86 would miss the 1/3 bound; the rounds' median, 3.1, holds.
    paired = {"ratios": {"cpu_chunk_asyncio": [2.5, 3.1, 3.4], "cpu_job_sync": [0.34]}}
    results: dict[str, dict[str, Any]] = {
        "trio_worker": trio,
        "reference": reference,
        "paired": paired,
    }
    rows = {row["key"]: row for row in build_targets(results)}
    assert rows["cpu_chunk_asyncio"]["ratio"] == pytest.approx(3.1)
    assert rows["cpu_chunk_asyncio"]["holds"] is True
    assert "median of 3 alternating rounds" in rows["cpu_chunk_asyncio"]["text"]["ratio"]
    assert rows["cpu_job_sync"]["holds"] is True  # one round: 0.34 >= 1/3
    assert rows["cpu_job_sync"]["text"]["ratio"].endswith("(one round)")
    # A row without rounds is still the ratio of its two figures.
    assert rows["cpu_chunk_trio"]["holds"] is None
    del paired["ratios"]["cpu_chunk_asyncio"]
    rows = {row["key"]: row for row in build_targets(results)}
    assert rows["cpu_chunk_asyncio"]["ratio"] == pytest.approx(200 / 70)
    assert rows["cpu_chunk_asyncio"]["holds"] is False


class _Settings:
    ratio_rounds = 3


class _Bench:
    settings = _Settings()


def test_paired_rounds_alternate_their_order_and_pair_each_rounds_figures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each round measures every side once, the order reversed every other round; a ratio
    is taken between the figures of one round; a side that fails stops being measured and
    its rounds pair with nothing."""
    from benchmarks import _cpu_figures, _paired
    from benchmarks._sdks import Sdk

    trio_sdk = Sdk("trio_worker", "trio_worker", "python", Path("w.py"), "0")
    ref_sdk = Sdk("reference", "runpod", "python", Path("r.py"), "1")
    calls: list[str] = []
    paced_us = {
        ("trio_worker", "asyncio"): iter([60.0, 80.0, 70.0]),
        ("trio_worker", "trio"): iter([50.0, 55.0, 65.0]),
        ("reference", "asyncio"): iter([180.0, 200.0, 300.0]),
    }

    def paced_pair(bench: Any, sdk: Sdk, backend: str) -> tuple[float, dict[str, Any]]:
        calls.append(f"{sdk.key}:{backend}")
        us = next(paced_us[sdk.key, backend])
        run = {"chunks": 9600, "latency_ms": {"p50": 1.0, "p99": us / 10}}
        return us, {**run, "pair": {"long": run}}

    sync_us = iter([200.0, 400.0])

    def noop_cpu_pair(bench: Any, sdk: Sdk) -> tuple[float, dict[str, Any]]:
        calls.append("sync")
        try:
            return next(sync_us), {}
        except StopIteration:
            raise RuntimeError("the worker died") from None

    floors = iter([70.0, 100.0, 90.0])

    def floor_once(bench: Any) -> tuple[float, dict[str, Any]]:
        calls.append("floor")
        return next(floors), {"jobs": 3000}

    monkeypatch.setattr(_cpu_figures, "paced_pair", paced_pair)
    monkeypatch.setattr(_cpu_figures, "noop_cpu_pair", noop_cpu_pair)
    monkeypatch.setattr(_cpu_figures, "floor_once", floor_once)
    said: list[str] = []
    out = _paired.paired_figures(_Bench(), trio_sdk, ref_sdk, said.append)  # type: ignore[arg-type]
    forward = ["trio_worker:asyncio", "reference:asyncio", "trio_worker:trio", "sync", "floor"]
    assert calls == [*forward, *forward[::-1], *forward]
    ratios = out["paired"]["ratios"]
    assert ratios["cpu_chunk_asyncio"] == pytest.approx([3.0, 2.5, 300 / 70])
    assert ratios["cpu_chunk_trio"] == pytest.approx([3.6, 200 / 55, 300 / 65])
    assert ratios["paced_p99"] == pytest.approx([3.0, 2.5, 300 / 70])
    # The third round's sync run failed: two rounds pair, the third's floor with nothing.
    assert ratios["cpu_job_sync"] == pytest.approx([70 / 200, 100 / 400])
    figures = out["trio_worker"]
    assert figures["paced"]["cpu_us_per_chunk"] == 70.0
    assert figures["paced"]["cpu_us_samples"] == [60.0, 80.0, 70.0]
    assert figures["noop_cpu"]["cpu_us_per_job"] == 300.0
    assert "the worker died" in figures["noop_cpu"]["error_in_a_round"]
    assert figures["floor"]["cpu_us_per_job"] == 90.0
    assert out["reference"]["paced"]["cpu_us_per_chunk"] == 200.0
    assert any("FAILED" in line and "the worker died" in line for line in said)


def test_without_the_reference_only_the_floors_ratio_is_paired(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from benchmarks import _cpu_figures, _paired
    from benchmarks._sdks import Sdk

    trio_sdk = Sdk("trio_worker", "trio_worker", "python", Path("w.py"), "0")
    monkeypatch.setattr(
        _cpu_figures, "paced_pair", lambda bench, sdk, backend: (None, {"pair": {}})
    )
    monkeypatch.setattr(_cpu_figures, "noop_cpu_pair", lambda bench, sdk: (300.0, {}))
    monkeypatch.setattr(_cpu_figures, "floor_once", lambda bench: (90.0, {}))
    out = _paired.paired_figures(_Bench(), trio_sdk, None, lambda line: None)  # type: ignore[arg-type]
    assert set(out["paired"]["ratios"]) == {"cpu_job_sync"}
    assert out["reference"] == {}
    assert out["trio_worker"]["paced"]["cpu_us_per_chunk"] is None


def test_alternating_rounds_turn_their_order_round_and_keep_each_sides_results_aligned() -> None:
    from benchmarks._figures import alternating, round_ratios

    calls: list[str] = []

    def side(name: str, values: list[float]) -> Any:
        feed = iter(values)

        def measure() -> float:
            calls.append(name)
            return next(feed)

        return measure

    old, new = alternating(4, [side("old", [10, 20, 30, 40]), side("new", [9, 22, 0, 48])])
    assert calls == ["old", "new", "new", "old", "old", "new", "new", "old"]
    assert (old, new) == ([10, 20, 30, 40], [9, 22, 0, 48])
    # A round without both figures (here a zero) has no ratio.
    assert round_ratios(new, old) == pytest.approx([0.9, 1.1, 1.2])
    assert round_ratios([1.0, None], [2.0, 4.0]) == [0.5]


def test_the_older_commits_row_is_the_median_of_its_rounds_ratios() -> None:
    trio = {
        "against": {
            "commit": "6e386a1",
            "current_jobs_per_s": 950.0,
            "old_jobs_per_s": 1000.0,
            "ratios": [0.9, 1.02, 1.05],
        }
    }
    rows = {row["key"]: row for row in build_targets({"trio_worker": trio})}
    assert rows["jobs_c8_against"]["ratio"] == pytest.approx(1.02)
    assert rows["jobs_c8_against"]["holds"] is True
