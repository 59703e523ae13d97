"""Structure: no import circle inside the package, and the layers only import downwards.

The graph is read from the source and follows every import: at module level, under
``TYPE_CHECKING`` and inside functions alike, so a lazy import cannot hide a circle or a back
edge. The C extensions (declared in setup.py) are modules of their layer like any other; a
higher layer that extends a lower object registers itself with it instead of being imported.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Where each installed package's sources live (backends/ installs as commlayer.backends).
SOURCES = {"commlayer": REPO / "commlayer", "commlayer.backends": REPO / "backends"}

# The C extension modules, by the names setup.py builds them under (each a private ``_name``).
EXTENSIONS = frozenset(
    re.findall(r'"(commlayer(?:\.\w+)*\._\w+)"', (REPO / "setup.py").read_text(encoding="utf-8"))
)

# Layers, lowest first; a module may import only from its own layer or lower ones. The facade's
# parts are layers of their own: groups < monitor < calls < ops < lifecycle < torch_bridge.
LAYERS = (
    ("commlayer.core.settings",),
    ("commlayer.core",),
    ("commlayer.contract",),
    ("commlayer.backends", "commlayer.facade.groups"),
    ("commlayer.facade.monitor",),
    ("commlayer.facade.calls",),
    ("commlayer.facade.ops",),
    ("commlayer.facade.lifecycle",),
    ("commlayer.facade.torch_bridge", "commlayer.facade"),
    ("commlayer.dist",),
    (
        "commlayer.mesh",
        "commlayer.zero",
        "commlayer.ft",
        "commlayer.comms_logger",
        "commlayer.parallel",
        "commlayer.hooks",
        "commlayer.windows",
    ),
    (
        "commlayer.launch",
        "commlayer.bench",
        "commlayer.testing",
        "commlayer.cli",
        "commlayer.__main__",
        "commlayer.trace_analysis",
        "commlayer",
    ),
)
# Parts side by side: neither imports the other (both build on the layers below them only).
SEPARATE = (("commlayer.backends", "commlayer.facade"),)


def _modules() -> dict[str, Path | None]:
    """Every module: its source, or None for a C extension (which imports no project module)."""
    found: dict[str, Path | None] = dict.fromkeys(EXTENSIONS)
    for package, root in SOURCES.items():
        for path in root.rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


def _nodes(tree: ast.AST, eager_only: bool) -> Iterator[ast.AST]:
    """Every node, or with ``eager_only`` those that run at import time (not in function bodies)."""
    for child in ast.iter_child_nodes(tree):
        if eager_only and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        yield child
        yield from _nodes(child, eager_only)


def _imports(name: str, path: Path, known: set[str], eager_only: bool) -> Iterator[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in _nodes(ast.parse(path.read_text(encoding="utf-8")), eager_only):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(package, node.module, node.level)
            # ``from pkg import name``: the submodule pkg.name if there is one, else pkg itself.
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names
            ]
        else:
            continue
        for target in targets:  # importing a.b.c runs the nearest known module of that path
            while target and target not in known:
                target = target.rpartition(".")[0]
            yield from _with_parents(target, name)


def _with_parents(module: str, importer: str) -> Iterator[str]:
    """``module`` and the packages Python imports first, except the importer's own packages
    (already being imported) and the top-level ones (lazy, PEP 562)."""
    while module and module not in SOURCES and not importer.startswith(module + "."):
        if module != importer:
            yield module
        module = module.rpartition(".")[0]


def _absolute(package: str, module: str | None, level: int) -> str:
    if level == 0:
        return module or ""
    base = package.split(".")[: len(package.split(".")) - (level - 1)]
    return ".".join([*base, *([module] if module else [])])


@functools.cache
def _graph(eager_only: bool = False) -> dict[str, set[str]]:
    modules = _modules()
    return {
        name: set() if path is None else set(_imports(name, path, set(modules), eager_only))
        for name, path in modules.items()
    }


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _layer(module: str) -> int:
    best = (-1, -1)  # (length of the matching prefix, layer)
    for level, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            # The top-level package names only itself: every module must be placed explicitly.
            nested = prefix != "commlayer" and module.startswith(prefix + ".")
            if (module == prefix or nested) and len(prefix) > best[0]:
                best = (len(prefix), level)
    return best[1]


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def test_the_package_has_no_import_circle() -> None:
    """Function-local imports count: a lazy import is an edge like any other."""
    assert _cycles(_graph()) == []


def test_the_checker_follows_function_local_imports() -> None:
    lazy = sorted(set().union(*_graph().values()) - set().union(*_graph(eager_only=True).values()))
    assert "commlayer.dist" in _graph()["commlayer.comms_logger.logger"], lazy


@pytest.mark.parametrize(("one", "other"), SEPARATE)
def test_side_by_side_parts_do_not_import_each_other(one: str, other: str) -> None:
    crossing = sorted(
        f"{module} -> {target}"
        for module, targets in _graph().items()
        for target in targets
        for source, destination in ((one, other), (other, one))
        if _within(module, source) and _within(target, destination)
    )
    assert crossing == []


def test_every_module_belongs_to_a_layer() -> None:
    assert [module for module in _graph() if _layer(module) < 0] == []


def test_the_c_extensions_are_modules_of_their_layer() -> None:
    """An extension imported by name (``from commlayer.backends import _C``) is an edge to it."""
    importers = {target for targets in _graph().values() for target in targets}
    assert EXTENSIONS and EXTENSIONS <= set(_graph())
    assert "commlayer.core._tensor_meta" in importers


@pytest.mark.parametrize("module", sorted(_graph()))
def test_a_module_imports_only_its_own_layer_or_lower(module: str) -> None:
    upward = sorted(target for target in _graph()[module] if _layer(target) > _layer(module))
    assert upward == [], f"{module} (layer {_layer(module)}) imports higher layers: {upward}"


def test_the_checker_sees_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_package_folder_is_named_like_build_output() -> None:
    """Packaging and lint tools skip folders named ``dist`` and ``build``: no source folder may use them."""
    named = [
        str(path.relative_to(REPO))
        for root in SOURCES.values()
        for path in root.rglob("*")
        if path.is_dir() and path.name in {"dist", "build"}
    ]
    assert named == []
