"""Every value of a training config is checked once, where the config is read: each number
against its domain (``collective.rl.config.DOMAINS``), each refusal one line naming the field and
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
    COMMONS_ONLY,
    DOMAINS,
    HF_ONLY,
    MIX_ONLY,
    STRINGS,
    TURN_ONLY,
    TrainConfig,
    load_config,
)


def finite_positive(x: float) -> bool:
    return math.isfinite(x) and x > 0


def finite_non_negative(x: float) -> bool:
    return math.isfinite(x) and x >= 0


def at_least(n: int) -> Callable[[int], bool]:
    return lambda x: n <= x <= 2**63 - 1  # (config.toml is TOML: 64-bit integers)


# What each number may be (the spec the validator is checked against).
SPEC: dict[str, Callable[[Any], bool]] = {
    "steps": at_least(1),
    "groups_per_step": at_least(1),
    "group_size": at_least(2),
    "seed": lambda x: 0 <= x <= 2**64 - 1,
    "resample": at_least(0),
    "time_limit_start": finite_positive,
    "time_limit_end": finite_positive,
    "latency_penalty": finite_non_negative,
    "fork_turns": at_least(1),
    "fork_samples": at_least(1),
    "fork_horizon": finite_non_negative,
    "learning_rate": finite_positive,
    "clip": lambda x: 0 < x < 1,
    "normaliser": finite_positive,
    "entropy_coef": finite_non_negative,
    "kl_coef": finite_non_negative,
    "max_grad_norm": finite_positive,
    "chunk": at_least(1),
    "lag": at_least(0),
    "max_staleness": at_least(0),
    "concurrency": at_least(1),
    "channel_capacity": at_least(1),
    "lora_rank": at_least(0),
    "lora_alpha": finite_positive,
    "logit_chunk": at_least(1),
    "hf_batch": at_least(1),
    "weight_decay": finite_non_negative,
    "temperature": finite_positive,
    "top_p": lambda x: 0 < x <= 1,
    "max_output_tokens": at_least(1),
    "snapshot_every": at_least(1),
    "commons_size": at_least(1),
    "commons_credit_entries": at_least(1),
    "commons_credit_reruns": at_least(1),
    "commons_discount": lambda x: 0 <= x <= 1,
    "baseline_episodes": at_least(1),
}
HINTS = typing.get_type_hints(TrainConfig)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("domains") / "base.toml"
    path.write_text('world = "tally"\n')
    return path


def test_every_field_has_a_domain() -> None:
    """Every number has a domain; every string is named with what checks it; the rest are
    Literal or bool (their type is their domain)."""
    for name, hint in HINTS.items():
        if hint in (int, float) or name == "team_sizes":
            assert name in DOMAINS and (name in SPEC or name == "team_sizes"), name
        elif hint is bool or typing.get_origin(hint) is typing.Literal:
            continue
        else:
            assert name in STRINGS, f"{name}: {hint} has no domain and nothing checks it"
    assert set(DOMAINS) == set(SPEC) | {"team_sizes"}


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
    """``--set NAME=VALUE`` is accepted exactly when the value is in its domain (and of the
    field's type); refused, it is one line naming the field (and the value, when the type was
    right and the domain refused it)."""
    settings_ = [f"{name}={_toml(value)}"]
    if name in HF_ONLY:  # (with the tiny backend they are refused for doing nothing)
        settings_.append('backend="hf"')
    if name in TURN_ONLY:  # (and these without advantage = "turn")
        settings_.append('advantage="turn"')
    if name in COMMONS_ONLY:  # (and these without commons = "credit")
        settings_.append('commons="credit"')
    if name in MIX_ONLY:  # (and these without [[worlds]], which replaces the top-level world,
        settings_.append('worlds=[{world = "tally"}]')  # refused beside it even at its default)
        base = base.with_name("no-world.toml")
        base.write_text("")
    fits_type = isinstance(value, int) or HINTS[name] is float
    try:
        cfg = load_config(base, settings_)
    except ValueError as e:
        message = str(e)
        assert "\n" not in message and name in message, message
        if fits_type:  # the type was right: the domain refused it, and says what it was
            assert not SPEC[name](value), f"{name} = {value!r} is in its domain: {message}"
            assert f"{name} must be" in message or "out of range" in message, message
            if "must be" in message:
                assert f"not {value!r}" in message or f"not {float(value)!r}" in message
        return
    got = getattr(cfg, name)
    assert fits_type and SPEC[name](got), f"{name} = {value!r} accepted as {got!r}"


@pytest.mark.parametrize("field", HF_ONLY)
def test_a_setting_the_tiny_backend_would_ignore_is_refused(field: str) -> None:
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
    with pytest.raises(ValueError, match=rf"backend = 'tiny' ignores {field} = "):
        TrainConfig(**{field: changed})  # type: ignore[arg-type]
    assert TrainConfig(backend="hf", **{field: changed}).backend == "hf"  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ignores device = 'cuda'"):
        TrainConfig(device="cuda")


def test_a_nucleus_reaches_every_episode_and_the_learner(tmp_path: Path) -> None:
    """``top_p`` goes into each rollout's episode config (what samples it, and what the record
    keeps) and into the learner's logprobs (what scores it), or is refused where a server
    would sample without it."""
    from collective.rl.backend import HFBackend
    from collective.rl.rollouts import first_configs

    cfg = TrainConfig(backend="hf", hf_model="m", top_p=0.8)
    assert [c.nucleus for c in first_configs(cfg)] == [0.8] * len(first_configs(cfg))
    scored: dict[str, object] = {}

    class Scored:  # a model that records what the learner scores it with
        def token_logprobs(self, *args: object, **kw: object) -> tuple[list, list]:
            scored.update(kw)
            return [], []

    HFBackend(cfg, tmp_path).token_logprobs(Scored(), [], [], [], 1.0)
    assert scored["top_p"] == 0.8
    served = TrainConfig(backend="hf", hf_model="m", top_p=0.8, hf_server="sglang:http://h:1")
    with pytest.raises(ValueError, match=r"top_p = 0.8 is sampled in-process only"):
        HFBackend(served, tmp_path)
    assert {c.top_p for c in first_configs(TrainConfig())} == {msgspec.UNSET}
