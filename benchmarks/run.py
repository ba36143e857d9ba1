"""Benchmark trio_worker (and, on request, the reference SDK) against the fake platform.

    python benchmarks/run.py [--quick] [--with-reference] [--jobs N] [--against COMMIT]
    python benchmarks/run.py --check [--baseline FILE]

Starts the fake platform as its own process on loopback, runs worker processes of each SDK
against preloaded queues, prints a Markdown table to stdout (progress goes to stderr) and
writes ``benchmarks/results/latest.md`` and ``latest.json``; a full run also puts the table
into ``docs/benchmarks.md`` and draws ``docs/benchmarks.png``. ``--quick`` (about 10-30 s)
writes to ``benchmarks/results/quick/`` instead. ``--check`` compares trio_worker's figures
with the committed table and writes nothing. See docs/benchmarks.md for what each figure
means and how it is measured.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import (
    _against,
    _check,
    _cpu_figures,
    _figures,
    _life_figures,
    _paired,
    _report,
    _sdks,
    _stream_figures,
    _targets,
    _watch_figures,
    lb_figures,
)
from benchmarks._platform import PlatformProcess
from benchmarks._procs import LoadMonitor, wait_quiet

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results"


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/run.py", description=__doc__.split("\n", 1)[0]
    )
    parser.add_argument("--quick", action="store_true", help="small sizes (about 30 s)")
    parser.add_argument(
        "--with-reference",
        action="store_true",
        help="also run the reference SDK (runpod, installed into benchmarks/.venv-reference)",
    )
    parser.add_argument(
        "--jobs", type=int, default=None, help="trio_worker jobs per throughput run"
    )
    parser.add_argument(
        "--output-dir",
        type=Path,
        default=None,
        help="where latest.md, latest.json (and the chart) go; default benchmarks/results, "
        "whose results also go into docs/benchmarks.md and docs/benchmarks.png; "
        "benchmarks/results/quick with --quick",
    )
    parser.add_argument("--chart", type=Path, default=None, help="chart path (see --output-dir)")
    parser.add_argument("--no-chart", action="store_true", help="do not draw the chart")
    parser.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="wait up to this long for the machine to be under 10%% busy before starting",
    )
    parser.add_argument(
        "--keep-logs", action="store_true", help="keep the worker logs (their folder is printed)"
    )
    parser.add_argument(
        "--against",
        default=_against.FIRST_WAVE,
        metavar="COMMIT",
        help="also measure no-op jobs/s at c=8 alternately on COMMIT (a throwaway git "
        "worktree) and on this checkout; default %(default)s (the first wave); '' skips it",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="run trio_worker's figures and compare them with --baseline: exit 1 if any is "
        "more than 20%% worse, 2 if the baseline is of another machine class or size; "
        "writes nothing unless --output-dir is given",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        default=RESULTS / "latest.json",
        help="the table --check compares with (default: the committed one)",
    )
    args = parser.parse_args(argv)
    if args.check and args.quick:
        parser.error("--check runs the full sizes of the committed table: no --quick")
    args.publish = args.output_dir is None and not args.quick and not args.check
    args.write = args.output_dir is not None or not args.check
    if args.output_dir is None:
        args.output_dir = RESULTS / "quick" if args.quick else RESULTS
    if args.jobs is not None and args.jobs < 1:
        parser.error("--jobs must be at least 1")
    return args


def _attempt(
    name: str,
    results: dict[str, Any],
    key: str,
    fn: Callable[[], Any],
    spans: dict[str, tuple[float, float]] | None = None,
) -> None:
    """Run one figure; a failure is recorded and reported, and the run goes on. Its span
    (monotonic start and end) goes into *spans*, for the machine's load meanwhile."""
    started = time.monotonic()
    try:
        results[key] = fn()
    except Exception as exc:
        results[key] = {"error": f"{type(exc).__name__}: {exc}"}
        say(f"  {name}: FAILED: {type(exc).__name__}: {exc}")
        return
    finally:
        if spans is not None:
            spans[key] = (started, time.monotonic())
    say(f"  {name}: done in {time.monotonic() - started:.1f} s")


