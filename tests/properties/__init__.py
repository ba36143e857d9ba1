"""The property-based race suite: scenario runner, strategies, invariant checkers.

Settings profiles live here (``tests/conftest.py`` is not ours to create: other suites
share it), and ``tests/test_properties.py`` applies them to its tests:

* ``default`` (CI): a fixed seed (``derandomize``), so CI is reproducible, with enough
  examples per property that the mutation check (``scripts/mutation_check.py``) catches
  every planted bug; the whole suite runs in about a minute on 2 cores.
* ``soak``: random seeds, 40 times the examples, the example database on, for long
  exploratory runs.

Select with ``HYPOTHESIS_PROFILE=soak``. A name this suite does not define falls back to
``default`` (so a global ``HYPOTHESIS_PROFILE=ci`` for other suites does not break this one).
Both profiles print the reproducing blob of a failure (``print_blob=True``).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

__all__ = ["PROFILES", "PROFILE_NAME", "examples"]

_COMMON = {
    "deadline": None,
    "print_blob": True,
    "suppress_health_check": [
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
}

PROFILES: dict[str, tuple[settings, int]] = {
    # (settings, scale applied to each property's example count)
    "default": (settings(derandomize=True, database=None, **_COMMON), 1),  # type: ignore[arg-type]
    "soak": (settings(derandomize=False, **_COMMON), 40),  # type: ignore[arg-type]
}
settings.register_profile("soak", PROFILES["soak"][0])

_requested = os.environ.get("HYPOTHESIS_PROFILE", "default")
PROFILE_NAME = _requested if _requested in PROFILES else "default"


def examples(count: int) -> settings:
    """The settings of one property: *count* examples under ``default``, scaled for soak."""
    parent, scale = PROFILES[PROFILE_NAME]
    return settings(parent, max_examples=count * scale)
