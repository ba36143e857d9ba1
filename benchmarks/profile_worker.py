"""Where a trio_worker worker's time goes, and what the floor is.

    python benchmarks/profile_worker.py [--jobs N] [--rate HZ] [--out DIR]

1. Import time of ``trio_worker`` (``python -X importtime``) and its biggest imports.
2. The floor, against the same fake platform: a raw-socket client (what the platform and
   loopback can serve) and a bare trio + httpx take/done loop (what the HTTP client costs
   with no worker logic), at 1 and 8 loops.
3. A trio_worker worker at concurrency 1 and 8, sampled with py-spy (installed into
   ``benchmarks/.venv-tools`` on first use) while it runs no-op jobs, and the platform
   sampled at the same time; CPU time per job of both, from ``/proc``.

Prints a Markdown report and writes it, with the raw py-spy stacks, to DIR (default
``benchmarks/results/profiles``, which is not committed).
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import _figures, _sdks
from benchmarks._cpu_figures import run_floor
from benchmarks._platform import PlatformProcess
from benchmarks._procs import kill_group, tree_cpu_split, wait_quiet, worker_process
from benchmarks._report import machine_info

if TYPE_CHECKING:
    from collections.abc import Sequence

HERE = Path(__file__).resolve().parent
FRAME = re.compile(r"^(?P<func>.*) \((?P<path>[^()]*):(?P<line>\d+)\)$")
HTTP_PACKAGES = frozenset({"httpx", "httpcore", "h11"})


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- py-spy stacks ---------------------------------------------------------------------------


def _package(path: str) -> str:
    for marker in ("site-packages/", "/lib/python3.11/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    if path.startswith("<frozen "):
        return path[len("<frozen ") :].rstrip(">")
    if path.startswith("<"):
        return path
    head = path.split("/", 1)[0]
    return head.removesuffix(".py")


def _frames(stack: str) -> tuple[str, list[tuple[str, str]]]:
    """(thread name, [(package, "file:function"), ...] root first) of one raw stack."""
    parts = stack.split(";")
    thread = parts[0].split(": ", 1)[-1] if parts and parts[0].startswith("thread (") else ""
    frames = []
    for part in parts[1:] if thread else parts:
        match = FRAME.match(part)
        if match is None:
            continue
        path = match["path"]
        short = path.split("site-packages/", 1)[-1]
        frames.append((_package(path), f"{short}:{match['func']}"))
    return thread, frames


def load_stacks(path: Path) -> list[tuple[str, list[tuple[str, str]], int]]:
    stacks = []
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            thread, frames = _frames(stack)
            stacks.append((thread, frames, int(count)))
    return stacks


def _task_frames(frames: list[tuple[str, str]]) -> list[tuple[str, str]] | None:
    """The frames above trio's run loop (the running task's coroutine chain), or None."""
    for index in range(len(frames) - 1, -1, -1):
        if frames[index][1].endswith(":unrolled_run"):
            return frames[index + 1 :]
    return None


def _is_http(package: str, name: str) -> bool:
    """A frame of an HTTP client: httpx and its stack, or trio_worker's own lean client."""
    return package in HTTP_PACKAGES or name.startswith("trio_worker/_platform/_http.py:")


def _layer(task: list[tuple[str, str]] | None) -> str:
    if task is None:
        return "outside trio.run (start-up, exit)"
    if not task:
        return "trio run loop (scheduling, epoll)"
    http = next((i for i, (pkg, name) in enumerate(task) if _is_http(pkg, name)), None)
    if http is not None:
        caller = next(
            (name for pkg, name in reversed(task[:http]) if pkg == "trio_worker"), "other"
        )
        client = "lean client (trio_worker/_platform/_http.py)"
        if any(pkg in HTTP_PACKAGES for pkg, _ in task[http:]):
            client = "httpx/httpcore/h11"
        return f"HTTP {client}, called from {caller.split(':')[-1]}"
    if any(pkg == "benchmarks" for pkg, _ in task):
        return "the handler (benchmark code)"
    leaf_pkg = task[-1][0]
    if leaf_pkg == "trio_worker" or any(pkg == "trio_worker" for pkg, _ in task):
        return "trio_worker logic (no HTTP call below)"
    return f"other ({leaf_pkg})"


IDLE_LEAVES = ("EpollIOManager.get_events", "EpollIOManager._epoll_wait")


