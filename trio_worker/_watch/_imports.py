"""Where the watchdog imports from: the place the worker loaded the package from.

See docs/design.md §13.1 ("Every install layout"). The watchdog runs as ``python -S``
with the worker's ``sys.path`` given whole, and imports only its small loop while it
waits (``BOOTSTRAP`` in ``_watchdog``). When a crash needs the reporting code, it
imports the rest of the SDK and trio, so by then it must find them as the worker did:

* the package itself from the very directory the worker loaded it from, whatever
  ``sys.path`` says (an editable install, for one, is on no ``sys.path`` entry: a finder
  installed by a ``.pth`` file maps it to the checkout);
* its dependencies (trio, h11, httpx) through the worker's ``sys.path`` (``PYTHONPATH``
  and the directories ``.pth`` files add are on it) and the import hooks of the
  environment's ``.pth`` files, which ``-S`` skipped: ``site.main()`` runs them then, and
  not before, so a waiting watchdog pays nothing for them.

Nothing here imports beyond the standard library: it runs in the small watchdog.
"""

from __future__ import annotations

import os
import sys

__all__ = ["load_package", "site_flags"]

PACKAGE = "trio_worker"


def site_flags() -> list[str]:
    """This interpreter's flags that decide where imports come from, for another one:
    the watchdog's, or the launched handler file's."""
    if sys.flags.isolated:
        return ["-I"]
    flags = ["-E"] if sys.flags.ignore_environment else []
    flags += ["-s"] if sys.flags.no_user_site else []
    flags += ["-P"] if sys.flags.safe_path else []
    return flags


def load_package(directory: str) -> None:
    """Import the package from *directory* (and its subpackages from there), after the
    ``.pth`` files ``-S`` skipped, in place of whatever ``sys.modules`` holds for it."""
    import importlib.util
    import site

    if sys.flags.no_site:
        site.main()  # the import hooks the worker had: .pth files, sitecustomize
    spec = importlib.util.spec_from_file_location(
        PACKAGE,
        os.path.join(directory, "__init__.py"),
        submodule_search_locations=[directory],
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"no {PACKAGE} package in {directory}", name=PACKAGE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[PACKAGE]
        raise
