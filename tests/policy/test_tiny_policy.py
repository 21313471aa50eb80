"""The tiny torch policy: valid by construction, batch-independent, deterministic, replayable,
and its logprobs recomputable by the learner. Everything here runs the real model on CPU."""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
import torch
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import collective  # noqa: F401  (import the engine before policy: policy.base imports it)
from collective import (
    ActionSpace,
    ArgSpec,
    Conductor,
    EpisodeConfig,
    ToolSpec,
    parse_action,
    run_episode,
)
from collective.base.seeding import Stream, derive
from collective.records import encode_episode
from collective.replay import replay
from policy import tokenizer
from policy.base import PolicyError, PolicyRequest, PolicyResponse
from policy.factory import make_policy
from policy.grammar import compile_space
from policy.tiny import (
    CheckpointError,
    TinyConfig,
    TinyModel,
    TinyPolicy,
    load_checkpoint,
    save_checkpoint,
)
from policy.tiny.decode import fit_prompt, seeds_tensor, uniforms
from policy.tiny.invariant import SamplingNet
from policy.uniform import RandomPolicy
from tests.support import ROOT, SUPPORT
from tests.support.busy import scaled
from tests.support.spaces import spaces

TEXT = ArgSpec("text", "text", max_chars=80, words=("add", "more"))
WORK = ActionSpace(
    (
        ToolSpec("add", (ArgSpec("amount", "int", lo=1, hi=3),)),
        ToolSpec("mark", (ArgSpec("label", "choice", choices=("red", "green", "blue")),)),
        ToolSpec("msg", (ArgSpec("to", "int", lo=0, hi=7), TEXT)),
        ToolSpec("wait", (ArgSpec("seconds", "int", lo=0, hi=600),)),
    )
)
TALK = ActionSpace((ToolSpec("post", (ArgSpec("ch", "choice", choices=("all",)), TEXT)),))
COUNT = ActionSpace((ToolSpec("n", (ArgSpec("v", "int", lo=-50, hi=99_999),)),))


@pytest.fixture(scope="module")
def model() -> TinyModel:
    return TinyModel.fresh(TinyConfig(seed=3))


def req(i: int, space: ActionSpace = WORK, **kw: object) -> PolicyRequest:
    prompt = f"agent {i}: count {i * 7 % 40} of 40\n" + "inbox: [1] more\n" * (i % 3)
    fields: dict = dict(agent=i, turn=i % 5, prompt=prompt + f"last: count is {i}\n>")
    fields.update(space=space, seed=derive(11, i))
    fields.update(kw)
    return PolicyRequest(**fields)


def mixed_batch(n: int) -> list[PolicyRequest]:
    pick = [WORK, TALK, COUNT]
    return [
        req(i, pick[i % 3], temperature=(0.6, 1.0, 1.7)[i % 3], max_tokens=(16, 24, 64)[i % 3])
        for i in range(n)
    ]


# -- randomness and prompts -------------------------------------------------------------------


def test_uniforms_are_the_seeding_stream_bit_for_bit() -> None:
    seeds = [0, 1, 2**63 - 1, 2**63, 2**64 - 1, derive(5, 6, 7)]
    for step in range(6):
        got = uniforms(seeds_tensor(seeds), step).tolist()
        want = []
        for s in seeds:
            stream = Stream(s)
            for _ in range(step):
                stream.random()
            want.append(stream.random())
        assert got == want