def run_sdk(
    bench: _figures.Bench,
    sdk: _sdks.Sdk,
    spans: dict[str, tuple[float, float]],
    *,
    against: str = "",
    check: bool = False,
) -> dict[str, Any]:
    """Every figure of *sdk*. ``check``: leave out the slowest (the crash watch pairs and
    the older commit's, whose c=8 jobs/s the c=8 row already covers)."""
    say(f"{sdk.label} {sdk.version}:")
    bench.warm_up(sdk)
    results: dict[str, Any] = {"version": sdk.version}
    trio = sdk.key == "trio_worker"

    def attempt(name: str, key: str, fn: Callable[[], Any]) -> None:
        _attempt(name, results, key, fn, spans)

    throughput: dict[str, Any] = {}
    for concurrency in bench.settings.concurrencies:
        _attempt(
            f"throughput c={concurrency}",
            throughput,
            str(concurrency),
            partial(_figures.throughput, bench, sdk, concurrency),
            spans,
        )
    results["throughput"] = throughput
    attempt("start-up, idle memory", "startup", partial(_life_figures.startup, bench, sdk))
    attempt("stop signal", "stop", partial(_life_figures.stop_signal, bench, sdk))
    attempt("streaming", "stream", partial(_stream_figures.streaming, bench, sdk))
    attempt("64 streams", "streams", partial(_stream_figures.many_streams, bench, sdk))
    # The paced-streams figures, trio_worker's sync job and the floor are the ratio
    # targets' figures: measured afterwards, in alternating rounds (benchmarks/_paired.py).
    if not trio:
        # The reference's own figure, which no ratio target rests on.
        attempt(
            "CPU per no-op sync job, c=8", "noop_cpu", partial(_cpu_figures.noop_cpu, bench, sdk)
        )
    else:
        attempt(
            "the paced handler alone, no SDK",
            "handler_alone",
            partial(_cpu_figures.handler_alone, bench),
        )
        attempt("init failure", "init_failure", partial(_life_figures.init_failure, bench, sdk))
        attempt(
            "throughput c=8, trio and asyncio backends alternating",
            "backends_c8",
            partial(_figures.backend_pair, bench, sdk, 8),
        )
        attempt(
            "64 streams, trio backend",
            "streams_trio",
            partial(_stream_figures.many_streams, bench, sdk, "trio"),
        )
        if against and not check:
            attempt(
                f"throughput c=8, alternating with {against}",
                "against",
                partial(_against.against, bench, sdk, against),
            )
        if not check:
            # The crash watchdog's cost: docs/design.md §13.
            attempt(
                "crash watch on/off", "crash_watch", partial(_watch_figures.crash_watch, bench, sdk)
            )
            if "error" not in results["crash_watch"]:
                say(_watch_figures.summary(results["crash_watch"]))
            # Load-balancing endpoints: start_app beside hypercorn and uvicorn alone.
            attempt(
                "load-balancing endpoint: start_app, hypercorn, uvicorn alternating",
                "lb",
                partial(lb_figures.lb, sdk.python, quick=bench.settings.quick, say=say),
            )
            if "error" not in results["lb"]:
                say(lb_figures.markdown(results["lb"]))
    results["import_ms"] = _import_ms(bench, sdk)
    return results


def _import_ms(bench: _figures.Bench, sdk: _sdks.Sdk) -> float | None:
    module = "runpod" if sdk.key == "reference" else "trio_worker"
    samples = [
        ms
        for _ in range(bench.settings.import_repeats)
        if (ms := _sdks.python_import_ms(sdk.python, module, bench.env())) is not None
    ]
    return _figures.median(samples)


def _chart_python() -> str | None:
    """An interpreter with matplotlib: this one, the tools venv or the reference venv."""
    candidates = [
        Path(sys.executable),
        _sdks.venv_python(_sdks.TOOLS_VENV),
        _sdks.venv_python(_sdks.REFERENCE_VENV),
    ]
    for python in candidates:
        if python.exists():
            probe = subprocess.run(
                [str(python), "-c", "import matplotlib"], capture_output=True, check=False
            )
            if probe.returncode == 0:
                return str(python)
    return None


