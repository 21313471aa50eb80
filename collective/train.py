"""RLCR: reinforcement learning from collective rewards, top to bottom.

1. ``TrainConfig``: every hyperparameter, its default in sight.
2. Latency pressure: the time-limit schedule T_max(step) and the optional latency penalty.
3. Returns and the flat collective advantage ``A_i = R_i - mean_j R_j``, the same on every
   output token of every agent of rollout i (gamma = lambda = 1).
4. The loss: policy gradient with a clipped importance ratio against the behaviour logprobs.
5. The learner: one optimiser step per training step, in a worker thread.
6. Rollouts: groups of G episodes of one task instance, each pinned to a policy version,
   streamed to the learner through a bounded channel while the learner trains.
7. The run directory: config as used, metrics, ledger, checkpoints, episodes; resume.

Determinism: every episode is pinned to a policy version chosen by its group index (``sync =
"pinned"``), the learner consumes a fixed set of groups per step in a fixed order, and every
sampling stream is seeded, so a run is a function of its config, however the threads
interleave. ``sync = "latest"`` lets episodes take the newest weights instead (faster to react,
not reproducible); then the staleness bound drops or down-weights what is too old.
"""

from __future__ import annotations

import copy
import json
import math
import re
import shutil
import sys
import time
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import msgspec
import numpy as np
import torch
import trio

from collective.actions import ActionSpace
from collective.conductor import Conductor, lone_error
from collective.loggers import RunLogger, check_logger, open_logger
from collective.organisation import PRIMITIVES, make_organisation
from collective.records import (
    Committed,
    Episode,
    EpisodeConfig,
    Spawned,
    load_episode,
    save_episode,
    world_error,
)
from collective.seeding import derive
from policy.base import Policy, PolicyRequest, PolicyResponse, TrainableModel
from policy.latency import latency_preset
from policy.tiny.model import TinyConfig

# == 1. The configuration ========================================================================


class TrainConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    # -- the task ---------------------------------------------------------------------------
    world: str = "workshop"
    params: dict[str, Any] = {}
    org: str = "flat"
    team_sizes: tuple[int, ...] = (1, 2, 4, 8)  # cycled over groups; for `ceo`, the CEO plus hires
    latency: str = "tiny"  # the simulated deployment's latency preset
    # -- groups and steps -------------------------------------------------------------------
    steps: int = 200
    groups_per_step: int = 4  # B
    group_size: int = 8  # G rollouts of the same task instance (world seed)
    seed: int = 0
    # -- latency pressure -------------------------------------------------------------------
    time_limit: Literal["constant", "linear", "geometric"] = "constant"
    time_limit_start: float = 600.0  # T_max at step 0, simulated seconds
    time_limit_end: float = 600.0  # T_max at the last step
    latency_penalty: float = 0.0  # beta in R = R_task - beta * pbar(q) * T / T_max; 0 = off
    # -- advantage --------------------------------------------------------------------------
    advantage: Literal["collective", "individual"] = "collective"
    std_normalise: bool = False  # divide A by the group's std of returns
    # -- loss -------------------------------------------------------------------------------
    learning_rate: float = 3e-3
    clip: float = 0.2  # PPO clip on the importance ratio
    aggregation: Literal["token_mean", "sequence_mean", "constant"] = "token_mean"
    normaliser: float = 4096.0  # tokens, for aggregation = "constant"
    entropy_coef: float = 0.0
    kl_coef: float = 0.0  # KL to the initial policy (k3 estimator)
    max_grad_norm: float = 1.0
    chunk: int = 512  # turns per forward/backward chunk (bounds the learner's memory)
    # -- asynchrony -------------------------------------------------------------------------
    sync: Literal["pinned", "latest"] = "pinned"
    lag: int = 1  # rollouts may use weights this many versions behind the learner
    max_staleness: int = 1  # older episodes are dropped or down-weighted
    stale: Literal["drop", "downweight"] = "drop"
    concurrency: int = 32  # episodes in flight at once
    channel_capacity: int = 64  # finished episodes buffered on their way to the learner
    # -- the policy -------------------------------------------------------------------------
    backend: Literal["tiny", "hf"] = "tiny"  # hf: a Hugging Face causal LM (policy/hf.py)
    hf_model: str = ""  # backend = "hf": a local model directory to start from
    hf_build: Literal["", "tiny-lm"] = ""  # build hf_model thus (make-model) if it is absent
    hf_server: str = ""  # "": sample in-process (hf:DIR); "sglang:URL[,URL...]"|"sglang:launch..."
    # -- the hf learner ---------------------------------------------------------------------
    device: Literal["auto", "cpu", "cuda"] = "auto"  # auto: cuda when torch sees a GPU
    dtype: Literal["float32", "bfloat16"] = "float32"  # exact ratios are claimed in float32
    lora_rank: int = 0  # > 0: train LoRA adapters of this rank (peft), not every weight
    lora_alpha: float = 16.0
    gradient_checkpointing: bool = False  # recompute layer activations in backward
    logit_chunk: int = 256  # output positions whose [chunk, vocab] logits exist at once
    hf_batch: int = 8  # sequences per learner forward pass
    weight_decay: float = 0.0  # AdamW's decoupled weight decay
    model: TinyConfig = msgspec.field(default_factory=lambda: TinyConfig(context=128))
    init: str = ""  # a tiny checkpoint to start from; "" = fresh weights from `seed`
    temperature: float = 1.0
    max_output_tokens: int = 24
    # -- bookkeeping ------------------------------------------------------------------------
    snapshot_every: int = 25  # keep checkpoints/step-N.pt every N steps (latest.pt: always)
    keep_episodes: bool = True  # keep every episode file (False: delete once consumed)
    plots: bool = True
    logger: Literal["none", "tensorboard", "wandb"] = "none"  # also log to TensorBoard or W&B

    def __post_init__(self) -> None:
        checks = [
            (self.steps >= 1, "steps must be >= 1"),
            (self.groups_per_step >= 1, "groups_per_step must be >= 1"),
            (self.group_size >= 2, "group_size must be >= 2 (a group baseline needs two)"),
            (bool(self.team_sizes) and min(self.team_sizes) >= 1, "team_sizes must be >= 1"),
            (
                0 < self.time_limit_start < math.inf and 0 < self.time_limit_end < math.inf,
                "time limits must be finite and > 0",
            ),
            (0 <= self.seed < 2**64, "seed must be in 0..2**64-1"),
            (self.learning_rate > 0, "learning_rate must be > 0"),
            (0 < self.clip < 1, "clip must be in (0, 1)"),
            (self.lag >= 0 and self.max_staleness >= 0, "lag and max_staleness must be >= 0"),
            (self.concurrency >= 1 and self.channel_capacity >= 1, "concurrency >= 1"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(f"train config: {msg}")
        # Fresh weights are a function of the run's seed, like everything else in the run.
        self.model = msgspec.structs.replace(self.model, seed=self.seed)


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> TrainConfig:
    """Read a TOML config and apply ``key=value`` overrides (values parsed as TOML)."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except OSError as e:
        raise ValueError(f"{path}: cannot read config ({e.strerror})") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: not valid TOML ({e})") from None
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set {item!r}: expected KEY=VALUE")
        try:
            parsed = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            parsed = value  # a bare word: a string
        node = raw
        *parents, leaf = key.split(".")
        for i, p in enumerate(parents):
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                where = ".".join(parents[: i + 1])
                raise ValueError(f"--set {item!r}: {where} is not a table, it has no {leaf!r}")
        node[leaf] = parsed
    if raw.get("init") and raw.get("backend", "tiny") == "tiny" and isinstance(raw["init"], str):
        # A run from a checkpoint has the checkpoint's shape: [model] says so in config.toml.
        # Settings the config does give are kept, and train() refuses them if they differ.
        from policy.tiny.checkpoint import load_checkpoint

        shape = msgspec.to_builtins(load_checkpoint(raw["init"]).config)
        shape.pop("seed")
        given = raw.get("model", {})
        if isinstance(given, dict):
            raw["model"] = {**shape, **given}
    try:
        return msgspec.convert(raw, TrainConfig)
    except msgspec.ValidationError as e:
        raise ValueError(f"{path}: {e}") from None


def dump_config(cfg: TrainConfig) -> str:
    """The config as TOML, every field written out, so a run is reproducible from it alone."""
    lines: list[str] = []
    tables: list[tuple[str, dict[str, Any]]] = []
    for key, value in msgspec.to_builtins(cfg).items():
        if isinstance(value, dict):
            tables.append((key, value))
        else:
            lines.append(f"{key} = {_toml(value)}")
    for name, table in tables:
        lines.append(f"\n[{name}]")
        lines += [f"{k} = {_toml(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_toml(x)}" for k, x in v.items()) + "}"
    return repr(v)


# == 2. Latency pressure =========================================================================


def time_limit_at(cfg: TrainConfig, step: int) -> float:
    """T_max for a step: constant, or linear / geometric from start to end over the run."""
    a, b = cfg.time_limit_start, cfg.time_limit_end
    frac = step / max(cfg.steps - 1, 1)
    if cfg.time_limit == "constant":
        return a
    if cfg.time_limit == "linear":
        return a + (b - a) * frac
    return a * (b / a) ** frac


def penalised_returns(
    scores: np.ndarray, durations: np.ndarray, t_max: float, beta: float
) -> np.ndarray:
    """``R = R_task - beta * pbar(q) * T / T_max``, pbar(q) the task's mean score in its group."""
    if beta == 0:
        return scores.astype(np.float64)
    return scores - beta * scores.mean() * durations / t_max


# == 3. The flat collective advantage ===========================================================


def group_advantages(returns: np.ndarray, std_normalise: bool) -> np.ndarray:
    """``A_i = R_i - mean_j R_j`` (optionally over the group's std): sums to zero."""
    adv = returns - returns.mean()
    if std_normalise:
        adv = adv / (returns.std() + 1e-6)
    return adv


def contributions(ep: Episode) -> dict[int, float]:
    """Each agent's own share of the score: every rise of the score is split equally among the
    agents whose world tools landed at that instant. (For the per-agent ablation.)"""
    landed: dict[float, list[int]] = {}
    for e in ep.events:
        if isinstance(e, Committed) and e.ok and e.tool not in PRIMITIVES:
            landed.setdefault(e.t, []).append(e.agent)
    share: dict[int, float] = {}
    for (_, before), (t, after) in zip(ep.curve, ep.curve[1:], strict=False):
        who = landed.get(t, [])
        for agent in who:
            share[agent] = share.get(agent, 0.0) + (after - before) / len(who)
    return share


# == 4. The loss =================================================================================


class LossParts(msgspec.Struct):
    loss: float
    clip_fraction: float
    ratio_mean: float
    entropy: float
    kl: float


def clipped_pg_loss(
    new_logp: torch.Tensor,  # [N] log-probabilities of the sampled tokens under the learner
    old_logp: torch.Tensor,  # [N] behaviour log-probabilities (what sampled them)
    advantage: torch.Tensor,  # [N] per token: its rollout's (flat) advantage
    weight: torch.Tensor,  # [N] 1, or less for down-weighted stale episodes
    seq: torch.Tensor,  # [N] which sequence (turn) each token belongs to
    n_tokens: float,  # normalisers over the WHOLE step (the loss may be computed in chunks)
    n_seqs: float,
    aggregation: str,
    normaliser: float,
    clip: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The PPO-clipped policy-gradient loss; returns (loss, per-token clipped mask)."""
    ratio = torch.exp(new_logp - old_logp)
    unclipped = ratio * advantage
    clipped = torch.clamp(ratio, 1 - clip, 1 + clip) * advantage
    per_token = -torch.minimum(unclipped, clipped) * weight
    if aggregation == "token_mean":
        loss = per_token.sum() / n_tokens
    elif aggregation == "sequence_mean":
        lengths = torch.bincount(seq).clamp(min=1).to(per_token.dtype)
        sums = torch.zeros_like(lengths).index_add(0, seq, per_token)
        loss = (sums / lengths).sum() / n_seqs
    else:
        loss = per_token.sum() / normaliser
    was_clipped = (clipped < unclipped).detach()
    return loss, was_clipped


# == 5. The learner ==============================================================================


class Sample(msgspec.Struct):
    """One turn's output tokens, ready for the loss."""

    prompt: str
    tokens: list[int]
    space: ActionSpace
    logprobs: list[float]  # behaviour
    advantage: float
    weight: float
    version: int


class Learner:
    """Owns the trainable model and its optimiser; ``step`` runs in a worker thread."""

    def __init__(
        self, model: TrainableModel, cfg: TrainConfig, logprob_kwargs: dict[str, Any] | None = None
    ) -> None:
        self.model = model
        self.cfg = cfg
        self.logprob_kwargs = logprob_kwargs or {}
        # AdamW (with weight_decay 0, Adam's update exactly); gradients clipped in `step`.
        self.optimiser = torch.optim.AdamW(
            list(model.parameters()), lr=cfg.learning_rate, weight_decay=cfg.weight_decay
        )
        self.reference: Any = None  # the initial policy, for the KL term
        if cfg.kl_coef > 0:
            # hf: the base model with LoRA adapters off, or a frozen copy; tiny: a snapshot
            # (a TinyModel holds a lock: no deepcopy)
            make = getattr(model, "reference", None) or getattr(model, "frozen", None)
            self.reference = make() if make is not None else copy.deepcopy(model)

    def step(self, samples: Sequence[Sample]) -> dict[str, float]:
        cfg = self.cfg
        t0 = time.perf_counter()
        self.optimiser.zero_grad(set_to_none=True)
        n_tokens = float(sum(len(s.tokens) for s in samples))
        n_seqs = float(len(samples))
        totals = dict(loss=0.0, clipped=0.0, ratio=0.0, entropy=0.0, kl=0.0)
        for start in range(0, len(samples), cfg.chunk):
            chunk = samples[start : start + cfg.chunk]
            new, entropy = self.model.token_logprobs(
                [s.prompt for s in chunk],
                [s.tokens for s in chunk],
                [s.space for s in chunk],
                cfg.temperature,
                **self.logprob_kwargs,
            )
            new_logp = torch.cat(new)
            ent = torch.cat(entropy)
            # Every tensor of the loss where the model's logprobs are (a GPU, for an LLM).
            on = dict(dtype=new_logp.dtype, device=new_logp.device)
            old = torch.tensor([x for s in chunk for x in s.logprobs], **on)
            adv = torch.tensor([s.advantage for s in chunk for _ in s.tokens], **on)
            w = torch.tensor([s.weight for s in chunk for _ in s.tokens], **on)
            seq = torch.tensor(
                [i for i, s in enumerate(chunk) for _ in s.tokens], device=new_logp.device
            )
            loss, was_clipped = clipped_pg_loss(
                new_logp,
                old,
                adv,
                w,
                seq,
                n_tokens,
                n_seqs,
                cfg.aggregation,
                cfg.normaliser,
                cfg.clip,
            )
            if cfg.entropy_coef:
                loss = loss - cfg.entropy_coef * ent.sum() / n_tokens
            if self.reference is not None:
                with torch.no_grad():
                    ref, _ = self.reference.token_logprobs(
                        [s.prompt for s in chunk],
                        [s.tokens for s in chunk],
                        [s.space for s in chunk],
                        cfg.temperature,
                        **self.logprob_kwargs,
                    )
                diff = torch.cat(ref) - new_logp
                kl = torch.exp(diff) - diff - 1
                loss = loss + cfg.kl_coef * kl.sum() / n_tokens
                totals["kl"] += float(kl.detach().sum())
            loss.backward()
            totals["loss"] += float(loss.detach())
            totals["clipped"] += float(was_clipped.sum())
            totals["ratio"] += float(torch.exp(new_logp - old).detach().sum())
            totals["entropy"] += float(ent.detach().sum())
        grad_norm = torch.nn.utils.clip_grad_norm_(list(self.model.parameters()), cfg.max_grad_norm)
        self.optimiser.step()
        self.model.version += 1
        seconds = time.perf_counter() - t0
        n = max(n_tokens, 1.0)
        return {
            "loss": totals["loss"],
            "clip_fraction": totals["clipped"] / n,
            "ratio_mean": totals["ratio"] / n,
            "entropy": totals["entropy"] / n,
            "kl": totals["kl"] / n,
            "grad_norm": float(grad_norm),
            "learner_tokens_per_s": n_tokens / seconds if seconds > 0 else 0.0,
            "learner_seconds": seconds,
            "trained_tokens": n_tokens,
        }

    def state(self) -> dict[str, Any]:
        return {"optimiser": self.optimiser.state_dict()}

    def load_state(self, state: dict[str, Any]) -> None:
        self.optimiser.load_state_dict(state["optimiser"])


# == 6. Rollouts =================================================================================


def team_config(cfg: TrainConfig, group: int, member: int, version: int) -> EpisodeConfig:
    """Episode ``member`` of ``group``: the group shares its task instance (world seed) and team
    size; each member has its own sampling stream."""
    team = cfg.team_sizes[group % len(cfg.team_sizes)]
    agents, budget = (1, team - 1) if cfg.org == "ceo" else (team, 0)
    step = group // cfg.groups_per_step
    return EpisodeConfig(
        world=cfg.world,
        params=dict(cfg.params),
        agents=agents,
        world_agents=team if cfg.org == "ceo" else 0,  # a CEO's task is sized for its team
        budget=budget,
        org=cfg.org,
        world_seed=derive(cfg.seed, group) >> 33,
        sample_seed=derive(cfg.seed, group, member) >> 1,
        time_limit=time_limit_at(cfg, step),
        latency=latency_preset(cfg.latency),
        max_output_tokens=cfg.max_output_tokens,
        temperature=cfg.temperature,
        policy=f"{cfg.backend} (training)",
        policy_version=version,
        tokenizer="bytes" if cfg.backend == "tiny" else "",
    )


def team_size(cfg: TrainConfig, group: int) -> int:
    return cfg.team_sizes[group % len(cfg.team_sizes)]


class GroupSource:
    """Issues the episodes of groups in order, each only once the policy version it is pinned to
    exists: group g belongs to step g // B and may use weights ``lag`` versions older."""

    def __init__(
        self, cfg: TrainConfig, first_group: int, have: set[tuple[int, int]], pin: bool = True
    ) -> None:
        self.cfg = cfg
        self.pin = pin  # False: the server holds one version; episodes take whatever it has
        self.group, self.member = first_group, 0
        self.have = have  # (group, member) already on disk: not run again
        self.latest = first_group // cfg.groups_per_step  # newest version the learner published
        self.issued: dict[int, tuple[int, int]] = {}  # sample_seed -> (group, member)
        self._changed = trio.Event()

    def publish(self, version: int) -> None:
        self.latest = version
        self._changed.set()
        self._changed = trio.Event()

    def _skip_done(self) -> None:
        while (self.group, self.member) in self.have:
            self._advance()

    def _advance(self) -> None:
        self.member += 1
        if self.member == self.cfg.group_size:
            self.group, self.member = self.group + 1, 0

    def _exhausted(self) -> bool:
        return self.group >= self.cfg.steps * self.cfg.groups_per_step

    def _needs(self) -> int:
        return max(0, self.group // self.cfg.groups_per_step - self.cfg.lag)

    def take(self) -> EpisodeConfig | None:
        self._skip_done()
        if self._exhausted() or self.latest < self._needs():
            return None
        if not self.pin:
            version = -1
        else:
            version = self._needs() if self.cfg.sync == "pinned" else self.latest
        ep = team_config(self.cfg, self.group, self.member, version)
        self.issued[ep.sample_seed] = (self.group, self.member)
        self._advance()
        return ep

    async def wait(self) -> bool:
        self._skip_done()
        while not self._exhausted() and self.latest < self._needs():
            await self._changed.wait()
        return not self._exhausted()


class VersionedPolicy:
    """Serves several policy versions at once: each request goes to the version its episode is
    pinned to. One quiescence batch becomes one sub-batch per live version (at most lag + 1)."""

    def __init__(self, name: str = "tiny (training)") -> None:
        self.policies: dict[int, Policy] = {}
        self.name = name
        self.version = -1

    def publish(self, version: int, policy: Policy, keep: int) -> None:
        self.policies[version] = policy
        self.version = max(self.version, version)
        for v in [v for v in self.policies if v < self.version - keep]:
            del self.policies[v]

    async def generate(self, requests: Sequence[PolicyRequest]) -> list[PolicyResponse]:
        by_version: dict[int, list[int]] = {}
        for i, r in enumerate(requests):
            by_version.setdefault(self.version if r.version < 0 else r.version, []).append(i)
        out: list[PolicyResponse | None] = [None] * len(requests)
        for v, idx in sorted(by_version.items()):
            if v not in self.policies:
                raise RuntimeError(
                    f"no weights for policy version {v} (have {sorted(self.policies)})"
                )
            answers = await self.policies[v].generate([requests[i] for i in idx])
            for i, a in zip(idx, answers, strict=True):
                out[i] = a
        return out  # type: ignore[return-value]

    async def aclose(self) -> None:
        return None


# == 7. Metrics, the run directory, resume ======================================================

TEAM_BUCKETS = ("solo", "2", "3", "4", "5-8", "9+")


def bucket(team: int) -> str:
    if team == 1:
        return "solo"
    if team <= 4:
        return str(team)
    return "5-8" if team <= 8 else "9+"


class StepMetrics(msgspec.Struct, kw_only=True):
    """One line of metrics.jsonl: the signs of life of one training step."""

    step: int
    version: int  # the learner's version after this step
    time_limit: float
    episodes: int
    return_mean: float
    return_min: float
    return_max: float
    score_mean: float
    duration_mean: float  # simulated seconds per episode
    output_tokens: int
    useful_tokens_mean: float  # output tokens of turns acting on the world, per rollout
    useful_average: float  # the environment's running average of that, over all steps so far
    useful_rel: dict[str, float]  # by team size: useful tokens per rollout / running average
    comm_tokens_per_hour: float  # message and post tokens per simulated hour
    staleness_mean: float
    staleness_max: int
    dropped_stale: int
    downweighted: int
    loss: float
    clip_fraction: float
    ratio_mean: float
    entropy: float
    kl: float
    grad_norm: float
    trained_tokens: float
    # Wall-clock figures: the only fields a re-run with the same config does not reproduce (how
    # many rollouts share a policy batch depends on when the learner frees the CPU).
    learner_tokens_per_s: float
    learner_seconds: float
    rollout_batch_mean: float
    wall_time: float  # seconds since the run (or its resumption) began


class Ledger(msgspec.Struct):
    """Which episode files a step consumed: every finished episode is used once, or dropped
    as stale, and this file says which."""

    step: int
    used: list[str]
    dropped: list[str]


def episode_name(group: int, member: int) -> str:
    return f"g{group:06d}-r{member:02d}.msgpack"


def episode_key(name: str) -> tuple[int, int] | None:
    """``(group, member)`` of a file named by :func:`episode_name`; None for any other name."""
    m = re.fullmatch(r"g(\d+)-r(\d+)\.msgpack", name)
    return (int(m[1]), int(m[2])) if m else None


def step_samples(
    cfg: TrainConfig, step: int, groups: list[list[Episode]], useful_so_far: tuple[float, int]
) -> tuple[list[Sample], dict[str, Any], list[int]]:
    """Turn a step's groups into token samples with their advantages, plus metrics.

    Returns (samples, metrics, staleness per episode)."""
    samples: list[Sample] = []
    returns_all: list[float] = []
    staleness: list[int] = []
    dropped = downweighted = 0
    useful_sum, useful_n = useful_so_far
    by_bucket: dict[str, list[float]] = {}
    for episodes in groups:
        scores = np.array([e.score for e in episodes])
        durations = np.array([e.duration for e in episodes])
        t_max = episodes[0].config.time_limit
        returns = penalised_returns(scores, durations, t_max, cfg.latency_penalty)
        adv = group_advantages(returns, cfg.std_normalise)
        returns_all += returns.tolist()
        if cfg.advantage == "individual":
            shares = [contributions(e) for e in episodes]
            everyone = [  # every agent that took part, hired or fired ones included
                s.get(ev.agent, 0.0)
                for e, s in zip(episodes, shares, strict=True)
                for ev in e.events
                if isinstance(ev, Spawned)
            ]
            base = float(np.mean(everyone)) if everyone else 0.0
        for i, ep in enumerate(episodes):
            versions = [t.version for t in ep.turns if t.policy == "trained"]
            stale = step - min(versions) if versions else 0
            staleness.append(stale)
            weight = 1.0
            if stale > cfg.max_staleness:
                if cfg.stale == "drop":
                    dropped += 1
                    continue
                weight = 0.5 ** (stale - cfg.max_staleness)
                downweighted += 1
            for t in ep.turns:
                if t.policy != "trained" or not t.token_ids:
                    continue  # the orchestrator's frozen sub-agents are not trained
                a = adv[i] if cfg.advantage == "collective" else shares[i].get(t.agent, 0.0) - base
                samples.append(
                    Sample(
                        t.prompt,
                        t.token_ids,
                        ep.spaces[t.space],
                        t.logprobs,
                        float(a),
                        weight,
                        t.version,
                    )
                )
    flat = [e for g in groups for e in g]
    for g, episodes in enumerate(groups):
        team = team_size(cfg, step * cfg.groups_per_step + g)
        by_bucket.setdefault(bucket(team), []).extend(e.stats.world_tokens for e in episodes)
    useful = [e.stats.world_tokens for e in flat]
    useful_sum += sum(useful)
    useful_n += len(useful)
    average = useful_sum / useful_n if useful_n else 0.0
    hours = sum(e.duration for e in flat) / 3600
    metrics = {
        "time_limit": flat[0].config.time_limit,
        "episodes": len(flat),
        "return_mean": float(np.mean(returns_all)),
        "return_min": float(np.min(returns_all)),
        "return_max": float(np.max(returns_all)),
        "score_mean": float(np.mean([e.score for e in flat])),
        "duration_mean": float(np.mean([e.duration for e in flat])),
        "output_tokens": int(sum(e.stats.output_tokens for e in flat)),
        "useful_tokens_mean": float(np.mean(useful)),
        "useful_average": average,
        "useful_rel": {
            b: float(np.mean(v)) / average if average else 0.0
            for b, v in sorted(by_bucket.items(), key=lambda kv: TEAM_BUCKETS.index(kv[0]))
        },
        "comm_tokens_per_hour": sum(e.stats.comm_tokens for e in flat) / hours if hours else 0.0,
        "staleness_mean": float(np.mean(staleness)),
        "staleness_max": int(max(staleness)),
        "dropped_stale": dropped,
        "downweighted": downweighted,
        "_useful_so_far": (useful_sum, useful_n),
    }
    return samples, metrics, staleness


class TrainState(msgspec.Struct):
    """What resuming needs besides the weights: where the run is."""

    step: int  # the next step to run
    useful_sum: float
    useful_n: int
    elapsed: float  # wall seconds spent before this (re)start


def _write_lines(path: Path, lines: Sequence[bytes]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(b"".join(line + b"\n" for line in lines))
    tmp.replace(path)


def _lines_before(path: Path, step: int) -> list[bytes]:
    """The lines of a JSON-lines file whose step is before ``step`` (a resume redoes the rest;
    a line cut short by a kill belongs to the rest)."""
    if not path.exists():
        return []
    kept = []
    for ln in path.read_bytes().splitlines():
        try:
            if json.loads(ln)["step"] < step:
                kept.append(ln)
        except (ValueError, KeyError, TypeError):
            continue
    return kept


class Interrupted(Exception):
    """Training stopped by Ctrl-C; everything up to the last finished step is kept."""


def _check_resumable(run_dir: Path) -> None:
    if not (run_dir / "config.toml").is_file():
        raise ValueError(f"{run_dir}: no run to resume (no config.toml)")


def _restore(
    state_path: Path, backend: Any, model: Any, learner: Learner
) -> tuple[TrainState, dict[int, Any]]:
    """The saved weights, optimiser and position of a run; one clear error for a state file
    that is truncated, corrupt, or does not fit the run's config (e.g. its [model] edited)."""
    try:
        # weights_only: a state file is data; loading one must not run pickled code.
        saved = torch.load(state_path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many kinds for a bad file; all mean the same here
        raise ValueError(
            f"{state_path}: not a readable training state (truncated or corrupt: "
            f"{_first_line(e)}); the run cannot be resumed from it"
        ) from None
    try:
        backend.load_weights(model, saved["model"])
        model.version = int(saved["version"])
        learner.load_state(saved["learner"])
        state = msgspec.convert(saved["state"], TrainState)
        serving = {int(v): w for v, w in saved["serving"].items()}
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as e:
        raise ValueError(
            f"{state_path}: does not fit this run's config.toml (was [model] or the optimiser "
            f"changed?): {_first_line(e)}"
        ) from None
    return state, serving


def _first_line(e: BaseException) -> str:
    """The telling line of an error from torch (its messages run to many lines)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    telling = [ln for ln in lines if "size mismatch" in ln or "Missing key" in ln]
    return f"{type(e).__name__}: {(telling or lines or [''])[0][:300]}"


def _check_init(cfg: TrainConfig, model: Any) -> None:
    """A run that starts from a checkpoint has the checkpoint's shape; its config must say so
    (``load_config`` fills [model] from the checkpoint where the config leaves it out)."""
    have = getattr(model, "config", None)
    if cfg.backend != "tiny" or have is None:
        return
    want = msgspec.structs.replace(cfg.model, seed=have.seed)
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


def validate(cfg: TrainConfig) -> None:
    """Everything a run needs that can be checked without running it: every team size's
    episode config, world and organisation, and the memory the concurrent episodes need at
    least. Raises ValueError with one line."""
    from collective.limits import check_agents
    from collective.registry import check_runnable

    check_agents(cfg.concurrency * max(cfg.team_sizes), "concurrency x largest team")
    first_group = {team: g for g, team in reversed(list(enumerate(cfg.team_sizes)))}
    for g in sorted(first_group.values()):
        check_runnable(team_config(cfg, g, 0, 0))


def train(
    cfg: TrainConfig,
    run_dir: str | Path,
    *,
    resume: bool = False,
    progress: bool = True,
    stop_after: int | None = None,
) -> list[StepMetrics]:
    """Train, writing everything into ``run_dir``; with ``resume``, continue a stopped run.

    Everything is checked and built first (config, worlds, model, a resumed run's state); only
    then is the run directory made, so a start that fails leaves nothing behind (and a failed
    resume leaves the run as it was). Ctrl-C raises :class:`Interrupted` once the step in hand
    is either fully written or not at all; ``--resume`` continues from there, as if never
    stopped. ``stop_after`` ends the run after that many steps of this invocation (tests use it
    to simulate an interruption). Returns the metrics of the steps run now."""
    from collective.backend import make_backend
    from collective.limits import memory_cap
    from collective.outputs import check_dir

    check_logger(cfg.logger)  # a missing extra fails here, before anything is written
    run_dir = Path(run_dir)
    # The outermost folder this run makes: removed again if the run fails before it has kept
    # anything (a failed start leaves nothing behind).
    made = next((p for p in reversed((run_dir, *run_dir.parents)) if not p.exists()), None)
    if resume:
        _check_resumable(run_dir)
    else:
        check_dir(run_dir, "run directory")
        if run_dir.exists() and any(run_dir.iterdir()):
            raise ValueError(
                f"{run_dir} already holds a run; resume it with --resume or pick --out"
            )
    validate(cfg)
    torch.manual_seed(cfg.seed)
    # One intra-op thread: the rollout thread and the learner thread each keep a core busy, and
    # a reduction's order (hence its last bits) cannot depend on how the two happen to overlap.
    torch.set_num_threads(1)
    backend = make_backend(cfg, run_dir)
    try:
        with memory_cap():
            model = backend.fresh() if not cfg.init else backend.load(cfg.init)
    except (MemoryError, RuntimeError) as e:
        if isinstance(e, RuntimeError) and "can't allocate memory" not in str(e):
            raise  # torch's allocator says RuntimeError; anything else is not about memory
        raise ValueError(
            f"the model ({cfg.model if cfg.backend == 'tiny' else cfg.hf_model}) needs more "
            "memory than half of what this machine has available (the other half is the run's)"
        ) from None
    _check_init(cfg, model)
    # The orchestrator's sub-agents answer with the weights training starts from, for good.
    frozen = backend.frozen(model) if make_organisation(cfg.org).name == "orchestrator" else None
    learner = Learner(model, cfg, backend.logprob_kwargs())
    state = TrainState(step=0, useful_sum=0.0, useful_n=0, elapsed=0.0)
    # The weights of every version rollouts may still use (pinned backends only).
    serving_weights: dict[int, Any] = {0: backend.weights(model)} if backend.pinned else {}
    state_path = run_dir / "checkpoints" / "train-state.pt"
    if resume and state_path.exists():
        state, serving_weights = _restore(state_path, backend, model, learner)
    # Checked and built: now the run directory may be written.
    for sub in ("checkpoints", "episodes", "plots"):
        (run_dir / sub).mkdir(parents=True, exist_ok=True)
    if not resume:
        (run_dir / "config.toml").write_text(dump_config(cfg))
    for leftover in (run_dir / "episodes").glob(".*.tmp"):  # a write cut short by a kill
        leftover.unlink()
    for name in ("metrics.jsonl", "ledger.jsonl"):
        _write_lines(run_dir / name, _lines_before(run_dir / name, state.step))
    if state.step >= cfg.steps:
        return []
    schedule = [time_limit_at(cfg, s) for s in range(cfg.steps)]
    try:
        logger = open_logger(cfg.logger, cfg, run_dir, state.step, schedule)
    except BaseException:
        if not resume:
            _remove_unstarted(run_dir, made)
        raise
    from tqdm import tqdm

    bar = tqdm(
        total=cfg.steps,
        initial=state.step,
        disable=not progress,
        unit="step",
        desc="rlcr",
        dynamic_ncols=True,
    )
    try:
        return trio.run(
            _train,
            cfg,
            run_dir,
            backend,
            model,
            frozen,
            learner,
            state,
            serving_weights,
            bar,
            stop_after,
            logger,
        )
    except BaseException as e:
        bar.leave = False  # a run that stops early clears its bar rather than leave it half drawn
        if _is_interrupt(e):
            raise Interrupted(
                f"interrupted at step {state.step}; resume with `collective train --resume "
                f"{run_dir}`"
            ) from None
        if not resume and state.step == 0:
            _remove_unstarted(run_dir, made)
        if isinstance(e, BaseExceptionGroup) and (lone := lone_error(e)) is not e:
            raise lone from None  # one error (a world's, the grammar's): as itself, in one line
        raise
    finally:
        bar.close()


def _remove_unstarted(run_dir: Path, made: Path | None) -> None:
    """A new run that failed before it kept anything (no step, no episode: a policy that cannot
    answer, a learner that fails on its first step) is removed, folders it made included, so
    that ``--out`` can be given again. Anything kept (an episode, a failed episode) stays:
    the run is resumable."""
    if any(run_dir.glob("*/*.msgpack")):
        return
    if made is not None:
        shutil.rmtree(made, ignore_errors=True)
    else:  # the folder was there, empty (checked before the run): empty it again
        for p in run_dir.iterdir():
            shutil.rmtree(p) if p.is_dir() else p.unlink()


def _is_interrupt(e: BaseException) -> bool:
    if isinstance(e, BaseExceptionGroup):
        return e.split(KeyboardInterrupt)[0] is not None
    return isinstance(e, KeyboardInterrupt)


async def _train(
    cfg: TrainConfig,
    run_dir: Path,
    backend: Any,
    model: TrainableModel,
    frozen: Policy | None,
    learner: Learner,
    state: TrainState,
    serving_weights: dict[int, Any],
    bar: Any,
    stop_after: int | None,
    logger: RunLogger | None,
) -> list[StepMetrics]:
    t_start = time.perf_counter() - state.elapsed
    B, G = cfg.groups_per_step, cfg.group_size
    first_group = state.step * B
    episodes_dir = run_dir / "episodes"
    on_disk: dict[tuple[int, int], Path] = {}
    for path in episodes_dir.glob("g*-r*.msgpack"):
        key = episode_key(path.name)
        if key is not None and key[0] >= first_group:
            on_disk[key] = path
    serving = await backend.serve(model, serving_weights)
    source = GroupSource(cfg, first_group, set(on_disk), pin=backend.pinned)
    source.latest = state.step
    conductor = Conductor(serving if frozen is None else {"trained": serving, "frozen": frozen})
    send, recv = trio.open_memory_channel[tuple[int, int, Episode]](cfg.channel_capacity)
    buffer: dict[tuple[int, int], Episode] = {key: load_episode(p) for key, p in on_disk.items()}
    done: list[StepMetrics] = []

    async def emit(ep: Episode) -> None:
        # Once the run is cancelled (Ctrl-C), an episode whose actors were cancelled can still
        # look finished ("idle") to the conductor: it must not be kept as if it had run.
        await trio.lowlevel.checkpoint_if_cancelled()
        g, i = source.issued.pop(ep.config.sample_seed)
        if ep.end == "world_error":  # kept for the author, never learned from: the run stops
            failed = run_dir / "failed" / episode_name(g, i)
            failed.parent.mkdir(exist_ok=True)
            save_episode(ep, failed)
            raise ValueError(
                f"{world_error(ep)}; the episode is kept in {failed}; once the world is fixed, "
                f"`collective train --resume {run_dir}`"
            )
        save_episode(ep, episodes_dir / episode_name(g, i))  # kept before anyone uses it
        await send.send((g, i, ep))

    stopped: list[Exception] = []

    async def rollouts() -> None:
        async with send:
            try:
                await conductor.play(source, concurrency=cfg.concurrency, emit=emit)
            except Exception as e:
                # Cancel the learner's loop before the channel closes, so that the error is
                # the run's only one (not grouped with the learner's EndOfChannel).
                stopped.append(e)
                nursery.cancel_scope.cancel()

    @trio.lowlevel.enable_ki_protection
    def commit(step: int, metrics: StepMetrics, ledger: Ledger, names: list[str]) -> None:
        """A finished step's records, all or none of them: Ctrl-C waits until they are written
        (a resume then finds metrics, ledger and checkpoint in step)."""
        with (run_dir / "metrics.jsonl").open("ab") as f:
            f.write(msgspec.json.encode(metrics) + b"\n")
        if logger is not None:  # the same line, to TensorBoard or W&B
            logger.log(step, msgspec.to_builtins(metrics))
        with (run_dir / "ledger.jsonl").open("ab") as f:
            f.write(msgspec.json.encode(ledger) + b"\n")
        state.step = step + 1
        state.elapsed = time.perf_counter() - t_start
        _checkpoint(run_dir, cfg, backend, model, learner, state, serving_weights)
        if not cfg.keep_episodes:
            for n in names:
                (episodes_dir / n).unlink(missing_ok=True)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(rollouts)
        for step in range(state.step, cfg.steps):
            wanted = [(g, i) for g in range(step * B, (step + 1) * B) for i in range(G)]
            while any(k not in buffer for k in wanted):
                g, i, ep = await recv.receive()
                buffer[(g, i)] = ep
            groups = [
                [buffer.pop((g, i)) for i in range(G)] for g in range(step * B, (step + 1) * B)
            ]
            samples, m, stale = step_samples(cfg, step, groups, (state.useful_sum, state.useful_n))
            state.useful_sum, state.useful_n = m.pop("_useful_so_far")
            stats = await trio.to_thread.run_sync(learner.step, samples)
            version = step + 1
            weights = backend.weights(model) if backend.pinned else {}
            if backend.pinned:
                serving_weights[version] = weights
                for v in [v for v in serving_weights if v < version - cfg.lag]:
                    del serving_weights[v]
            await backend.publish(model, version, weights)
            source.publish(version)
            batches = conductor.batch_stats
            metrics = StepMetrics(
                step=step,
                version=version,
                rollout_batch_mean=batches.mean,
                wall_time=time.perf_counter() - t_start,
                **m,
                **stats,
            )
            names = [episode_name(g, i) for g in range(step * B, (step + 1) * B) for i in range(G)]
            kept = [
                n
                for n, s in zip(names, stale, strict=True)
                if not (s > cfg.max_staleness and cfg.stale == "drop")
            ]
            ledger = Ledger(step, kept, [n for n in names if n not in kept])
            commit(step, metrics, ledger, names)
            done.append(metrics)
            bar.set_postfix(ret=f"{metrics.return_mean:.3f}", T=f"{metrics.time_limit:.0f}")
            bar.update(1)
            if stop_after is not None and len(done) >= stop_after:
                break
        nursery.cancel_scope.cancel()
    if stopped:
        raise stopped[0]
    bar.close()
    if logger is not None:  # (TensorBoard was flushed at every step; W&B also finishes at exit)
        logger.close()
    await backend.aclose()
    if cfg.plots:
        try:
            import matplotlib  # noqa: F401  (an optional extra)
        except ImportError:
            print(
                "plots skipped: matplotlib is not installed (pip install 'collective[plots]', "
                f"then `collective plot {run_dir}`)",
                file=sys.stderr,
            )
        else:
            from collective.plots import plot_run

            plot_run(run_dir)
    return done


def _checkpoint(
    run_dir: Path,
    cfg: TrainConfig,
    backend: Any,
    model: TrainableModel,
    learner: Learner,
    state: TrainState,
    serving_weights: dict[int, Any],
) -> None:
    """The backend's ``latest`` checkpoint (tiny: ``latest.pt``, usable with ``--policy
    tiny:PATH``), a snapshot every ``snapshot_every`` steps, and ``train-state.pt`` for
    resuming; each written atomically."""
    ckpt = run_dir / "checkpoints"
    snap = state.step % cfg.snapshot_every == 0 or state.step == cfg.steps
    backend.checkpoint(model, ckpt, f"step-{state.step:06d}" if snap else None)
    tmp = ckpt / "train-state.pt.tmp"
    torch.save(
        {
            "model": backend.weights(model),
            "version": model.version,
            "learner": learner.state(),
            "state": msgspec.to_builtins(state),
            "serving": serving_weights,
        },
        tmp,
    )
    tmp.replace(ckpt / "train-state.pt")


def read_metrics(run_dir: str | Path) -> list[StepMetrics]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        raise ValueError(f"{run_dir}: no metrics.jsonl (is it a run directory?)")
    return [
        msgspec.json.decode(ln, type=StepMetrics) for ln in path.read_bytes().splitlines() if ln
    ]