def test_fit_prompt_keeps_observation_and_last_result() -> None:
    short = "agent 0: count 1 of 10\nlast: ok\n>"
    assert fit_prompt(short, 100) == [tokenizer.BOS, *tokenizer.encode(short)]
    obs = "agent 3: count 12 of 40"
    long = obs + "\ninbox: " + " | ".join(f"[{i}] message number {i}" for i in range(40))
    long += "\nlast: count is 12 of 40\n>"
    ids = fit_prompt(long, 120)
    text = tokenizer.decode(ids)
    assert len(ids) == 120 and ids[0] == tokenizer.BOS
    assert text.startswith(obs + "\ninbox: [0]")
    assert text.endswith("last: count is 12 of 40\n>")
    # A tail longer than half the room keeps its end (the result's end and the cue).
    huge_last = obs + "\nlast: " + "x" * 300 + " END\n>"
    text = tokenizer.decode(fit_prompt(huge_last, 101))
    assert text.startswith(obs) and text.endswith("x END\n>") and len(text) == 100
    # Without a last: line, the last line is the tail.
    assert tokenizer.decode(fit_prompt("a" * 500 + "\nb>", 50)) == "a" * 47 + "b>"


# -- the network ------------------------------------------------------------------------------


def test_the_sampler_computes_the_learners_function(model: TinyModel) -> None:
    """Prefill and cached decoding in fixed point (``SamplingNet``) against the learner's float32
    forward over whole sequences: the same logits, to within the fixed point's rounding."""
    net = model.net
    sampler = SamplingNet(net)
    torch.manual_seed(0)
    lens = [5, 9, 3]
    total = 14
    seqs = [torch.randint(0, 256, (total,)) for _ in lens]
    with torch.inference_mode():
        full = net.logits(net.hidden(torch.stack(seqs), torch.arange(total).expand(3, total)))
        last = torch.tensor(lens) - 1
        h, cache = sampler.prefill([seqs[i][:n].tolist() for i, n in enumerate(lens)], total)
        for i, n in enumerate(lens):
            torch.testing.assert_close(sampler.logits(h)[i], full[i, n - 1], atol=1e-5, rtol=0)
        pos = last
        for _ in range(total - max(lens)):
            pos = pos + 1
            tok = torch.stack([seqs[i][pos[i]] for i in range(3)])
            logits = sampler.logits(sampler.step(tok, pos, cache))
            for i in range(3):
                torch.testing.assert_close(logits[i], full[i, pos[i]], atol=1e-5, rtol=0)
    rows, cols = torch.tensor([0, 0, 2, 1]), torch.tensor([3, 13, 0, 7])
    with torch.inference_mode():
        hidden = net.hidden(torch.stack(seqs), torch.arange(total).expand(3, total))
        picked = net.hidden(
            torch.stack(seqs), torch.arange(total).expand(3, total), select=(rows, cols)
        )
    torch.testing.assert_close(picked, hidden[rows, cols], atol=1e-5, rtol=1e-5)


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="divisible"):
        TinyConfig(d_model=100, n_heads=3)
    with pytest.raises(ValueError, match="n_layers"):
        TinyConfig(n_layers=0)
    assert 50_000 < TinyModel.fresh().net.n_params() < 5_000_000


# -- sampling ---------------------------------------------------------------------------------


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    space=spaces,
    seed=st.integers(0, 2**64 - 1),
    extra=st.integers(0, 30),
    temperature=st.sampled_from([0.3, 1.0, 2.5]),
)
def test_every_sampled_output_parses(
    model: TinyModel, space: ActionSpace, seed: int, extra: int, temperature: float
) -> None:
    budget = compile_space(space).shortest + extra
    rs = [
        PolicyRequest(
            agent=i,
            turn=0,
            prompt=f"agent {i}\n>",
            space=space,
            seed=derive(seed, i),
            max_tokens=budget,
            temperature=temperature,
        )
        for i in range(3)
    ]
    for r, resp in zip(rs, model.sample(rs), strict=True):
        parse_action(resp.text, r.space)
        assert resp.token_ids[-1] == tokenizer.EOS and len(resp.token_ids) <= budget
        assert resp.text == tokenizer.decode(resp.token_ids)
        assert len(resp.logprobs) == len(resp.token_ids)
        assert all(math.isfinite(lp) and lp <= 1e-6 for lp in resp.logprobs)


