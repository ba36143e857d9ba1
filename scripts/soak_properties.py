"""Soak the property suite and watch its memory: one long run of the ``soak`` profile.

Runs

    HYPOTHESIS_PROFILE=soak python -m pytest tests/test_properties.py -x --hypothesis-seed=N

(N random unless ``--seed`` is given, printed either way) for ``--minutes``, samples the
resident memory of that pytest process (``VmRSS`` in ``/proc/PID/status``) every
``--interval`` seconds, and prints one row per sample: elapsed time, RSS, examples run so
far, examples per second since the previous row, and the property running. At the deadline
it interrupts pytest (SIGINT, then SIGTERM, then SIGKILL) and prints a verdict: RSS at the
start, the end, the minimum and maximum, the least-squares slope, and whether the later
properties stayed within ``--tolerance`` of the peak of the first one.

Memory is not expected to be constant within a property: Hypothesis keeps the data of up
to 10,000 examples per test (its ``ConjectureRunner`` cache, ``stats_per_test_case``, its
tree of the choices made so far), 40-50 KiB an example here, released when the test ends;
the next property reuses that memory. So RSS climbs during the first property (about 500
MiB after its 9,600 examples) and must then stay at that level, not climb further from one
property to the next: that is what the verdict checks, and why it needs a run long enough
to reach the second property (on 2 busy cores, 10 minutes or more; 30 to see several).

A failure's shrinking runs more examples of the same test, and they grow memory at the
same rate: the profiles leave out Hypothesis's ``explain`` phase, which would trace each
of them and keep about 130 KiB of executed branches per example (over 1 GiB in a few
minutes of shrinking, see ``tests/properties/__init__.py``), and a failing example's
exception no longer holds its run (``drop_frames`` in ``tests/properties/invariants.py``).

Examples are counted by this same file loaded into pytest as a plugin (``-p
soak_properties``): it wraps each Hypothesis test's ``hypothesis.inner_test`` and writes
the running count to a file the sampler reads. Stdlib only.

Usage::

    python scripts/soak_properties.py --minutes 30
    python scripts/soak_properties.py --minutes 10 --interval 30 --seed 7

Exit status: 0 when the tests passed (or were still passing at the deadline) and memory
stayed flat, 1 when a test failed, 2 when memory grew beyond the tolerance.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    import pytest

REPO = Path(__file__).resolve().parents[1]
SUITE = "tests/test_properties.py"
PLUGIN = "soak_properties"
COUNTER_ENV = "SOAK_PROPERTIES_COUNTER"
# How often (at most) the plugin rewrites the counter file.
COUNTER_EVERY = 0.5
# How long pytest gets to end after SIGINT, then after SIGTERM.
STOP_WAIT = 30.0
LOG_TAIL_LINES = 30


# -- the pytest side: count examples ------------------------------------------------------


class _Counter:
    def __init__(self, path: str) -> None:
        self.path = path
        self.count = 0
        self.test = "-"
        self.written = 0.0

    def bump(self, test: str) -> None:
        self.count += 1
        self.test = test
        now = time.monotonic()
        if now - self.written >= COUNTER_EVERY:
            self.write(now)

    def write(self, now: float) -> None:
        self.written = now
        tmp = f"{self.path}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(f"{self.count} {self.test}\n")
        os.replace(tmp, self.path)


def _counting(inner: Callable[..., Any], test: str, counter: _Counter) -> Callable[..., Any]:
    def run_one(*args: Any, **kwargs: Any) -> Any:
        try:
            return inner(*args, **kwargs)
        finally:
            counter.bump(test)

    return run_one


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Plugin hook: wrap each Hypothesis test's inner test to count its examples."""
    path = os.environ.get(COUNTER_ENV)
    if not path:
        return
    counter = _Counter(path)
    for item in items:
        hyp = getattr(getattr(item, "obj", None), "hypothesis", None)
        if hyp is not None and not getattr(hyp.inner_test, "_soak_counted", False):
            wrapped = _counting(hyp.inner_test, item.name, counter)
            wrapped._soak_counted = True  # type: ignore[attr-defined]
            hyp.inner_test = wrapped


# -- the sampler ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Sample:
    elapsed: float
    rss_mib: float
    examples: int | None
    test: str


