"""collective: an actor-model simulation engine for training agent collectives with RLCR.

Where things are (``docs/architecture.md`` has the picture): an agent's action lands in
``collective.episode``; a message's rules live in ``collective.comms``; who is in an episode in
``collective.cast``; time moves only in ``collective.conductor``, through each episode's
``collective.agenda``; the collective advantage is computed in ``collective.train``.

The names below are imported on first use (PEP 562), so importing one submodule, such as
``collective.actions`` from ``policy.base``, does not load the engine: no import loops between
``collective`` and ``policy``.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

# One instruction set on every x86 CPU, set before anything of ours imports torch. torch's own
# kernels (ATen), MKL and oneDNN each pick their vector code by the CPU: on one with AVX-512 they
# round a layer norm, a softmax or a gradient otherwise than on one with AVX2 only, so the tiny
# sampler's float32 prefill and the learner's float32 steps, hence a training run's figures,
# depended on the machine (measured: one learner step of the main job, other weights; a
# sampled logprob, another 7th digit). AVX2 is on every x86 CPU of the last decade and, on this
# machine's AVX-512, no slower here. A variable already set is the user's choice, and kept.
ISA = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
for _name, _value in ISA.items():
    os.environ.setdefault(_name, _value)

if TYPE_CHECKING:
    from collective.actions import Action, ActionError, ActionSpace, ArgSpec, ToolSpec, parse_action
    from collective.actor import Actor, Dismissed, EpisodeOver, default_program
    from collective.cast import Cast
    from collective.comms import Comms, Outcome
    from collective.conductor import Conductor, run_episode, run_episodes
    from collective.latency import LatencyModel, latency_preset
    from collective.organisation import Organisation, make_organisation, register_organisation
    from collective.primitives import PRIMITIVES, Primitive
    from collective.records import (
        Episode,
        EpisodeConfig,
        EpisodeFileError,
        EpisodeStream,
        EpisodeWriter,
        Turn,
        load_episode,
        open_episode,
        save_episode,
    )
    from collective.registry import resolve_world
    from collective.swimlane import draw_timeline
    from collective.trace import write_trace
    from collective.world import OneOf, Range, Text, ToolError, World, tool

_HOME: dict[str, str] = {
    "Action": "collective.actions",
    "ActionError": "collective.actions",
    "ActionSpace": "collective.actions",
    "Actor": "collective.actor",
    "ArgSpec": "collective.actions",
    "Cast": "collective.cast",
    "Comms": "collective.comms",
    "Conductor": "collective.conductor",
    "default_program": "collective.actor",
    "Dismissed": "collective.actor",
    "EpisodeOver": "collective.actor",
    "draw_timeline": "collective.swimlane",
    "Episode": "collective.records",
    "EpisodeConfig": "collective.records",
    "EpisodeFileError": "collective.records",
    "EpisodeStream": "collective.records",
    "EpisodeWriter": "collective.records",
    "latency_preset": "collective.latency",
    "LatencyModel": "collective.latency",
    "load_episode": "collective.records",
    "make_organisation": "collective.organisation",
    "OneOf": "collective.world",
    "open_episode": "collective.records",
    "Organisation": "collective.organisation",
    "Outcome": "collective.comms",
    "parse_action": "collective.actions",
    "Primitive": "collective.primitives",
    "PRIMITIVES": "collective.primitives",
    "Range": "collective.world",
    "register_organisation": "collective.organisation",
    "resolve_world": "collective.registry",
    "run_episode": "collective.conductor",
    "run_episodes": "collective.conductor",
    "save_episode": "collective.records",
    "Text": "collective.world",
    "tool": "collective.world",
    "ToolError": "collective.world",
    "ToolSpec": "collective.actions",
    "Turn": "collective.records",
    "World": "collective.world",
    "write_trace": "collective.trace",
}
__all__ = [
    "PRIMITIVES",
    "Action",
    "ActionError",
    "ActionSpace",
    "Actor",
    "ArgSpec",
    "Cast",
    "Comms",
    "Conductor",
    "Dismissed",
    "Episode",
    "EpisodeConfig",
    "EpisodeFileError",
    "EpisodeOver",
    "EpisodeStream",
    "EpisodeWriter",
    "LatencyModel",
    "OneOf",
    "Organisation",
    "Outcome",
    "Primitive",
    "Range",
    "Text",
    "ToolError",
    "ToolSpec",
    "Turn",
    "World",
    "default_program",
    "draw_timeline",
    "latency_preset",
    "load_episode",
    "make_organisation",
    "open_episode",
    "parse_action",
    "register_organisation",
    "resolve_world",
    "run_episode",
    "run_episodes",
    "save_episode",
    "tool",
    "write_trace",
]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'collective' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # once
    return value