def _idle(frames: list[tuple[str, str]]) -> bool:
    """Blocked in epoll: py-spy's --nonblocking mode reports some of this as active."""
    return frames[-1][1].endswith(IDLE_LEAVES)


def summarize_worker(path: Path, top: int = 15) -> dict[str, Any]:
    stacks = load_stacks(path)
    threads: Counter[str] = Counter()
    layers: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    leaf_packages: Counter[str] = Counter()
    leaf_functions: Counter[str] = Counter()
    main_total = idle = 0
    for thread, frames, count in stacks:
        threads[thread or "?"] += count
        if thread != "MainThread" or not frames:
            continue
        if _idle(frames):
            idle += count
            continue
        task = _task_frames(frames)
        if task is None:
            if any(name.endswith(":<module>") for _, name in frames[:1]):
                continue  # start-up and exit are not the steady state
            # py-spy caught the thread mid-switch and could not unwind to the run loop.
            main_total += count
            layers[f"partial stack, leaf {frames[-1][1].split(':')[-1]}"] += count
            leaf_packages[frames[-1][0]] += count
            leaf_functions[frames[-1][1]] += count
            continue
        main_total += count
        layers[_layer(task)] += count
        leaf_packages[frames[-1][0]] += count
        leaf_functions[frames[-1][1]] += count
        for name in {name for pkg, name in task if pkg == "trio_worker"}:
            inclusive[name] += count
    total = sum(threads.values())

    def pct(counter: Counter[str], base: int, n: int = top) -> list[tuple[str, float]]:
        return [(k, 100 * v / base) for k, v in counter.most_common(n)] if base else []

    return {
        "samples": total,
        "main_loop_samples": main_total,
        "idle_samples": idle,
        "threads": pct(threads, total),
        "layers": pct(layers, main_total, 20),
        "trio_worker_inclusive": pct(inclusive, main_total),
        "leaf_packages": pct(leaf_packages, main_total, 12),
        "leaf_functions": pct(leaf_functions, main_total),
    }


def summarize_platform(path: Path) -> dict[str, Any]:
    packages: Counter[str] = Counter()
    total = 0
    for _, frames, count in load_stacks(path):
        if not frames:
            continue
        total += count
        packages[frames[-1][0]] += count
    return {
        "samples": total,
        "leaf_packages": [(k, 100 * v / total) for k, v in packages.most_common(10)]
        if total
        else [],
    }


# -- runs ------------------------------------------------------------------------------------


