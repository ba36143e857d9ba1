"""What the crash watchdog costs: the same figures with it on (the default) and off.

See docs/design.md §13 for why it exists. With it on, the worker process the harness
starts is the watchdog and the worker is its child, so:

* start to first take: spawn -> the first take request (the fork is on this path);
* the watchdog's memory: its resident set (VmRSS, which counts the pages it still shares
  with the worker after the fork) and its private memory (Private_Clean + Private_Dirty of
  ``/proc/PID/smaps_rollup``), which is what the watchdog adds to the container;
* jobs/s: no-op jobs through the worker at concurrency 1 and 8 (the watchdog is not on a
  job's path: only a take and a settle record, 2 small pipe writes, per job);
* raising jobs/s at concurrency 8: every job prints a line and raises, so its error report
  flushes the output capture, which, when watched, waits for the watchdog to pass the
  output on. Measured in alternating rounds (``_figures.alternating``); the ratio watched
  over unwatched is the round-by-round median, and the target is at least 0.9.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks._figures import alternating, median, round_ratios, throughput
from benchmarks._procs import descendants, kill_group, rss_kib

if TYPE_CHECKING:
    from benchmarks._figures import Bench
    from benchmarks._sdks import Sdk

OFF = {"TRIO_WORKER_CRASH_WATCH": "0"}


def smaps_kib(pid: int, *fields: str) -> int | None:
    """The sum of *fields* (``Pss:``, ``Private_Dirty:``...) of *pid*'s smaps_rollup, KiB."""
    try:
        lines = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
    except OSError:
        return None
    return sum(int(line.split()[1]) for line in lines if line.startswith(fields))


def private_kib(pid: int) -> int | None:
    """Private_Clean + Private_Dirty: the pages only *pid* maps."""
    return smaps_kib(pid, "Private_Clean:", "Private_Dirty:")


def _start_once(bench: Bench, sdk: Sdk, env: dict[str, str]) -> dict[str, Any]:
    bench.platform.reset(1, take_hold=5.0)
    worker = bench.start_worker(sdk, "noop", 1, **env)
    try:
        bench.wait_first_job_done(worker)
        time.sleep(bench.settings.idle_settle)
        report = bench.platform.report()
        children = descendants(worker.pid)
        tree = [worker.pid, *children]
        return {
            "first_take_s": report["first_request"]["take"] - worker.spawned_at,
            "main_rss_kib": rss_kib(worker.pid),
            "main_private_kib": private_kib(worker.pid),
            "child_rss_kib": sum(rss_kib(c) or 0 for c in children),
            # Shared pages counted once: what the container's memory accounting sees.
            "tree_pss_kib": sum(smaps_kib(pid, "Pss:") or 0 for pid in tree),
        }
    finally:
        kill_group(worker)


def crash_watch(bench: Bench, sdk: Sdk, rounds: int | None = None) -> dict[str, Any]:
    """Start-up, memory and jobs/s with the watchdog on and off, in alternating runs (the
    median of *rounds* throughput runs each: a shared machine is noisy)."""
    if rounds is None:
        rounds = 1 if bench.settings.quick else 3
    runs: dict[str, list[dict[str, Any]]] = {"on": [], "off": []}
    for _ in range(bench.settings.start_repeats * 2):
        for key, env in (("on", {}), ("off", OFF)):
            runs[key].append(_start_once(bench, sdk, env))
    out: dict[str, Any] = {}
    for key, samples in runs.items():
        out[key] = {
            "first_take_s": median([s["first_take_s"] for s in samples]),
            "first_take_samples_s": [round(s["first_take_s"], 3) for s in samples],
            "main_rss_mib": _mib(median([s["main_rss_kib"] or 0 for s in samples])),
            "main_private_mib": _mib(median([s["main_private_kib"] or 0 for s in samples])),
            "child_rss_mib": _mib(median([s["child_rss_kib"] for s in samples])),
            "tree_pss_mib": _mib(median([s["tree_pss_kib"] for s in samples])),
        }
    on, off = out["on"]["tree_pss_mib"], out["off"]["tree_pss_mib"]
    out["added_pss_mib"] = None if on is None or off is None else round(on - off, 2)
    failing = failing_jobs(bench, sdk, rounds)
    out["on"]["raising_jobs_per_s_c8"] = failing["on"]
    out["off"]["raising_jobs_per_s_c8"] = failing["off"]
    out["raising_ratio_samples"] = failing["ratio_samples"]
    out["raising_ratio"] = failing["ratio"]
    for concurrency in (1, 8):
        rates: dict[str, list[float]] = {"on": [], "off": []}
        for _ in range(rounds):
            for key, env in (("on", {}), ("off", OFF)):
                rates[key].append(_throughput(bench, sdk, concurrency, env)["jobs_per_s"])
        for key, values in rates.items():
            out[key][f"jobs_per_s_c{concurrency}"] = median(values)
            out[key][f"jobs_per_s_c{concurrency}_samples"] = [round(v) for v in values]
    return out


def failing_jobs(bench: Bench, sdk: Sdk, rounds: int) -> dict[str, Any]:
    """Raising jobs/s at c=8, watched and unwatched, in *rounds* alternating rounds."""
    on, off = alternating(
        rounds,
        [
            lambda: _throughput(bench, sdk, 8, {}, scenario="raising")["jobs_per_s"],
            lambda: _throughput(bench, sdk, 8, OFF, scenario="raising")["jobs_per_s"],
        ],
    )
    ratios = [round(r, 3) for r in round_ratios(on, off)]
    return {
        "on": median(on),
        "off": median(off),
        "on_samples": on,
        "off_samples": off,
        "ratio_samples": ratios,
        "ratio": median(ratios),
    }


def _throughput(
    bench: Bench, sdk: Sdk, concurrency: int, env: dict[str, str], scenario: str = "noop"
) -> dict[str, Any]:
    return throughput(bench, sdk, concurrency, scenario=scenario, **env)


def _mib(kib: float | None) -> float | None:
    return None if kib is None else round(kib / 1024, 2)


def summary(result: dict[str, Any]) -> str:
    """One line per setting, for the run's log."""
    lines = []
    for key in ("on", "off"):
        r = result[key]
        lines.append(
            f"crash watch {key:3}: first take {r['first_take_s'] * 1000:.0f} ms, "
            f"main process {r['main_rss_mib']} MiB RSS ({r['main_private_mib']} MiB private), "
            f"worker child {r['child_rss_mib']} MiB, PSS of both {r['tree_pss_mib']} MiB, "
            f"jobs/s c=1 {r['jobs_per_s_c1']:.0f}, c=8 {r['jobs_per_s_c8']:.0f}"
        )
    lines.append(f"crash watch adds {result['added_pss_mib']} MiB (PSS)")
    lines.append(
        f"raising jobs/s c=8: watched {result['on']['raising_jobs_per_s_c8']:.0f}, unwatched "
        f"{result['off']['raising_jobs_per_s_c8']:.0f}, ratio {result['raising_ratio']:.2f} "
        f"(rounds {result['raising_ratio_samples']})"
    )
    return "\n".join(lines)
