"""The training configuration: every hyperparameter of an RLCR run, its default in sight.

A run is a function of its config (and the code): ``load_config`` reads TOML with ``--set``
overrides and validates it once, here, at the boundary; ``dump_config`` writes every field back
out, so the run directory's ``config.toml`` alone reproduces the run. ``time_limit_at`` is the
latency-pressure schedule, a function of the config and the step only.

The config is a tree. Where a choice brings settings of its own it is a tagged union, a table
whose ``kind`` picks the branch: ``[advantage]`` (collective | individual | turn), ``[commons]``
(off | on | credit), ``[model]`` (tiny | hf). A branch holds only the settings it reads, so a
setting that would do nothing cannot be written: msgspec refuses it where the file is read.
``worlds`` is always a list (one world is one ``[[worlds]]`` entry); a ``[mix]`` table (implied
by more than one world) measures the run as a mix, world by world.

The flat form, one key a setting (``fork_turns``, ``commons_size``, ``backend``, a top-level
``world``), is read too: ``tree`` turns it into the tree, so every config file and run directory
in that form loads as it always has, and ``--set`` takes both its names and dotted paths. It is
also the form a run's record is kept in (``config_fields``, ``config_digest``), so a run's
digest is the same whichever form its config was written in.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import msgspec

from collective.base.seeding import derive
from collective.rl.domains import check as _check
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
    """One world of the run (a ``[[worlds]]`` table): the task, its team sizes, its share of the
    groups and its own time-limit schedule (time scales differ between tasks)."""

    world: str
    name: str = ""  # the label metrics.jsonl reports it under; "" = the world's own name
    params: dict[str, Any] = {}
    team_sizes: tuple[int, ...] = (1, 2, 4, 8)  # cycled over this world's groups; ceo: + hires
    weight: float = 1.0  # its share of the groups: each group draws a world by weight
    time_limit: Schedule = "constant"
    time_limit_start: float = 600.0  # T_max at step 0, simulated seconds
    time_limit_end: float = 600.0  # T_max at the last step

    def __post_init__(self) -> None:
        if not self.world:
            raise ValueError("train config: worlds: world must name a world")
        try:
            _check(self, "worlds.")
        except ValueError as e:
            raise ValueError(str(e).replace("worlds.", f"worlds ({self.label}): ", 1)) from None

    @property
    def label(self) -> str:
        return self.name or self.world


class Mix(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A run measured as a mix of worlds (``[mix]``): each world's metrics, and its random and
    untrained baselines measured at the start (``collective/rl/baselines.py``)."""

    normalise: bool = False  # divide A by the std of returns of the group's world's step
    baseline_episodes: int = 4  # random and untrained episodes a world, at the start

    def __post_init__(self) -> None:
        _check(self, "mix.")


class _Kind(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, tag_field="kind"):
    """A branch of a tagged union: ``kind`` (its tag, as the TOML table gives it)."""

    @property
    def kind(self) -> str:
        return str(self.__struct_config__.tag)


# -- advantage: how a rollout's return becomes each turn's advantage (collective/rl/credit.py) --
class Collective(_Kind, tag="collective"):
    """One flat advantage a rollout: every trained turn of it gets ``A_i``."""


class Individual(_Kind, tag="individual"):
    """Leave-one-out credit per agent: each agent's turns get what the episode scored without
    it subtracted (re-runs with the agent idle)."""


class Turn(_Kind, tag="turn"):
    """Forked turns' own credit (collective/rl/forks.py); the rest keep ``A_i``."""

    turns: int = 2  # turns forked per rollout
    samples: int = 2  # forks per forked turn: the Monte Carlo samples of its state's value
    horizon: float = 0.0  # seconds after a fork its return is read at; 0: the end

    def __post_init__(self) -> None:
        _check(self, "advantage.")


Advantage = Collective | Individual | Turn


# -- a commons: goods that outlive an episode (collective/rl/commons.py) -----------------------
class CommonsOff(_Kind, tag="off"):
    """The world plays without one."""


class CommonsOn(_Kind, tag="on"):
    """What episodes contribute is there for the episodes that start later."""

    size: int = 6  # entries kept (the oldest go)

    def __post_init__(self) -> None:
        _check(self, "commons.")