def rss_mib(pid: int) -> float | None:
    """VmRSS of *pid* in MiB, or None once the process is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        return None
    return None


def read_counter(path: Path) -> tuple[int | None, str]:
    try:
        count, _, test = path.read_text(encoding="utf-8").strip().partition(" ")
        return int(count), test or "-"
    except (OSError, ValueError):
        return None, "-"


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Interrupt pytest as Ctrl-C would; escalate if it does not end."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(STOP_WAIT)
        except subprocess.TimeoutExpired:
            continue


def slope_per_minute(samples: list[Sample]) -> float:
    """Least-squares slope of RSS over time, in MiB per minute."""
    if len(samples) < 2:
        return 0.0
    n = len(samples)
    mean_t = sum(s.elapsed for s in samples) / n
    mean_r = sum(s.rss_mib for s in samples) / n
    var = sum((s.elapsed - mean_t) ** 2 for s in samples)
    if var == 0:
        return 0.0
    cov = sum((s.elapsed - mean_t) * (s.rss_mib - mean_r) for s in samples)
    return cov / var * 60


def verdict(samples: list[Sample], tolerance: float) -> tuple[bool, list[str]]:
    """Flat: the peak while later properties run stays within *tolerance* (a fraction) of
    the peak while the first one runs (see the module docstring)."""
    first, last = samples[0], samples[-1]
    rss = [s.rss_mib for s in samples]
    lines = [
        f"start {first.rss_mib:.0f} MiB, end {last.rss_mib:.0f} MiB, "
        f"min {min(rss):.0f} MiB, max {max(rss):.0f} MiB, "
        f"slope {slope_per_minute(samples):+.1f} MiB/min over {last.elapsed / 60:.1f} min",
    ]
    if last.examples is not None:
        lines.append(f"{last.examples} examples")
    first_test = next((s.test for s in samples if s.test != "-"), "-")
    early = [s.rss_mib for s in samples if s.test in (first_test, "-")]
    late = [s.rss_mib for s in samples if s.test not in (first_test, "-")]
    if not late:
        lines.append(
            f"INCONCLUSIVE: only {first_test} ran (within a property Hypothesis's own data "
            "grows until the test ends); run longer to reach the next property"
        )
        return True, lines
    flat = max(late) <= max(early) * (1 + tolerance)
    lines.append(
        f"peak during {first_test} {max(early):.0f} MiB, during the later properties "
        f"{max(late):.0f} MiB: "
        + ("FLAT" if flat else f"GROWING (more than {tolerance:.0%} above the first)")
    )
    return flat, lines


def row(sample: Sample, previous: Sample | None) -> str:
    minutes, seconds = divmod(int(sample.elapsed), 60)
    examples = "-" if sample.examples is None else str(sample.examples)
    rate = "-"
    if previous is not None and sample.examples is not None and previous.examples is not None:
        span = sample.elapsed - previous.elapsed
        if span > 0:
            rate = f"{(sample.examples - previous.examples) / span:.1f}"
    return (
        f"{minutes:4d}:{seconds:02d} {sample.rss_mib:9.1f} {examples:>9} {rate:>7}  {sample.test}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--minutes", type=float, default=30.0, help="how long (default 30)")
    parser.add_argument("--interval", type=float, default=30.0, help="seconds between samples")
    parser.add_argument("--seed", type=int, default=None, help="--hypothesis-seed (random)")
    parser.add_argument(
        "--tolerance", type=float, default=0.25, help="allowed growth of the peak (0.25 = 25%%)"
    )
    parser.add_argument(
        "--log", type=Path, default=None, help="pytest's output (default: a temporary file)"
    )
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)

    with tempfile.TemporaryDirectory(prefix="soak-properties-") as tmp:
        counter = Path(tmp) / "examples"
        log_path: Path = args.log if args.log is not None else Path(tmp) / "pytest.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
        path = [str(REPO), str(Path(__file__).resolve().parent)]
        if env.get("PYTHONPATH"):
            path.append(env["PYTHONPATH"])
        env.update(
            HYPOTHESIS_PROFILE="soak",
            PYTHONPATH=os.pathsep.join(path),
            **{COUNTER_ENV: str(counter)},
        )
        command = [sys.executable, "-m", "pytest", SUITE, "-p", "no:cacheprovider", "-x"]
        command += ["-q", "-rf", "-p", PLUGIN, f"--hypothesis-seed={seed}", *args.pytest_args]
        print(f"soak: seed {seed}, {args.minutes:g} min, a sample every {args.interval:g} s")
        print(f"soak: {' '.join(command)}  (output in {log_path})")
        print(f"{'time':>7} {'RSS MiB':>9} {'examples':>9} {'ex/s':>7}  property", flush=True)
        samples: list[Sample] = []
        started = time.monotonic()
        deadline = started + args.minutes * 60
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=log)
            try:
                # The first sample after one interval: at once, pytest has not even started.
                while proc.poll() is None and time.monotonic() < deadline:
                    try:
                        proc.wait(min(args.interval, deadline - time.monotonic()))
                    except subprocess.TimeoutExpired:
                        pass
                    rss = rss_mib(proc.pid) if proc.poll() is None else None
                    if rss is not None:
                        examples, test = read_counter(counter)
                        sample = Sample(time.monotonic() - started, rss, examples, test)
                        print(row(sample, samples[-1] if samples else None), flush=True)
                        samples.append(sample)
            finally:
                ended_early = proc.poll() is not None
                stop(proc)
        returncode = proc.returncode
        tail = log_path.read_text(encoding="utf-8", errors="replace").splitlines()

    print()
    failed = ended_early and returncode != 0
    if ended_early:
        print(f"soak: pytest ended by itself (status {returncode}) before the deadline")
    else:
        print("soak: deadline reached, pytest interrupted")
    if failed:
        print("\n".join(tail[-LOG_TAIL_LINES:]))
    if not samples:
        print("soak: no sample taken")
        return 1
    flat, lines = verdict(samples, args.tolerance)
    for line in lines:
        print(f"soak: {line}")
    print(f"soak: seed {seed}")
    if failed:
        return 1
    return 0 if flat else 2


if __name__ == "__main__":
    sys.exit(main())
