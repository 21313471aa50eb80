"""The training configuration: every hyperparameter of an RLCR run, its default in sight.

A run is a function of its config (and the code): ``load_config`` reads TOML with ``--set``
overrides and validates it once, here, at the boundary; ``dump_config`` writes every field back
out, so the run directory's ``config.toml`` alone reproduces the run. ``time_limit_at`` is the
latency-pressure schedule, a function of the config and the step only.
"""

from __future__ import annotations

import hashlib
import json
import math
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple

import msgspec

from collective.base.seeding import derive
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


Schedule = Literal["constant", "linear", "geometric"]


class WorldEntry(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One world of a mix (a ``[[worlds]]`` table): the task, its team sizes, its share of the
    groups and its own time-limit schedule (time scales differ between tasks). A config without
    ``[[worlds]]`` is the mix of one entry made of its top-level fields (``mix``)."""

    world: str
    name: str = ""  # the label metrics.jsonl reports it under; "" = the world's own name
    params: dict[str, Any] = {}
    team_sizes: tuple[int, ...] = (1, 2, 4, 8)  # cycled over this world's groups
    weight: float = 1.0  # its share of the groups: each group draws a world by weight
    time_limit: Schedule = "constant"
    time_limit_start: float = 600.0
    time_limit_end: float = 600.0

    @property
    def label(self) -> str:
        return self.name or self.world


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
    # Dynamic sampling (DAPO's and slime's filter): a group whose returns are all equal carries
    # no signal (every advantage 0), so it is dropped and a fresh group of the same step drawn
    # in its place, up to this many a step; 0 = off. Counted in metrics.jsonl either way.
    resample: int = 0
    # -- many worlds in one run (``[[worlds]]`` tables: ``WorldEntry``) ------------------------
    # Given, they replace world, params, team_sizes and the time-limit schedule: each group
    # draws its world by weight from a stream seeded by (seed, group), so a run stays a function
    # of its config; the advantage stays per group (one task instance).
    worlds: tuple[WorldEntry, ...] = ()
    world_normalise: bool = False  # divide A by the std of returns of the group's world's step
    baseline_episodes: int = 4  # [[worlds]]: random and untrained episodes a world, at start
    # -- latency pressure -------------------------------------------------------------------
    time_limit: Schedule = "constant"
    time_limit_start: float = 600.0  # T_max at step 0, simulated seconds
    time_limit_end: float = 600.0  # T_max at the last step
    latency_penalty: float = 0.0  # beta in R = R_task - beta * pbar(q) * T / T_max; 0 = off
    # -- advantage --------------------------------------------------------------------------
    # collective: one flat advantage a rollout; individual: leave-one-out credit per agent
    # (collective/rl/credit.py); turn: forked turns' own credit (collective/rl/forks.py)
    advantage: Literal["collective", "individual", "turn"] = "collective"
    std_normalise: bool = False  # divide A by the group's std of returns
    fork_turns: int = 2  # advantage = "turn": turns forked per rollout (the rest keep A_i)
    fork_samples: int = 2  # forks per forked turn: the Monte Carlo samples of its state's value
    fork_horizon: float = 0.0  # seconds after a fork its return is read at; 0: the end
    # -- a commons: goods that outlive an episode (collective/rl/commons.py) -------------------
    # off: the world plays without one; on: what episodes contribute is there for the episodes
    # that start later; credit: and the turns that made an entry are credited with its measured
    # value to later episodes (re-runs without it)
    commons: Literal["off", "on", "credit"] = "off"
    commons_size: int = 6  # entries kept (the oldest go)
    commons_credit_entries: int = 2  # credit: entries whose value is measured a step
    commons_credit_reruns: int = 2  # credit: episodes re-run without each of them
    commons_discount: float = 0.9  # credit: per step between a contribution and its use
    # -- loss -------------------------------------------------------------------------------
    learning_rate: float = 3e-3
    clip: float = 0.2  # PPO clip on the importance ratio
    aggregation: Literal["token_mean", "sequence_mean", "constant"] = "token_mean"
    normaliser: float = 4096.0  # tokens, for aggregation = "constant"
    entropy_coef: float = 0.0  # a bonus on the mean entropy of the sampled tokens' distributions
    kl_coef: float = 0.0  # a penalty on the KL to the starting weights (the reference policy)
    # k1: log(pi / pi_ref), unbiased, can be negative; k3: r - log r - 1 with r = pi_ref / pi,
    # unbiased and never negative (Schulman's estimators, as GRPO trainers offer them)
    kl_estimator: Literal["k1", "k3"] = "k3"
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
    backend: Literal["tiny", "hf"] = "tiny"  # hf: a Hugging Face causal LM (policy/hf/model.py)
    # Each role of the organisation (ceo and specialist; orchestrator and sub with
    # org = "orchestrator:trained") trains its own tiny model, learner and versions
    # (collective/rl/roles.py); false: every trained role shares one policy.
    role_policies: bool = False
    hf_model: str = ""  # backend = "hf": a local model directory to start from
    # build hf_model thus (make-model) if it is absent
    hf_build: Literal["", "tiny-lm", "smollm2-135m"] = ""
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
    top_p: float = 1.0  # backend = "hf", in-process: nucleus sampling (1.0: none)
    max_output_tokens: int = 24
    # -- bookkeeping ------------------------------------------------------------------------
    snapshot_every: int = 25  # keep checkpoints/step-N.pt every N steps (latest.pt: always)
    keep_episodes: bool = True  # keep every episode file (False: delete once consumed)
    plots: bool = True
    logger: Literal["none", "tensorboard", "wandb"] = "none"  # also log to TensorBoard or W&B
    cluster: ClusterConfig = msgspec.field(default_factory=ClusterConfig)  # [cluster]: placement

    def __post_init__(self) -> None:
        for name, domain in DOMAINS.items():  # every number, once, here at the boundary
            value = getattr(self, name)
            if not domain.holds(value):
                raise ValueError(f"train config: {name} must be {domain.says}, not {value!r}")
        if self.backend == "tiny":  # a setting that would do nothing is refused, not ignored
            given = self._set(HF_ONLY + (("device",) if self.device == "cuda" else ()))
            if given:
                raise ValueError(
                    f"train config: backend = 'tiny' ignores {given} (backend = 'hf' settings): "
                    "drop them or set backend = 'hf'"
                )
        self._check_mix()
        if self.commons == "off" and (given := self._set(COMMONS_ONLY)):
            raise ValueError(
                f"train config: commons = 'off' ignores {given}: drop them or set commons"
            )
        if self.commons == "on" and (given := self._set(COMMONS_ONLY[1:])):
            raise ValueError(
                f"train config: commons = 'on' ignores {given} (commons = 'credit' settings): "
                "drop them or set commons = 'credit'"
            )
        if self.commons == "credit" and not self.keep_episodes:
            raise ValueError(
                "train config: commons = 'credit' pays the turn that made an entry, read back "
                "from its episode file, which keep_episodes = false deletes: keep the episodes"
            )
        if self.commons != "off" and self.sync != "pinned":
            raise ValueError(
                "train config: a commons follows the policy versions episodes are pinned to; "
                "sync = 'latest' does not pin them: set sync = 'pinned'"
            )
        if self.commons != "off" and (self.worlds or self.cluster.backend != "local"):
            raise ValueError(
                "train config: a commons is built for one world ([[worlds]] each with its own "
                "commons is not) on cluster.backend = 'local' (Ray workers would each need it): "
                "drop commons or those settings"
            )
        if self.commons != "off" and self.hf_server:
            raise ValueError(
                "train config: a commons needs episodes pinned to policy versions (its versions "
                "follow them), which a server holding one version does not give: drop hf_server"
            )
        if self.role_policies and (self.backend != "tiny" or self.cluster.backend != "local"):
            raise ValueError(
                "train config: role_policies is built for backend = 'tiny' on "
                "cluster.backend = 'local' (a LoRA adapter per role on the hf path, and Ray "
                "workers serving several roles, are not): drop role_policies or those settings"
            )
        if self.role_policies and self.advantage == "turn":
            raise ValueError(
                "train config: role_policies with advantage = 'turn' is not built yet (its forks "
                "have not been checked per role): use advantage 'collective' or 'individual'"
            )
        if self.advantage == "turn" and self.hf_server:
            raise ValueError(
                "train config: advantage = 'turn' needs the weights of the version that played "
                "each episode, which a server holding one version at a time does not keep: "
                "drop hf_server or use another advantage"
            )
        if self.resample and (self.cluster.backend != "local" or self.commons != "off"):
            raise ValueError(
                "train config: resample (dynamic sampling) is built for cluster.backend = "
                "'local' without a commons (Ray workers are dealt whole steps; a commons follows "
                "the groups in order): drop resample or those settings"
            )
        if self.advantage != "turn" and (given := self._set(TURN_ONLY)):
            raise ValueError(
                f"train config: advantage = {self.advantage!r} ignores {given} "
                "(advantage = 'turn' settings): drop them or set advantage = 'turn'"
            )
        # Fresh weights are a function of the run's seed, like everything else in the run.
        self.model = msgspec.structs.replace(self.model, seed=self.seed)

    def _set(self, fields: Sequence[str]) -> str:
        """``name = value`` of each of ``fields`` set away from its default ("" if none)."""
        return ", ".join(
            f"{f} = {getattr(self, f)!r}" for f in fields if getattr(self, f) != DEFAULTS[f]
        )

    def _check_mix(self) -> None:
        if self.world_normalise and self.std_normalise:
            raise ValueError(
                "train config: world_normalise and std_normalise each rescale the advantage; "
                "set one of them"
            )
        if not self.worlds:
            if given := self._set(MIX_ONLY):
                raise ValueError(
                    f"train config: {given} act only on a mix of worlds: add [[worlds]] "
                    "tables or drop them"
                )
            return
        replaced = [f for f in REPLACED_BY_MIX if getattr(self, f) != DEFAULTS[f]]
        if replaced:
            raise ValueError(
                f"train config: [[worlds]] replaces {', '.join(replaced)} (each world has its "
                "own): set them in the [[worlds]] tables and drop them from the top level"
            )
        for i, w in enumerate(self.worlds):
            where = f"train config: worlds[{i}] ({w.label})"
            if not w.world:
                raise ValueError(f"train config: worlds[{i}]: world must name a world")
            for name in ("team_sizes", "time_limit_start", "time_limit_end"):
                domain = DOMAINS[name]
                if not domain.holds(getattr(w, name)):
                    raise ValueError(
                        f"{where}: {name} must be {domain.says}, not {getattr(w, name)!r}"
                    )
            if not 0 <= w.weight < math.inf:
                raise ValueError(f"{where}: weight must be finite and >= 0, not {w.weight!r}")
        if not math.isfinite(total := sum(w.weight for w in self.worlds)):
            raise ValueError(  # (each finite, their sum not: every draw would be the last world)
                f"train config: the [[worlds]] weights sum to {total} (each must be finite and "
                "so must their sum): give them as shares, e.g. 1 and 3"
            )
        if not total > 0:
            raise ValueError(
                "train config: the [[worlds]] weights sum to 0: at least one world needs a "
                "weight > 0"
            )
        labels = [w.label for w in self.worlds]
        if twice := sorted({x for x in labels if labels.count(x) > 1}):
            raise ValueError(
                f"train config: more than one [[worlds]] table is labelled {twice}: give each "
                "a distinct name (name = ...)"
            )


class Domain(NamedTuple):
    """What values a config field may take: ``holds(value)``, and how an error says it."""

    holds: Callable[[Any], bool]
    says: str


def _at_least(n: int) -> Domain:
    # (the upper bound: config.toml is TOML, whose integers are 64-bit)
    return Domain(lambda x: n <= x < 2**63, f">= {n} (a 64-bit integer)")


FINITE_POSITIVE = Domain(lambda x: 0 < x < math.inf, "finite and > 0")  # (nan is neither)
FINITE_NON_NEGATIVE = Domain(lambda x: 0 <= x < math.inf, "finite and >= 0")

# The domain of every number in TrainConfig (Literal and bool fields have theirs in their type;
# STRINGS says what checks each string, and when).
DOMAINS: dict[str, Domain] = {
    "team_sizes": Domain(
        lambda t: bool(t) and min(t) >= 1 and max(t) < 2**63, ">= 1 (at least one size)"
    ),
    "steps": _at_least(1),
    "groups_per_step": _at_least(1),
    "group_size": Domain(lambda x: 2 <= x < 2**63, ">= 2 (a group baseline needs two)"),
    "seed": Domain(lambda x: 0 <= x < 2**64, "in 0..2**64-1"),
    "resample": _at_least(0),
    "time_limit_start": FINITE_POSITIVE,
    "time_limit_end": FINITE_POSITIVE,
    "latency_penalty": FINITE_NON_NEGATIVE,
    "fork_turns": _at_least(1),
    "fork_samples": _at_least(1),
    "fork_horizon": FINITE_NON_NEGATIVE,
    "learning_rate": FINITE_POSITIVE,
    "clip": Domain(lambda x: 0 < x < 1, "in (0, 1)"),
    "normaliser": FINITE_POSITIVE,
    "entropy_coef": FINITE_NON_NEGATIVE,
    "kl_coef": FINITE_NON_NEGATIVE,
    "max_grad_norm": FINITE_POSITIVE,
    "chunk": _at_least(1),
    "lag": _at_least(0),
    "max_staleness": _at_least(0),
    "concurrency": _at_least(1),
    "channel_capacity": _at_least(1),
    "lora_rank": _at_least(0),
    "lora_alpha": FINITE_POSITIVE,
    "logit_chunk": _at_least(1),
    "hf_batch": _at_least(1),
    "weight_decay": FINITE_NON_NEGATIVE,
    "baseline_episodes": _at_least(1),
    "temperature": FINITE_POSITIVE,
    "top_p": Domain(lambda x: 0 < x <= 1, "in (0, 1]"),
    "max_output_tokens": _at_least(1),
    "snapshot_every": _at_least(1),
    "commons_size": _at_least(1),
    "commons_credit_entries": _at_least(1),
    "commons_credit_reruns": _at_least(1),
    "commons_discount": Domain(lambda x: 0 <= x <= 1, "in [0, 1]"),
}
STRINGS = {
    "world": "validate() (the registry builds it)",
    "params": "validate() (the world constructor's annotations, convert_params)",
    "org": "validate() (make_organisation)",
    "latency": "validate() (latency_preset)",
    "hf_model": "the hf backend (HFBackend: needed; the directory when the model loads)",
    "hf_server": "the hf backend (HFBackend: parse_spec, before anything runs)",
    "init": "load_config and the backend's load (a checkpoint that must read)",
    "worlds": "TrainConfig._check_mix, then validate() (each world as world is)",
    "model": "TinyConfig.__post_init__",
    "cluster": "ClusterConfig.__post_init__",
}
# Settings only the hf backend reads (``device = "cuda"`` too: the tiny learner is on the CPU).
HF_ONLY = (
    "hf_model",
    "hf_build",
    "hf_server",
    "dtype",
    "lora_rank",
    "lora_alpha",
    "gradient_checkpointing",
    "logit_chunk",
    "hf_batch",
    "top_p",
)
#: The settings only ``advantage = "turn"`` reads. Under any other advantage they are held at
#: their defaults (refused otherwise) and left out of a run's study digest: they cannot change
#: such a run, and leaving them out keeps every run made before they existed valid.
TURN_ONLY = ("fork_turns", "fork_samples", "fork_horizon")
#: The top-level fields a ``[[worlds]]`` mix replaces (each entry has its own), refused beside
#: it unless at their defaults.
REPLACED_BY_MIX = (
    "world",
    "params",
    "team_sizes",
    "time_limit",
    "time_limit_start",
    "time_limit_end",
)
#: The settings only a mix reads. Like TURN_ONLY they are held at their defaults otherwise and
#: left out of a run's study digest when at them, with ``worlds`` itself: a run made before the
#: mix existed keeps its digest.
MIX_ONLY = ("world_normalise", "baseline_episodes")
#: The settings only a commons reads (held at their defaults, and out of a run's study digest,
#: with ``commons`` itself, when it is off).
COMMONS_ONLY = (
    "commons_size",
    "commons_credit_entries",
    "commons_credit_reruns",
    "commons_discount",
)
#: Every field's default, what "set away from its default" is judged against.
DEFAULTS: dict[str, Any] = {
    f.name: f.default if f.default is not msgspec.NODEFAULT else f.default_factory()
    for f in msgspec.structs.fields(TrainConfig)
}


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> TrainConfig:
    """Read a TOML config and apply ``key=value`` overrides (values parsed as TOML)."""
    from collective.base.outputs import open_input

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
    # Refused as given, whatever the value: `world = "workshop"` beside [[worlds]] is the
    # default, yet says something the mix does not do. (A run directory's config.toml of a mix
    # written before dump_config left these out is the engine's own record: it has config.json
    # beside it, which a resume checks it against.)
    own_record = path.name == "config.toml" and (path.parent / "config.json").exists()
    if raw.get("worlds") and not own_record and (top := [f for f in REPLACED_BY_MIX if f in raw]):
        raise ValueError(
            f"{path}: [[worlds]] replaces {', '.join(top)} (each world has its own): set them "
            "in the [[worlds]] tables and drop them from the top level"
        )
    try:
        return msgspec.convert(raw, TrainConfig)
    except msgspec.ValidationError as e:
        raise ValueError(f"{path}: {e}") from None


def config_fields(cfg: TrainConfig) -> dict[str, Any]:
    """The config as its config.toml reads back (tuples as lists; a float field given as 1 is
    1.0), as JSON holds it: what a run's config record keeps."""
    typed = msgspec.convert(msgspec.to_builtins(cfg), TrainConfig)
    return json.loads(msgspec.json.encode(typed))


def config_digest(cfg: TrainConfig) -> str:
    """A run's config in one string (BLAKE2b of its fields): what a resume checks."""
    canonical = json.dumps(config_fields(cfg), sort_keys=True).encode()
    return hashlib.blake2b(canonical, digest_size=16).hexdigest()


def config_changes(recorded: dict[str, Any], cfg: TrainConfig) -> dict[str, tuple[Any, Any]]:
    """How ``cfg`` differs from a config record (``config_fields`` as a run kept it), where a
    field the record lacks counts as its default: a field added to TrainConfig since the run
    began, at its default, is no change, so an upgrade never strands a run (a digest over every
    field would call each old run edited)."""
    defaults = config_fields(TrainConfig())
    filled = {**defaults, **recorded}
    for key, value in defaults.items():
        if isinstance(value, dict) and isinstance(recorded.get(key), dict) and key != "params":
            filled[key] = {**value, **recorded[key]}
    return changed_fields(filled, config_fields(cfg))


def changed_fields(a: dict[str, Any], b: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """The fields (tables' too, as ``model.d_model``) where two configs' builtins differ."""
    out: dict[str, tuple[Any, Any]] = {}
    for key in [*a, *(k for k in b if k not in a)]:
        x, y = a.get(key), b.get(key)
        if isinstance(x, dict) and isinstance(y, dict):
            out |= {f"{key}.{k}": v for k, v in changed_fields(x, y).items()}
        elif x != y:
            out[key] = (x, y)
    return out


def dump_config(cfg: TrainConfig) -> str:
    """The config as TOML, every field written out, so a run is reproducible from it alone."""
    lines: list[str] = []
    tables: list[tuple[str, dict[str, Any]]] = []
    for key, value in msgspec.to_builtins(cfg).items():
        if cfg.worlds and key in REPLACED_BY_MIX:
            continue  # (a mix replaces them: written beside [[worlds]] they would be refused)
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


def mix(cfg: TrainConfig) -> tuple[WorldEntry, ...]:
    """The run's worlds: its ``[[worlds]]`` tables, or the one world its top-level fields name."""
    if cfg.worlds:
        return cfg.worlds
    return (
        WorldEntry(
            world=cfg.world,
            params=cfg.params,
            team_sizes=cfg.team_sizes,
            time_limit=cfg.time_limit,
            time_limit_start=cfg.time_limit_start,
            time_limit_end=cfg.time_limit_end,
        ),
    )


#: The stream tag of a group's world draw (``world_of``).
WORLD_DRAW = 0x776F726C64


def world_of(cfg: TrainConfig, group: int) -> WorldEntry:
    """The world of group ``group``: drawn by weight from a stream seeded by (seed, group), so
    any group's world is known without the groups before it (a resumed run, a Ray worker)."""
    worlds = mix(cfg)
    if len(worlds) == 1:
        return worlds[0]
    total = sum(w.weight for w in worlds)
    u = derive(cfg.seed, WORLD_DRAW, group) / 2**64 * total
    for w in worlds:
        if w.weight > 0 and u < w.weight:
            return w
        u -= w.weight
    return next(w for w in reversed(worlds) if w.weight > 0)  # (u at the rounding edge)


def draws_per_step(cfg: TrainConfig) -> int:
    """Group indices a step owns: its ``groups_per_step`` draws, then its ``resample`` reserve
    draws (played only when a drawn group carries no signal). Group ``g`` belongs to step
    ``g // draws_per_step``; with ``resample = 0`` this is ``groups_per_step``, as always."""
    return cfg.groups_per_step + cfg.resample


def time_limit_at(cfg: TrainConfig, step: int, world: WorldEntry | None = None) -> float:
    """T_max for a step: constant, or linear / geometric from start to end over the run; that of
    ``world``'s own schedule if given (a mix), else the config's."""
    w = world or mix(cfg)[0]
    a, b = w.time_limit_start, w.time_limit_end
    frac = step / max(cfg.steps - 1, 1)
    if w.time_limit == "constant":
        return a
    if w.time_limit == "linear":
        return a + (b - a) * frac
    return a * (b / a) ** frac
