"""No-op jobs/s at concurrency 8, this checkout against an older commit, alternating.

``run.py --against COMMIT`` (default: the first wave, 6e386a1) checks COMMIT out into a
throwaway ``git worktree add --detach`` inside the run's scratch folder, then runs the same
c=8 throughput figure on it and on this checkout in alternating pairs (old, current, old,
...), so both see the same machine; each side's figure is the median of its runs. The
worktree is removed afterwards, also when a run fails.

Both sides run this checkout's ``benchmarks/worker_trio.py`` against this checkout's
platform; ``BENCH_REPO`` points the old side's worker script at the old tree, so it imports
that tree's ``trio_worker`` (the harness strips ``PYTHONPATH``). The script passes
``async_backend`` only to a ``start`` that has it; the first wave ran on trio alone, so both
sides run the trio backend.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from benchmarks._figures import Result, alternating, median, round_ratios, throughput

if TYPE_CHECKING:
    from benchmarks._figures import Bench
    from benchmarks._sdks import Sdk

REPO = Path(__file__).resolve().parents[1]
FIRST_WAVE = "6e386a1"


def _git(*args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=120, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {done.stderr.strip()[-500:]}")
    return done.stdout.strip()


def against(bench: Bench, sdk: Sdk, commit: str = FIRST_WAVE, concurrency: int = 8) -> Result:
    """c=*concurrency* no-op jobs/s of *commit* and of this checkout, alternating."""
    full = _git("rev-parse", "--verify", f"{commit}^{{commit}}")
    tree = bench.workdir / f"against-{full[:12]}"
    _git("worktree", "add", "--detach", str(tree), full)
    try:
        # Compile the old tree's bytecode into the run's pycache before anything is timed,
        # as Bench.warm_up does for this checkout.
        subprocess.run(
            [sdk.python, "-c", "import trio_worker"],
            cwd=tree,
            env=bench.env(),
            capture_output=True,
            timeout=300,
            check=True,
        )
        old = {"BENCH_REPO": str(tree)}
        old_runs, current_runs = alternating(
            bench.settings.against_rounds,
            [
                lambda: _jobs_per_s(throughput(bench, sdk, concurrency, "trio", **old)),
                lambda: _jobs_per_s(throughput(bench, sdk, concurrency, "trio")),
            ],
        )
    finally:
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)],
            capture_output=True,
            timeout=120,
            check=False,
        )
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "prune"],
            capture_output=True,
            timeout=120,
            check=False,
        )
    ratios = round_ratios(current_runs, old_runs)
    return {
        "commit": full[:7],
        "concurrency": concurrency,
        "old_jobs_per_s": median(old_runs),
        "current_jobs_per_s": median(current_runs),
        "old_runs": old_runs,
        "current_runs": current_runs,
        "ratios": ratios,
        "ratio": median(ratios),
    }


def _jobs_per_s(result: Result) -> float:
    return round(float(result["jobs_per_s"]), 1)
