"""Fitness checks: a broken host is reported as broken, before it takes a job.

docs/reference.md ("Fitness checks") is the user's view; each module's docstring says its part.
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
