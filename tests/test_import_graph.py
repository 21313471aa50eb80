"""The engine's modules import one way (issue 14).

No cycle inside ``collective/``, counting imports at module level and under ``TYPE_CHECKING``
(a cycle of types is still a cycle a reader must hold in mind); and none across ``collective/``
and ``policy/`` together counting imports inside functions too: a lazy import that closes a
circle is still a circle (lazy imports of optional heavy dependencies, ray or matplotlib, are
outside both packages and not counted). ``policy/`` sits below the engine: it imports from
``collective/`` only the shared types below both (``SHARED``). ``from collective import NAME``
counts as an import of NAME's home module (``collective/__init__.py`` loads it on first use)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: What ``policy/`` may import from ``collective/``: the action-space types, the seeded streams,
#: and how a file is read and written (``collective.outputs``: standard library only, importing
#: nothing of either package; a checkpoint is written and read as every other file is).
SHARED = {"collective.actions", "collective.seeding", "collective.outputs"}


def _modules(pkg: str) -> dict[str, Path]:
    out = {}
    for f in (ROOT / pkg).rglob("*.py"):
        name = ".".join(f.relative_to(ROOT).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = f
    return out


@functools.cache
def _homes() -> dict[str, str]:
    """``collective/__init__.py``'s lazily loaded names and the modules they come from."""
    tree = ast.parse((ROOT / "collective" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "_HOME":
            return ast.literal_eval(node.value)  # type: ignore[arg-type]
    raise AssertionError("collective/__init__.py has no _HOME table")


def _imports(tree: ast.AST, mods: dict[str, Path], functions: bool = False) -> set[str]:
    """Modules of ``mods`` imported outside function bodies (and inside them: ``functions``)."""
    found: set[str] = set()
    homes = _homes()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) and not functions:
                continue
            if isinstance(child, ast.ImportFrom) and child.module:
                subs = [f"{child.module}.{a.name}" for a in child.names]
                found.update(s for s in subs if s in mods)
                if not all(s in mods for s in subs):
                    found.add(child.module)
                if child.module == "collective":
                    found.update(homes[a.name] for a in child.names if a.name in homes)
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


def _graph(mods: dict[str, Path], functions: bool = False) -> dict[str, set[str]]:
    return {
        m: {
            t
            for t in _imports(ast.parse(f.read_text()), mods, functions)
            if not m.startswith(t + ".")
        }
        - {m}
        for m, f in mods.items()
    }


def test_no_import_cycle_inside_collective() -> None:
    assert _cycle(_graph(_modules("collective"))) == []


def test_no_import_cycle_across_both_packages_counting_lazy_imports() -> None:
    both = {**_modules("collective"), **_modules("policy")}
    assert _cycle(_graph(both, functions=True)) == []


def test_policy_imports_from_collective_only_the_shared_types() -> None:
    both = {**_modules("collective"), **_modules("policy")}
    graph = _graph(both, functions=True)
    crossing = {
        (m, t)
        for m in both
        if m.startswith("policy")
        for t in graph[m] - SHARED
        if t.split(".")[0] == "collective" and t != "collective"
    }
    assert sorted(crossing) == []


def test_the_check_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycle(graph) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) == []


def test_the_check_sees_lazy_imports_and_the_packages_lazy_names() -> None:
    mods = {"collective": Path(), "collective.records": Path(), "policy.x": Path()}
    tree = ast.parse("def f():\n    from collective import EpisodeConfig\n")
    assert _imports(tree, mods) == set()
    assert _imports(tree, mods, functions=True) == {"collective", "collective.records"}
