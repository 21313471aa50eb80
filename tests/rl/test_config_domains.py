"""Every value of a training config is checked once, where the config is read: each number
against its domain (``collective.rl.domains.DOMAINS``), each refusal one line naming the field and
the value. Hypothesis throws numbers of every kind (NaN, infinities, zero, negatives, huge
integers, floats where integers go) through ``load_config``'s ``--set``, the boundary the
command line uses, against the domains the issue asks for, written out here again."""

from __future__ import annotations

import math
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collective.rl.config import (
    HF,
    STRINGS,
    CommonsCredit,
    Mix,
    Tiny,
    TrainConfig,
    Turn,
    WorldEntry,
    load_config,
    read_config,
)
from collective.rl.domains import DOMAINS


def finite_positive(x: float) -> bool:
    return math.isfinite(x) and x > 0


def finite_non_negative(x: float) -> bool:
    return math.isfinite(x) and x >= 0


def at_least(n: int) -> Callable[[int], bool]:
    return lambda x: n <= x <= 2**63 - 1  # (config.toml is TOML: 64-bit integers)


# What each number may be, by its path in the tree (the spec the validator is checked against).
SPEC: dict[str, Callable[[Any], bool]] = {
    "steps": at_least(1),
    "groups_per_step": at_least(1),
    "group_size": at_least(2),
    "seed": lambda x: 0 <= x <= 2**64 - 1,
    "resample": at_least(0),
    "worlds.time_limit_start": finite_positive,
    "worlds.time_limit_end": finite_positive,
    "worlds.weight": finite_non_negative,
    "latency_penalty": finite_non_negative,
    "advantage.turns": at_least(1),
    "advantage.samples": at_least(1),
    "advantage.horizon": finite_non_negative,
    "learning_rate": finite_positive,
    "clip": lambda x: 0 < x < 1,
    "normaliser": finite_positive,
    "entropy_coef": finite_non_negative,
    "kl_coef": finite_non_negative,
    "max_grad_norm": finite_positive,
    "chunk": at_least(1),
    "chunk_tokens": at_least(0),
    "lag": at_least(0),
    "max_staleness": at_least(0),
    "concurrency": at_least(1),
    "channel_capacity": at_least(1),
    "model.lora_rank": at_least(0),
    "model.lora_alpha": finite_positive,
    "model.logit_chunk": at_least(1),
    "model.batch": at_least(1),
    "weight_decay": finite_non_negative,
    "temperature": finite_positive,
    "model.top_p": lambda x: 0 < x <= 1,
    "max_output_tokens": at_least(1),
    "snapshot_every": at_least(1),
    "commons.size": at_least(1),
    "commons.entries": at_least(1),
    "commons.reruns": at_least(1),
    "commons.discount": lambda x: 0 <= x <= 1,
    "mix.baseline_episodes": at_least(1),
}
#: The struct each table's settings live in (the branch that reads them all, for a union).
TABLES: dict[str, type] = {
    "": TrainConfig,
    "worlds.": WorldEntry,
    "mix.": Mix,
    "advantage.": Turn,
    "commons.": CommonsCredit,
    "model.": HF,
}
#: What a table is when it is no number: a table or a union of them (checked where it is read).
NESTED = {"worlds", "mix", "advantage", "commons", "model", "cluster"}


def hint(path: str) -> Any:
    table, _, leaf = path.rpartition(".")
    return typing.get_type_hints(TABLES[f"{table}." if table else ""])[leaf]


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("domains") / "base.toml"
    path.write_text('world = "tally"\n')
    return path


def test_every_field_has_a_domain() -> None:
    """Every number has a domain; every string is named with what checks it; the rest are
    Literal or bool (their type is their domain) or tables. The tiny shape's numbers are
    TinyConfig's to check."""
    for prefix, cls in TABLES.items():
        for name, h in typing.get_type_hints(cls).items():
            path = prefix + name
            if h in (int, float) or path == "worlds.team_sizes":
                assert path in DOMAINS and (path in SPEC or path == "worlds.team_sizes"), path
            elif h is bool or typing.get_origin(h) is typing.Literal or path in NESTED:
                continue
            else:
                assert path in STRINGS, f"{path}: {h} has no domain and nothing checks it"
    assert set(DOMAINS) == set(SPEC) | {"worlds.team_sizes"}
    with pytest.raises(ValueError, match="d_model must be >= 1"):
        read_config({"model": {"kind": "tiny", "d_model": 0}})
    assert isinstance(TrainConfig().model, Tiny)


def _toml(value: int | float) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return repr(value)


numbers = st.one_of(
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, 1, -1, 2, 2**63, 2**64 - 1, 2**64]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -0.0, 1.0, 0.5, 1e308, 5e-324]),
)


EDGES = [math.nan, math.inf, -math.inf, 0.0, -1.0, 0.5, 1.0, 0, -1, 1, 2, 2**63 - 1, 2**63]


