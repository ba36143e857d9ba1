"""A worker process for the fitness-check tests: ``python fitness_worker.py [flags]``.

``TW_CHECK`` picks the user's check (none, one that passes, fails sync or async, hangs,
forks a child and hangs, or swallows its cancellation on trio);
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

elif CHECK == "fork_and_hang":

    @trio_worker.register_fitness_check
    def forks_then_hangs() -> None:
        child = os.fork()
        if child == 0:  # a copy of the worker, as a library that forks a helper makes
            time.sleep(600)
            os._exit(0)
        with open(os.environ["TW_CHILD_PID"], "w") as out:
            out.write(str(child))
        time.sleep(3600)

elif CHECK == "swallows_cancellation":

    @trio_worker.register_fitness_check
    async def stubborn() -> None:
        import trio

        while True:
            try:
                await trio.sleep(0.01)
            except BaseException:  # the user's bare except
                pass


def handler(job: dict[str, object]) -> dict[str, object]:
    return {"echo": job["input"]}


if __name__ == "__main__":
    bound = float(os.environ.get("TW_FITNESS_BOUND", "120"))
    backend = os.environ.get("TW_BACKEND", "trio")
    trio_worker.start(
        handler,
        timings=trio_worker.Timings(fitness_check_timeout=bound),
        async_backend=backend,  # type: ignore[arg-type]
    )
