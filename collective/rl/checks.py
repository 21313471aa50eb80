"""What a training run checks before it writes anything: that its config can run (``validate``:
every team size's episode, world, organisation and credit setting, and the memory it needs) and
that a checkpoint it starts from has the shape the config says (``check_init``). Each raises
ValueError with one line; ``train`` and ``sft`` call them before the run directory exists.
"""

from __future__ import annotations

import typing
from typing import Any

import msgspec

from collective.engine.limits import (
    AGENT_BYTES,
    BACKWARD_UNIT_BYTES,
    CHECKPOINTED_UNIT_BYTES,
    EPISODE_AGENT_BYTES,
    check_agents,
    check_fits,
    human,
    world_footprint,
)
from collective.engine.organisation import make_organisation
from collective.engine.registry import check_runnable, resolve_world
from collective.rl.commons import CommonsStore
from collective.rl.config import TrainConfig, Turn, mix, time_limit_at
from collective.rl.forks import fork_budget
from collective.rl.roles import trained_roles
from collective.rl.rollouts import first_configs
from collective.world import Commons, convert_params


def check_training(cfg: TrainConfig) -> str:
    """ValueError if a training run cannot hold what it will: the episodes in flight (each its
    team's agents and its world: the largest of the mix's worlds, as any group may draw it) and
    the finished ones a step keeps whole for the learner, up to ``lag + 1`` steps of
    ``groups_per_step x group_size`` (an episode of a later step waits for its weights' step to
    be learned from), and an hf model held in this machine's memory (:func:`model_parts`). A
    world that does not exist fails here, naming it. Returns the one line of what it will
    take."""
    worlds = mix(cfg)
    classes = [resolve_world(w.world) for w in worlds]  # (a world that is not there: first)
    largest = max(max(w.team_sizes) for w in worlds)
    check_agents(cfg.concurrency * largest, "concurrency x largest team")  # cheap, first
    held = (cfg.lag + 1) * cfg.groups_per_step * cfg.group_size
    live = min(cfg.concurrency, held)
    # (team sizes are cycled over each world's groups: the largest world mean bounds them all)
    team = max(sum(w.team_sizes) / len(w.team_sizes) for w in worlds)
    world = max(
        world_footprint(cls, max(w.team_sizes), convert_params(cls, w.params, w.world), w.world)
        for cls, w in zip(classes, worlds, strict=True)
    )
    unbounded = cfg.model.kind == "hf" and not cfg.chunk_tokens
    return check_fits(
        f"training: {live:,} episodes in flight and {held:,} held for the learner"
        + (" (and a backward pass bounded by turns alone: chunk_tokens = 0)" if unbounded else ""),
        {
            "their agents": int(live * team * AGENT_BYTES),
            "their worlds": live * world,
            f"the held episodes at {human(EPISODE_AGENT_BYTES)} an agent": int(
                held * team * EPISODE_AGENT_BYTES
            ),
            **model_parts(cfg),
        },
        world=world,
    )


def model_parts(cfg: TrainConfig) -> dict[str, int]:
    """What an hf run holds in this machine's memory besides its episodes, by what holds it
    (none for the tiny model, or a model on a GPU): the model (and its LoRA adapters), the
    trained parameters' gradients and two Adam moments, the in-process served copies (one per
    live version, ``lag + 1``, and the orchestrator's frozen one: each a copy of the model and
    the batch-invariant decoder's float64 rounded copy of every weight matrix, the tied head's
    apart, ``policy.hf.decoder``; under LoRA the versions share the base weights and one set of
    those matrices, and each holds its adapters only), a KL reference's copy, and the backward pass
    at ``chunk_tokens`` (a measured slope per token and layer x hidden unit; with no token
    budget the backward is bounded by turns alone and is not counted: ``check_training``'s line
    says so). The model is sized from its directory (``policy.hf.size``), built first where
    ``build`` names a recipe."""
    if cfg.model.kind != "hf":
        return {}
    hf = cfg.hf
    import torch

    if hf.device == "cuda" or (hf.device == "auto" and torch.cuda.is_available()):
        return {}  # (the model is in the GPU's memory, not this machine's)
    from pathlib import Path

    from collective.rl.backend import build_model
    from policy.hf.size import model_size

    if hf.build and not Path(hf.path).exists():
        build_model(hf.build, Path(hf.path))
    try:
        size = model_size(hf.path)
    except ValueError:  # (not a model: the backend's load names what is wrong, in one line)
        return {}
    width = 4 if hf.dtype == "float32" else 2
    model = size.parameters * width
    adapters = size.adapters(hf.lora_rank)
    trained = adapters or size.parameters
    parts = {
        f"the model ({size.parameters:,} parameters)": model + adapters * 4,
        f"gradients and Adam moments of {trained:,}": trained * 3 * (4 if adapters else width),
    }
    if not hf.server:
        versions = cfg.lag + 1 + ("frozen" in policies_of(cfg.org))
        # the decoder's matrices: every weight matrix in float64, the tied head apart, not the
        # embedding (FixedDecoder.nbytes, which tests/policy/test_hf_memory.py holds this to)
        embedding = size.vocab * size.hidden
        matrices = (size.parameters + (embedding if size.tied else 0) - embedding) * 8
        if adapters:  # one base, shared; a version is its adapters, in float32 and float64
            parts["the decoder's base matrices (float64, shared by every version)"] = matrices
            each = adapters * (4 + 8)
            parts[f"{versions} served versions at {human(each)} (adapters only)"] = versions * each
            parts["a merged copy while a checkpoint is written"] = model + adapters * 4
        else:  # a version is a copy of the model and its own matrices
            each = model + matrices
            parts[f"{versions} served versions at {human(each)} (float64 decode weights)"] = (
                versions * each
            )
    if cfg.kl_coef > 0 and not adapters:
        parts["the KL reference's copy"] = model
    if cfg.chunk_tokens:
        unit = CHECKPOINTED_UNIT_BYTES if hf.gradient_checkpointing else BACKWARD_UNIT_BYTES
        parts[f"the backward at {cfg.chunk_tokens:,} tokens"] = (
            cfg.chunk_tokens * size.layers * size.hidden * unit
        )
    return parts


