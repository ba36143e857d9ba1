"""The package's layout keeps its promises (docs/how-it-works.md, the module map).

Read from the source with ``ast``, so the checks see every import, including those under
``TYPE_CHECKING`` and inside functions: a cycle hidden behind a lazy import is still a
cycle for the reader.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "trio_worker"

# Layers that sit below the supervisor: data flows into them, never back out.
LOWER_LAYERS = (
    "trio_worker._platform",
    "trio_worker._capture",
    "trio_worker._endpoint",
    "trio_worker.testing",
)
UPPER_MODULES = (
    "trio_worker._supervisor",
    "trio_worker._worker",
    "trio_worker._start",
    "trio_worker._runner",
    "trio_worker._local",
)
# trio_worker.testing.serve is the worker with its test seams: it must import the worker.
# The rest of testing/ (the fake platform and its servers) stands below it.
SEAM_HELPERS = ("trio_worker.testing._worker",)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The package modules *path* imports (a package's re-exports count as its own)."""
    name = _module_name(path)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                prefix = ".".join([*base, node.module] if node.module else base)
            else:
                prefix = node.module or ""
            targets = [f"{prefix}.{alias.name}" for alias in node.names]
            if node.module:
                targets.append(prefix)
        else:
            continue
        found.update(t for t in targets if t in modules and t != name)
    return found


def _graph() -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = set(paths)
    return {name: _imports(path, modules) for name, path in paths.items()}


def _is_parent(a: str, b: str) -> bool:
    return b.startswith(a + ".")


def test_the_graph_is_read() -> None:
    graph = _graph()
    # A reader that found nothing would pass every check below.
    assert "trio_worker._platform._client" in graph["trio_worker._supervisor"]
    assert "trio_worker._capture._redact" in graph["trio_worker._capture._fd"]


def test_no_import_cycles() -> None:
    assert _circles(_graph()) == []


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            # A submodule's import of its own package adds nothing: the package is always
            # imported first. A package's import of its submodules (a re-export) counts:
            # a submodule that imports back what imports the package closes a circle.
            if _is_parent(nxt, node):
                continue
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return cycles


def test_a_circle_through_a_package_re_export_is_found() -> None:
    """``a`` imports package ``p``, whose ``__init__`` re-exports ``p._b``, which imports
    ``a``: a circle (importing ``a`` first fails), where ``p._b`` importing ``p`` is not."""
    graph = {"pkg.a": {"pkg.p"}, "pkg.p": {"pkg.p._b"}, "pkg.p._b": {"pkg.a"}}
    assert _circles(graph) == [["pkg.a", "pkg.p", "pkg.p._b", "pkg.a"]]
    assert _circles({"pkg.p": {"pkg.p._b"}, "pkg.p._b": {"pkg.p"}}) == []


IMPORT_EACH_FIRST = """
import importlib, sys
failed = []
for name in sys.argv[1:]:
    for loaded in [m for m in sys.modules if m.split(".")[0] == "trio_worker"]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed.append(f"{name}: {exc!r}")
print("\\n".join(failed))
"""


def test_every_module_imports_first_in_a_fresh_interpreter() -> None:
    """What a circle breaks at run time: a module imported before the rest (by a tool, a
    test or a lazy import) finds a partly initialised one."""
    names = sorted(n for n in _graph() if not n.endswith("__main__"))
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_EACH_FIRST, *names],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout.strip() == ""


@pytest.mark.parametrize("layer", LOWER_LAYERS)
def test_lower_layers_never_import_the_layers_above(layer: str) -> None:
    graph = _graph()
    offenders = {
        module: sorted(set(imports) & set(UPPER_MODULES))
        for module, imports in graph.items()
        if (module == layer or _is_parent(layer, module))
        and module not in SEAM_HELPERS
        and set(imports) & set(UPPER_MODULES)
    }
    assert offenders == {}


def test_product_code_never_imports_the_testing_package() -> None:
    # The local endpoint is a product feature built on its own modules; the fake platform
    # in trio_worker.testing is built on it, never the reverse.
    graph = _graph()
    offenders = {
        module: sorted(i for i in imports if i.startswith("trio_worker.testing"))
        for module, imports in graph.items()
        if not module.startswith("trio_worker.testing")
        and any(i.startswith("trio_worker.testing") for i in imports)
    }
    assert offenders == {}
    # The rule is read from a graph that does see the testing package build on it.
    assert "trio_worker._endpoint._app" in graph["trio_worker.testing._app"]


@pytest.mark.parametrize("folder", ["_endpoint", "testing"])
def test_no_module_is_over_450_lines(folder: str) -> None:
    long = {
        str(path.relative_to(PACKAGE.parent)): lines
        for path in (PACKAGE / folder).rglob("*.py")
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > 450
    }
    assert long == {}


def test_capture_platform_and_endpoint_stay_self_contained() -> None:
    # _capture and _endpoint import only themselves; _platform only itself and the leaf
    # modules every layer shares (config, the proxy rules config reads, exceptions,
    # version).
    shared = {
        "trio_worker._config",
        "trio_worker._proxies",
        "trio_worker._exceptions",
        "trio_worker._version",
    }
    graph = _graph()
    for layer, allowed in (
        ("trio_worker._capture", set()),
        ("trio_worker._endpoint", set()),
        ("trio_worker._platform", shared),
    ):
        for module, imports in graph.items():
            if module == layer or _is_parent(layer, module):
                outside = {i for i in imports if not (i == layer or _is_parent(layer, i))}
                assert outside <= allowed, (module, outside - allowed)