class CommonsCredit(_Kind, tag="credit"):
    """A commons, and the turns that made an entry credited with its measured value to later
    episodes (re-runs without it)."""

    size: int = 6  # entries kept (the oldest go)
    entries: int = 2  # entries whose value is measured a step
    reruns: int = 2  # episodes re-run without each of them
    discount: float = 0.9  # per step between a contribution and its use

    def __post_init__(self) -> None:
        _check(self, "commons.")


Commons = CommonsOff | CommonsOn | CommonsCredit


# -- the policy ---------------------------------------------------------------------------------
class Tiny(_Kind, tag="tiny"):
    """The tiny byte-level transformer (policy/tiny), trained on the CPU; its fresh weights are
    a function of the run's ``seed``."""

    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4  # query heads; keys and values have one head of d_model / n_heads
    d_ff: int = 128
    context: int = 128  # tokens (bytes) of prompt plus output the network can see

    def __post_init__(self) -> None:
        self.shape(0)  # (TinyConfig checks the shape)

    def shape(self, seed: int) -> TinyConfig:
        """The network this branch describes, with fresh weights of ``seed``."""
        fields = {name: getattr(self, name) for name in self.__struct_fields__}
        return TinyConfig(**fields, seed=seed)


class HF(_Kind, tag="hf"):
    """A Hugging Face causal LM (policy/hf/model.py), sampled in this process or by SGLang."""

    path: str = ""  # a local model directory to start from
    build: Literal["", "tiny-lm", "smollm2-135m"] = ""  # build it thus (make-model) if absent
    server: str = ""  # "": sample in-process (hf:DIR); "sglang:URL[,URL...]"|"sglang:launch..."
    device: Literal["auto", "cpu", "cuda"] = "auto"  # auto: cuda when torch sees a GPU
    dtype: Literal["float32", "bfloat16"] = "float32"  # exact ratios are claimed in float32
    lora_rank: int = 0  # > 0: train LoRA adapters of this rank (peft), not every weight
    lora_alpha: float = 16.0
    gradient_checkpointing: bool = False  # recompute layer activations in backward
    logit_chunk: int = 256  # output positions whose [chunk, vocab] logits exist at once
    batch: int = 8  # sequences per learner forward pass
    top_p: float = 1.0  # in-process: nucleus sampling (1.0: none)

    def __post_init__(self) -> None:
        _check(self, "model.")


Model = Tiny | HF


class TrainConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    # -- the task ---------------------------------------------------------------------------
    # Each group draws its world by weight from a stream seeded by (seed, group), so a run
    # stays a function of its config; the advantage stays per group (one task instance).
    worlds: tuple[WorldEntry, ...] = (WorldEntry(world="workshop"),)
    mix: Mix | None = None  # [mix]: measured as a mix of worlds (implied by more than one)
    org: str = "flat"
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
    latency_penalty: float = 0.0  # beta in R = R_task - beta * pbar(q) * T / T_max; 0 = off
    # -- advantage --------------------------------------------------------------------------
    advantage: Advantage = msgspec.field(default_factory=Collective)
    std_normalise: bool = False  # divide A by the group's std of returns
    commons: Commons = msgspec.field(default_factory=CommonsOff)
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
    # Prompt + output tokens per forward/backward chunk, besides ``chunk``: what bounds the
    # backward's memory whatever a step's size (its activations grow with tokens, not turns;
    # a turn longer than this goes alone). 0 = no token bound (turns only).
    chunk_tokens: int = 0
    weight_decay: float = 0.0  # AdamW's decoupled weight decay
    # -- asynchrony -------------------------------------------------------------------------
    sync: Literal["pinned", "latest"] = "pinned"
    lag: int = 1  # rollouts may use weights this many versions behind the learner
    max_staleness: int = 1  # older episodes are dropped or down-weighted
    stale: Literal["drop", "downweight"] = "drop"
    concurrency: int = 32  # episodes in flight at once
    channel_capacity: int = 64  # finished episodes buffered on their way to the learner
    # -- the policy -------------------------------------------------------------------------
    model: Model = msgspec.field(default_factory=Tiny)
    # Each role of the organisation (ceo and specialist; orchestrator and sub with
    # org = "orchestrator:trained") trains its own tiny model, learner and versions
    # (collective/rl/roles.py); false: every trained role shares one policy.
    role_policies: bool = False
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
        _check(self, "")  # every number, once, here at the boundary (the branches check theirs)
        if len(self.worlds) > 1 and self.mix is None:
            self.mix = Mix()
        self._check_worlds()
        hf = self.model if isinstance(self.model, HF) else None
        commons = self.commons.kind
        if self.mix is not None and self.mix.normalise and self.std_normalise:
            raise ValueError(
                "train config: mix.normalise and std_normalise each rescale the advantage; "
                "set one of them"
            )
        if commons == "credit" and not self.keep_episodes:
            raise ValueError(
                "train config: commons = 'credit' pays the turn that made an entry, read back "
                "from its episode file, which keep_episodes = false deletes: keep the episodes"
            )
        if commons != "off" and self.sync != "pinned":
            raise ValueError(
                "train config: a commons follows the policy versions episodes are pinned to; "
                "sync = 'latest' does not pin them: set sync = 'pinned'"
            )
        if commons != "off" and (self.mix is not None or self.cluster.backend != "local"):
            raise ValueError(
                "train config: a commons is built for one world (a mix, each world with its own "
                "commons, is not) on cluster.backend = 'local' (Ray workers would each need it): "
                "drop commons or those settings"
            )
        if commons != "off" and hf is not None and hf.server:
            raise ValueError(
                "train config: a commons needs episodes pinned to policy versions (its versions "
                "follow them), which a server holding one version does not give: drop "
                "model.server"
            )
        if self.role_policies and (hf is not None or self.cluster.backend != "local"):
            raise ValueError(
                "train config: role_policies is built for model.kind = 'tiny' on "
                "cluster.backend = 'local' (a LoRA adapter per role on the hf path, and Ray "
                "workers serving several roles, are not): drop role_policies or those settings"
            )
        if self.role_policies and isinstance(self.advantage, Turn):
            raise ValueError(
                "train config: role_policies with advantage = 'turn' is not built yet (its forks "
                "have not been checked per role): use advantage 'collective' or 'individual'"
            )
        if isinstance(self.advantage, Turn) and hf is not None and hf.server:
            raise ValueError(
                "train config: advantage = 'turn' needs the weights of the version that played "
                "each episode, which a server holding one version at a time does not keep: "
                "drop model.server or use another advantage"
            )
        if self.resample and (self.cluster.backend != "local" or commons != "off"):
            raise ValueError(
                "train config: resample (dynamic sampling) is built for cluster.backend = "
                "'local' without a commons (Ray workers are dealt whole steps; a commons follows "
                "the groups in order): drop resample or those settings"
            )

    def _check_worlds(self) -> None:
        if not self.worlds:
            raise ValueError("train config: worlds is empty: a run needs at least one world")
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

    @property
    def hf(self) -> HF:
        """The hf model's settings (model.kind = 'hf' only)."""
        if not isinstance(self.model, HF):
            raise ValueError(f"train config: model.kind = {self.model.kind!r} has no hf settings")
        return self.model

    @property
    def top_p(self) -> float:
        """Nucleus sampling's p: the hf model's in-process setting (1.0, none, for the tiny)."""
        return self.model.top_p if isinstance(self.model, HF) else 1.0

    @property
    def tiny(self) -> TinyConfig:
        """The tiny network to train, its fresh weights from the run's seed (model.kind =
        'tiny' only)."""
        if not isinstance(self.model, Tiny):
            raise ValueError(f"train config: model.kind = {self.model.kind!r} has no tiny shape")
        return self.model.shape(self.seed)


STRINGS = {
    "worlds.world": "validate() (the registry builds it)",
    "worlds.name": "TrainConfig._check_worlds (labels distinct)",
    "worlds.params": "validate() (the world constructor's annotations, convert_params)",
    "org": "validate() (make_organisation)",
    "latency": "validate() (latency_preset)",
    "model.path": "the hf backend (HFBackend: needed; the directory when the model loads)",
    "model.server": "the hf backend (HFBackend: parse_spec, before anything runs)",
    "init": "load_config and the backend's load (a checkpoint that must read)",
    "cluster": "ClusterConfig.__post_init__",
}

