"""RLCR: reinforcement learning from collective rewards, top to bottom.

1. The config: ``TrainConfig`` (``collective/rl/config.py``), every hyperparameter with its default
   in sight, and the latency pressure T_max(step) (``time_limit_at``).
2. Returns and the flat collective advantage ``A_i = R_i - mean_j R_j``, the same on every
   output token of every agent of rollout i (gamma = lambda = 1), with the optional latency
   penalty; the one staleness rule; a step's groups turned into samples.
3. ``train``: the loop. Rollouts (``collective/rl/rollouts.py``) stream finished episodes while the
   learner (``collective/rl/learner.py``) trains in a worker thread: per output token the clipped
   loss ``-min(r A, clip(r, 1 - clip, 1 + clip) A) * w``, ``r = exp(logp - logp_behaviour)``,
   ``w`` the staleness weight (``clipped_pg_loss``; optional entropy and KL terms beside it),
   then one AdamW step. Each step's records go to the run directory (``collective/rl/rundir.py``:
   writing them, resuming from them) whole.

Determinism: every episode is pinned to a policy version chosen by its group index (``sync =
"pinned"``), the learner consumes a fixed set of groups per step in a fixed order, and every
sampling stream is seeded, so a run is a function of its config, however the threads
interleave. ``sync = "latest"`` lets episodes take the newest weights instead (faster to react,
not reproducible); then the staleness bound drops or down-weights what is too old.
"""

from __future__ import annotations

import sys
import time
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import torch
import trio

from collective.engine.conductor import lone_error
from collective.engine.limits import (
    AGENT_BYTES,
    EPISODE_AGENT_BYTES,
    check_agents,
    check_fits,
    human,
    memory_cap,
    world_footprint,
)
from collective.engine.organisation import make_organisation
from collective.engine.registry import check_runnable, resolve_world
from collective.records import Episode
from collective.records.signs import Signs, signs
from collective.rl.backend import make_backend
from collective.rl.baselines import Baselines, measure_baselines
from collective.rl.cluster import LearnerDied, RayRollouts, train_on_learner_node
from collective.rl.commons import CommonsStore, step_commons
from collective.rl.config import (
    TrainConfig,
    Turn,
    draws_per_step,
    dump_config,
    flat_fields,
    load_config,
    mix,
    read_config,
    time_limit_at,
    world_of,
)
from collective.rl.credit import (
    credit_for,
    group_credits,
    individual_advantages,
)
from collective.rl.forks import fork_budget, trained_turn
from collective.rl.learner import Learner, Sample, clipped_pg_loss
from collective.rl.loggers import check_logger, open_logger
from collective.rl.roles import RoleLearner, RoleModels, trained_roles
from collective.rl.rollouts import LocalRollouts, RolloutArgs, Rollouts, first_configs, team_size
from collective.rl.rundir import (
    TEAM_BUCKETS,
    Ledger,
    RunDir,
    StepMetrics,
    TrainState,
    bucket,
    episode_key,
    episode_name,
    read_metrics,
)
from collective.world import Commons, convert_params

__all__ = [
    "Interrupted",
    "Learner",
    "Sample",
    "StepMetrics",
    "TrainConfig",
    "bucket",
    "clipped_pg_loss",
    "dump_config",
    "episode_key",
    "episode_name",
    "fork_policies",
    "group_advantages",
    "group_credits",
    "individual_advantages",
    "load_config",
    "penalised_returns",
    "read_config",
    "read_metrics",
    "stale_weight",
    "step_samples",
    "time_limit_at",
    "train",
    "validate",
]

# == 2. Returns, the flat collective advantage, the staleness rule, a step's samples =============


def penalised_returns(
    scores: np.ndarray, durations: np.ndarray, t_max: float, beta: float
) -> np.ndarray:
    """``R = R_task - beta * pbar(q) * T / T_max``, pbar(q) the task's mean score in its group."""
    if beta == 0:
        return scores.astype(np.float64)
    return scores - beta * scores.mean() * durations / t_max


