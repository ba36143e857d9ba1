"""The table of ratio targets: CPU per chunk and per job, latency, start-up, old code.

Each target is a ratio measured in one run (against the reference, the floor or an older
commit), not an absolute time: on a shared machine an absolute time means little, a ratio
of two figures taken minutes apart on the same machine holds (docs/benchmarks.md,
"Targets"). Where the two figures were measured in alternating rounds
(``benchmarks/_paired.py``), the ratio is the median of the rounds' ratios; the two
figures shown are each side's median. Every row says how busy the machine was, outside
the benchmark, while its figures ran.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from collections.abc import Callable

Result = dict[str, Any]


def at(result: Any, path: tuple[str, ...]) -> Any:
    """What *path* leads to through nested dicts; None where it leads nowhere."""
    value = result
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def dig(result: Result | None, path: tuple[str, ...]) -> float | None:
    value = at(result, path)
    return float(value) if isinstance(value, int | float) else None


@dataclass(frozen=True)
class Target:
    """One row: trio_worker's figure, what it is compared with, and the target."""

    key: str
    label: str
    unit: Literal["µs", "ms", "s", "chunks/s", "jobs/s"]
    better: Literal["higher", "lower"]
    path: tuple[str, ...]  # in trio_worker's results (and the reference's, unless ref_path)
    target: str
    # The figure trio_worker's is measured against, from (trio_worker's results, the
    # reference's): the ratio is taken against it, the target is a bound on that ratio.
    base: Callable[[Result, Result | None], float | None]
    base_name: str  # how the ratio column names the base: "reference", "the floor"...
    bound: float | None  # the ratio (base/value for lower-is-better) must be >= bound
    figures: tuple[str, ...]  # result keys whose machine load the row reports
    ref_path: tuple[str, ...] | None = None
    # Where the whole run's results keep the row's ratio round by round, when its two
    # figures were measured in alternating rounds (benchmarks/_figures.alternating): the
    # ratio is then the median of those, not the ratio of the two figures shown.
    rounds: tuple[str, ...] | None = None


def _paired(key: str) -> tuple[str, ...]:
    return ("paired", "ratios", key)


def _reference(path: tuple[str, ...]) -> Callable[[Result, Result | None], float | None]:
    return lambda _trio, ref: dig(ref, path)


PACED_CPU = ("paced", "cpu_us_per_chunk")
TARGETS: tuple[Target, ...] = (
    Target(
        "cpu_chunk_asyncio",
        "CPU per streamed chunk, 64 async-generator streams at 50 chunks/s, asyncio backend",
        "µs",
        "lower",
        PACED_CPU,
        "at most 1/3 of the reference's",
        _reference(PACED_CPU),
        "reference",
        3.0,
        ("paced",),
        rounds=_paired("cpu_chunk_asyncio"),
    ),
    Target(
        "cpu_chunk_trio",
        "same, trio backend (against the reference's, which runs on asyncio)",
        "µs",
        "lower",
        ("paced_trio", "cpu_us_per_chunk"),
        "at most 1/3 of the reference's",
        _reference(PACED_CPU),
        "reference",
        3.0,
        ("paced_trio", "paced"),
        ref_path=PACED_CPU,
        rounds=_paired("cpu_chunk_trio"),
    ),
    # What no SDK can remove from those two rows: the generator's own timer wake-ups and
    # chunks, measured with no SDK (benchmarks/handler_alone.py), its streams started
    # together (the cheapest case) and phased over an interval (as the run's are). No
    # bound: they say how much of the 1/3 bound is left for the SDK itself.
    *(
        Target(
            f"handler_{start}_{backend}",
            f"the paced handler alone, no SDK, on {backend}, {how} (its own CPU per chunk)",
            "µs",
            "lower",
            ("handler_alone", backend, *phase, "cpu_us_per_chunk"),
            "",
            _reference(PACED_CPU),
            "reference",
            None,
            ("handler_alone",),
            ref_path=PACED_CPU,
        )
        for start, how, phase in (
            ("alone", "streams started together", ()),
            ("phased", "streams phased over an interval", ("phased",)),
        )
        for backend in ("asyncio", "trio")
    ),
    Target(
        "paced_p50",
        "yield-to-receipt latency p50, same load (asyncio)",
        "ms",
        "lower",
        ("paced", "latency_ms", "p50"),
        "",
        _reference(("paced", "latency_ms", "p50")),
        "reference",
        None,
        ("paced",),
    ),
    Target(
        "paced_p99",
        "yield-to-receipt latency p99, same load (asyncio)",
        "ms",
        "lower",
        ("paced", "latency_ms", "p99"),
        "at most 1/3 of the reference's, same run",
        _reference(("paced", "latency_ms", "p99")),
        "reference",
        3.0,
        ("paced",),
        rounds=_paired("paced_p99"),
    ),
    Target(
        "streams64",
        "chunks/s with no gap, 64 streams (asyncio)",
        "chunks/s",
        "higher",
        ("streams", "chunks_per_s"),
        "at least 2× the reference's",
        _reference(("streams", "chunks_per_s")),
        "reference",
        2.0,
        ("streams",),
    ),
    Target(
        "cpu_job_sync",
        "CPU per no-op job (a sync handler), concurrency 8",
        "µs",
        "lower",
        ("noop_cpu", "cpu_us_per_job"),
        "at most 3× a raw blocking-socket take/done loop's",
        lambda trio, _ref: dig(trio, ("floor", "cpu_us_per_job")),
        "the floor",
        1 / 3,
        ("noop_cpu", "floor"),
        rounds=_paired("cpu_job_sync"),
    ),
    Target(
        "first_take",
        "process start to first take",
        "s",
        "lower",
        ("startup", "first_take_s"),
        "at most 1/5 of the reference's, same run",
        _reference(("startup", "first_take_s")),
        "reference",
        5.0,
        ("startup",),
    ),
    Target(
        "jobs_c8_against",
        "no-op jobs/s, concurrency 8, alternating with an older commit",
        "jobs/s",
        "higher",
        ("against", "current_jobs_per_s"),
        "at least the older commit's",
        lambda trio, _ref: dig(trio, ("against", "old_jobs_per_s")),
        "",  # named after the commit, see build_targets
        1.0,
        ("against",),
        ref_path=("throughput", "8", "jobs_per_s"),
        rounds=("trio_worker", "against", "ratios"),
    ),
)


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "–"
    if value >= 100:
        number = f"{value:,.0f}"
    elif value >= 10:
        number = f"{value:.1f}"
    else:
        number = f"{value:.3g}"
    return f"{number} {unit}"


