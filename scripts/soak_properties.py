"""Soak the property suite in rounds and watch its memory.

Each round is one pytest process running the whole of ``tests/test_properties.py``:

    HYPOTHESIS_PROFILE=soak HYPOTHESIS_SOAK_SCALE=S \\
        python -m pytest tests/test_properties.py -x --hypothesis-seed=N

with *S* times each property's CI example count (``--scale``, default 1) and a fresh seed
*N* (printed; the first round's is ``--seed`` when given, the later ones are drawn from
it). Rounds follow one another until ``--minutes`` are up; the round running at the
deadline is interrupted (SIGINT, then SIGTERM, then SIGKILL). A failure ends the soak.

Why rounds: Hypothesis spends a property's examples before it moves on, so one run of the
suite at 40 times the examples spent the better part of an hour inside its first few
properties. A round of the CI counts reaches every property in minutes (about 2,700
examples: under 2 minutes on 2 idle cores, 3 to 6 on 2 busy ones); the rounds then come
back to each one with a new seed, so the time buys new examples of every property rather
than more of the first ones.

Every ``--interval`` seconds it samples the resident memory of the round's pytest process
(``VmRSS`` in ``/proc/PID/status``) and prints one row: elapsed time, round, RSS, examples
run so far in the round, examples per second since the previous row, and the property
running. After each round it prints the round's seed, its RSS (start, peak, end) and each
test it reached with its examples. At the end, a verdict: the properties no round reached,
and the memory, which compares rounds: flat when no later round's peak is more than
``--tolerance`` above the first round's. Every round runs the same properties with the
same example counts, so their peaks are comparable; memory that one process keeps from one
round to the next cannot hide in a fresh process, but memory kept from one property to the
next within a round shows in every round's peak.

Memory is not constant within a property: Hypothesis keeps the data of up to 10,000
examples per test (its ``ConjectureRunner`` cache, ``stats_per_test_case``, its tree of the
choices made so far), 40-50 KiB an example here, released when the test ends. Fewer
examples per property keep that cache small. A failure's shrinking runs more examples of
the same test: the profiles leave out Hypothesis's ``explain`` phase, which would trace
each of them (see ``tests/properties/__init__.py``), and a failing example's exception no
longer holds its run (``drop_frames`` in ``tests/properties/invariants.py``).

Examples are counted by this same file loaded into pytest as a plugin (``-p
soak_properties``): it wraps each Hypothesis test's ``hypothesis.inner_test``, writes the
running count to a file the sampler reads, and logs each test collected, started and
ended to another. Stdlib only.

Usage::

    python scripts/soak_properties.py --minutes 60
    python scripts/soak_properties.py --minutes 15 --interval 15 --seed 7 --scale 2

Exit status: 0 when every round passed (or was still passing at the deadline), memory
stayed flat and every property was reached; 1 when a test failed; 2 when memory grew beyond
the tolerance; 3 when some property was never reached (the soak was too short).
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
TESTS_ENV = "SOAK_PROPERTIES_TESTS"
# The variable tests/properties/__init__.py reads to scale the soak profile's examples.
SCALE_ENV = "HYPOTHESIS_SOAK_SCALE"
# How often (at most) the plugin rewrites the counter file.
COUNTER_EVERY = 0.5
# How long pytest gets to end after SIGINT, then after SIGTERM.
STOP_WAIT = 30.0
LOG_TAIL_LINES = 30
# pytest's exit status when every test passed.
PASSED = 0


# -- the pytest side: count examples, log the tests ----------------------------------------


class _Counter:
    def __init__(self, path: str) -> None:
        self.path = path
        self.count = 0
        self.per_test: dict[str, int] = {}
        self.test = "-"
        self.written = 0.0

    def bump(self) -> None:
        self.count += 1
        self.per_test[self.test] = self.per_test.get(self.test, 0) + 1
        now = time.monotonic()
        if now - self.written >= COUNTER_EVERY:
            self.write(now)

    def write(self, now: float) -> None:
        self.written = now
        tmp = f"{self.path}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(f"{self.count} {self.test}\n")
        os.replace(tmp, self.path)


_counter: _Counter | None = None


def _log_test(event: str, name: str, extra: str = "") -> None:
    path = os.environ.get(TESTS_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{event} {name} {extra}".rstrip() + "\n")


def _counting(inner: Callable[..., Any], counter: _Counter) -> Callable[..., Any]:
    def run_one(*args: Any, **kwargs: Any) -> Any:
        try:
            return inner(*args, **kwargs)
        finally:
            counter.bump()

    return run_one


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Plugin hook: wrap each Hypothesis test's inner test to count its examples."""
    global _counter
    path = os.environ.get(COUNTER_ENV)
    if not path:
        return
    _counter = _Counter(path)
    for item in items:
        hyp = getattr(getattr(item, "obj", None), "hypothesis", None)
        if hyp is not None and not getattr(hyp.inner_test, "_soak_counted", False):
            wrapped = _counting(hyp.inner_test, _counter)
            wrapped._soak_counted = True  # type: ignore[attr-defined]
            hyp.inner_test = wrapped