def group_advantages(returns: np.ndarray, std_normalise: bool) -> np.ndarray:
    """``A_i = R_i - mean_j R_j`` (optionally over the group's std): sums to zero."""
    adv = returns - returns.mean()
    if std_normalise:
        adv = adv / (returns.std() + 1e-6)
    return adv


def has_signal(returns: np.ndarray) -> bool:
    """Whether a group's returns differ: a group whose rollouts all returned the same has every
    advantage 0 (flat or normalised alike) and teaches nothing."""
    return bool(np.ptp(returns) > 0)


def group_returns(cfg: TrainConfig, episodes: list[Episode]) -> np.ndarray:
    """A group's returns: its scores, less the latency penalty where one is set."""
    return penalised_returns(
        np.array([e.score for e in episodes]),
        np.array([e.duration for e in episodes]),
        episodes[0].config.time_limit,
        cfg.latency_penalty,
    )


def fork_policies(
    cfg: TrainConfig, backend: Any, model: Any, serving_weights: dict[int, Any]
) -> Callable[[int, Episode], Any]:
    """``advantage = "turn"``'s ``policy_of(step, episode)``: the policy of the version that
    played the episode (a pinned backend keeps its weights in ``serving_weights``), one a
    version per step."""
    policies: dict[int, Any] = {}
    at = [-1]

    def policy_of(step: int, ep: Episode) -> Any:
        if at[0] != step:
            policies.clear()
            at[0] = step
        versions = {t.version for t in ep.turns if trained_turn(t)}
        # (pinned: an episode is played by one version, so its forks re-sample with that one)
        if len(versions) != 1:
            raise RuntimeError(
                f"advantage = 'turn': episode {ep.config.sample_seed} of step {step} was played "
                f"by versions {sorted(versions)}, not one (forks need a pinned episode)"
            )
        (v,) = versions
        if v not in serving_weights:
            raise RuntimeError(
                f"advantage = 'turn': step {step}'s episode {ep.config.sample_seed} was played "
                f"by version {v}, whose weights are no longer kept (kept: "
                f"{sorted(serving_weights)}; lag = {cfg.lag})"
            )
        if v not in policies:
            policies[v] = backend.policy_for(model, serving_weights[v], v)
        return policies[v]

    return policy_of


def stale_weight(cfg: TrainConfig, staleness: int) -> float | None:
    """The staleness rule, decided here only: an episode whose oldest trained turn is at most
    ``max_staleness`` versions behind the step counts fully; an older one is dropped (None) or,
    with ``stale = "downweight"``, weighted by half per version beyond the bound."""
    if staleness <= cfg.max_staleness:
        return 1.0
    if cfg.stale == "drop":
        return None
    return 0.5 ** (staleness - cfg.max_staleness)