#: Requests whose prompts pad to many different widths (some truncated), with every space,
#: temperature and budget above mixed: the material for the batch-independence property.
POOL = [
    msgspec.structs.replace(r, prompt="w" * (i * 37 % 230) + r.prompt)
    for i, r in enumerate(mixed_batch(36))
]
#: The default shape, a wider one (the previous default), and an odd one: three heads, sizes
#: that are no multiples of anything, three layers.
CONFIGS = [
    TinyConfig(seed=3),
    TinyConfig(seed=3, d_model=96, d_ff=256),
    TinyConfig(seed=3, d_model=30, n_heads=3, d_ff=70, n_layers=3),
]
_ALONE: dict[tuple[TinyConfig, int], PolicyResponse] = {}


def alone(i: int, config: TinyConfig = CONFIGS[0]) -> PolicyResponse:
    """``POOL[i]`` answered on its own (computed once per test session)."""
    if (config, i) not in _ALONE:
        _ALONE[config, i] = TinyModel.fresh(config, workers=1).sample([POOL[i]])[0]
    return _ALONE[config, i]


def same(got: PolicyResponse, want: PolicyResponse) -> bool:
    """Bit for bit: the same tokens and the same float logprobs (no tolerance)."""
    return got.token_ids == want.token_ids and got.logprobs == want.logprobs


