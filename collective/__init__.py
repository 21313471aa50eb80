"""collective: an actor-model simulation engine for training agent collectives with RLCR.

The floors, bottom up; each imports only the floors below it
(``tests/project/test_import_graph.py``):

    base/      plain data: actions, seeded streams, latency, primitives, logging, file writes
    records/   what an episode is (schema) and how it is kept (file format, streaming reader)
    world/     the World class a researcher writes, its tools and parameters
    engine/    where time moves (conductor, agenda) and an agent's turn happens (episode, actor)
    replay/    re-run, fork and compare recorded episodes
    views/     timelines, traces and swimlanes of an episode
    rl/        RLCR training: config, rollouts, the collective advantage, the learner, Ray
    studies/   scale studies, world checks, the statistics findings are judged by
    cli/       the ``collective`` command (``episodes``: the commands that read an episode)

An agent's action lands in ``collective.engine.episode``; a message's rules live in
``collective.engine.comms``; time moves only in ``collective.engine.conductor``, through each
episode's ``collective.engine.agenda``; the collective advantage is computed in
``collective.rl.train``. ``policy/`` (beside this package) sits on ``base/`` alone.

The names of the faces below are imported on first use (PEP 562), so importing one submodule,
such as ``collective.base.actions`` from ``policy.base``, does not load the engine: no import
loops between ``collective`` and ``policy``.
"""

from __future__ import annotations

import importlib
import os
import types
from typing import TYPE_CHECKING, Any

# One instruction set on every x86 CPU, set before anything of ours imports torch. torch's own
# kernels (ATen), MKL and oneDNN each pick their vector code by the CPU: on one with AVX-512 they
# round a layer norm, a softmax or a gradient otherwise than on one with AVX2 only, so the tiny
# sampler's float32 prefill and the learner's float32 steps, hence a training run's figures,
# depended on the machine (what differed: bench/results/rerun/README.md). AVX2 is on every x86
# CPU of the last decade, and no slower here. A variable already set is the user's choice, kept.
ISA = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
for _name, _value in ISA.items():
    os.environ.setdefault(_name, _value)

if TYPE_CHECKING:  # the same names, for type checkers (each face re-exports with ``as``)
    from collective.base import *  # noqa: F403
    from collective.engine import *  # noqa: F403
    from collective.records import *  # noqa: F403
    from collective.views import *  # noqa: F403
    from collective.world import *  # noqa: F403

#: The faces whose names ``collective`` hands on, each loaded on first use. A face lists its
#: public names once, as ``from .module import Name as Name``.
FACES = (
    "collective.base",
    "collective.records",
    "collective.world",
    "collective.engine",
    "collective.views",
)


def __getattr__(name: str) -> Any:
    if name == "__all__":  # ``from collective import *``
        return [n for n in __dir__() if n not in ("FACES", "ISA")]
    if not name.startswith("_"):
        for face in FACES:
            value = getattr(importlib.import_module(face), name, None)
            if value is not None and not isinstance(value, types.ModuleType):
                globals()[name] = value  # once
                return value
    raise AttributeError(f"module 'collective' has no attribute {name!r}")


def __dir__() -> list[str]:
    names = set(globals())
    for face in FACES:
        module = importlib.import_module(face)
        names.update(
            n
            for n, v in vars(module).items()
            if not n.startswith("_") and not isinstance(v, types.ModuleType)
        )
    return sorted(names)