def step_samples(
    cfg: TrainConfig,
    step: int,
    groups: list[list[Episode]],
    credited: list[list[dict[int, float]]] | None = None,
    baselines: Baselines | None = None,
    ids: Sequence[int] | None = None,
) -> tuple[list[Sample], dict[str, Any], list[bool]]:
    """Turn a step's groups into token samples with their advantages, plus metrics.

    ``credited`` (``collective.rl.credit.Credited.turns``): each episode's trained turns' own
    advantages by turn index, as the config's ``Credit`` assigned them (assigned here when not
    given, which ``advantage = "turn"``'s forks cannot be); every other turn keeps its rollout's
    flat advantage. With a mix of worlds (``[mix]``) the metrics are also given per world, and
    ``baselines`` (each world's random and untrained scores) make its normalised score.
    Useful work is reported relative to this step's own average rollout (the average over all
    its groups, every team size alike), as the reference work measures it. Returns (samples,
    metrics, whether each episode was used: False for one dropped as stale), episodes in group
    and member order. ``ids`` are the groups' indices (a step's consecutive draws unless dynamic
    sampling replaced some)."""
    samples: list[Sample] = []
    staleness: list[int] = []  # each episode's, in group and member order
    if credited is None:
        credited = credit_for(cfg).assign(step, groups).turns
    if ids is None:
        ids = range(step * draws_per_step(cfg), step * draws_per_step(cfg) + len(groups))
    worlds = [world_of(cfg, g).label for g in ids]
    returns = [group_returns(cfg, episodes) for episodes in groups]
    spread = {  # mix.normalise: each world's spread of returns this step
        w: float(np.concatenate([r for r, x in zip(returns, worlds, strict=True) if x == w]).std())
        for w in set(worlds)
    }
    for g, episodes in enumerate(groups):
        adv = group_advantages(returns[g], cfg.std_normalise)
        if cfg.mix is not None and cfg.mix.normalise:
            adv = adv / (spread[worlds[g]] + 1e-6)
        for i, ep in enumerate(episodes):
            versions = [t.version for t in ep.turns if t.policy == "trained"]
            staleness.append(step - min(versions) if versions else 0)
            weight = stale_weight(cfg, staleness[-1])
            if weight is None:
                continue
            own = credited[g][i]
            for j, t in enumerate(ep.turns):
                if not trained_turn(t):
                    continue
                a = own.get(j, adv[i])
                samples.append(
                    Sample(
                        t.prompt,
                        t.token_ids,
                        ep.spaces[t.space],
                        t.logprobs,
                        float(a),
                        weight,
                        t.version,
                        t.role,
                    )
                )
    everything = range(len(groups))
    each = [signs(e) for episodes in groups for e in episodes]  # (read once, for every table)
    metrics = step_metrics(cfg, ids, groups, returns, staleness, each, everything)
    metrics["signal_groups"] = sum(1 for r in returns if has_signal(r))
    if cfg.mix is not None:
        per_world = {
            w.label: step_metrics(
                cfg,
                ids,
                groups,
                returns,
                staleness,
                each,
                [g for g in everything if worlds[g] == w.label],
            )
            for w in cfg.worlds
            if w.label in worlds
        }
        if baselines is not None:
            for label, m in per_world.items():
                m.update(baselines.normalised(label, m["score_mean"]))
            metrics.update(
                {
                    key: float(np.mean([m[key] for m in per_world.values()]))
                    for key in ("normalised_score", "normalised_gain")
                }
            )
        metrics["worlds"] = per_world
    return samples, metrics, [stale_weight(cfg, x) is not None for x in staleness]


def step_metrics(
    cfg: TrainConfig,
    ids: Sequence[int],
    groups: list[list[Episode]],
    returns: list[np.ndarray],
    staleness: list[int],
    each: list[Signs],
    which: Sequence[int],
) -> dict[str, Any]:
    """The metrics of a step's groups ``which`` (all of them, or one world's): ``returns`` are
    every group's, ``staleness`` and ``each`` (its signs) every episode's, in group and member
    order; ``ids`` every group's index."""
    G = cfg.group_size
    flat = [groups[g][i] for g in which for i in range(len(groups[g]))]
    returns_all = np.concatenate([returns[g] for g in which])
    stale = [staleness[g * G + i] for g in which for i in range(len(groups[g]))]
    weight = [stale_weight(cfg, x) for x in stale]
    by_bucket: dict[str, list[float]] = {}
    teams: dict[str, list[Signs]] = {}
    for g in which:
        team = bucket(team_size(cfg, ids[g]))
        by_bucket.setdefault(team, []).extend(e.stats.world_tokens for e in groups[g])
        teams.setdefault(team, []).extend(each[g * G + i] for i in range(len(groups[g])))
    useful = [e.stats.world_tokens for e in flat]
    useful_average = float(np.mean(useful))
    hours = sum(e.duration for e in flat) / 3600
    return {
        "time_limit": flat[0].config.time_limit,
        "episodes": len(flat),
        "return_mean": float(np.mean(returns_all)),
        "return_min": float(np.min(returns_all)),
        "return_max": float(np.max(returns_all)),
        "score_mean": float(np.mean([e.score for e in flat])),
        "duration_mean": float(np.mean([e.duration for e in flat])),
        "output_tokens": int(sum(e.stats.output_tokens for e in flat)),
        "useful_tokens_mean": float(np.mean(useful)),
        "useful_average": useful_average,
        "useful_rel": {
            b: float(np.mean(v)) / useful_average if useful_average else 0.0
            for b, v in sorted(by_bucket.items(), key=lambda kv: TEAM_BUCKETS.index(kv[0]))
        },
        "comm_tokens_per_hour": sum(e.stats.comm_tokens for e in flat) / hours if hours else 0.0,
        **sign_metrics(teams),
        "staleness_mean": float(np.mean(stale)),
        "staleness_max": int(max(stale)),
        "dropped_stale": weight.count(None),
        "downweighted": sum(1 for w in weight if w is not None and w < 1.0),
    }


