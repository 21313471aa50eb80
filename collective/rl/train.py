"""RLCR: reinforcement learning from collective rewards, top to bottom.

1. The config: ``TrainConfig`` (``collective/rl/config.py``), every hyperparameter with its default
   in sight, and the latency pressure T_max(step) (``time_limit_at``).
2. Returns and the flat collective advantage ``A_i = R_i - mean_j R_j``, the same on every
   output token of every agent of rollout i (gamma = lambda = 1), with the optional latency
   penalty; the one staleness rule; a step's groups turned into samples.
3. ``train``: the loop, one ``_step`` at a time: draw a step's groups (rollouts,
   ``collective/rl/rollouts.py``, stream finished episodes), credit their turns (the config's
   ``Credit``, ``collective/rl/credit.py``), learn (``collective/rl/learner.py``, in a worker
   thread: per output token the clipped loss ``-min(r A, clip(r, 1 - clip, 1 + clip) A) * w``,
   ``r = exp(logp - logp_behaviour)``, ``w`` the staleness weight (``clipped_pg_loss``; optional
   entropy and KL terms beside it), then one AdamW step), publish the new weights to the
   rollouts, record the step in the run directory (``collective/rl/rundir.py``: writing it,
   resuming from it) whole. What a run checks first is ``collective/rl/checks.py``; the step's
   figures are ``collective/rl/metrics.py``; where a run goes (here, or a Ray learner node) is
   ``collective/rl/launch.py``.

Determinism: every episode is pinned to a policy version chosen by its group index (``sync =
"pinned"``), the learner consumes a fixed set of groups per step in a fixed order, and every
sampling stream is seeded, so a run is a function of its config, however the threads
interleave. ``sync = "latest"`` lets episodes take the newest weights instead (faster to react,
not reproducible); then the staleness bound drops or down-weights what is too old.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import trio

from collective.engine.conductor import lone_error
from collective.engine.limits import memory_cap
from collective.engine.registry import resolve_world
from collective.records import Episode
from collective.rl.backend import Backend, Weights, make_backend
from collective.rl.baselines import Baselines, measure_baselines
from collective.rl.checks import check_init, policies_of, validate
from collective.rl.cluster import RayRollouts
from collective.rl.commons import CommonsStore, step_commons
from collective.rl.config import (
    TrainConfig,
    draws_per_step,
    dump_config,
    flat_fields,
    load_config,
    read_config,
    time_limit_at,
    world_of,
)
from collective.rl.credit import (
    Credit,
    credit_for,
    group_credits,
    individual_advantages,
)
from collective.rl.forks import trained_turn
from collective.rl.learner import Learner, Sample, clipped_pg_loss
from collective.rl.loggers import check_logger, open_logger
from collective.rl.metrics import metrics_of
from collective.rl.roles import RoleLearner, RoleModels
from collective.rl.rollouts import LocalRollouts, RolloutArgs, Rollouts
from collective.rl.rundir import (
    Ledger,
    RunDir,
    StepMetrics,
    TrainState,
    bucket,
    episode_key,
    episode_name,
    read_metrics,
)
from policy.base import Policy

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
    ``baselines`` (each world's random and untrained scores) make its normalised score (the
    figures: ``collective/rl/metrics.py``). Returns (samples,
    metrics, whether each episode was used: False for one dropped as stale), episodes in group
    and member order. ``ids`` are the groups' indices (a step's consecutive draws unless dynamic
    sampling replaced some)."""
    samples: list[Sample] = []
    staleness: list[int] = []  # each episode's, in group and member order
    weights: list[float | None] = []  # (and its staleness weight: None for one dropped)
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
            weights.append(weight := stale_weight(cfg, staleness[-1]))
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
    metrics = metrics_of(cfg, ids, groups, returns, staleness, weights, worlds, baselines)
    metrics["signal_groups"] = sum(1 for r in returns if has_signal(r))
    return samples, metrics, [w is not None for w in weights]


# == 3. The loop =================================================================================


class Interrupted(Exception):
    """Training stopped by Ctrl-C; everything up to the last finished step is kept."""