def _load_text(results: dict[str, Result], row: Target) -> str:
    """ "trio_worker 3% (max 21%), reference 1% (max 40%)": others' CPU during the figures."""
    parts = []
    for sdk, result in results.items():
        loads = [
            load
            for key in row.figures
            if isinstance(load := (result.get("loads") or {}).get(key), dict)
            and load.get("mean_pct") is not None
        ]
        if loads:
            mean = max(float(load["mean_pct"]) for load in loads)
            top = max(float(load["max_pct"]) for load in loads)
            parts.append(f"{'reference' if sdk == 'reference' else sdk} {mean:g}% (max {top:g}%)")
    return ", ".join(parts) or "–"


def build_targets(results: dict[str, Result]) -> list[Result]:
    """The rows as data, for latest.json, the Markdown table and ``--check``."""
    trio = results.get("trio_worker", {})
    ref = results.get("reference")
    commit = (trio.get("against") or {}).get("commit")
    rows: list[Result] = []
    for row in TARGETS:
        value = dig(trio, row.path)
        base = row.base(trio, ref)
        ratio = None
        rounds = _round_ratios(results, row.rounds)
        if rounds:
            ratio = statistics.median(rounds)
        elif value is not None and base is not None and value > 0 and base > 0:
            ratio = value / base if row.better == "higher" else base / value
        holds = None if ratio is None or row.bound is None else ratio >= row.bound
        base_name = row.base_name or (f"{commit}'s" if commit else "the older commit's")
        ref_value = dig(ref, row.ref_path or row.path) if ref is not None else None
        target = row.target
        if row.key == "cpu_job_sync" and base is not None:
            target += f" ({fmt(base, 'µs')} here)"
        elif row.key == "jobs_c8_against" and base is not None:
            target = f"at least {base_name} {fmt(base, 'jobs/s')}"
        elif row.key.startswith("handler_") and base is not None and value is not None:
            left = base / 3 - value
            target = (
                f"leaves the SDK {fmt(left, 'µs')} per chunk under the 1/3 bound "
                f"({fmt(base / 3, 'µs')})"
                if left > 0
                else f"alone above the 1/3 bound ({fmt(base / 3, 'µs')})"
            )
        rows.append(
            {
                "key": row.key,
                "label": row.label,
                "unit": row.unit,
                "better": row.better,
                "trio_worker": value,
                "reference": ref_value,
                "base": base,
                "ratio": ratio,
                "ratio_rounds": rounds,
                "target": target,
                "holds": holds,
                "text": {
                    "trio_worker": fmt(value, row.unit),
                    "reference": "not run" if ref is None else fmt(ref_value, row.unit),
                    "ratio": _ratio_text(ratio, row, base_name) + _rounds_text(rounds),
                    "load": _load_text(results, row),
                },
            }
        )
    return rows


def _round_ratios(results: dict[str, Result], path: tuple[str, ...] | None) -> list[float]:
    found = None if path is None else at(results, path)
    if not isinstance(found, list):
        return []
    return [float(r) for r in found if isinstance(r, int | float)]


def _rounds_text(rounds: list[float]) -> str:
    if not rounds:
        return ""
    if len(rounds) == 1:
        return " (one round)"
    return f" (median of {len(rounds)} alternating rounds)"


def _times(factor: float) -> str:
    return f"{factor:,.0f}×" if factor >= 10 else f"{factor:.2f}×"


def _ratio_text(ratio: float | None, row: Target, base_name: str) -> str:
    """ "2.20× less than the reference"; for the floor "4.10× the floor"."""
    if ratio is None:
        return "–"
    if row.key == "cpu_job_sync":
        return f"{_times(1 / ratio)} {base_name}"
    if row.key == "jobs_c8_against":
        return f"{_times(ratio)} {base_name}"
    word = "more" if row.better == "higher" else "less"
    if ratio >= 1:
        return f"{_times(ratio)} {word} than the {base_name}"
    return f"the {base_name}'s is {_times(1 / ratio)} {word}"


def markdown(rows: list[Result], reference_name: str) -> str:
    """figure | reference | trio_worker | ratio | target | holds | others' CPU meanwhile."""
    lines = [
        f"| figure | {reference_name} | trio_worker | ratio | target | holds "
        "| other processes' CPU meanwhile (mean, max over half a second) |",
        "|---|---:|---:|---:|---|:---:|---|",
    ]
    for row in rows:
        text = row["text"]
        holds = {True: "yes", False: "**no**", None: ""}[row["holds"]]
        lines.append(
            f"| {row['label']} | {text['reference']} | {text['trio_worker']} | {text['ratio']} "
            f"| {row['target']} | {holds} | {text['load']} |"
        )
    return "\n".join(lines) + "\n"