def sign_metrics(teams: dict[str, list[Signs]]) -> dict[str, Any]:
    """The signs of life of a step (StepMetrics' landed_* and talk_*) from its episodes' signs by
    team-size bucket: each bucket's mean per rollout over the step's average rollout (every
    bucket's episodes alike, as the reference work measures it), per agent, and communication
    per agent-second (tokens over the agents' summed seconds alive)."""
    order = sorted(teams, key=TEAM_BUCKETS.index)
    every = [x for b in order for x in teams[b]]
    landed = float(np.mean([x.landed_tokens for x in every]))
    talk = float(np.mean([x.talk_tokens for x in every]))
    begun = sum(x.landed_tokens + x.refused_tokens for x in every)

    def per_second(xs: list[Signs]) -> float:
        seconds = sum(x.agent_seconds for x in xs)
        return sum(x.talk_tokens for x in xs) / seconds if seconds > 0 else 0.0

    def rel(b: str, field: str, average: float) -> float:
        return float(np.mean([getattr(x, field) for x in teams[b]])) / average if average else 0.0

    return {
        "landed_tokens_mean": landed,
        "landed_units_mean": float(np.mean([x.landed_units for x in every])),
        "refused_share": sum(x.refused_tokens for x in every) / begun if begun else 0.0,
        "landed_rel": {b: rel(b, "landed_tokens", landed) for b in order},
        "landed_per_agent": {
            b: float(np.mean([x.landed_per_agent for x in teams[b]])) for b in order
        },
        "talk_tokens_mean": talk,
        "talk_per_agent_second": per_second(every),
        "talk_rel": {b: rel(b, "talk_tokens", talk) for b in order},
        "talk_per_agent_second_by_team": {b: per_second(teams[b]) for b in order},
    }


# == 3. The loop =================================================================================


class Interrupted(Exception):
    """Training stopped by Ctrl-C; everything up to the last finished step is kept."""


def check_training(cfg: TrainConfig) -> None:
    """ValueError if a training run cannot hold what it will: the episodes in flight (each its
    team's agents and its world: the largest of the mix's worlds, as any group may draw it) and
    the finished ones a step keeps whole for the learner, up to ``lag + 1`` steps of
    ``groups_per_step x group_size`` (an episode of a later step waits for its weights' step to
    be learned from). A world that does not exist fails here, naming it."""
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
    check_fits(
        f"training: {live:,} episodes in flight and {held:,} held for the learner",
        {
            "their agents": int(live * team * AGENT_BYTES),
            "their worlds": live * world,
            f"the held episodes at {human(EPISODE_AGENT_BYTES)} an agent": int(
                held * team * EPISODE_AGENT_BYTES
            ),
        },
        world=world,
    )


def validate(cfg: TrainConfig) -> None:
    """Everything a run needs that can be checked without running it: every team size's
    episode config, world and organisation, and the memory the concurrent episodes need at
    least. Raises ValueError with one line."""
    check_training(cfg)
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
        if commons == "credit" and "frozen" in _policies_of(cfg.org):
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
    if turn is not None and "frozen" in _policies_of(cfg.org):
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


def _policies_of(org: str) -> set[str]:
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


