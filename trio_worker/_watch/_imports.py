"""Where the watchdog imports the reporting code from at a crash: the package from the
directory the worker loaded it from, its dependencies after the ``.pth`` files ``-S``
skipped (docs/design.md §13.1, "Every install layout"). Standard library only: it runs
in the small watchdog.
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
