"""Failing jobs with the crash watchdog on and off: the row of docs/benchmarks.md, "What
the crash watchdog costs".

Every job of the ``raising`` scenario prints a line and raises, so its error report reads
the job's output: the capture's flush, which, watched, waits for the watchdog's hop (it
reads fds 1/2 first, docs/design.md §13.3). Raising jobs/s at concurrency 8, watched and
unwatched, in alternating rounds (``_figures.alternating``), from a preloaded queue; the
figure is the median of the rounds' ratios, watched over unwatched (the target: at least
0.9). ``benchmarks/run.py`` measures the same pair among the crash watch figures
(``_watch_figures.crash_watch``); ``python benchmarks/watch_failing.py [--rounds N]`` runs
it alone.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import _figures, _sdks, _watch_figures
from benchmarks._platform import PlatformProcess


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/watch_failing.py")
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args(argv)
    settings = _figures.Settings.for_run(False, None)
    with tempfile.TemporaryDirectory() as directory:
        workdir = Path(directory)
        with PlatformProcess(workdir) as platform:
            bench = _figures.Bench(platform, workdir, settings, lambda m: print(m, file=sys.stderr))
            sdk = _sdks.trio_worker_sdk()
            bench.warm_up(sdk)
            result = _watch_figures.failing_jobs(bench, sdk, args.rounds)
    print("| raising jobs/s, c=8 | watched | unwatched | ratio |")
    print("|---|---:|---:|---:|")
    for on, off in zip(result["on_samples"], result["off_samples"], strict=True):
        print(f"| round | {on:.0f} | {off:.0f} | {on / off:.2f} |")
    print(f"| **median** | {result['on']:.0f} | {result['off']:.0f} | **{result['ratio']:.2f}** |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
