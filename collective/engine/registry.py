"""Finding a world by name: a built-in, ``path/to/file.py:Class`` or ``package.module:Class``
(a World, or an Open Reward Standard environment class), or ``ors:http://HOST:PORT/NAME`` (an
environment served over HTTP)."""

from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib
import importlib.util
import inspect
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from collective.records import EpisodeConfig
from collective.world import (
    Commons,
    World,
    WorldBug,
    check_built,
    checked_observation,
    checked_score,
    convert_params,
)
from collective.world.ors import OrsError

_loaded: dict[str, type[World]] = {}


def builtin_worlds() -> dict[str, str]:
    from worlds import BUILTIN

    return BUILTIN


def resolve_world(ref: str) -> type[World]:
    """The World subclass a reference names; a clear ValueError if it names nothing usable."""
    cls = _loaded.get(ref)
    if cls is not None:
        return cls
    if ref.startswith("ors:"):  # an Open Reward Standard environment served over HTTP
        from collective.world.ors import HttpSource, ors_world

        source = HttpSource(ref.removeprefix("ors:"))
        cls = _loaded[ref] = ors_world(source, source.name)
        return cls
    builtins = builtin_worlds()
    target = builtins.get(ref, ref)
    if target not in builtins.values():
        from collective.world.ors import quiet_sdk

        quiet_sdk()  # (before the module imports the SDK, if it does)
    if ":" not in target:
        if target.endswith(".py") or "/" in target:
            raise ValueError(_name_the_class(target))
        raise ValueError(
            f"unknown world {ref!r}; built-in worlds are: {', '.join(sorted(builtins))}; "
            "or give path/to/file.py:ClassName or package.module:ClassName"
        )
    where, _, name = target.rpartition(":")
    if where.endswith(".py") or "/" in where:
        path = Path(where)
        if not path.is_file():
            raise ValueError(f"world {ref!r}: no file {where}")
        digest = hashlib.blake2b(str(path.resolve()).encode(), digest_size=6).hexdigest()
        mod_name = f"_collective_world_{digest}"
        spec = importlib.util.spec_from_file_location(mod_name, path)
        if spec is None or spec.loader is None:
            raise ValueError(f"world {ref!r}: cannot load {where} as Python")
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        try:
            with _ctrl_c_told_apart() as pressed:
                spec.loader.exec_module(module)
        except BaseException as e:  # sys.exit() or a BaseException of its own: one line too
            del sys.modules[mod_name]
            if isinstance(e, KeyboardInterrupt) and pressed:
                raise
            raise ValueError(f"world {ref!r}: importing {where} failed: {_told(e)}") from e
    else:
        if where.startswith("."):
            raise ValueError(
                f"world {ref!r}: {where!r} is a relative module name; give package.module:Class"
            )
        try:
            with _ctrl_c_told_apart() as pressed:
                module = importlib.import_module(where)
        except ImportError as e:
            raise ValueError(f"world {ref!r}: cannot import module {where!r} ({e})") from e
        except BaseException as e:
            if isinstance(e, KeyboardInterrupt) and pressed:
                raise
            raise ValueError(f"world {ref!r}: importing {where} failed: {_told(e)}") from e
    cls = getattr(module, name, None)
    from collective.world.ors import LocalSource, is_environment, ors_world

    if is_environment(cls):  # an Open Reward Standard environment, run in this process
        cls = ors_world(LocalSource(cls), name)
    if not (inspect.isclass(cls) and issubclass(cls, World)):
        raise ValueError(
            f"world {ref!r}: {where} has no World subclass named {name!r} (nor an openreward "
            "Environment)" + (f"; it is a {type(cls).__name__}" if cls is not None else "")
        )
    _loaded[ref] = cls
    return cls


def _told(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


@contextlib.contextmanager
def _ctrl_c_told_apart() -> Iterator[list[int]]:
    """A list that a Ctrl-C (SIGINT) during the block appends to: a ``KeyboardInterrupt`` with
    the list empty was raised by the code itself (a world file's ``raise KeyboardInterrupt``),
    which is that file's error, not the user stopping the command. Off the main thread no
    handler can be set: every KeyboardInterrupt then counts as a Ctrl-C."""
    if threading.current_thread() is not threading.main_thread():
        yield [signal.SIGINT]
        return
    pressed: list[int] = []
    previous = signal.getsignal(signal.SIGINT)

    def press(signum: int, frame: Any) -> None:
        pressed.append(signum)
        if callable(previous):
            previous(signum, frame)
        else:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, press)
    try:
        yield pressed
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)


