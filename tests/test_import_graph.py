"""The engine's modules import one way (issue 14): no cycle inside ``collective/``, counting
imports at module level and under ``TYPE_CHECKING`` (a cycle of types is still a cycle a
reader must hold in mind). Imports inside functions are left out: they are the known,
deliberate exceptions (train, study and cluster load each other's entry points lazily)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _modules(pkg: str) -> dict[str, Path]:
    out = {}
    for f in (ROOT / pkg).rglob("*.py"):
        name = ".".join(f.relative_to(ROOT).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = f
    return out


def _imports(tree: ast.AST, mods: dict[str, Path]) -> set[str]:
    """Modules of ``mods`` imported outside function bodies."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if isinstance(child, ast.ImportFrom) and child.module:
                subs = [f"{child.module}.{a.name}" for a in child.names]
                found.update(s for s in subs if s in mods)
                if not all(s in mods for s in subs):
                    found.add(child.module)
            elif isinstance(child, ast.Import):
                found.update(a.name for a in child.names)
            visit(child)

    visit(tree)
    return found & mods.keys()


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of ``graph`` (as a path), or [] if it has none."""
    state: dict[str, int] = {}
    path: list[str] = []

    def walk(v: str) -> list[str]:
        state[v] = 1
        path.append(v)
        for w in sorted(graph[v]):
            if state.get(w) == 1:
                return [*path[path.index(w) :], w]
            if w not in state and (found := walk(w)):
                return found
        state[v] = 2
        path.pop()
        return []

    for v in sorted(graph):
        if v not in state and (found := walk(v)):
            return found
    return []


def _graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    return {
        m: {t for t in _imports(ast.parse(f.read_text()), mods) if not m.startswith(t + ".")} - {m}
        for m, f in mods.items()
    }


def test_no_import_cycle_inside_collective() -> None:
    assert _cycle(_graph(_modules("collective"))) == []


def test_the_check_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycle(graph) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) == []