def draw_chart(results_json: Path, out: Path, *, may_install: bool) -> None:
    python = _chart_python()
    if python is None and may_install:
        installed = _sdks.ensure_venv(_sdks.TOOLS_VENV, ["matplotlib"], say, module="matplotlib")
        python = str(installed) if installed is not None else None
    # Without matplotlib, chart.py writes an SVG instead.
    chart = subprocess.run(
        [python or sys.executable, str(HERE / "chart.py"), str(results_json), str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    if chart.returncode != 0:
        say(f"chart failed:\n{chart.stderr[-2000:]}")
    else:
        say(chart.stdout.strip())


DOCS = REPO / "docs" / "benchmarks.md"
BEGIN, END = "<!-- latest-results:begin -->", "<!-- latest-results:end -->"


def update_docs(table: str, docs: Path = DOCS) -> bool:
    """Put *table* between the markers of docs/benchmarks.md; False if there are none."""
    try:
        text = docs.read_text()
    except FileNotFoundError:
        return False
    head, begin, rest = text.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        return False
    docs.write_text(f"{head}{BEGIN}\n{table}{END}{tail}")
    return True


def _baseline(args: argparse.Namespace) -> dict[str, Any] | None:
    """The committed table --check compares with; None (after saying why) if it cannot."""
    try:
        baseline: dict[str, Any] = json.loads(args.baseline.read_text())
    except (OSError, ValueError) as exc:
        say(f"--check: no baseline at {args.baseline}: {exc}")
        return None
    mismatch = _check.compare(baseline, {"machine": _report.machine_info(None)})
    if not mismatch.comparable:
        say(f"--check: {mismatch.reason}; nothing to compare with (exit 2)")
        return None
    return baseline


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    settings = _figures.Settings.for_run(args.quick, args.jobs)
    baseline: dict[str, Any] | None = None
    if args.check:
        baseline = _baseline(args)
        if baseline is None:
            return _check.NOT_COMPARABLE
    reference: _sdks.Sdk | None = None
    if args.with_reference and not args.check:
        reference = _sdks.reference_sdk(say)
        if reference is None:
            say("the reference SDK is not available: running trio_worker only")
    sdks = [_sdks.trio_worker_sdk()] + ([reference] if reference is not None else [])
    busy_before = wait_quiet(args.wait_quiet, say)
    started = time.monotonic()  # the run proper: not the install, not the wait
    monitor = LoadMonitor()
    monitor.start()
    workdir = Path(tempfile.mkdtemp(prefix="trio-worker-bench-"))
    results: dict[str, Any] = {}
    spans: dict[str, dict[str, tuple[float, float]]] = {}
    failed = False
    try:
        with PlatformProcess(workdir) as platform:
            bench = _figures.Bench(platform, workdir, settings, say)
            for sdk in sdks:
                sdk_started = time.monotonic()
                spans[sdk.key] = {}
                results[sdk.key] = run_sdk(
                    bench, sdk, spans[sdk.key], against=args.against, check=args.check
                )
                load = monitor.summary(sdk_started, time.monotonic())
                results[sdk.key]["others_load"] = load
            paired_started = time.monotonic()
            paired = _paired.paired_figures(bench, sdks[0], reference, say)
            span = (paired_started, time.monotonic())
            for sdk in sdks:
                results[sdk.key].update(paired[sdk.key])
                spans[sdk.key].update(dict.fromkeys(paired[sdk.key], span))
            results["paired"] = paired["paired"]
    except BaseException:
        failed = True
        raise
    finally:
        if failed or args.keep_logs:
            say(f"worker and platform logs: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    machine = _report.machine_info(reference)
    machine["busy_before_pct"] = busy_before
    machine["others_during_run"] = monitor.stop()
    for key, figure_spans in spans.items():
        results[key]["loads"] = {
            figure: monitor.summary(start, end) for figure, (start, end) in figure_spans.items()
        }
    settings_dict = {
        "quick": settings.quick,
        "jobs": settings.jobs,
        "reference_seconds": settings.reference_seconds,
        "start_repeats": settings.start_repeats,
        "stop_jobs": settings.stop_jobs,
        "init_repeats": settings.init_repeats,
        "stream_chunks": settings.stream_chunks,
        "paced_chunks": [settings.paced_short_chunks, settings.paced_chunks],
        "noop_cpu_jobs": [settings.short_jobs, settings.jobs],
        "reference_cpu_seconds": list(settings.reference_cpu_seconds),
        "floor_jobs": settings.floor_jobs,
        "ratio_rounds": settings.ratio_rounds,
        "against": args.against,
        "against_rounds": settings.against_rounds,
        "with_reference": reference is not None,
        "check": args.check,
        "wall_seconds": round(time.monotonic() - started, 1),
    }
    rows = _report.build_rows(results)
    targets = _targets.build_targets(results)
    reference_name = f"runpod {machine['runpod']}" if machine.get("runpod") else "reference"
    table = _report.markdown(
        rows, machine, settings_dict, results, _targets.markdown(targets, reference_name)
    )
    print(table)
    payload = {
        "machine": machine,
        "settings": settings_dict,
        "targets": targets,
        "rows": rows,
        "results": results,
    }
    if args.write:
        args.output_dir.mkdir(parents=True, exist_ok=True)
        (args.output_dir / "latest.md").write_text(table)
        results_json = args.output_dir / "latest.json"
        results_json.write_text(json.dumps(payload, indent=2) + "\n")
        say(f"wrote {args.output_dir / 'latest.md'} and {results_json}")
        # Only a full run with the default output publishes into docs/.
        if args.publish and update_docs(table):
            say(f"updated the table in {DOCS.relative_to(REPO)}")
        if not args.no_chart and not args.check:
            chart = args.chart or (
                REPO / "docs" / "benchmarks.png"
                if args.publish
                else args.output_dir / "benchmarks.png"
            )
            draw_chart(results_json, chart, may_install=not args.quick)
    say(f"total {time.monotonic() - started:.0f} s")
    if baseline is not None:
        comparison = _check.compare(baseline, payload)
        print(_check.render(comparison))
        others = machine["others_during_run"].get("mean_pct")
        if comparison.failed and others is not None and others > 10:
            say(
                f"warning: other processes used {others}% of all CPUs meanwhile: a figure "
                "may have fallen with the machine; rerun on a quiet one (--wait-quiet)"
            )
        return comparison.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