# -- the flat form -----------------------------------------------------------------------------
#: Each flat key that lives in a table of the tree: (table, key). ``backend`` is the model's
#: kind; ``advantage`` and ``commons`` name their kind as a flat key and as the tree's shorthand.
FLAT: dict[str, tuple[str, str]] = {
    "fork_turns": ("advantage", "turns"),
    "fork_samples": ("advantage", "samples"),
    "fork_horizon": ("advantage", "horizon"),
    "commons_size": ("commons", "size"),
    "commons_credit_entries": ("commons", "entries"),
    "commons_credit_reruns": ("commons", "reruns"),
    "commons_discount": ("commons", "discount"),
    "backend": ("model", "kind"),
    "hf_model": ("model", "path"),
    "hf_build": ("model", "build"),
    "hf_server": ("model", "server"),
    "device": ("model", "device"),
    "dtype": ("model", "dtype"),
    "lora_rank": ("model", "lora_rank"),
    "lora_alpha": ("model", "lora_alpha"),
    "gradient_checkpointing": ("model", "gradient_checkpointing"),
    "logit_chunk": ("model", "logit_chunk"),
    "hf_batch": ("model", "batch"),
    "top_p": ("model", "top_p"),
    "world_normalise": ("mix", "normalise"),
    "baseline_episodes": ("mix", "baseline_episodes"),
}
#: The flat keys of the one world of a config without ``[[worlds]]``.
WORLD_KEYS = ("world", "params", "team_sizes", "time_limit", "time_limit_start", "time_limit_end")
#: Each tagged union's branches, by kind.
UNIONS: dict[str, dict[str, type[_Kind]]] = {
    "advantage": {"collective": Collective, "individual": Individual, "turn": Turn},
    "commons": {"off": CommonsOff, "on": CommonsOn, "credit": CommonsCredit},
    "model": {"tiny": Tiny, "hf": HF},
}


def _default(table: str, key: str) -> Any:
    """A table's key's default, in whichever branch has it."""
    kinds = UNIONS.get(table, {"": Mix})
    for cls in kinds.values():
        for f in msgspec.structs.fields(cls):
            if f.name == key:
                return f.default
    return msgspec.NODEFAULT


def _flat_default(key: str) -> Any:
    """A flat key's default (what a run directory's config.toml writes for a setting its run
    does not read)."""
    if key in WORLD_KEYS:
        return json.loads(msgspec.json.encode(getattr(WorldEntry(world="workshop"), key)))
    return _default(*FLAT[key])


def _inert(key: str, value: Any) -> bool:
    """A flat setting that does nothing where the tree puts it, and says so harmlessly: at its
    default (a run directory's config.toml writes every field), or ``device = "cpu"`` for the
    tiny model (which trains on the CPU)."""
    return value == _flat_default(key) or (key == "device" and value in ("auto", "cpu"))


