"""Fitness checks: a broken host is reported as broken, before it takes a job.

- ``_registry``: ``register_fitness_check`` (the reference's decorator) and the runner,
  each check bounded by ``Timings.fitness_check_timeout``.
- ``_builtin``: the built-in checks (memory, disk, and the GPU and network ones below),
  with the reference's names and ``RUNPOD_*`` variables.
- ``_gpu`` and ``_gpu_probe``: the GPU checks, in child processes.
- ``_reach``: the platform's reachability and the unhealthy ping.
- ``_gate``: all of it before the first take, and a failure's ping and exit.

docs/reference.md ("Fitness checks") is the user's view.
"""

from __future__ import annotations

from ._gate import FitnessCheckFailed, check_fitness, check_then_serve, note_local_mode
from ._registry import register_fitness_check

__all__ = [
    "FitnessCheckFailed",
    "check_fitness",
    "check_then_serve",
    "note_local_mode",
    "register_fitness_check",
]
