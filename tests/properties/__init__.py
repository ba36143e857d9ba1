"""The property-based race suite: scenario runner, strategies, invariant checkers.

Settings profiles live here rather than in a ``tests/conftest.py``: registering and loading
a global ``default`` profile there would change every other Hypothesis test of the
repository. ``tests/test_properties.py`` applies them to its own tests:

* ``default`` (CI): a fixed seed (``derandomize``), so CI is reproducible, with enough
  examples per property that the mutation check (``scripts/mutation_check.py``) catches
  every planted bug; ``tests/test_properties.py`` runs in about 100 s on 2 cores.
* ``soak``: random seeds, 40 times the examples, the example database on, for long
  exploratory runs. ``HYPOTHESIS_SOAK_SCALE`` (a number above 0) replaces the 40:
  ``scripts/soak_properties.py`` runs rounds of the CI counts (or a few times them), a
  fresh seed each, so that every property is reached early and again
  (docs/property-suite.md).

Select with ``HYPOTHESIS_PROFILE=soak``. A name this suite does not define falls back to
``default`` (so a global ``HYPOTHESIS_PROFILE=ci`` for other suites does not break this one).
Both profiles print the reproducing blob of a failure (``print_blob=True``), and both leave
out Hypothesis's ``explain`` phase: once a test has failed, that phase traces every later
example line by line (``sys.settrace`` before Python 3.12) and keeps each example's set of
executed branches until the test ends. An example here runs the worker, trio, h11 and the
harness: about 130 KiB a trace, one per shrink attempt, so a soak that found a failure
grew by about 1 GiB in three minutes of shrinking, at a fifth of the speed. What it
would print ("lines always and only run by failing test cases") is the trace report's own
code, since every failing example prints its trace.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

__all__ = ["PROFILES", "PROFILE_NAME", "SOAK_SCALE_ENV", "examples"]

_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
_PHASES = tuple(phase for phase in Phase if phase is not Phase.explain)

SOAK_SCALE_ENV = "HYPOTHESIS_SOAK_SCALE"


def _soak_scale() -> float:
    raw = os.environ.get(SOAK_SCALE_ENV)
    if raw is None:
        return 40
    try:
        scale = float(raw)
    except ValueError:
        scale = 0.0
    if not scale > 0 or scale == float("inf"):
        raise ValueError(f"{SOAK_SCALE_ENV}={raw!r}: expected a number above 0, such as 2 or 0.5")
    return scale


PROFILES: dict[str, tuple[settings, float]] = {
    # name: (settings, scale applied to each property's example count)
    "default": (
        settings(
            deadline=None,
            print_blob=True,
            suppress_health_check=_HEALTH,
            phases=_PHASES,
            derandomize=True,
            database=None,
        ),
        1,
    ),
    "soak": (
        settings(deadline=None, print_blob=True, suppress_health_check=_HEALTH, phases=_PHASES),
        _soak_scale(),
    ),
}

_requested = os.environ.get("HYPOTHESIS_PROFILE", "default")
PROFILE_NAME = _requested if _requested in PROFILES else "default"


def examples(count: int) -> settings:
    """The settings of one property: *count* examples under ``default``, scaled for soak
    (at least one)."""
    parent, scale = PROFILES[PROFILE_NAME]
    return settings(parent, max_examples=max(1, round(count * scale)))