def tree(raw: dict[str, Any], where: str = "train config", own_record: bool = False) -> dict:
    """A config as TOML gives it, in the flat form, the tree's or a mix of both, as the tree:
    the one translation from the flat form. A flat setting that the chosen branch does not read
    is dropped at its default (a run directory's config.toml writes every field) and refused
    otherwise, in one line. ``own_record``: ``raw`` is a run directory's own config.toml, whose
    flat form may write the top-level world fields beside ``[[worlds]]`` at their defaults."""
    raw = copy.deepcopy(raw)
    for table in UNIONS:  # the shorthand: `advantage = "turn"` is `[advantage] kind = "turn"`
        if isinstance(raw.get(table), str):
            raw[table] = {"kind": raw[table]}
    if isinstance(shape := raw.get("model"), dict) and "kind" not in shape:
        shape.pop("seed", None)  # (the flat form's [model] is the tiny shape; seed is the run's)
        shape["kind"] = raw.get("backend", "tiny")
        moved = {("model", k) for k in shape if k != "kind"}
    else:
        moved = set()
    flat_worlds = {k: raw.pop(k) for k in WORLD_KEYS if k in raw}
    worlds = raw.get("worlds")
    if worlds:  # a [[worlds]] list given: a mix in the flat form
        if flat_worlds and own_record:
            flat_worlds = {k: v for k, v in flat_worlds.items() if not _inert(k, v)}
        if flat_worlds:
            raise ValueError(
                f"{where}: [[worlds]] replaces {', '.join(flat_worlds)} (each world has its own): "
                "set them in the [[worlds]] tables and drop them from the top level"
            )
        if "world_normalise" in raw or "baseline_episodes" in raw:
            raw.setdefault("mix", {})
    elif worlds is not None or flat_worlds:  # (`worlds = []`: the flat form's one world)
        raw["worlds"] = [{"world": "workshop", **flat_worlds}]
    for key in [k for k in raw if k in FLAT]:
        table, leaf = FLAT[key]
        value = raw.pop(key)
        node = raw.get(table)
        if table == "mix" and node is None:
            if _inert(key, value):
                continue
            raise ValueError(
                f"{where}: {key} = {_toml(value)} (a [mix] setting): mix settings act only on "
                "a mix of worlds: add [[worlds]] tables (or a [mix] table) or drop it"
            )
        if not isinstance(node, dict):
            raw[table] = node = {} if node is None else node
        if not isinstance(node, dict):
            raise ValueError(f"{where}: {table} is not a table, it has no {leaf!r}")
        node[leaf] = value
        moved.add((table, leaf))
    for table, kinds in UNIONS.items():
        node = raw.get(table)
        if not isinstance(node, dict):
            continue
        kind = node.setdefault("kind", next(iter(kinds)))
        cls = kinds.get(kind) if isinstance(kind, str) else None
        if cls is None:
            continue  # (msgspec names the kinds there are)
        has = {f.name for f in msgspec.structs.fields(cls)}
        for key in [k for k in node if k != "kind" and k not in has]:
            if (table, key) in moved and node[key] == _default(table, key):
                del node[key]
            elif (table, key) in moved and table == "model" and key in Tiny.__struct_fields__:
                del node[key]  # (the flat form's [model] is the tiny shape, never read by hf)
            elif (table, key) in moved and table == "model" and key == "device" and kind == "tiny":
                if node[key] in ("auto", "cpu"):
                    del node[key]
                    continue
                raise ValueError(
                    f"{where}: device = {_toml(node[key])} does nothing for the tiny model (it "
                    "trains on the CPU): drop it or set model.kind = 'hf'"
                )
            else:
                name = f"{table}.{key}"
                if (table, key) in moved:  # (named as the config wrote it)
                    name = next((f for f, p in FLAT.items() if p == (table, key)), name)
                branches = [k for k, c in kinds.items() if key in c.__struct_fields__]
                reads = f" ({table} = {' or '.join(map(repr, branches))} reads it)" * bool(branches)
                raise ValueError(
                    f"{where}: {table} = {kind!r} has no {name} = {_toml(node[key])}"
                    f"{reads}: drop it or choose that {table}"
                )
    return raw


def read_config(
    raw: dict[str, Any], where: str = "train config", own_record: bool = False
) -> TrainConfig:
    """A ``TrainConfig`` from a TOML-like dict in either form (``tree``; structs in it, such as
    a ``TinyConfig`` for ``model``, as their tables), validated."""
    try:
        return msgspec.convert(tree(msgspec.to_builtins(raw), where, own_record), TrainConfig)
    except msgspec.ValidationError as e:
        message = str(e)  # (a check of the config's own names itself already)
        raise ValueError(message if message.startswith(where) else f"{where}: {message}") from None