def train(
    cfg: TrainConfig,
    run_dir: str | Path,
    *,
    resume: bool = False,
    progress: bool = True,
    stop_after: int | None = None,
    here: bool = False,
) -> list[StepMetrics]:
    """Train, writing everything into ``run_dir``; with ``resume``, continue a stopped run.

    The run directory is this process's alone while it runs (``RunDir.lock``: a second
    ``train`` on it is refused, naming this one's pid), and a resume runs the config the run
    began with (only ``steps`` may grow). Everything is checked and built first (config,
    worlds, model, a resumed run's state); only then is the run directory written, so a start
    that fails leaves nothing behind (and a failed resume leaves the run as it was). Ctrl-C
    raises :class:`Interrupted` once the step in hand is either fully written or not at all;
    ``--resume`` continues from there, as if never stopped. ``stop_after`` ends the run after
    that many steps of this invocation (tests use it to simulate an interruption). Returns the
    metrics of the steps run now.

    With ``[cluster] backend = "ray"`` and ``learner_gpus > 0`` this whole function runs in a
    Ray actor holding those GPUs (``collective.rl.cluster.train_on_learner_node``; ``here`` is
    how that actor says it is the place)."""
    if cfg.cluster.backend == "ray" and cfg.cluster.learner_gpus > 0 and not here:
        try:
            where = str(Path(run_dir).absolute())  # (the actor's working directory is not ours)
            rows = train_on_learner_node(train, cfg, where, resume=resume, stop_after=stop_after)
        except (LearnerDied, KeyboardInterrupt) as e:
            why = str(e) if isinstance(e, LearnerDied) else "interrupted"
            raise Interrupted(f"{why}; resume with `collective train --resume {run_dir}`") from None
        return [msgspec.json.decode(r, type=StepMetrics) for r in rows]
    check_logger(cfg.logger)  # a missing extra fails here, before anything is written
    run = RunDir(run_dir, cfg)
    with run.lock(resume):  # one process per run directory, for the whole run
        return _train(cfg, run, resume=resume, progress=progress, stop_after=stop_after)