@pytest.mark.parametrize("config", CONFIGS, ids=["default", "wide", "odd"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    picked=st.lists(st.integers(0, len(POOL) - 1), min_size=1, max_size=len(POOL)),
    cuts=st.lists(st.integers(1, len(POOL) - 1), max_size=4),
    max_rows=st.integers(1, 40),
    workers=st.sampled_from([1, 2]),
    caller_threads=st.sampled_from([1, 2]),
)
def test_a_request_gets_the_same_answer_alone_or_in_any_batch(
    config: TinyConfig,
    picked: list[int],
    cuts: list[int],
    max_rows: int,
    workers: int,
    caller_threads: int,
) -> None:
    """Tokens AND logprobs, bit for bit, whatever shares the batch (repeats included), in
    whatever order and partition into calls, chunking, sampling threads, and the caller's torch
    threads."""
    model = TinyModel.fresh(config, max_rows=max_rows, workers=workers)
    bounds = sorted({0, len(picked), *(c for c in cuts if c < len(picked))})
    threads = torch.get_num_threads()
    torch.set_num_threads(caller_threads)
    try:
        for lo, hi in itertools.pairwise(bounds):
            got = model.sample([POOL[i] for i in picked[lo:hi]])
            for i, g in zip(picked[lo:hi], got, strict=True):
                assert same(g, alone(i, config)), f"request {i} differs in a batch of {hi - lo}"
    finally:
        torch.set_num_threads(threads)


def test_the_whole_pool_in_one_batch_and_reversed() -> None:
    together = TinyModel.fresh(TinyConfig(seed=3), max_rows=7, workers=2).sample(POOL)
    backwards = TinyModel.fresh(TinyConfig(seed=3), workers=1).sample(POOL[::-1])[::-1]
    assert all(same(a, alone(i)) for i, a in enumerate(together))
    assert all(same(a, alone(i)) for i, a in enumerate(backwards))
    assert len({r.text for r in together}) > 20  # the requests' own streams differ
    assert len({r.prompt_tokens // 16 for r in together}) >= 8  # many prompt lengths mixed


#: Settings that steer torch's, MKL's and oneDNN's choice of kernels, each a subprocess of
#: ``tests/support/batch_probe.py`` (environment, arguments): this CPU's defaults; ATen's kernels
#: without SIMD, with oneDNN off; ATen's AVX2 kernels (on a CPU with AVX-512 the default is
#: another); the process's torch threads at 3; MKL's compatibility mode (on torch 2.13's MKL a plain
#: float32 product then rounds a row differently in batches of 8 or more than in a batch of 4: the
#: old sampler, which counted on MKL rounding a row the same for any 4+ rows, failed here as on CPUs
#: with AVX-512); MKL and oneDNN capped at SSE4.2.
KERNEL_SETTINGS: dict[str, tuple[dict[str, str], list[str]]] = {
    "defaults": ({}, []),
    "aten-no-simd-mkldnn-off": ({"ATEN_CPU_CAPABILITY": "default"}, ["--no-mkldnn"]),
    "aten-avx2": ({"ATEN_CPU_CAPABILITY": "avx2"}, []),
    "threads-3": ({}, ["--threads", "3"]),
    "mkl-compatible": ({"MKL_CBWR": "COMPATIBLE"}, []),
    "sse4.2": ({"MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ONEDNN_MAX_CPU_ISA": "SSE41"}, []),
}
_PROBED: dict[tuple[str, str], dict] = {}
#: Seconds a probe may take, by sampler (the hf one decodes each prompt's prefill alone).
PROBE_TIMEOUT = {"tiny": 180, "hf": 300}


def probe(setting: str, model: str = "tiny") -> dict:
    """``tests/support/batch_probe.py --model MODEL``'s verdict under
    ``KERNEL_SETTINGS[setting]`` (run once per process)."""
    if (model, setting) not in _PROBED:
        env, args = KERNEL_SETTINGS[setting]
        r = subprocess.run(
            [sys.executable, str(SUPPORT / "batch_probe.py"), "--model", model, *args],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=scaled(PROBE_TIMEOUT[model]),
            check=False,
        )
        assert r.returncode == 0, r.stderr
        _PROBED[model, setting] = json.loads(r.stdout.splitlines()[-1])
    return _PROBED[model, setting]


@pytest.mark.parametrize("setting", list(KERNEL_SETTINGS))
def test_batch_invariance_holds_whatever_kernels_the_libraries_pick(setting: str) -> None:
    """The same requests in batches of 1 to 257 (across the sizes where GEMM libraries change
    strategy), reversed, and three of them at every position of every batch of 1 to 8, under
    each kernel choice this CPU can be made to take: bit-identical answers everywhere."""
    got = probe(setting)
    assert got["differ"] == [], f"{setting} ({got['capability']}): {got['differ']}"
    if setting == "mkl-compatible" and torch.backends.mkl.is_available():
        # The control: here plain products do depend on the batch, so the check above is not
        # vacuous (were this to stop, another setting must take over that role).
        assert got["blas_batch_sizes_that_differ"], "MKL's compatibility mode no longer varies"
    if setting == "threads-3":
        # Sampling runs one intra-op thread whatever the caller set: the same answers.
        assert got["answers"] == probe("defaults")["answers"]


def test_a_long_prompt_with_a_short_budget_beside_long_budgets() -> None:
    """A finished row may stay in the batch while others go on for many more steps; its
    position must not run past the context (this raised IndexError once)."""
    digit = ActionSpace((ToolSpec("n", (ArgSpec("v", "int", lo=0, hi=9),)),))
    long_text = ActionSpace((ToolSpec("m", (ArgSpec("t", "text", max_chars=200),)),))
    first = PolicyRequest(agent=0, turn=0, prompt="x" * 400, space=digit, seed=1, max_tokens=8)
    rest = [
        PolicyRequest(
            agent=i, turn=0, prompt="y", space=long_text, seed=i, max_tokens=200, temperature=0.3
        )
        for i in range(1, 41)
    ]
    model = TinyModel.fresh(TinyConfig(seed=1), workers=1)
    got = model.sample([first, *rest])
    assert got[0].prompt_tokens == model.config.context - 8
    assert max(len(g.token_ids) for g in got) > 8 + 8  # the others went on well past it
    assert same(got[0], model.sample([first])[0])


def test_bad_requests_are_refused_with_the_agent_named(model: TinyModel) -> None:
    with pytest.raises(PolicyError, match="agent 2 turn 2: temperature"):
        model.sample([req(2, temperature=0.0)])
    with pytest.raises(PolicyError, match="max_tokens 400"):
        model.sample([req(1, max_tokens=400)])
    with pytest.raises(PolicyError, match=r"agent 3 .*shortest action"):
        model.sample([req(3, COUNT, max_tokens=3)])
    with pytest.raises(PolicyError, match="agent 4 turn 4 is pinned to version 7"):
        model.sample([req(1), req(4, version=7)])
    assert model.sample([req(4, version=model.version)])[0].version == model.version


# -- the learner's side -----------------------------------------------------------------------


def test_recomputed_logprobs_match_the_sampled_ones(model: TinyModel) -> None:
    batch = [msgspec.structs.replace(r, temperature=0.8, max_tokens=24) for r in mixed_batch(30)]
    got = model.sample(batch)
    assert any(len(g.token_ids) == 24 for g in got)  # the budget was binding somewhere
    logps, entropies = model.token_logprobs(
        [r.prompt for r in batch],
        [g.token_ids for g in got],
        [r.space for r in batch],
        0.8,
        max_tokens=24,
    )
    for g, lp, ent in zip(got, logps, entropies, strict=True):
        torch.testing.assert_close(lp.detach(), torch.tensor(g.logprobs), atol=1e-5, rtol=0)
        assert ent.shape == lp.shape and bool((ent >= -1e-6).all())
        assert bool((ent <= math.log(tokenizer.VOCAB_SIZE)).all())
        forced = lp.detach().abs() < 1e-7  # a token the grammar forced: one choice, no entropy
        assert bool((ent.detach()[forced] < 1e-5).all())
    loss = -sum(lp.sum() for lp in logps) - 0.01 * sum(e.sum() for e in entropies)
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(bool(torch.isfinite(g).all()) for g in grads)
    assert any(float(g.abs().sum()) > 0 for g in grads)
    model.net.zero_grad()
    # The temperature is part of the distribution.
    hot, _ = model.token_logprobs(
        [batch[0].prompt], [got[0].token_ids], [batch[0].space], 2.0, max_tokens=24
    )
    assert not torch.allclose(hot[0].detach(), logps[0].detach())


def test_recompute_refuses_outputs_its_mask_forbids(model: TinyModel) -> None:
    out = [*tokenizer.encode("add 2"), tokenizer.EOS]
    model.token_logprobs(["x"], [out], [WORK])
    assert model.token_logprobs([], [], []) == ([], [])
    with pytest.raises(ValueError, match="sample 1: output token 0"):
        model.token_logprobs(["x", "y"], [out, out], [WORK, TALK])
    with pytest.raises(ValueError, match="sample 0: output does not end"):
        model.token_logprobs(["x"], [out[:-1]], [WORK])
    with pytest.raises(ValueError, match="after its EOS"):
        model.token_logprobs(["x"], [[*out, 65]], [WORK])
    with pytest.raises(ValueError, match="3 prompts, 1 outputs"):
        model.token_logprobs(["x"] * 3, [out], [WORK])


def test_versions_and_frozen_copies() -> None:
    model = TinyModel.fresh(TinyConfig(seed=4))
    policy = TinyPolicy(model)
    batch = mixed_batch(6)
    before = model.sample(batch)
    frozen = model.frozen()
    assert frozen.version == 0 and all(not p.requires_grad for p in frozen.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    logps, _ = model.token_logprobs(  # request 2 at its own temperature and budget
        [batch[2].prompt], [before[2].token_ids], [batch[2].space], 1.7, max_tokens=64
    )
    (-logps[0].sum()).backward()
    with model.update():
        opt.step()
    assert model.version == 1 and policy.version == 1 and frozen.version == 0
    again, _ = model.token_logprobs(
        [batch[2].prompt], [before[2].token_ids], [batch[2].space], 1.7, max_tokens=64
    )
    assert float(again[0].detach().sum()) > float(logps[0].detach().sum())  # now likelier
    after = model.sample(batch)
    assert {a.version for a in after} == {1}
    assert [a.logprobs for a in after] != [b.logprobs for b in before]
    still = frozen.sample(batch)
    assert [s.token_ids for s in still] == [b.token_ids for b in before]
    assert {s.version for s in still} == {0}


# -- checkpoints ------------------------------------------------------------------------------


def test_checkpoint_round_trip(tmp_path: Path) -> None:
    model = TinyModel.fresh(TinyConfig(seed=9, n_layers=1, d_model=64))
    with model.update():
        pass
    path = model.save(tmp_path)
    assert path.name == "tiny-v000001.pt"
    loaded = load_checkpoint(path)
    assert loaded.version == 1 and loaded.config == model.config
    for (k, a), (_, b) in zip(
        model.net.state_dict().items(), loaded.net.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), k
    batch = mixed_batch(5)
    assert [r.token_ids for r in loaded.sample(batch)] == [r.token_ids for r in model.sample(batch)]


def test_bad_checkpoints_give_clear_errors(tmp_path: Path) -> None:
    model = TinyModel.fresh(TinyConfig(n_layers=1, d_model=32, n_heads=2))
    good = save_checkpoint(model, tmp_path / "good.pt")
    with pytest.raises(CheckpointError, match="no such checkpoint file"):
        load_checkpoint(tmp_path / "missing.pt")
    cut = tmp_path / "cut.pt"
    cut.write_bytes(good.read_bytes()[:500])
    with pytest.raises(CheckpointError, match=r"cut\.pt: not a readable .*corrupt"):
        load_checkpoint(cut)
    blob = torch.load(good, weights_only=True)
    other = tmp_path / "other.pt"
    torch.save(
        {
            "meta": blob["meta"].replace('"vocab_size":259', '"vocab_size":300'),
            **{"state_dict": blob["state_dict"]},
        },
        other,
    )
    with pytest.raises(CheckpointError, match="tokenizer"):
        load_checkpoint(other)
    torch.save(
        {
            "meta": blob["meta"].replace('"d_ff":128', '"d_ff":256'),
            **{"state_dict": blob["state_dict"]},
        },
        other,
    )
    with pytest.raises(CheckpointError, match="weights do not match"):
        load_checkpoint(other)
    torch.save({"weights": 1}, other)
    with pytest.raises(CheckpointError, match="no meta and state_dict"):
        load_checkpoint(other)


def test_make_policy_tiny(tmp_path: Path) -> None:
    fresh = make_policy("tiny", seed=5)
    assert "seed 5" in fresh.name and fresh.version == 0
    assert isinstance(fresh, TinyPolicy) and fresh.model.config.seed == 5
    path = save_checkpoint(TinyModel.fresh(TinyConfig(seed=5)), tmp_path / "c.pt")
    loaded = make_policy(f"tiny:{path}")
    assert loaded.name == f"tiny:{path}"
    with pytest.raises(CheckpointError):
        make_policy(f"tiny:{tmp_path / 'nope.pt'}")
    with pytest.raises(ValueError, match="tiny:PATH"):
        make_policy("tinyy")


# -- episodes ---------------------------------------------------------------------------------


class Counting:
    """Wraps a policy and records the size of every batch it is asked."""

    def __init__(self, inner: TinyPolicy) -> None:
        self.inner, self.name, self.sizes = inner, inner.name, []

    @property
    def version(self) -> int:
        return self.inner.version

    async def generate(self, requests: list[PolicyRequest]) -> list[PolicyResponse]:
        self.sizes.append(len(requests))
        return await self.inner.generate(requests)

    async def aclose(self) -> None:
        await self.inner.aclose()


def test_tiny_episodes_are_deterministic_valid_and_batched() -> None:
    cfg = EpisodeConfig(world="tally", agents=6, time_limit=120.0, sample_seed=7)
    runs = []
    for _ in range(2):
        policy = Counting(make_policy("tiny", seed=1))  # type: ignore[arg-type]
        runs.append((run_episode(cfg, policy), policy.sizes))  # type: ignore[arg-type]
    (a, sizes), (b, _) = runs
    assert encode_episode(a) == encode_episode(b)
    assert sizes[0] == 6  # six agents thinking at t=0: one batch of six
    assert a.stats.rejected == 0 and a.stats.turns > 20
    assert all(t.kind != "invalid" for t in a.turns)
    other = run_episode(msgspec.structs.replace(cfg, sample_seed=8), make_policy("tiny", seed=1))
    assert [t.text for t in other.turns] != [t.text for t in a.turns]


def test_all_agents_of_concurrent_episodes_share_one_batch() -> None:
    conductor = Conductor(make_policy("tiny", seed=2))
    cfgs = [EpisodeConfig(world="tally", agents=3, time_limit=20.0, world_seed=i) for i in range(4)]
    trio.run(lambda: conductor.play(cfgs, concurrency=4))
    assert conductor.batch_stats.largest == 12


def test_replay_of_a_tiny_episode_never_calls_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    ep = run_episode(EpisodeConfig(world="tally", agents=4, time_limit=100.0), make_policy("tiny"))

    def forbidden(*_: object) -> None:
        raise AssertionError("replay called the model")

    monkeypatch.setattr(TinyModel, "sample", forbidden)
    again = replay(ep)
    assert again.events == ep.events and again.score == ep.score


def test_random_and_tiny_agree_on_the_action_language() -> None:
    """Both policies' outputs in one real episode are accepted by the compiled spaces."""
    spaces_seen: list[ActionSpace] = []

    class Spy(RandomPolicy):
        async def generate(self, requests):  # type: ignore[no-untyped-def]
            spaces_seen.extend(r.space for r in requests)
            return await super().generate(requests)

    ep = run_episode(EpisodeConfig(world="tally", agents=3, time_limit=60.0), Spy())
    for space, turn in zip(spaces_seen, ep.turns, strict=False):
        assert compile_space(space).accepts(turn.token_ids), turn.text


@pytest.mark.heavy
def test_cli_runs_and_replays_tiny_episodes(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cli = [sys.executable, "-m", "collective.cli"]
    ep = tmp_path / "e.msgpack"
    common = ["run", "tally", "--agents", "4", "--time-limit", "60"]
    r = subprocess.run(
        [*cli, *common, "--policy", "tiny", "--out", str(ep)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    r = subprocess.run(
        [*cli, "replay", str(ep)], env=env, capture_output=True, text=True, check=False
    )
    assert r.returncode == 0 and '"identical"' in r.stdout, r.stdout + r.stderr
    ckpt = save_checkpoint(TinyModel.fresh(TinyConfig(seed=2)), tmp_path / "c.pt")
    r = subprocess.run(
        [*cli, *common, "--policy", f"tiny:{ckpt}"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    r = subprocess.run(
        [*cli, *common, "--policy", f"tiny:{tmp_path}/missing.pt"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 2 and "missing.pt: no such checkpoint file" in r.stderr


def test_a_draw_that_rounds_to_one_never_picks_a_forbidden_token() -> None:
    """A uniform within 2**-25 of 1 rounds to 1.0 in float32; the pick must then be the last
    token with any probability, never a forbidden one past it (this once emitted EOS inside a
    quoted text, an invalid action, about once in tens of thousands of turns)."""
    from policy.tiny.decode import FORBIDDEN, _pick

    z = torch.tensor([[0.0, 1.0, FORBIDDEN, FORBIDDEN], [FORBIDDEN, 2.0, 0.5, FORBIDDEN]])
    for u in (1 - 2**-30, 1 - 2**-60):
        assert _pick(z, torch.tensor([u, u], dtype=torch.float64)).tolist() == [1, 2]
    assert _pick(z, torch.tensor([0.0, 0.0], dtype=torch.float64)).tolist() == [0, 1]
