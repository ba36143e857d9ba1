"""Load-balancing endpoints: the user's ASGI app served on hypercorn, its load supervised.

See docs/load-balancing.md and docs/design.md §14; each module's docstring says its part.
"""

from __future__ import annotations

from ._start import start_app

__all__ = ["start_app"]