def _set(raw: dict[str, Any], item: str) -> None:
    """Apply one ``--set KEY=VALUE`` (a flat name or a dotted path; the value parsed as TOML)."""
    key, sep, value = item.partition("=")
    if not sep:
        raise ValueError(f"--set {item!r}: expected KEY=VALUE")
    try:
        parsed = tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        parsed = value  # a bare word: a string
    *parents, leaf = key.split(".")
    path = (*parents, leaf)
    one = raw.get("worlds")
    mixed = {"mix", "world_normalise", "baseline_episodes"} & set(raw)
    alone = isinstance(one, list) and len(one) == 1 and not mixed
    # (the one world of a config in the tree form)
    if key in WORLD_KEYS and alone and isinstance(world := one[0], dict):  # type: ignore[index]
        world[key] = parsed
        return
    if path in FLAT.values():  # the dotted path of a flat key: the later --set wins
        raw.pop(next(f for f, p in FLAT.items() if p == path), None)
    elif key in FLAT and isinstance(raw.get(FLAT[key][0]), dict):
        raw[FLAT[key][0]].pop(FLAT[key][1], None)
    if not parents and leaf in UNIONS and isinstance(parsed, str):
        node = raw.get(leaf)  # a kind: the table's other settings stay (and are checked)
        raw[leaf] = {**node, "kind": parsed} if isinstance(node, dict) else {"kind": parsed}
        return
    node = raw
    for i, p in enumerate(parents):
        if isinstance(node.get(p), str) and p in UNIONS:
            node[p] = {"kind": node[p]}
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            where = ".".join(parents[: i + 1])
            raise ValueError(f"--set {item!r}: {where} is not a table, it has no {leaf!r}")
    node[leaf] = parsed


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> TrainConfig:
    """Read a TOML config (either form) and apply ``key=value`` overrides (values parsed as
    TOML; a key a flat name or a dotted path, ``commons.size=4``)."""
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
        _set(raw, item)
    # (A run directory's config.toml of a mix, in the flat form, may write the top-level world
    # fields beside [[worlds]]: the engine's own record, with config.json beside it, which a
    # resume checks it against.)
    own_record = path.name == "config.toml" and (path.parent / "config.json").exists()
    shaped = tree(raw, str(path), own_record)
    model = shaped.get("model", {"kind": "tiny"})
    init = shaped.get("init")
    if init and isinstance(init, str) and isinstance(model, dict) and model.get("kind") == "tiny":
        # A run from a checkpoint has the checkpoint's shape: [model] says so in config.toml.
        # Settings the config does give are kept, and train() refuses them if they differ.
        from policy.tiny.checkpoint import load_checkpoint

        shape = msgspec.to_builtins(load_checkpoint(init).config)
        shape.pop("seed")
        shaped["model"] = {**shape, **model}
    try:
        return msgspec.convert(shaped, TrainConfig)
    except msgspec.ValidationError as e:
        raise ValueError(f"{path}: {e}") from None


def flat_fields(cfg: TrainConfig) -> dict[str, Any]:
    """The config in the flat form, every key (a branch's settings it does not have at their
    defaults), as builtins: what a run's record keeps and its digest covers."""
    tree_ = msgspec.to_builtins(cfg)
    out: dict[str, Any] = {}
    one = (
        tree_["worlds"][0] if cfg.mix is None else msgspec.to_builtins(WorldEntry(world="workshop"))
    )
    for key in WORLD_KEYS:
        out[key] = one[key]
    out["worlds"] = tree_["worlds"] if cfg.mix is not None else []
    for key, value in tree_.items():
        if key in ("worlds", "mix"):
            continue
        if key in UNIONS:
            branch = {k: v for k, v in value.items() if k != "kind"}
            for flat, (table, leaf) in FLAT.items():
                if table == key:
                    out[flat] = branch.get(leaf, _flat_default(flat))
            if key == "model":
                out["backend"] = value["kind"]
                shape = branch if cfg.model.kind == "tiny" else msgspec.to_builtins(Tiny())
                shape.pop("kind", None)
                out["model"] = {k: v for k, v in shape.items() if k in Tiny.__struct_fields__}
                out["model"]["seed"] = cfg.seed
            else:
                out[key] = value["kind"]
        else:
            out[key] = value
    mixed = tree_["mix"] or {}
    out["world_normalise"] = mixed.get("normalise", _flat_default("world_normalise"))
    out["baseline_episodes"] = mixed.get("baseline_episodes", _flat_default("baseline_episodes"))
    return {k: out[k] for k in RECORD_ORDER if k not in UNSET or out[k] != UNSET[k]}


