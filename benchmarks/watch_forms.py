"""The crash watchdog's two forms side by side: the fork at ``start()`` and the launcher.

    python benchmarks/watch_forms.py [--runs 7]

Run it with the interpreter of the environment to measure (an editable install, a
wheel's virtual environment): docs/design.md §13.5 gives the figures and what they mean.

1. **The waiting watchdog's imports**, as shipped (``python -S``: the ``.pth`` files wait
   for a crash) and with ``site`` (what dropping ``-S`` would cost: every ``.pth`` file of
   the environment, an editable install's finder among them): the CPU of that process up
   to there, and its resident and private memory.
2. **A no-op queue worker** against the fake platform, started three ways in turn:
   ``python app.py`` (the fork), ``python -m trio_worker app.py`` (the launcher) and
   ``TRIO_WORKER_CRASH_WATCH=0 python app.py`` (no watchdog): spawn to the first take,
   then, once the first job is done and the processes idle, the started process's (the
   watchdog's) memory, and the CPU and PSS of every process.
"""

from __future__ import annotations

import argparse
import marshal
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Last: trio_worker comes from the environment measured, the harness from this checkout.
sys.path.append(str(Path(__file__).resolve().parents[1]))

import trio

from benchmarks._procs import cpu_seconds, descendants, rss_kib
from benchmarks._watch_figures import private_kib, smaps_kib
from trio_worker._watch._watchdog import BOOTSTRAP
from trio_worker.testing import FakePlatform, run_platform_server

# In place of BOOTSTRAP's last line: what the waiting watchdog imported, and its cost.
REPORT = """\
import resource, trio_worker._capture._feed
usage = resource.getrusage(resource.RUSAGE_SELF)
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
rollup = [line.split() for line in open("/proc/self/smaps_rollup")]
private = sum(int(f[1]) for f in rollup if f[0] in ("Private_Clean:", "Private_Dirty:"))
print(usage.ru_utime + usage.ru_stime, int(status["VmRSS"].split()[0]), private, len(sys.modules))
"""
APP = """
import trio_worker

trio_worker.start(lambda job: {"ok": True})
"""
FORMS = {
    "fork": ([], {}),
    "launcher": (["-m", "trio_worker"], {}),
    "off": ([], {"TRIO_WORKER_CRASH_WATCH": "0"}),
}


def waiting_imports(site: bool) -> dict[str, float]:
    import trio_worker

    spec = {"path": sys.path, "package": os.path.dirname(trio_worker.__file__)}
    code = BOOTSTRAP.replace("main(spec)\n", REPORT)
    flags = [] if site else ["-S"]
    argv = [sys.executable, *flags, "-c", code, marshal.dumps(spec).hex()]
    done = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60)
    cpu, rss, private, modules = done.stdout.split()
    return {"cpu_ms": float(cpu) * 1e3, "rss_kib": int(rss), "private_kib": int(private),
            "modules": int(modules)}  # fmt: skip


async def one_worker(form: str, app: Path) -> dict[str, float]:
    prefix, extra = FORMS[form]
    fake = FakePlatform(take_hold=5.0)
    async with run_platform_server(fake) as url:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNPOD_")}
        env.update(fake.worker_env(url), **extra)
        job_id = fake.enqueue({})
        spawned = time.monotonic()
        process = await trio.lowlevel.open_process(
            [sys.executable, *prefix, str(app)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            with trio.fail_after(60):
                await fake.wait_for_requests("take", 1)
                first_take = time.monotonic() - spawned
                await fake.wait_for_status(job_id, "COMPLETED")
            await trio.sleep(1.0)  # idle: the watchdog waits, the worker long-polls
            tree = [process.pid, *descendants(process.pid)]
            return {
                "first_take_ms": first_take * 1e3,
                "cpu_ms": sum(cpu_seconds(pid) or 0 for pid in tree) * 1e3,
                "started_rss_kib": rss_kib(process.pid) or 0,
                "started_private_kib": private_kib(process.pid) or 0,
                "tree_pss_kib": sum(smaps_kib(pid, "Pss:") or 0 for pid in tree),
            }
        finally:
            os.killpg(process.pid, signal.SIGKILL)  # the worker follows (PDEATHSIG)
            await process.wait()


def medians(samples: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(s[key] for s in samples) for key in samples[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="samples of each (default 7)")
    args = parser.parse_args()
    print(f"{sys.executable}, median of {args.runs}\n")
    print("| the waiting watchdog | CPU to there | resident | private | modules |")
    print("|---|---:|---:|---:|---:|")
    for site in (False, True):
        m = medians([waiting_imports(site) for _ in range(args.runs)])
        name = "with site (no -S)" if site else "python -S (as shipped)"
        print(f"| {name} | {m['cpu_ms']:.1f} ms | {m['rss_kib'] / 1024:.2f} MiB | "
              f"{m['private_kib'] / 1024:.2f} MiB | {m['modules']:.0f} |")  # fmt: skip
    runs: dict[str, list[dict[str, float]]] = {form: [] for form in FORMS}
    with tempfile.TemporaryDirectory() as workdir:
        app = Path(workdir) / "app.py"
        app.write_text(APP)
        for _ in range(args.runs):
            for form in FORMS:
                runs[form].append(trio.run(one_worker, form, app))
    print("\n| started as | spawn to first take | CPU, every process | the started process "
          "(resident, private) | PSS, every process |")  # fmt: skip
    print("|---|---:|---:|---:|---:|")
    for form, samples in runs.items():
        m = medians(samples)
        print(f"| {form} | {m['first_take_ms']:.0f} ms | {m['cpu_ms']:.0f} ms | "
              f"{m['started_rss_kib'] / 1024:.2f} MiB, {m['started_private_kib'] / 1024:.2f} MiB"
              f" | {m['tree_pss_kib'] / 1024:.2f} MiB |")  # fmt: skip


if __name__ == "__main__":
    main()