class PySpy:
    """``py-spy record`` attached to a running process; stopped with SIGINT."""

    def __init__(self, binary: Path, pid: int, out: Path, rate: int) -> None:
        self.out = out
        self.popen = subprocess.Popen(
            [
                str(binary),
                "record",
                "--pid",
                str(pid),
                "--format",
                "raw",
                "--threads",
                "--nonblocking",
                "--rate",
                str(rate),
                "--output",
                str(out),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGINT)
        try:
            _, err = self.popen.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            _, err = self.popen.communicate()
        if not self.out.exists():
            raise RuntimeError(f"py-spy wrote nothing: {err.decode(errors='replace')[-800:]}")


def profile_worker(
    bench: _figures.Bench,
    pyspy: Path,
    scenario: str,
    concurrency: int,
    jobs: int,
    rate: int,
    out: Path,
    chunks: int = 0,
) -> dict[str, Any]:
    """Run *jobs* jobs of *scenario*, the worker and the platform both under py-spy."""
    platform = bench.platform
    platform.reset(jobs, take_hold=2.0)
    sdk = _sdks.trio_worker_sdk()
    extra = {"BENCH_CHUNKS": str(chunks)} if chunks else {}
    worker = bench.start_worker(sdk, scenario, concurrency, **extra)
    name = f"{scenario}-c{concurrency}"
    worker_out = out / f"worker-{name}.txt"
    platform_out = out / f"platform-{name}.txt"
    try:
        bench.wait_until_taken(worker)
        # With the crash watch on (the default), the spawned pid became the watchdog and
        # the worker is its child: sample the worker, count the CPU of the whole tree.
        sampled = worker_process(worker.pid)
        spies = [
            PySpy(pyspy, sampled, worker_out, rate),
            # The platform at a fifth of the rate: py-spy itself needs CPU, and the
            # platform's profile only has to say which layer its time goes to.
            PySpy(pyspy, platform.popen.pid, platform_out, max(rate // 5, 50)),
        ]
        time.sleep(0.3)  # let py-spy attach before the CPU clock starts
        split0 = tree_cpu_split(worker.pid)
        platform_cpu0 = platform.cpu_seconds()
        done0, t0 = platform.progress()["finished"], time.perf_counter()
        final = platform.wait_for("finished", jobs, timeout=300, poll=0.1)
        seconds = time.perf_counter() - t0
        split1 = tree_cpu_split(worker.pid)
        user, system = split1[0] - split0[0], split1[1] - split0[1]
        worker_cpu = user + system
        platform_cpu = platform.cpu_seconds() - platform_cpu0
        for spy in spies:
            spy.stop()
    finally:
        kill_group(worker)
    measured = final["finished"] - done0
    report = platform.report()
    routes = report["requests_by_route"]
    # Streaming: the unit is a chunk (one job-stream POST each), not a job.
    units = measured * chunks if chunks else measured
    requests = sum(routes.get(r, 0) for r in ("take", "take_batch", "done", "stream"))
    return {
        "scenario": scenario,
        "concurrency": concurrency,
        "unit": "chunk" if chunks else "job",
        "per_s": units / seconds,
        "worker_cpu_ms_per_unit": worker_cpu * 1000 / units,
        "worker_user_pct": 100 * user / worker_cpu if worker_cpu else 0.0,
        "platform_cpu_ms_per_unit": platform_cpu * 1000 / units,
        "requests_per_unit": requests / (jobs * chunks if chunks else jobs),
        "worker": summarize_worker(worker_out),
        "platform": summarize_platform(platform_out),
    }


def import_report(env: dict[str, str], repeats: int = 5) -> dict[str, Any]:
    """``-X importtime`` of ``import trio_worker``: the total, and what it is made of.

    Children are printed before their parent, so the block of lines before the
    ``trio_worker`` line (back to the previous top-level line) is what importing it did.
    """
    samples: list[float] = []
    packages: dict[str, list[float]] = {}
    own: list[float] = []
    for _ in range(repeats):
        result = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", "import trio_worker"],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        )
        block: list[tuple[str, int, int]] = []
        for line in result.stderr.splitlines():
            parts = line.split("|")
            if len(parts) != 3 or not parts[1].strip().isdigit():
                continue
            self_us = int(parts[0].rsplit(":", 1)[1])
            name = parts[2].rstrip()
            top_level = len(name) - len(name.lstrip()) == 1
            name = name.strip()
            if name == "trio_worker":
                samples.append(int(parts[1]) / 1000)
                own_us = self_us + sum(s for n, s, _ in block if n.startswith("trio_worker."))
                own.append(own_us / 1000)
                for n, _, cumulative in block:
                    if "." not in n:
                        packages.setdefault(n, []).append(cumulative / 1000)
                break
            block = [] if top_level else [*block, (name, self_us, int(parts[1]))]
    ranked = sorted(
        ((name, _figures.median(ms) or 0.0) for name, ms in packages.items()),
        key=lambda item: -item[1],
    )[:12]
    return {
        "median_ms": _figures.median(samples),
        "samples_ms": samples,
        "trio_worker_modules_self_ms": _figures.median(own),
        "top_level_imports_ms": ranked,
    }


# -- report ----------------------------------------------------------------------------------


def _table(rows: list[tuple[str, float]], header: str) -> list[str]:
    lines = [f"| {header} | % |", "|---|---:|"]
    lines += [f"| `{name}` | {share:.1f} |" for name, share in rows]
    return lines


def render(result: dict[str, Any]) -> str:
    imp = result["import"]
    lines = [
        "# trio_worker profile",
        "",
        f"{result['machine']}",
        "",
        f"## Import time: {imp['median_ms']:.0f} ms (median of {len(imp['samples_ms'])}, "
        "`python -X importtime -c 'import trio_worker'`)",
        "",
        f"trio_worker's own modules (self time): {imp['trio_worker_modules_self_ms']:.1f} ms.",
        "",
        "| package imported by it (cumulative, median) | ms |",
        "|---|---:|",
    ]
    lines += [f"| `{name}` | {ms:.1f} |" for name, ms in imp["top_level_imports_ms"]]
    lines += [
        "",
        "## The floor (same platform, no worker logic)",
        "",
        "| client | loops | jobs/s | client CPU ms/job | platform CPU ms/job |",
        "|---|---:|---:|---:|---:|",
    ]
    for floor in result["floor"]:
        lines.append(
            f"| {floor['mode']} | {floor['loops']} | {floor['jobs_per_s']:,.0f} | "
            f"{floor['client_cpu_ms_per_job']:.3f} | {floor['platform_cpu_ms_per_job']:.3f} |"
        )
    for run in result["workers"]:
        worker = run["worker"]
        lines += [
            "",
            f"## trio_worker, {run['scenario']}, concurrency {run['concurrency']} (under py-spy)",
            "",
            f"{run['per_s']:,.0f} {run['unit']}s/s; worker CPU "
            f"{run['worker_cpu_ms_per_unit']:.3f} ms/{run['unit']}; platform CPU "
            f"{run['platform_cpu_ms_per_unit']:.3f} ms/{run['unit']}; "
            f"{run['requests_per_unit']:.2f} HTTP requests/{run['unit']} (pings and stop "
            f"polls not counted); worker CPU {run['worker_user_pct']:.0f}% user, "
            f"{100 - run['worker_user_pct']:.0f}% system. py-spy: {worker['samples']} samples, "
            f"{worker['idle_samples']} of them blocked in epoll (idle, left out), "
            f"{worker['main_loop_samples']} on the event-loop thread (the base of the "
            "percentages below).",
            "",
            *_table(worker["threads"], "thread (share of all samples)"),
            "",
            *_table(worker["layers"], "where the event loop thread is (share of its samples)"),
            "",
            *_table(worker["trio_worker_inclusive"], "trio_worker function, inclusive"),
            "",
            *_table(worker["leaf_packages"], "package of the leaf frame (self time)"),
            "",
            *_table(worker["leaf_functions"], "leaf function (self time)"),
            "",
            *_table(run["platform"]["leaf_packages"], "platform: package of the leaf frame"),
        ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/profile_worker.py")
    parser.add_argument("--jobs", type=int, default=20000, help="jobs per no-op run")
    parser.add_argument("--rate", type=int, default=1000, help="py-spy samples per second (worker)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "profiles")
    parser.add_argument(
        "--wait-quiet", type=float, default=0.0, metavar="SECONDS", help="as for run.py"
    )
    args = parser.parse_args(argv)
    python = _sdks.ensure_venv(_sdks.TOOLS_VENV, ["py-spy"], say, executable="py-spy")
    if python is None:
        say("py-spy is not available; cannot profile")
        return 1
    pyspy = python.parent / "py-spy"
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"busy_before_pct": wait_quiet(args.wait_quiet, say)}
    with tempfile.TemporaryDirectory(prefix="trio-worker-profile-") as tmp:
        with PlatformProcess(Path(tmp)) as platform:
            settings = _figures.Settings.for_run(False, args.jobs)
            bench = _figures.Bench(platform, Path(tmp), settings, say)
            bench.warm_up(_sdks.trio_worker_sdk())
            say("import time ...")
            result["import"] = import_report(bench.env())
            say("floor ...")
            result["floor"] = []
            for mode, loops in (("raw", 1), ("httpx", 1), ("httpx", 8), ("lean", 1), ("lean", 8)):
                try:
                    result["floor"].append(run_floor(platform, mode, args.jobs, loops))
                except subprocess.CalledProcessError as exc:
                    say(f"floor {mode} x{loops} failed: {exc.stderr[-500:]}")
            result["workers"] = []
            for concurrency in (1, 8):
                say(f"trio_worker no-op c={concurrency} under py-spy ...")
                result["workers"].append(
                    profile_worker(
                        bench, pyspy, "noop", concurrency, args.jobs, args.rate, args.out
                    )
                )
            say("trio_worker streaming under py-spy ...")
            result["workers"].append(
                profile_worker(
                    bench, pyspy, "stream", 1, 4, args.rate, args.out, chunks=max(args.jobs, 1000)
                )
            )
    machine = machine_info(None)
    result["machine"] = (
        f"{machine['cpu']}, {machine['cores']} cores; Python {machine['python']}; "
        f"trio {machine['trio']}, httpx {machine['httpx']}; trio_worker "
        f"{machine['trio_worker']} ({machine.get('commit')}); {machine['date']}; "
        f"machine {result['busy_before_pct']}% busy before the run"
    )
    text = render(result)
    print(text)
    (args.out / "profile.md").write_text(text)
    (args.out / "profile.json").write_text(json.dumps(result, indent=2) + "\n")
    say(f"wrote {args.out / 'profile.md'} and the raw stacks beside it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