def _train(
    cfg: TrainConfig, run: RunDir, *, resume: bool, progress: bool, stop_after: int | None
) -> list[StepMetrics]:
    from tqdm import tqdm

    from collective.base.progress import step_clock

    # -- check and build everything; nothing but the lock is written yet ---------------------
    validate(cfg)
    torch.manual_seed(cfg.seed)
    # One intra-op thread: the rollout thread and the learner thread each keep a core busy, and
    # a reduction's order (hence its last bits) cannot depend on how the two happen to overlap.
    torch.set_num_threads(1)
    if (isa := torch.backends.cpu.get_cpu_capability()) != "AVX2":  # (collective.ISA pins it)
        print(
            f"note: torch runs its {isa} kernels, not AVX2 (ATEN_CPU_CAPABILITY is set, or this "
            "CPU has no AVX2): the run's figures are those of such machines",
            file=sys.stderr,
        )
    backend = make_backend(cfg, run.path)
    try:
        with memory_cap():
            model = backend.fresh() if not cfg.init else backend.load(cfg.init)
    except (MemoryError, RuntimeError) as e:
        if isinstance(e, RuntimeError) and "can't allocate memory" not in str(e):
            raise  # torch's allocator says RuntimeError; anything else is not about memory
        raise ValueError(
            f"the model ({cfg.tiny if cfg.model.kind == 'tiny' else cfg.hf.path}) needs more "
            "memory than half of what this machine has available (the other half is the run's)"
        ) from None
    check_init(cfg, model)
    # The orchestrator's sub-agents answer with the weights training starts from, for good.
    frozen = backend.frozen(model) if "frozen" in _policies_of(cfg.org) else None
    learner: Learner | RoleLearner
    if isinstance(model, RoleModels):  # role_policies: a learner a role
        learner = RoleLearner(model, cfg, backend)
    else:
        learner = Learner(model, cfg, backend)
    state = TrainState(step=0, useful_sum=0.0, useful_n=0, elapsed=0.0)
    # The weights of every version rollouts may still use (pinned backends only).
    serving_weights: dict[int, Any] = {0: backend.weights(model)} if backend.pinned else {}
    restored = run.restore(backend, model, learner) if resume else None
    if restored is not None:
        state, serving_weights = restored
    # commons = "on"/"credit": the run's commons, as the last finished step left it
    commons = (
        CommonsStore(cfg, resolve_world(cfg.worlds[0].world).commons, state.commons)
        if cfg.commons.kind != "off"
        else None
    )
    if state.step >= cfg.steps:
        run.create(resume, state.step)
        return []
    # A mix of worlds: each world's random and untrained scores, its normalised score's zero
    # points (collective/rl/baselines.py), measured once, before the first step.
    baselines = Baselines.load(run.path) if resume else None
    if cfg.mix is not None and baselines is None:
        untrained = serving_weights[0] if 0 in serving_weights else backend.weights(model)
        baselines = measure_baselines(cfg, backend.policy_for(model, untrained, 0))
    args = RolloutArgs(
        cfg=cfg,
        run=run,
        first_step=state.step,
        backend=backend,
        model=model,
        serving_weights=serving_weights,
        commons=commons,
    )
    rollouts: Rollouts
    if cfg.cluster.backend == "ray":  # Ray actors run the episodes; the learner stays here
        rollouts = RayRollouts(args)  # (each worker makes the sub-agents' frozen copy itself)
    else:
        rollouts = LocalRollouts(args, frozen=frozen)
    rollouts.start()  # Ray: connect, check resources, start the workers (one-line errors)
    # -- checked and built: now the run directory may be written ------------------------------
    try:
        run.create(resume, state.step)
        if baselines is not None:
            baselines.save(run.path)
        schedule = [time_limit_at(cfg, s) for s in range(cfg.steps)] if cfg.logger != "none" else []
        logger = open_logger(cfg.logger, flat_fields(cfg), run.path, state.step, schedule)
    except BaseException:
        rollouts.close()
        if not resume:
            run.remove_if_unstarted()
        raise
    bar = tqdm(
        total=cfg.steps,
        initial=state.step,
        disable=not progress,
        unit="step",
        desc="rlcr",
        dynamic_ncols=True,
    )
    if progress:  # (the first step's episodes on the simulated clock, until the bar moves)
        rollouts.on_time = step_clock(bar, time_limit_at(cfg, state.step), "rolling out")
    done: list[StepMetrics] = []
    quiet = _NoSignal()

    credit = credit_for(cfg, fork_policies(cfg, backend, model, serving_weights))

    def signal(episodes: list[Episode]) -> bool:
        return has_signal(group_returns(cfg, episodes))

    async def loop() -> None:
        t_start = time.perf_counter() - state.elapsed
        async with rollouts.running():
            for step in range(state.step, cfg.steps):
                drawn = await rollouts.groups(step, signal if cfg.resample else None)
                groups = drawn.groups
                # (re-runs and forks: off the event loop)
                credited = await trio.to_thread.run_sync(credit.assign, step, groups)
                samples, m, used = step_samples(
                    cfg, step, groups, credited.turns, baselines, drawn.ids
                )
                m["resampled_groups"] = len(drawn.flat)  # (a reserve played: one group dropped)
                if commons is not None:  # credit re-runs (off the event loop), then the merge
                    extra, commons_metrics = await trio.to_thread.run_sync(
                        step_commons,
                        cfg,
                        step,
                        groups,
                        commons,
                        lambda v: backend.policy_for(model, serving_weights[v], v),
                        run.kept_episode,
                    )
                    samples = samples + extra
                    m.update(commons_metrics)
                    state.commons = commons.entries
                # (Any: its floats go to StepMetrics by name, which a checker cannot follow.)
                stats: dict[str, Any] = await trio.to_thread.run_sync(learner.step, samples)
                version = step + 1
                weights = backend.weights(model) if backend.pinned else {}
                if backend.pinned:  # rollouts may use versions up to `lag` behind
                    serving_weights[version] = weights
                    for v in [v for v in serving_weights if v < version - cfg.lag]:
                        del serving_weights[v]
                await rollouts.publish(version, weights)
                metrics = StepMetrics(
                    step=step,
                    version=version,
                    rollout_batch_mean=rollouts.batch_mean,
                    wall_time=time.perf_counter() - t_start,
                    fork_rollouts=credited.rollouts,
                    **m,
                    **stats,
                )
                ledger = Ledger.of_step(step, drawn.ids, cfg.group_size, used, drawn.flat)
                quiet.see(metrics)
                state.step = step + 1
                state.elapsed = time.perf_counter() - t_start
                run.commit(
                    metrics,
                    ledger,
                    state,
                    {
                        "model": backend.weights(model),
                        "version": model.version,
                        "learner": learner.state(),
                        "serving": serving_weights,
                    },
                    lambda directory, snapshot: backend.checkpoint(model, directory, snapshot),
                    logger,
                )
                done.append(metrics)
                bar.set_postfix(ret=f"{metrics.return_mean:.3f}", T=f"{metrics.time_limit:.0f}")
                bar.update(1)
                if stop_after is not None and len(done) >= stop_after:
                    break
        await backend.aclose()  # (an SGLang server this run launched stops here)

    try:
        # Ctrl-C lands only where the loop awaits, so a step is committed whole or not at all.
        trio.run(loop, restrict_keyboard_interrupt_to_checkpoints=True)
    except BaseException as e:
        bar.leave = False  # a run that stops early clears its bar rather than leave it half drawn
        if _is_interrupt(e):
            raise Interrupted(
                f"interrupted at step {state.step}; resume with `collective train --resume "
                f"{run.path}`"
            ) from None
        if not resume and state.step == 0:
            run.remove_if_unstarted()
        if isinstance(e, BaseExceptionGroup) and (lone := lone_error(e)) is not e:
            raise lone from None  # one error (a world's, the grammar's): as itself, in one line
        raise
    finally:
        bar.close()
        quiet.close()
        rollouts.close()
    if logger is not None:  # (TensorBoard was flushed at every step; W&B also finishes at exit)
        logger.close()
    if cfg.plots:
        _plot(run.path)
    return done


