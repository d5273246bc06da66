"""The package's layer contract (STYLE 14, issue 32): imports only run down the layers, and no
module imports itself back through others. Read from the source with ``ast``: every import,
lazy ones inside functions included, since a lazy import is still a dependency."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[2] / "engine"

LAYERS: tuple[frozenset[str], ...] = (
    # pure foundations: the error tree, the shared types, the one namespace rule, file helpers
    frozenset({"engine", "engine.errors", "engine.types", "engine.validation", "engine.fsutil"}),
    frozenset({"engine.facts", "engine.lifecycle"}),  # facts from JSON; what is active when
    # model runtimes, FAISS indexes, stores: each knows nothing of the others' callers
    frozenset({"engine.runtime", "engine.index", "engine.store"}),
    frozenset({"engine.reads"}),  # recall, get and history now or as of a point: store + index
    frozenset({"engine.gate"}),  # the decision pipeline over store / index protocols
    frozenset({"engine.core"}),  # queue, batcher, admission: transport-free
    frozenset({"engine.app"}),  # the composition root: settings -> an opened engine
    # what runs on an engine: services, jobs, offline tuning, framework adapters, model builds
    frozenset(
        {
            "engine.server",
            "engine.client",
            "engine.backfill",
            "engine.tuning",
            "engine.adapters",
            "engine.pipeline",
        }
    ),
    frozenset({"engine.cli", "engine.__main__"}),  # the console script
)
"""Lowest first. A package may import its own layer's packages (no cycle among them) and any
layer below it, never one above."""


def _module(path: Path) -> str:
    parts = list(path.relative_to(ENGINE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    modules = {_module(p): p for p in ENGINE.rglob("*.py") if "_proto" not in p.parts}
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            targets: set[str] = set()
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                named = {f"{node.module}.{a.name}" for a in node.names} & modules.keys()
                targets = named or ({node.module} & modules.keys())
            elif isinstance(node, ast.Import):
                targets = {a.name for a in node.names} & modules.keys()
            graph[name] |= {t for t in targets if t != name}
        graph.setdefault(name, set())
    return graph


def _package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def _layer(package: str) -> int:
    for i, members in enumerate(LAYERS):
        if package in members:
            return i
    raise AssertionError(f"{package} is in no layer: add it to LAYERS")


def test_every_import_runs_down_the_layers() -> None:
    upward = sorted(
        f"{a} -> {b}"
        for a, deps in _graph().items()
        for b in deps
        if _layer(_package(b)) > _layer(_package(a))
    )
    assert upward == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_package_imports_itself_back() -> None:
    packages: dict[str, set[str]] = defaultdict(set)
    for a, deps in _graph().items():
        packages[_package(a)] |= {_package(b) for b in deps if _package(b) != _package(a)}
    assert _cycles(packages) == []


def test_no_module_imports_itself_back() -> None:
    graph = _graph()
    # a package's __init__ that re-exports its modules is not a cycle with them
    pruned = {
        a: {b for b in deps if not (a.startswith(b + ".") and _is_package(b))}
        for a, deps in graph.items()
    }
    assert _cycles(pruned) == []


def _is_package(module: str) -> bool:
    return (ENGINE.parent / module.replace(".", "/") / "__init__.py").is_file()


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