def _name_the_class(path: str) -> str:
    """What to say of a file given without ``:Class``: that a file world names its class, with
    the classes the file defines (read with ``ast``, not imported: nothing runs for a hint)."""
    head = f"world {path!r} is a file: name its World class, {path}:ClassName"
    try:
        tree = ast.parse(Path(path).read_bytes())
    except (OSError, SyntaxError, ValueError):
        return head + ("" if Path(path).is_file() else f" (and there is no file {path})")
    classes = [n.name for n in tree.body if isinstance(n, ast.ClassDef)]
    if not classes:
        return f"{head} ({path} defines no class)"
    return f"{head} ({path} defines {', '.join(classes[:8])}{', ...' * (len(classes) > 8)})"


def make_world(ref: str, n_agents: int, seed: int, params: dict[str, Any]) -> World:
    """Build a world for an episode: its parameters checked and converted against the
    constructor's annotations, then the instance checked (``check_built``); every problem is
    a one-line ValueError naming the world, before anything runs."""
    cls = resolve_world(ref)
    params = convert_params(cls, params, ref)
    try:
        world = cls(n_agents=n_agents, seed=seed, **params)
    except MemoryError:
        raise
    except OrsError as e:  # the environment or its server: what went wrong, not where
        raise ValueError(f"world {ref!r}: {e}") from e
    except Exception as e:
        bug = WorldBug(cls, "__init__", e)
        raise ValueError(f"world {ref!r}: building it failed: {bug.error} at {bug.where}") from e
    try:
        check_built(world)
    except ValueError as e:
        with contextlib.suppress(Exception):  # the problem worth naming is the first
            world.close()
        raise ValueError(f"world {ref!r}: {e}") from None
    return world


def is_builtin(ref: str) -> bool:
    """Whether ``ref`` names a built-in world: the only worlds an episode file may name and have
    imported without the user naming them (anything else is code the file's author chose)."""
    return ref in builtin_worlds()


def commons_mismatch(cls: type[World], params: dict[str, Any], version: int) -> str:
    """Why a world's commons parameter cannot be the one an episode pinned to policy
    ``version`` starts from ("" if it can): the commons of version v is the one episodes of
    version v play with (``collective.rl.commons``), so a record naming another version (999
    for an episode of version 1, -5, a version no run made) holds what it does not say. -1 is
    no commons."""
    held = params.get(cls.commons) if cls.commons else None
    if not isinstance(held, Commons) or held.version == -1:
        return ""
    if held.version < -1 or held.version != version:
        pinned = f"pinned to policy version {version}" if version >= 0 else "not pinned"
        return (
            f"its commons ({cls.commons}) says version {held.version}, but the episode is "
            f"{pinned}: an episode of version v starts from commons version v (-1: none)"
        )
    return ""


def check_runnable(cfg: EpisodeConfig) -> None:
    """Build, once, everything an episode of ``cfg`` builds before its first event (the
    organisation, each group's world, its tools, score and first observation), then throw it
    away: a bad name, parameter or size is a one-line ValueError before the run, not a
    traceback from inside a run that has started writing. (Class-level checks of a world's
    definition are the world's own.)"""
    from collective.engine.limits import check_agents, memory_cap, world_footprint
    from collective.engine.organisation import make_organisation

    org = make_organisation(cfg.org, cfg.budget)
    what = f"world {cfg.world!r}"
    check_agents(cfg.agents + cfg.budget, what)
    sizes = org.groups(cfg.agents)
    if sum(sizes) != cfg.agents or min(sizes) < 1:
        raise ValueError(f"organisation {cfg.org!r} cannot split {cfg.agents} agents ({sizes})")
    if cfg.world_agents and len(sizes) != 1:
        raise ValueError(f"world_agents needs a one-group organisation, not {cfg.org!r}")
    world_sizes = [cfg.world_agents] if cfg.world_agents else sizes
    # Every group holds its own world: what they say they take, before one is built.
    cls = resolve_world(cfg.world)
    params = convert_params(cls, cfg.params, cfg.world)
    if why := commons_mismatch(cls, params, cfg.policy_version):
        raise ValueError(f"world {cfg.world!r}: {why}")
    each = {n: world_footprint(cls, n, params, cfg.world) for n in set(world_sizes)}
    worlds = sum(each[n] for n in world_sizes)
    check_agents(cfg.agents + cfg.budget, what, worlds, max(each.values()))
    for n in sorted(set(world_sizes)):
        try:
            with memory_cap():
                world = make_world(cfg.world, n, cfg.world_seed, cfg.params)
        except MemoryError:
            raise ValueError(
                f"world {cfg.world!r} with {cfg.params or 'its default parameters'} for {n} "
                "agents needs more memory than half of what this machine has available (the "
                "other half is the run's)"
            ) from None
        try:
            for method, call in (
                ("tool_specs", world.tool_specs),
                ("score", lambda w=world: checked_score(w)),
                ("observe", lambda w=world: checked_observation(w, 0)),
            ):
                try:
                    call()
                except Exception as e:
                    bug = WorldBug(world, method, e, fn=getattr(world, method))
                    raise ValueError(f"world {cfg.world!r}: {bug.line()}") from e
        finally:
            world.close()
