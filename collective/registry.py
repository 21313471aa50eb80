"""Finding a world by name: a built-in, ``path/to/file.py:Class`` or ``package.module:Class``."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any

from collective.world import World

_loaded: dict[str, type[World]] = {}


def builtin_worlds() -> dict[str, str]:
    from worlds import BUILTIN

    return BUILTIN


def resolve_world(ref: str) -> type[World]:
    """The World subclass a reference names; a clear ValueError if it names nothing usable."""
    cls = _loaded.get(ref)
    if cls is not None:
        return cls
    builtins = builtin_worlds()
    target = builtins.get(ref, ref)
    if ":" not in target:
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
            spec.loader.exec_module(module)
        except Exception as e:
            raise ValueError(
                f"world {ref!r}: importing {where} failed: {type(e).__name__}: {e}"
            ) from e
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as e:
            raise ValueError(f"world {ref!r}: cannot import module {where!r} ({e})") from e
    cls = getattr(module, name, None)
    if not (inspect.isclass(cls) and issubclass(cls, World)):
        raise ValueError(f"world {ref!r}: {where} has no World subclass named {name!r}")
    _loaded[ref] = cls
    return cls


def make_world(ref: str, n_agents: int, seed: int, params: dict[str, Any]) -> World:
    cls = resolve_world(ref)
    try:
        return cls(n_agents=n_agents, seed=seed, **params)
    except TypeError as e:
        sig = inspect.signature(cls.__init__)
        takes = [p for p in sig.parameters if p not in ("self", "n_agents", "seed")]
        raise ValueError(
            f"world {ref!r} rejected parameters {sorted(params)}: {e}; "
            f"it takes: {', '.join(takes) or 'none'}"
        ) from e