class _NoSignal:
    """Says, in one line each, when training stops learning because no group carries signal
    (every rollout of every group returned the same: a policy that always fails, or always
    succeeds alike), and how many steps in a row that lasted, with the share of the actions
    the world refused beside it (a policy whose actions are mostly refused is the usual cause).
    """

    def __init__(self) -> None:
        self.run: list[StepMetrics] = []

    def see(self, m: StepMetrics) -> None:
        if m.signal_groups == 0:
            if not self.run:
                print(
                    f"note: step {m.step} learned nothing: no group carries signal (each group's "
                    f"rollouts all returned {m.return_mean:.3g}); {m.refused_share:.0%} of the "
                    "work begun was refused",
                    file=sys.stderr,
                )
            self.run.append(m)
        else:
            self.close()

    def close(self) -> None:
        if len(self.run) > 1:
            print(
                f"note: steps {self.run[0].step}-{self.run[-1].step} ({len(self.run)} in a row) "
                "had no group with signal: no weight changed in them",
                file=sys.stderr,
            )
        self.run = []


def _is_interrupt(e: BaseException) -> bool:
    if isinstance(e, BaseExceptionGroup):
        return e.split(KeyboardInterrupt)[0] is not None
    return isinstance(e, KeyboardInterrupt)


def _plot(run_dir: Path) -> None:
    try:
        import matplotlib  # noqa: F401  (an optional extra)
    except ImportError:
        print(
            "plots skipped: matplotlib is not installed (pip install 'collective[plots]', "
            f"then `collective plot {run_dir}`)",
            file=sys.stderr,
        )
        return
    from collective.rl.plots import plot_run

    plot_run(run_dir)
