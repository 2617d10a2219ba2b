"""Import rules over every module of every package: one direction, no circles.

The layers, lowest first: ``narbench_core`` <- ``suites`` <- ``models`` <- ``theory`` <- ``bench``, with
``bench.cli`` (the command line) on top. A module may import its own layer or any below it, never one
above; nothing outside ``bench.cli`` imports it. And no module imports itself back through others
(a file cycle), lazily or not: every import statement counts, inside functions and ``TYPE_CHECKING``
blocks too.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("narbench_core", "suites", "models", "theory", "bench", "bench.cli")


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the project's packages by dotted name (a package by its ``__init__``)."""
    out = {}
    for top in ("narbench_core", "suites", "models", "theory", "bench"):
        for path in (root / top).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the project's modules it imports (the deepest known module each statement names)."""
    def known(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [known(a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [known(f"{node.module}.{a.name}") for a in node.names]
            else:
                continue
            edges[mod] |= {t for t in targets if t and t != mod}
    return edges


def layer(module: str) -> int:
    return max(i for i, name in enumerate(LAYERS) if module == name or module.startswith(name + "."))


def upward(edges: dict[str, set[str]]) -> list[str]:
    """Imports that point up the layers."""
    return sorted(f"{a} -> {b}" for a, targets in edges.items() for b in targets if layer(b) > layer(a))


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_every_import_points_down_the_layers():
    assert upward(graph(modules())) == []


def test_no_module_imports_itself_back():
    assert cycles(graph(modules())) == []


def test_the_checks_catch_a_planted_arrow():
    edges = graph(modules())
    assert "bench.runner" in edges and "models.train" in edges
    planted = {**edges, "models.train": edges["models.train"] | {"bench.runner"}}
    assert "models.train -> bench.runner" in upward(planted)
    assert "bench.rows" in edges["bench.store"]                # the store reads rows; rows back to it loops
    looped = {**edges, "bench.rows": edges["bench.rows"] | {"bench.store"}}
    assert any({"bench.rows", "bench.store"} <= set(c) for c in cycles(looped))
    assert upward({**edges, "bench.runner": edges["bench.runner"] | {"bench.cli.run"}}) == ["bench.runner -> bench.cli.run"]