def validate(cfg: TrainConfig) -> str:
    """Everything a run needs that can be checked without running it: every team size's
    episode config, world and organisation, and the memory the run needs at least. Raises
    ValueError with one line; returns the one line of the memory it will take."""
    memory = check_training(cfg)
    commons, (world, *_) = cfg.commons.kind, cfg.worlds
    if commons != "off":
        cls = resolve_world(world.world)
        if not cls.commons:
            raise ValueError(
                f"commons = {commons!r}: world {world.world!r} declares no commons (a world "
                'names the constructor parameter that receives it: `commons = "..."`; '
                "library has one)"
            )
        if cls.commons in world.params:
            raise ValueError(
                f"commons = {commons!r}: params sets {cls.commons!r}, which the run's "
                "commons fills: drop it from params"
            )
        hint = typing.get_type_hints(cls.__init__).get(cls.commons)
        if hint is None or Commons not in (hint, *typing.get_args(hint)):
            raise ValueError(
                f"commons = {commons!r}: world {world.world!r} says its commons is the "
                f"parameter {cls.commons!r}, which its constructor does not take as a "
                "collective.world.Commons"
            )
        if commons == "credit" and "frozen" in policies_of(cfg.org):
            raise ValueError(
                f"commons = 'credit' with org = {cfg.org!r}: a re-run answers every agent with "
                "the trained weights, so the frozen sub-agents' turns would change with the "
                "entry removed; use org = 'orchestrator:trained' or commons = 'on'"
            )
    if cfg.role_policies and len(trained_roles(cfg.org)) < 2:
        raise ValueError(
            f"role_policies with org = {cfg.org!r}: it has one trained role "
            f"({', '.join(trained_roles(cfg.org))}), so one policy already is per role; use "
            "org = 'ceo' or 'orchestrator:trained', or drop role_policies"
        )
    turn = cfg.advantage if isinstance(cfg.advantage, Turn) else None
    if turn is not None and "frozen" in policies_of(cfg.org):
        raise ValueError(
            "advantage = 'turn' with org = 'orchestrator': a fork answers every agent with the "
            "trained policy, so the frozen sub-agents' turns would be re-sampled by the wrong "
            "weights; use another advantage or another org"
        )
    if turn is not None and (
        why := fork_budget(
            turn.turns, turn.samples, cfg.groups_per_step * cfg.group_size, cfg.steps
        )
    ):
        raise ValueError(f"advantage = 'turn': {why}")
    if turn is not None and turn.horizon > 0:
        longest = max(time_limit_at(cfg, step, w) for w in mix(cfg) for step in (0, cfg.steps - 1))
        if turn.horizon >= longest:
            raise ValueError(
                f"advantage.horizon = {turn.horizon:g} s reaches past every episode's end (the "
                f"longest time limit is {longest:g} s): every fork would be read at the end, "
                "as horizon = 0 says; set 0 or a horizon shorter than the time limit"
            )
    for episode in first_configs(cfg):
        if commons != "off":  # (as its episodes will be: with the commons' parameter)
            episode = CommonsStore(cfg, resolve_world(world.world).commons).apply(episode, 0)
        check_runnable(episode)
    return memory


def policies_of(org: str) -> set[str]:
    """The policies an organisation's roles run (``trained``, ``frozen``)."""
    o = make_organisation(org)
    return {o.policy_of(r) for r in o.roles()}


def check_init(cfg: TrainConfig, model: Any) -> None:
    """A run that starts from a checkpoint has the checkpoint's shape; its config must say so
    (``load_config`` fills [model] from the checkpoint where the config leaves it out)."""
    have = getattr(model, "config", None)
    if cfg.model.kind != "tiny" or have is None:
        return
    want = msgspec.structs.replace(cfg.tiny, seed=have.seed)
    if want != have:
        diff = ", ".join(
            f"{f} = {getattr(have, f)} (config says {getattr(want, f)})"
            for f in have.__struct_fields__
            if getattr(have, f) != getattr(want, f)
        )
        raise ValueError(
            f"init {cfg.init}: the checkpoint's network has {diff}; drop those [model] settings "
            "or make them match"
        )