#: Flat keys a record holds only when set (not at these defaults): a run made before they
#: existed keeps its record and its digest, and one that sets them says so.
UNSET: dict[str, Any] = {"chunk_tokens": 0}
#: The flat form's keys in the order a run's record writes them.
RECORD_ORDER = (
    *("world", "params", "org", "team_sizes", "latency", "steps", "groups_per_step"),
    *("group_size", "seed", "resample", "worlds", "world_normalise", "baseline_episodes"),
    *("time_limit", "time_limit_start", "time_limit_end", "latency_penalty", "advantage"),
    *("std_normalise", "fork_turns", "fork_samples", "fork_horizon", "commons"),
    *("commons_size", "commons_credit_entries", "commons_credit_reruns", "commons_discount"),
    *("learning_rate", "clip", "aggregation", "normaliser", "entropy_coef", "kl_coef"),
    *("kl_estimator", "max_grad_norm", "chunk", "chunk_tokens", "sync", "lag"),
    *("max_staleness", "stale"),
    *("concurrency", "channel_capacity", "backend", "role_policies", "hf_model", "hf_build"),
    *("hf_server", "device", "dtype", "lora_rank", "lora_alpha", "gradient_checkpointing"),
    *("logit_chunk", "hf_batch", "weight_decay", "model", "init", "temperature", "top_p"),
    *("max_output_tokens", "snapshot_every", "keep_episodes", "plots", "logger", "cluster"),
)


def config_fields(cfg: TrainConfig) -> dict[str, Any]:
    """The config's flat form as its config.toml reads back (tuples as lists; a float field
    given as 1 is 1.0), as JSON holds it: what a run's config record keeps."""
    typed = msgspec.convert(msgspec.to_builtins(cfg), TrainConfig)
    return json.loads(msgspec.json.encode(flat_fields(typed)))


def config_digest(cfg: TrainConfig) -> str:
    """A run's config in one string (BLAKE2b of its flat fields): what a resume checks. The
    flat form makes it the same whichever form the config was written in."""
    canonical = json.dumps(config_fields(cfg), sort_keys=True).encode()
    return hashlib.blake2b(canonical, digest_size=16).hexdigest()


def config_changes(recorded: dict[str, Any], cfg: TrainConfig) -> dict[str, tuple[Any, Any]]:
    """How ``cfg`` differs from a config record (``config_fields`` as a run kept it), where a
    field the record lacks counts as its default: a field added to TrainConfig after the run
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
    """The config as TOML in the tree form, every field written out, so a run is reproducible
    from it alone."""
    lines: list[str] = []
    tables: list[tuple[str, dict[str, Any]]] = []
    arrays: list[tuple[str, list[dict[str, Any]]]] = []
    for key, value in msgspec.to_builtins(cfg).items():
        if value is None:
            continue  # (no [mix])
        if isinstance(value, dict):
            tables.append((key, value))
        elif key == "worlds":
            arrays.append((key, value))
        else:
            lines.append(f"{key} = {_toml(value)}")
    for name, table in tables:
        lines.append(f"\n[{name}]")
        lines += [f"{k} = {_toml(v)}" for k, v in table.items()]
    for name, rows in arrays:
        for row in rows:
            lines.append(f"\n[[{name}]]")
            lines += [f"{k} = {_toml(v)}" for k, v in row.items()]
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
    """The run's worlds (always at least one)."""
    return cfg.worlds


#: The stream tag of a group's world draw (``world_of``).
WORLD_DRAW = 0x776F726C64


def world_of(cfg: TrainConfig, group: int) -> WorldEntry:
    """The world of group ``group``: drawn by weight from a stream seeded by (seed, group), so
    any group's world is known without the groups before it (a resumed run, a Ray worker)."""
    worlds = cfg.worlds
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
    ``world``'s own schedule if given (a mix), else the first world's."""
    w = world or cfg.worlds[0]
    a, b = w.time_limit_start, w.time_limit_end
    frac = step / max(cfg.steps - 1, 1)
    if w.time_limit == "constant":
        return a
    if w.time_limit == "linear":
        return a + (b - a) * frac
    return a * (b / a) ** frac