def pytest_collection_finish(session: pytest.Session) -> None:
    """Plugin hook: log every test the round will run (after ``-k`` and the like)."""
    for item in session.items:
        _log_test("collected", item.name)


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    """Plugin hook: a test started (so it was reached, even if the deadline cuts it); its
    examples are counted under its name (parametrized tests share one inner test)."""
    if _counter is not None:
        _counter.test = nodeid.rpartition("::")[2]
    _log_test("started", nodeid.rpartition("::")[2])


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Plugin hook: a test's call ended; log its outcome and its examples."""
    if report.when != "call":
        return
    name = report.nodeid.rpartition("::")[2]
    examples = _counter.per_test.get(name, 0) if _counter is not None else 0
    _log_test("ended", name, f"{report.outcome} {examples}")


# -- the sampler ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Sample:
    elapsed: float
    rss_mib: float
    examples: int | None
    test: str


@dataclasses.dataclass
class Round:
    number: int
    seed: int
    samples: list[Sample] = dataclasses.field(default_factory=list)
    collected: list[str] = dataclasses.field(default_factory=list)
    started: list[str] = dataclasses.field(default_factory=list)
    # test name: (outcome, examples)
    ended: dict[str, tuple[str, int]] = dataclasses.field(default_factory=dict)
    returncode: int | None = None
    cut: bool = False

    @property
    def peak(self) -> float | None:
        return max((s.rss_mib for s in self.samples), default=None)


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


def read_tests(path: Path, into: Round) -> None:
    """Fill *into* from the plugin's log of the tests collected, started and ended."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return
    for line in lines:
        event, _, rest = line.partition(" ")
        name, _, extra = rest.partition(" ")
        if event == "collected":
            into.collected.append(name)
        elif event == "started":
            into.started.append(name)
        elif event == "ended":
            outcome, _, examples = extra.partition(" ")
            into.ended[name] = (outcome, int(examples or 0))


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


def round_summary(one: Round) -> list[str]:
    """The lines printed after a round: its seed, end, RSS and the tests it reached."""
    how = "cut at the deadline" if one.cut else f"pytest status {one.returncode}"
    reached = [name for name in one.collected if name in one.started]
    lines = [f"round {one.number} (seed {one.seed}, {how}): reached {len(reached)} of "]
    lines[0] += f"{len(one.collected)} tests"
    if one.samples:
        first, last = one.samples[0], one.samples[-1]
        lines[0] += (
            f"; RSS start {first.rss_mib:.0f} MiB, peak {one.peak:.0f} MiB, "
            f"end {last.rss_mib:.0f} MiB"
        )
    for name in reached:
        outcome, examples = one.ended.get(name, ("running", 0))
        if one.cut and name == reached[-1]:
            # pytest reports the test SIGINT interrupted as failed.
            outcome = "interrupted at the deadline"
        count = f", {examples} examples" if examples else ""
        lines.append(f"  {name}: {outcome}{count}")
    return lines


def verdict(rounds: list[Round], tolerance: float) -> tuple[bool, list[str]]:
    """Flat: no later round's peak RSS is more than *tolerance* (a fraction) above the first
    round's (see the module docstring)."""
    measured = [r for r in rounds if r.peak is not None]
    samples = [s for r in measured for s in r.samples]
    if not samples:
        return True, ["no sample taken"]
    rss = [s.rss_mib for s in samples]
    lines = [
        f"{len(rounds)} rounds, {sum(n for r in rounds for _, n in r.ended.values())} examples; "
        f"RSS min {min(rss):.0f} MiB, max {max(rss):.0f} MiB",
        "peak RSS per round: "
        + ", ".join(f"{r.number}: {r.peak:.0f}" for r in measured if r.peak is not None),
    ]
    if len(measured) < 2:
        lines.append("INCONCLUSIVE: one round only; run longer to compare rounds")
        return True, lines
    base = measured[0].peak or 0.0
    later = max(r.peak or 0.0 for r in measured[1:])
    flat = later <= base * (1 + tolerance)
    lines.append(
        f"peak of round {measured[0].number} {base:.0f} MiB, of the later rounds {later:.0f} "
        "MiB: " + ("FLAT" if flat else f"GROWING (more than {tolerance:.0%} above the first)")
    )
    return flat, lines


def never_reached(rounds: list[Round]) -> list[str]:
    collected = next((r.collected for r in rounds if r.collected), [])
    started = {name for r in rounds for name in r.started}
    return [name for name in collected if name not in started]


def row(one: Round, sample: Sample, previous: Sample | None) -> str:
    minutes, seconds = divmod(int(sample.elapsed), 60)
    examples = "-" if sample.examples is None else str(sample.examples)
    rate = "-"
    if previous is not None and sample.examples is not None and previous.examples is not None:
        span = sample.elapsed - previous.elapsed
        if span > 0:
            rate = f"{(sample.examples - previous.examples) / span:.1f}"
    return (
        f"{minutes:4d}:{seconds:02d} {one.number:>5} {sample.rss_mib:9.1f} {examples:>9} "
        f"{rate:>7}  {sample.test}"
    )


