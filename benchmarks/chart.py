"""Draw ``docs/benchmarks.png`` from ``benchmarks/results/latest.json``.

``python benchmarks/chart.py RESULTS.json OUT.png``. It needs only the standard library and
matplotlib, so it runs under whichever interpreter has matplotlib (``run.py`` looks in its
own, ``benchmarks/.venv-tools`` and ``benchmarks/.venv-reference``). Without matplotlib it
writes a plain SVG next to the requested path instead.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

TRIO_COLOR = "#2b7bba"
REF_COLOR = "#c44e52"

# (panel title, y label, log scale, [(row key, bar label, scale to the unit)], {key: target})
PANELS: list[tuple[str, str, bool, list[tuple[str, str, float]], dict[str, float]]] = [
    (
        "Throughput (higher is better)",
        "per second (log)",
        True,
        [
            ("jobs_c1", "jobs/s\nc=1", 1.0),
            ("jobs_c8", "jobs/s\nc=8", 1.0),
            ("jobs_c64", "jobs/s\nc=64", 1.0),
            ("stream", "chunks/s\nstream", 1.0),
        ],
        {"jobs_c1": 300.0, "jobs_c8": 1000.0},
    ),
    (
        "Latency (lower is better)",
        "milliseconds (log)",
        True,
        [
            ("overhead_p50", "take→done\np50", 1.0),
            ("overhead_p99", "take→done\np99", 1.0),
            ("first_take", "start→\nfirst take", 1000.0),
            ("stop", "stop→\ncancelled", 1.0),
            ("init_failure", "init fail→\nreported", 1.0),
            ("import", "import", 1.0),
        ],
        {"overhead_p50": 1.0, "first_take": 300.0, "stop": 10.0, "init_failure": 100.0},
    ),
    (
        "Memory (lower is better)",
        "MiB",
        False,
        [("idle_rss", "idle", 1.0), ("load_rss", "peak\nc=64", 1.0)],
        {"idle_rss": 40.0},
    ),
]


def _label(value: float) -> str:
    if value >= 1000:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.0f}"
    return f"{value:.2g}"


def draw_png(data: dict[str, Any], out: Path) -> None:
    import matplotlib  # type: ignore[import-not-found, unused-ignore]

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # type: ignore[import-not-found, unused-ignore]

    rows = {row["key"]: row for row in data["rows"]}
    has_ref = any(row["reference"] is not None for row in data["rows"])
    fig, axes = plt.subplots(
        1, 3, figsize=(15, 5.2), gridspec_kw={"width_ratios": [4, 6, 2.2]}, layout="constrained"
    )
    width = 0.38 if has_ref else 0.6
    for ax, (title, ylabel, log, bars, targets) in zip(axes, PANELS, strict=True):
        for i, (key, _, scale) in enumerate(bars):
            row = rows.get(key, {})
            series = [("trio_worker", TRIO_COLOR, -width / 2 if has_ref else 0.0)]
            if has_ref:
                series.append(("reference", REF_COLOR, width / 2))
            for name, color, offset in series:
                value = row.get(name)
                if value is None:
                    if name == "reference":
                        ax.text(
                            i + offset,
                            0.02,
                            "n/a",
                            ha="center",
                            transform=ax.get_xaxis_transform(),
                            fontsize=8,
                            color=REF_COLOR,
                        )
                    continue
                value *= scale
                ax.bar(i + offset, value, width, color=color)
                ax.annotate(
                    _label(value),
                    (i + offset, value),
                    ha="center",
                    va="bottom",
                    fontsize=8,
                    xytext=(0, 2),
                    textcoords="offset points",
                )
            if key in targets:
                ax.hlines(
                    targets[key],
                    i - 0.45,
                    i + 0.45,
                    colors="black",
                    linestyles="dashed",
                    linewidth=1.2,
                )
        ax.set_xticks(range(len(bars)), [label for _, label, _ in bars], fontsize=9)
        ax.set_title(title, fontsize=11)
        ax.set_ylabel(ylabel)
        if log:
            ax.set_yscale("log")
        ax.margins(y=0.15)
        ax.grid(axis="y", alpha=0.3)
    handles = [plt.Rectangle((0, 0), 1, 1, color=TRIO_COLOR)]
    labels = ["trio_worker"]
    if has_ref:
        handles.append(plt.Rectangle((0, 0), 1, 1, color=REF_COLOR))
        labels.append(f"runpod {data['machine'].get('runpod', '')} (reference)")
    handles.append(plt.Line2D([0], [0], color="black", linestyle="dashed"))
    labels.append("docs/design.md §11 target")
    fig.legend(handles, labels, loc="outside lower center", ncol=3, frameon=False)
    machine = data["machine"]
    fig.suptitle(
        f"trio_worker benchmarks — {machine['cpu']}, {machine['cores']} cores, "
        f"Python {machine['python']}, {machine['date'][:10]}",
        fontsize=12,
    )
    fig.savefig(out, dpi=110)
    plt.close(fig)


def draw_svg(data: dict[str, Any], out: Path) -> None:
    """A plain SVG fallback: one pair of bars per row, on a log scale per row."""
    rows = [r for r in data["rows"] if r["trio_worker"] is not None]
    height = 40 + 34 * len(rows)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="900" height="{height}" '
        'font-family="sans-serif" font-size="12">',
        '<text x="10" y="20" font-size="14">trio_worker benchmarks '
        "(blue: trio_worker, red: reference; bar length on a log scale per row)</text>",
    ]
    for i, row in enumerate(rows):
        y = 40 + 34 * i
        values = [v for v in (row["trio_worker"], row["reference"]) if v is not None and v > 0]
        top = math.log10(max(values)) + 1
        parts.append(f'<text x="10" y="{y + 14}">{row["label"]}</text>')
        for j, (key, color) in enumerate((("trio_worker", TRIO_COLOR), ("reference", REF_COLOR))):
            value = row[key]
            if value is None or value <= 0:
                continue
            length = max(2.0, 300 * (math.log10(value) + 1) / top)
            parts.append(
                f'<rect x="330" y="{y + j * 13}" width="{length:.0f}" height="11" fill="{color}"/>'
                f'<text x="{336 + length:.0f}" y="{y + j * 13 + 10}">{row["text"][key]}</text>'
            )
    parts.append("</svg>")
    out.write_text("\n".join(parts) + "\n")


def main(argv: list[str]) -> int:
    source, out = Path(argv[1]), Path(argv[2])
    data = json.loads(source.read_text())
    try:
        import matplotlib  # type: ignore[import-not-found, unused-ignore]  # noqa: F401
    except ImportError:
        svg = out.with_suffix(".svg")
        draw_svg(data, svg)
        print(f"matplotlib is not installed: wrote {svg}")
        return 0
    draw_png(data, out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
