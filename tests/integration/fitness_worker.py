"""A worker process for the fitness-check tests: ``python fitness_worker.py [flags]``.

``TW_CHECK`` picks the user's check (none, one that passes, fails sync or async, or hangs);
``TW_FITNESS_BOUND`` sets ``Timings.fitness_check_timeout``.
"""

from __future__ import annotations

import os
import time

import trio_worker

CHECK = os.environ.get("TW_CHECK", "")

if CHECK == "pass":

    @trio_worker.register_fitness_check
    def model_files_present() -> None:
        print("user check ran", flush=True)

elif CHECK == "fail_sync":

    @trio_worker.register_fitness_check
    def model_files_present() -> None:
        raise RuntimeError("model file /models/model.safetensors not found")

elif CHECK == "fail_async":

    @trio_worker.register_fitness_check
    async def model_files_present() -> None:  # type: ignore[misc]  # one per scenario
        raise RuntimeError("model file /models/model.safetensors not found")

elif CHECK == "hang":

    @trio_worker.register_fitness_check
    def stuck_mount() -> None:
        time.sleep(3600)


def handler(job: dict[str, object]) -> dict[str, object]:
    return {"echo": job["input"]}


if __name__ == "__main__":
    bound = float(os.environ.get("TW_FITNESS_BOUND", "120"))
    trio_worker.start(handler, timings=trio_worker.Timings(fitness_check_timeout=bound))