def train(
    cfg: TrainConfig,
    run_dir: str | Path,
    *,
    resume: bool = False,
    progress: bool = True,
    stop_after: int | None = None,
) -> list[StepMetrics]:
    """Train in this process, writing everything into ``run_dir``; with ``resume``, continue a
    stopped run.

    The run directory is this process's alone while it runs (``RunDir.lock``: a second
    ``train`` on it is refused, naming this one's pid), and a resume runs the config the run
    began with (only ``steps`` may grow). Everything is checked and built first (config,
    worlds, model, a resumed run's state); only then is the run directory written, so a start
    that fails leaves nothing behind (and a failed resume leaves the run as it was). Ctrl-C
    raises :class:`Interrupted` once the step in hand is either fully written or not at all;
    ``--resume`` continues from there, as if never stopped. ``stop_after`` ends the run after
    that many steps of this invocation (tests use it to simulate an interruption). Returns the
    metrics of the steps run now.

    Where the run goes (here, or a Ray actor holding ``[cluster] learner_gpus``) is the
    launcher's to decide: ``collective.rl.launch.launch``."""
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
    memory = validate(cfg)
    if cfg.model.kind == "hf":  # what the model holds is most of the run's memory: said first
        print(f"memory: {memory}", flush=True)  # (stdout: stderr is a failure's one line)
    parts = _build(cfg, run, resume)
    state = parts.state
    if state.step >= cfg.steps:
        run.create(resume, state.step)
        return []
    parts.baselines = _baselines(parts, resume)
    rollouts = _rollouts(parts)
    rollouts.start()  # Ray: connect, check resources, start the workers (one-line errors)
    # -- checked and built: now the run directory may be written ------------------------------
    try:
        run.create(resume, state.step)
        if parts.baselines is not None:
            parts.baselines.save(run.path)
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

    async def loop() -> None:
        t_start = time.perf_counter() - state.elapsed
        async with rollouts.running():
            for step in range(state.step, cfg.steps):
                metrics, ledger = await _step(parts, rollouts, step, t_start)
                quiet.see(metrics)
                state.step = step + 1
                state.elapsed = time.perf_counter() - t_start
                _record(parts, metrics, ledger, logger)
                done.append(metrics)
                bar.set_postfix(ret=f"{metrics.return_mean:.3f}", T=f"{metrics.time_limit:.0f}")
                bar.update(1)
                if stop_after is not None and len(done) >= stop_after:
                    break
        await parts.backend.aclose()  # (an SGLang server this run launched stops here)

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


async def _step(
    p: _Parts, rollouts: Rollouts, step: int, t_start: float
) -> tuple[StepMetrics, Ledger]:
    """One step of RLCR: draw the step's groups (the rollouts play them), credit each turn,
    learn from the samples, publish the new weights to the rollouts. Returns the step's metrics
    and its ledger, for the run directory (``t_start``: the run's start on the wall clock)."""
    cfg = p.cfg
    drawn = await rollouts.groups(step, p.signal if cfg.resample else None)
    # (re-runs and forks: off the event loop)
    credited = await trio.to_thread.run_sync(p.credit.assign, step, drawn.groups)
    samples, m, used = step_samples(cfg, step, drawn.groups, credited.turns, p.baselines, drawn.ids)
    m["resampled_groups"] = len(drawn.flat)  # (a reserve played: one group dropped)
    if p.commons is not None:  # credit re-runs (off the event loop), then the merge
        extra, commons_metrics = await trio.to_thread.run_sync(p.commons_step, step, drawn.groups)
        samples = samples + extra
        m.update(commons_metrics)
    # (Any: its floats go to StepMetrics by name, which a checker cannot follow.)
    stats: dict[str, Any] = await trio.to_thread.run_sync(p.learner.step, samples)
    version = step + 1
    await rollouts.publish(version, p.keep(version))
    metrics = StepMetrics(
        step=step,
        version=version,
        rollout_batch_mean=rollouts.batch_mean,
        wall_time=time.perf_counter() - t_start,
        fork_rollouts=credited.rollouts,
        **m,
        **stats,
    )
    return metrics, Ledger.of_step(step, drawn.ids, cfg.group_size, used, drawn.flat)


def _record(p: _Parts, metrics: StepMetrics, ledger: Ledger, logger: Any) -> None:
    """A finished step into the run directory, whole: its metrics, its ledger, the state to
    resume from (the weights, the learner's optimiser, the versions rollouts may still use)."""
    backend, model = p.backend, p.model
    p.run.commit(
        metrics,
        ledger,
        p.state,
        {
            "model": backend.weights(model),
            "version": model.version,
            "learner": p.learner.state(),
            "serving": p.serving,
        },
        lambda directory, snapshot: backend.checkpoint(model, directory, snapshot),
        logger,
    )


# -- what a run is built of ------------------------------------------------------------------


