"""The engine's modules import one way, and the folders are the floors (issues 14, 27).

No cycle inside ``collective/``, counting imports at module level and under ``TYPE_CHECKING``
(a cycle of types is still a cycle a reader must hold in mind); and none across ``collective/``
and ``policy/`` together counting imports inside functions too: a lazy import that closes a
circle is still a circle (lazy imports of optional heavy dependencies, ray or matplotlib, are
outside both packages and not counted). Each subpackage of ``collective/`` is a floor
(``FLOORS``) and imports only floors below it or its own modules; ``policy/`` stands on
``collective.base`` alone. ``from collective import NAME`` counts as an import of every face
``collective/__init__.py`` hands names on from (it loads one on first use), and importing
``a.b.c`` counts as importing the package faces ``a.b`` and ``a`` too (Python runs them
first). Above the library stands ``experiments/`` (the studies as programs), which no module of
``collective/``, ``policy/`` or ``worlds/`` imports; and ``collective/`` reaches ``worlds/`` only
through the registry of built-in worlds (``REACHES_WORLDS``): the worlds stand on the
library."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from tests.support import ROOT

#: The floors, bottom up: a module imports only floors below its own, or modules of its own
#: folder. ``policy/`` stands beside ``records`` (above ``base``, below the engine).
FLOORS = {
    "collective.base": 0,
    "policy": 1,
    "collective.records": 1,
    "collective.world": 2,
    "collective.engine": 3,
    "collective.replay": 4,
    "collective.views": 4,
    "collective.rl": 5,
    "collective.studies": 6,
    "collective.cli": 7,
    "collective": 8,  # the top face: hands names on, imported by none of ours
}


#: The one module of ``collective/`` that imports ``worlds/``: the registry of built-in worlds
#: (``worlds.BUILTIN``, read by name when a world is resolved).
REACHES_WORLDS = {"collective.engine.registry"}


def floor_of(module: str) -> str:
    """The floor (a key of ``FLOORS``) a module stands on: its longest matching prefix."""
    parts = module.split(".")
    for k in range(len(parts), 0, -1):
        if ".".join(parts[:k]) in FLOORS:
            return ".".join(parts[:k])
    raise AssertionError(f"{module} stands on no floor of FLOORS")


def _modules(pkg: str) -> dict[str, Path]:
    out = {}
    for f in (ROOT / pkg).rglob("*.py"):
        name = ".".join(f.relative_to(ROOT).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = f
    return out


@functools.cache
def _faces() -> tuple[str, ...]:
    """The faces ``collective/__init__.py`` hands names on from (its ``FACES``)."""
    tree = ast.parse((ROOT / "collective" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "FACES":
            return ast.literal_eval(node.value)  # type: ignore[no-any-return]
    raise AssertionError("collective/__init__.py has no FACES")


def _parents(module: str) -> list[str]:
    """``a.b.c`` -> ``[a.b.c, a.b]``: what importing a module runs (the top package too, which
    hands names on lazily and imports nothing of ours when it runs, so it is left out)."""
    parts = module.split(".")
    return [".".join(parts[:k]) for k in range(len(parts), 1, -1)] or [module]


def _imports(tree: ast.AST, mods: dict[str, Path], functions: bool = False) -> set[str]:
    """Modules of ``mods`` imported outside function bodies (and inside them: ``functions``)."""
    found: set[str] = set()

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
                    found.update(_faces())  # whichever face holds the name: any of them
            elif isinstance(child, ast.Import):
                found.update(a.name for a in child.names)
            visit(child)

    visit(tree)
    return {p for f in found for p in _parents(f)} & mods.keys()


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


def test_every_import_runs_down_the_floors() -> None:
    """A module imports floors below its own or its own folder, counting lazy imports: the
    engine nothing of rl, replay, views or studies; records and world no engine; policy only
    the ground floor."""
    both = {**_modules("collective"), **_modules("policy")}
    graph = _graph(both, functions=True)
    upward = sorted(
        (m, t)
        for m, targets in graph.items()
        for t in targets
        if (fm := floor_of(m)) != (ft := floor_of(t))
        and FLOORS[ft] >= FLOORS[fm]
        and t != "collective"  # the top face, which every module's import runs (no names used)
    )
    assert upward == []


def test_every_module_stands_on_a_floor_and_every_floor_has_a_face() -> None:
    for m in _modules("collective"):
        floor_of(m)
    for floor in FLOORS:
        path = ROOT / Path(*floor.split("."))
        assert path.with_suffix(".py").is_file() or (path / "__init__.py").is_file(), floor


def test_the_check_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycle(graph) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) == []


def test_the_check_sees_lazy_imports_the_packages_faces_and_parents() -> None:
    mods = {"collective": Path(), "collective.records": Path(), "policy.x": Path()}
    tree = ast.parse("def f():\n    from collective import EpisodeConfig\n")
    assert _imports(tree, mods) == set()
    assert _imports(tree, mods, functions=True) == {"collective", "collective.records"}
    tree = ast.parse("from collective.records.schema import Turn\n")
    assert _imports(tree, mods) == {"collective.records"}
    assert floor_of("collective.engine.conductor") == "collective.engine"
    assert floor_of("policy.tiny.model") == "policy"


def test_nothing_but_bench_imports_bench() -> None:
    """bench/ holds programs: the packages and the tests import nothing of it (what both need
    lives in the package, or in tests/support/), so an installed copy and the suite stand
    without a checkout's bench/ on the path."""
    bench = {**_modules("bench"), "bench": ROOT / "bench" / "__init__.py"}
    for pkg in ("collective", "policy", "worlds", "tests"):
        for m, f in _modules(pkg).items():
            got = _imports(ast.parse(f.read_text()), bench, functions=True)
            assert not got, f"{m} imports {sorted(got)} from bench/"


def test_the_library_imports_nothing_of_the_experiments() -> None:
    """``experiments/`` holds programs on the library (``collective experiment`` runs one in a
    process of its own): the library imports nothing of it, counting lazy imports, so it stands
    without them."""
    experiments = _modules("experiments")
    for pkg in ("collective", "policy", "worlds"):
        for m, f in _modules(pkg).items():
            got = _imports(ast.parse(f.read_text()), experiments, functions=True)
            assert not got, f"{m} imports {sorted(got)} from experiments/"


def test_collective_reaches_the_worlds_only_through_the_registry() -> None:
    """The worlds stand on the library (a world is written against ``collective.world``), so
    an import of ``worlds`` from ``collective/`` runs back up; the registry's lazy import of
    ``worlds.BUILTIN`` is the one allowed, counting lazy imports."""
    worlds = _modules("worlds")
    reaching = {
        m
        for m, f in _modules("collective").items()
        if _imports(ast.parse(f.read_text()), worlds, functions=True)
    }
    assert reaching == REACHES_WORLDS


def test_the_experiment_and_world_checks_see_an_import() -> None:
    mods = {"worlds": Path(), "worlds.city": Path(), "experiments": Path()}
    tree = ast.parse("def f():\n    from worlds.city import BLOCK\n")
    assert _imports(tree, mods) == set()
    assert _imports(tree, mods, functions=True) == {"worlds.city"}
    assert _imports(ast.parse("from experiments import city\n"), mods) == {"experiments"}


def test_the_bench_check_sees_a_bench_import() -> None:
    bench = {"bench": Path(), "bench.city": Path()}
    assert _imports(ast.parse("def f():\n    from bench.city import Crowd\n"), bench, True)
    assert _imports(ast.parse("import bench.city\n"), bench) == {"bench.city"}