def round_seeds(first: int | None) -> Callable[[], int]:
    """The seeds of the rounds: *first* (random when None), then drawn from it."""
    draw = random.Random(first) if first is not None else random.SystemRandom()
    pending = [first] if first is not None else []

    def next_seed() -> int:
        return pending.pop() if pending else draw.randrange(2**32)

    return next_seed


def run_round(
    one: Round,
    command: list[str],
    env: dict[str, str],
    tmp: Path,
    log_path: Path,
    deadline: float,
    started: float,
    interval: float,
) -> None:
    """Run one round until pytest ends or the deadline, sampling its RSS."""
    counter = tmp / f"examples-{one.number}"
    tests = tmp / f"tests-{one.number}"
    env = {**env, COUNTER_ENV: str(counter), TESTS_ENV: str(tests)}
    with open(log_path, "ab") as log:
        log.write(f"\n==== round {one.number}, seed {one.seed} ====\n".encode())
        log.flush()
        proc = subprocess.Popen(
            [*command, f"--hypothesis-seed={one.seed}"], cwd=REPO, env=env, stdout=log, stderr=log
        )
        try:
            # The first sample after one interval: at once, pytest has not even started.
            while proc.poll() is None and time.monotonic() < deadline:
                try:
                    proc.wait(max(0.0, min(interval, deadline - time.monotonic())))
                except subprocess.TimeoutExpired:
                    pass
                rss = rss_mib(proc.pid) if proc.poll() is None else None
                if rss is not None:
                    examples, test = read_counter(counter)
                    sample = Sample(time.monotonic() - started, rss, examples, test)
                    print(row(one, sample, one.samples[-1] if one.samples else None), flush=True)
                    one.samples.append(sample)
        finally:
            one.cut = proc.poll() is None
            stop(proc)
    one.returncode = proc.returncode
    read_tests(tests, one)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--minutes", type=float, default=60.0, help="how long (default 60)")
    parser.add_argument("--interval", type=float, default=15.0, help="seconds between samples")
    parser.add_argument(
        "--seed", type=int, default=None, help="the first round's --hypothesis-seed (random)"
    )
    parser.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="examples per property in a round, as a multiple of its CI count (default 1)",
    )
    parser.add_argument(
        "--tolerance", type=float, default=0.25, help="allowed growth of the peak (0.25 = 25%%)"
    )
    parser.add_argument(
        "--log", type=Path, default=None, help="pytest's output (default: a temporary file)"
    )
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)
    if not args.scale > 0:
        parser.error(f"--scale {args.scale}: expected a number above 0")
    next_seed = round_seeds(args.seed)

    rounds: list[Round] = []
    with tempfile.TemporaryDirectory(prefix="soak-properties-") as tmp_name:
        tmp = Path(tmp_name)
        log_path: Path = args.log if args.log is not None else tmp / "pytest.log"
        log_path.write_bytes(b"")
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
        path = [str(REPO), str(Path(__file__).resolve().parent)]
        if env.get("PYTHONPATH"):
            path.append(env["PYTHONPATH"])
        env.update(
            HYPOTHESIS_PROFILE="soak",
            PYTHONPATH=os.pathsep.join(path),
            **{SCALE_ENV: f"{args.scale:g}"},
        )
        command = [sys.executable, "-m", "pytest", SUITE, "-p", "no:cacheprovider", "-x"]
        command += ["-q", "-rf", "-p", PLUGIN, *args.pytest_args]
        print(
            f"soak: {args.minutes:g} min in rounds of {args.scale:g}x each property's "
            f"examples, a sample every {args.interval:g} s"
        )
        print(f"soak: {SCALE_ENV}={args.scale:g} HYPOTHESIS_PROFILE=soak {' '.join(command)}")
        print(f"soak: output in {log_path}")
        print(f"{'time':>7} {'round':>5} {'RSS MiB':>9} {'examples':>9} {'ex/s':>7}  property")
        started = time.monotonic()
        deadline = started + args.minutes * 60
        failed: Round | None = None
        while time.monotonic() < deadline:
            one = Round(len(rounds) + 1, next_seed())
            rounds.append(one)
            print(f"soak: round {one.number}, seed {one.seed}", flush=True)
            run_round(one, command, env, tmp, log_path, deadline, started, args.interval)
            for line in round_summary(one):
                print(f"soak: {line}", flush=True)
            if not one.cut and one.returncode != PASSED:
                failed = one
                break
        tail = log_path.read_text(encoding="utf-8", errors="replace").splitlines()

    print()
    if failed is not None:
        print(f"soak: round {failed.number} FAILED (seed {failed.seed}):")
        print("\n".join(tail[-LOG_TAIL_LINES:]))
    else:
        print("soak: deadline reached" + (", last round interrupted" if rounds[-1].cut else ""))
    flat, lines = verdict(rounds, args.tolerance)
    missing = never_reached(rounds)
    lines.append(
        f"NOT REACHED: {', '.join(missing)}" if missing else "every test reached at least once"
    )
    lines.append("seeds: " + ", ".join(f"{r.number}: {r.seed}" for r in rounds))
    for line in lines:
        print(f"soak: {line}")
    if failed is not None:
        return 1
    if not flat:
        return 2
    return 3 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