@dataclass(kw_only=True)
class _Parts:
    """A run's pieces, checked and built before its run directory is written."""

    cfg: TrainConfig
    run: RunDir
    backend: Backend
    model: Any
    learner: Learner | RoleLearner
    state: TrainState
    # The weights of every version rollouts may still use (pinned backends only).
    serving: dict[int, Weights]
    commons: CommonsStore | None  # commons = "on"/"credit": the run's, as its last step left it
    credit: Credit
    frozen: Policy | None  # the orchestrator's sub-agents' policy, if any
    baselines: Baselines | None = None  # a mix of worlds: each world's zero points

    def signal(self, episodes: list[Episode]) -> bool:
        """Whether a group teaches anything (``resample`` draws a reserve for one that does
        not)."""
        return has_signal(group_returns(self.cfg, episodes))

    def keep(self, version: int) -> Weights:
        """The weights of the learner's new ``version``, kept for the rollouts that may use it
        (pinned backends: up to ``lag`` versions behind); an unpinned backend's rollouts take
        the newest weights themselves, and are handed none."""
        if not self.backend.pinned:
            return {}
        self.serving[version] = weights = self.backend.weights(self.model)
        for v in [v for v in self.serving if v < version - self.cfg.lag]:
            del self.serving[v]
        return weights

    def commons_step(
        self, step: int, groups: list[list[Episode]]
    ) -> tuple[list[Sample], dict[str, Any]]:
        """The commons' credit samples and metrics of a step (``step_commons``), the run's
        commons merged; its entries are then the state a resume starts from."""
        assert self.commons is not None
        out = step_commons(
            self.cfg,
            step,
            groups,
            self.commons,
            lambda v: self.backend.policy_for(self.model, self.serving[v], v),
            self.run.kept_episode,
        )
        self.state.commons = self.commons.entries
        return out


def _build(cfg: TrainConfig, run: RunDir, resume: bool) -> _Parts:
    """Everything a run is built of, in the order that keeps it a function of its config: the
    seeded model, the sub-agents' frozen copy of the weights training starts from, the learner,
    then a resumed run's state over them."""
    _seed_torch(cfg)
    backend = make_backend(cfg, run.path)
    model = _load_model(cfg, backend)
    check_init(cfg, model)
    # The orchestrator's sub-agents answer with the weights training starts from, for good.
    frozen = backend.frozen(model) if "frozen" in policies_of(cfg.org) else None
    learner: Learner | RoleLearner
    if isinstance(model, RoleModels):  # role_policies: a learner a role
        learner = RoleLearner(model, cfg, backend)
    else:
        learner = Learner(model, cfg, backend)
    state = TrainState(step=0, useful_sum=0.0, useful_n=0, elapsed=0.0)
    serving: dict[int, Weights] = {0: backend.weights(model)} if backend.pinned else {}
    restored = run.restore(backend, model, learner) if resume else None
    if restored is not None:
        state, serving = restored
    commons = (
        CommonsStore(cfg, resolve_world(cfg.worlds[0].world).commons, state.commons)
        if cfg.commons.kind != "off"
        else None
    )
    credit = credit_for(cfg, fork_policies(cfg, backend, model, serving))
    return _Parts(
        cfg=cfg,
        run=run,
        backend=backend,
        model=model,
        learner=learner,
        state=state,
        serving=serving,
        commons=commons,
        credit=credit,
        frozen=frozen,
    )


def _baselines(p: _Parts, resume: bool) -> Baselines | None:
    """A mix of worlds: each world's random and untrained scores, its normalised score's zero
    points (collective/rl/baselines.py), measured once, before the first step."""
    baselines = Baselines.load(p.run.path) if resume else None
    if p.cfg.mix is not None and baselines is None:
        untrained = p.serving[0] if 0 in p.serving else p.backend.weights(p.model)
        baselines = measure_baselines(p.cfg, p.backend.policy_for(p.model, untrained, 0))
    return baselines


def _rollouts(p: _Parts) -> Rollouts:
    """Where the episodes run: Ray actors (the learner stays here), or this process."""
    args = RolloutArgs(
        cfg=p.cfg,
        run=p.run,
        first_step=p.state.step,
        backend=p.backend,
        model=p.model,
        serving_weights=p.serving,
        commons=p.commons,
    )
    if p.cfg.cluster.backend == "ray":  # (each worker makes the sub-agents' frozen copy itself)
        return RayRollouts(args)
    return LocalRollouts(args, frozen=p.frozen)


def _seed_torch(cfg: TrainConfig) -> None:
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


def _load_model(cfg: TrainConfig, backend: Backend) -> Any:
    """The model training starts from (``init``, or fresh weights), in at most half of this
    machine's available memory: more is a one-line ValueError."""
    try:
        with memory_cap():
            return backend.fresh() if not cfg.init else backend.load(cfg.init)
    except (MemoryError, RuntimeError) as e:
        if isinstance(e, RuntimeError) and "can't allocate memory" not in str(e):
            raise  # torch's allocator says RuntimeError; anything else is not about memory
        raise ValueError(
            f"the model ({cfg.tiny if cfg.model.kind == 'tiny' else cfg.hf.path}) needs more "
            "memory than half of what this machine has available (the other half is the run's)"
        ) from None


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