@pytest.mark.parametrize("value", EDGES, ids=repr)
@pytest.mark.parametrize("name", sorted(SPEC))
def test_every_field_at_the_edges(base: Path, name: str, value: int | float) -> None:
    _check(base, name, value)


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(sorted(SPEC)), value=numbers)
def test_a_number_outside_its_domain_is_refused_in_one_line_naming_field_and_value(
    base: Path, name: str, value: int | float
) -> None:
    _check(base, name, value)


def _check(base: Path, name: str, value: int | float) -> None:
    """``--set NAME=VALUE`` (a world's settings: written in its ``[[worlds]]`` table) is
    accepted exactly when the value is in its domain (and of the field's type); refused, it is
    one line naming the field (and the value, when the type was right and the domain refused
    it)."""
    table, _, leaf = name.rpartition(".")
    settings_ = [f"{name}={_toml(value)}"]
    if table in ("advantage", "commons", "model"):  # (the branch that reads it)
        kind = {"advantage": "turn", "commons": "credit", "model": "hf"}[table]
        settings_.insert(0, f"{table}={kind}")
    if table == "worlds":
        settings_ = []
        base = base.with_name(f"world-{abs(hash((name, repr(value))))}.toml")
        other = '\n[[worlds]]\nworld = "workshop"\n'  # (a weight of 0 leaves it the sum)
        base.write_text(f'[[worlds]]\nworld = "tally"\n{leaf} = {_toml(value)}\n{other}')
    fits_type = isinstance(value, int) or hint(name) is float
    try:
        cfg = load_config(base, settings_)
    except ValueError as e:
        message = str(e)
        assert "\n" not in message and leaf in message, message
        if fits_type:  # the type was right: the domain refused it, and says what it was
            assert not SPEC[name](value), f"{name} = {value!r} is in its domain: {message}"
            assert f"{leaf} must be" in message or "out of range" in message, message
            if "must be" in message:
                assert f"not {value!r}" in message or f"not {float(value)!r}" in message
        return
    node: Any = cfg.worlds[0] if table == "worlds" else getattr(cfg, table) if table else cfg
    got = getattr(node, leaf)
    assert fits_type and SPEC[name](got), f"{name} = {value!r} accepted as {got!r}"


@pytest.mark.parametrize(
    "field",
    [
        *("hf_model", "hf_build", "hf_server", "dtype", "lora_rank", "lora_alpha"),
        *("gradient_checkpointing", "logit_chunk", "hf_batch", "top_p"),
    ],
)
def test_a_setting_the_tiny_model_would_ignore_is_refused(field: str) -> None:
    """The hf settings, in the flat form, live in the hf branch of [model]: beside the tiny
    model they cannot be written (one line naming it); at their default (as a run directory's
    config.toml writes them) they are dropped."""
    changed = {
        "hf_model": "m",
        "hf_build": "tiny-lm",
        "hf_server": "sglang:http://127.0.0.1:1",
        "dtype": "bfloat16",
        "lora_rank": 4,
        "lora_alpha": 8.0,
        "gradient_checkpointing": True,
        "logit_chunk": 64,
        "hf_batch": 2,
        "top_p": 0.9,
    }[field]
    with pytest.raises(ValueError, match=rf"model = 'tiny' has no {field} = "):
        read_config({field: changed})
    assert read_config({"backend": "hf", field: changed}).model.kind == "hf"
    with pytest.raises(ValueError, match='device = "cuda" does nothing for the tiny model'):
        read_config({"device": "cuda"})
    assert read_config({"device": "cpu"}) == TrainConfig()


def test_a_nucleus_reaches_every_episode_and_the_learner(tmp_path: Path) -> None:
    """``top_p`` goes into each rollout's episode config (what samples it, and what the record
    keeps) and into the learner's logprobs (what scores it), or is refused where a server
    would sample without it."""
    from collective.rl.backend import HFBackend
    from collective.rl.rollouts import first_configs

    cfg = read_config({"model": {"kind": "hf", "path": "m", "top_p": 0.8}})
    assert [c.nucleus for c in first_configs(cfg)] == [0.8] * len(first_configs(cfg))
    scored: dict[str, object] = {}

    class Scored:  # a model that records what the learner scores it with
        def token_logprobs(self, *args: object, **kw: object) -> tuple[list, list]:
            scored.update(kw)
            return [], []

    HFBackend(cfg, tmp_path).token_logprobs(Scored(), [], [], [], 1.0)
    assert scored["top_p"] == 0.8
    served = read_config(dict(backend="hf", hf_model="m", top_p=0.8, hf_server="sglang:http://h:1"))
    with pytest.raises(ValueError, match=r"top_p = 0.8 is sampled in-process only"):
        HFBackend(served, tmp_path)
    assert {c.top_p for c in first_configs(TrainConfig())} == {msgspec.UNSET}
