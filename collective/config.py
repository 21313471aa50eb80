"""The training configuration: every hyperparameter of an RLCR run, its default in sight.

A run is a function of its config (and the code): ``load_config`` reads TOML with ``--set``
overrides and validates it once, here, at the boundary; ``dump_config`` writes every field back
out, so the run directory's ``config.toml`` alone reproduces the run. ``time_limit_at`` is the
latency-pressure schedule, a function of the config and the step only.
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import msgspec

from policy.tiny.model import TinyConfig


class ClusterConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Where a run's work happens (``[cluster]``). Placement only: the same config and seed give
    the same run on either backend and any number of workers."""

    backend: Literal["local", "ray"] = "local"  # local: everything in this process
    address: str = ""  # ray: "" starts a local Ray; "auto" or "ray://host:port" joins a cluster
    rollout_workers: int = 2  # Ray actors, each a conductor running its share of a step's episodes
    cpus_per_worker: float = 1.0  # Ray CPUs each rollout worker reserves
    learner_gpus: float = 0.0  # > 0: the learner is a Ray actor holding this many GPUs

    def __post_init__(self) -> None:
        checks = [
            (self.rollout_workers >= 1, "rollout_workers must be >= 1"),
            (0 < self.cpus_per_worker < math.inf, "cpus_per_worker must be > 0"),
            (0 <= self.learner_gpus < math.inf, "learner_gpus must be >= 0"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(f"train config: cluster.{msg}")


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
    cluster: ClusterConfig = msgspec.field(default_factory=ClusterConfig)  # [cluster]: placement

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
    from collective.outputs import open_input

    path = Path(path)
    try:
        with open_input(path, "config") as f:  # a FIFO is refused, never waited on
            raw = tomllib.loads(f.read().decode())
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not valid TOML (not UTF-8 text: {e.reason})") from None
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


def time_limit_at(cfg: TrainConfig, step: int) -> float:
    """T_max for a step: constant, or linear / geometric from start to end over the run."""
    a, b = cfg.time_limit_start, cfg.time_limit_end
    frac = step / max(cfg.steps - 1, 1)
    if cfg.time_limit == "constant":
        return a
    if cfg.time_limit == "linear":
        return a + (b - a) * frac
    return a * (b / a) ** frac
