"""The figures that ratio targets rest on, measured in alternating rounds.

A ratio target compares two figures of one run: trio_worker's CPU per paced chunk with the
reference's, and its CPU per no-op sync job with the floor's. Measured one SDK after the
other, minutes apart, such a ratio also measures how the machine's speed moved in between:
on the 2-core machines this project is measured on, the same code read 30-45% apart in
runs minutes apart, and the floor 58% (docs/benchmarks.md, "What is left"). So these
figures are taken in rounds. Each round measures every side once, in an order that turns
round with every round (A B C, then C B A, ...), so that neither side always runs first or
in the same phase of the machine; a ratio is the median of its rounds' ratios, each taken
between two figures measured minutes apart at most. Each side's own figure is still the
median of its samples, as before, and every sample is in ``latest.json``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from benchmarks import _cpu_figures
from benchmarks._figures import alternating, round_ratios

if TYPE_CHECKING:
    from collections.abc import Callable

    from benchmarks._figures import Bench, Result
    from benchmarks._sdks import Sdk


@dataclass
class _Figure:
    """One side: an SDK's figure (``owner``, ``key`` as in its results), measured once a
    round by ``measure``, which returns the figure's number (None when it has none) and
    the run behind it."""

    owner: str
    key: str
    name: str
    measure: Callable[[], tuple[float | None, Result]]
    summarize: Callable[[list[Any]], Result]  # the figure from its measured rounds
    rounds: list[tuple[float | None, Result] | None] = field(default_factory=list)
    error: str | None = None

    def take(self, say: Callable[[str], None]) -> None:
        """Measure once more; after a failure, record None for this and every later round
        (the run goes on, as for any figure)."""
        if self.error is not None:
            self.rounds.append(None)
            return
        started = time.monotonic()
        try:
            self.rounds.append(self.measure())
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            self.rounds.append(None)
            say(f"  {self.name}: FAILED: {self.error}")
            return
        say(f"  {self.name}: done in {time.monotonic() - started:.1f} s")

    def values(self, of_run: Callable[[Result], float | None] | None = None) -> list[float | None]:
        """Each round's number (None where it failed), or what *of_run* reads from each
        round's run."""
        return [
            None if sample is None else sample[0] if of_run is None else of_run(sample[1])
            for sample in self.rounds
        ]

    def figure(self) -> Result:
        measured = [sample for sample in self.rounds if sample is not None]
        if not measured:
            return {"error": self.error or "not measured"}
        result = self.summarize(measured)
        if self.error is not None:
            result["error_in_a_round"] = self.error
        return result


def _p99(run: Result) -> float | None:
    value = run.get("latency_ms", {}).get("p99")
    return float(value) if isinstance(value, int | float) else None


def paired_figures(
    bench: Bench, trio: Sdk, reference: Sdk | None, say: Callable[[str], None]
) -> dict[str, Any]:
    """trio_worker's paced (asyncio, trio), sync-job and floor figures, and the
    reference's paced one, in ``ratio_rounds`` alternating rounds.

    Returns ``{"trio_worker": {key: figure}, "reference": {key: figure}, "paired":
    {"rounds": n, "ratios": {target key: [one ratio per round]}}}``: the figures under
    the keys the per-SDK results use (``paced``, ``paced_trio``, ``noop_cpu``, ``floor``),
    and the rounds' ratios as the targets orient them (base over trio_worker's).
    """
    paced = _Figure(
        "trio_worker",
        "paced",
        "64 paced streams, CPU per chunk",
        lambda: _cpu_figures.paced_pair(bench, trio, "asyncio"),
        _cpu_figures.paced_figure,
    )
    paced_trio = _Figure(
        "trio_worker",
        "paced_trio",
        "64 paced streams, CPU per chunk, trio backend",
        lambda: _cpu_figures.paced_pair(bench, trio, "trio"),
        _cpu_figures.paced_figure,
    )
    sync = _Figure(
        "trio_worker",
        "noop_cpu",
        "CPU per no-op sync job, c=8",
        lambda: _cpu_figures.noop_cpu_pair(bench, trio),
        lambda measured: _cpu_figures.noop_cpu_figure(measured, trio),
    )
    floor = _Figure(
        "trio_worker",
        "floor",
        "the floor (raw socket loop)",
        lambda: _cpu_figures.floor_once(bench),
        _cpu_figures.floor_figure,
    )
    figures = [paced, paced_trio, sync, floor]
    reference_paced: _Figure | None = None
    if reference is not None:
        reference_paced = _Figure(
            "reference",
            "paced",
            f"{reference.label}: 64 paced streams, CPU per chunk",
            lambda: _cpu_figures.paced_pair(bench, reference, "asyncio"),
            _cpu_figures.paced_figure,
        )
        # Between trio_worker's two paced figures, so that each is next to it in turn.
        figures.insert(1, reference_paced)
    rounds = bench.settings.ratio_rounds
    alternating(rounds, [partial(figure.take, say) for figure in figures])
    ratios: dict[str, list[float]] = {}
    if reference_paced is not None:
        # As the targets orient them: the base over trio_worker's figure.
        theirs = reference_paced.values()
        ratios["cpu_chunk_asyncio"] = round_ratios(theirs, paced.values())
        ratios["cpu_chunk_trio"] = round_ratios(theirs, paced_trio.values())
        ratios["paced_p99"] = round_ratios(reference_paced.values(_p99), paced.values(_p99))
    ratios["cpu_job_sync"] = round_ratios(floor.values(), sync.values())
    out: dict[str, Any] = {
        "trio_worker": {},
        "reference": {},
        "paired": {"rounds": rounds, "ratios": ratios},
    }
    for figure in figures:
        out[figure.owner][figure.key] = figure.figure()
    return out
