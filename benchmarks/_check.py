"""``run.py --check``: this checkout's figures against the committed table.

The regression guard is a benchmark, not a timed test. It compares trio_worker's figures
of a fresh run with ``benchmarks/results/latest.json`` and fails (exit 1) when any figure
is more than 20% worse: a rate (jobs/s, chunks/s) more than 20% lower, a CPU time, latency
or memory more than 20% higher. Figures only compare on the same machine class (CPU model
and core count) and at the same sizes (a ``--quick`` table is not a baseline): otherwise
the check says why and exits 2, "cannot tell", so that a script does not read it as a pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Result = dict[str, Any]
TOLERANCE = 0.20
PASS, WORSE, NOT_COMPARABLE = 0, 1, 2


@dataclass(frozen=True)
class Line:
    key: str
    label: str
    better: str
    baseline: float
    current: float | None  # None: not measured this time

    @property
    def worse_by(self) -> float | None:
        """How much worse the current figure is, as a fraction (negative: better)."""
        if self.current is None or self.baseline <= 0:
            return None
        if self.better == "higher":
            return (self.baseline - self.current) / self.baseline
        return (self.current - self.baseline) / self.baseline

    def fails(self, tolerance: float) -> bool:
        worse = self.worse_by
        return worse is not None and worse > tolerance


@dataclass(frozen=True)
class Comparison:
    comparable: bool
    reason: str = ""
    lines: list[Line] = field(default_factory=list)
    tolerance: float = TOLERANCE

    @property
    def failed(self) -> list[Line]:
        return [line for line in self.lines if line.fails(self.tolerance)]

    @property
    def exit_code(self) -> int:
        if not self.comparable:
            return NOT_COMPARABLE
        return WORSE if self.failed else PASS


def machine_class(machine: Result) -> tuple[str, int] | None:
    cpu, cores = machine.get("cpu"), machine.get("cores")
    if not isinstance(cpu, str) or not isinstance(cores, int):
        return None
    return cpu, cores


def _figures(payload: Result) -> dict[str, Result]:
    """trio_worker's figures of a latest.json payload, by key: the table's rows and the
    targets' (a figure in both has the same key and value)."""
    figures: dict[str, Result] = {}
    for row in [*payload.get("rows", []), *payload.get("targets", [])]:
        if isinstance(row.get("trio_worker"), int | float) and row.get("better"):
            figures[row["key"]] = row
    return figures


def compare(baseline: Result, current: Result, tolerance: float = TOLERANCE) -> Comparison:
    """Compare two latest.json payloads (``machine``, ``settings``, ``rows``, ``targets``)."""
    old_class = machine_class(baseline.get("machine", {}))
    new_class = machine_class(current.get("machine", {}))
    if old_class is None or old_class != new_class:
        return Comparison(
            False, f"the baseline was measured on {old_class}, this machine is {new_class}"
        )
    if bool(baseline.get("settings", {}).get("quick")) != bool(
        current.get("settings", {}).get("quick")
    ):
        return Comparison(False, "one of the two runs is a --quick run: sizes differ")
    old, new = _figures(baseline), _figures(current)
    lines = [
        Line(
            key,
            row["label"],
            row["better"],
            float(row["trio_worker"]),
            float(new[key]["trio_worker"]) if key in new else None,
        )
        for key, row in old.items()
    ]
    return Comparison(True, lines=lines, tolerance=tolerance)


def render(comparison: Comparison) -> str:
    if not comparison.comparable:
        return f"--check cannot compare: {comparison.reason}\n"
    rows = [
        "| figure | committed | now | worse by | verdict |",
        "|---|---:|---:|---:|:---:|",
    ]
    for line in comparison.lines:
        worse = line.worse_by
        now = "not measured" if line.current is None else f"{line.current:.4g}"
        change = "–" if worse is None else f"{worse:+.0%}"
        verdict = "**worse**" if line.fails(comparison.tolerance) else "ok"
        if line.current is None:
            verdict = "skipped"
        rows.append(f"| {line.label} | {line.baseline:.4g} | {now} | {change} | {verdict} |")
    failed = len(comparison.failed)
    summary = (
        f"{failed} figure(s) more than {comparison.tolerance:.0%} worse than the committed table"
        if failed
        else f"no figure more than {comparison.tolerance:.0%} worse than the committed table"
    )
    return "\n".join(rows) + f"\n\n{summary}\n"
