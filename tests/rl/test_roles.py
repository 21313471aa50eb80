"""Per-role policies (``role_policies``): each role of an organisation answered by, and trained
as, its own tiny model; on the real engine, the real tiny model and the real training loop."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import msgspec
import numpy as np
import pytest
import torch
import trio

from collective import EpisodeConfig, run_episodes
from collective.engine.organisation import make_organisation
from collective.rl.checks import validate
from collective.rl.config import ClusterConfig
from collective.rl.train import train
from policy.base import PolicyError, PolicyRequest
from policy.roles import RolePolicy
from policy.tiny import TinyConfig, TinyModel, TinyPolicy
from tests.support.busy import scaled
from tests.support.training import comparable_metrics, small_train

NET = TinyConfig(d_model=32, n_layers=1, n_heads=2, d_ff=64, context=96)


# An orchestrator and two sub-agents from the start, all on the trained policy.
EPISODE = EpisodeConfig(
    world="tally",
    params={"target": 12},
    agents=3,
    org="orchestrator:trained",
    world_seed=4,
    sample_seed=1,
    time_limit=60.0,
    max_output_tokens=12,
)


def test_each_turn_is_answered_by_its_roles_model() -> None:
    """Under a RolePolicy every turn's logprobs are those of its own role's weights (two
    networks of different seeds: the other role's weights would give other numbers)."""
    model = {
        "orchestrator": TinyModel.fresh(NET),
        "sub": TinyModel.fresh(msgspec.structs.replace(NET, seed=7)),
    }
    pol = RolePolicy({r: TinyPolicy(m) for r, m in model.items()})
    (ep,) = run_episodes([EPISODE], pol)
    assert {t.role for t in ep.turns} == {"orchestrator", "sub"}
    assert {t.policy for t in ep.turns} == {"trained"}  # (the subs' turns are training data)
    for t in ep.turns:
        for role, m in model.items():
            got, _ = m.token_logprobs(
                [t.prompt], [t.token_ids], [ep.spaces[t.space]], 1.0, max_tokens=12
            )
            close = torch.allclose(got[0], torch.tensor(t.logprobs), atol=1e-5)
            assert close == (role == t.role), (t.agent, t.turn, t.role, role)


def test_a_role_without_a_policy_is_named() -> None:
    (ep,) = run_episodes(
        [msgspec.structs.replace(EPISODE, time_limit=5.0)], TinyPolicy(TinyModel.fresh(NET))
    )
    pol = RolePolicy({"orchestrator": TinyPolicy(TinyModel.fresh(NET))})
    req = PolicyRequest(agent=3, turn=0, prompt="x", space=ep.spaces[0], seed=1, role="sub")
    with pytest.raises(PolicyError, match=r"agent 3 asks as role 'sub'.*roles: orchestrator"):
        trio.run(pol.generate, [req])


def test_orchestrator_trained_runs_its_subs_on_the_trained_policy() -> None:
    o = make_organisation("orchestrator:trained")
    assert [o.policy_of(r) for r in o.roles()] == ["trained", "trained"]
    plain = make_organisation("orchestrator")
    assert [plain.policy_of(r) for r in plain.roles()] == ["trained", "frozen"]
    with pytest.raises(ValueError, match="the one option is 'trained'"):
        make_organisation("orchestrator:frozen")


@pytest.mark.parametrize(
    ("over", "says"),
    [
        ({"org": "flat"}, "org = 'flat': it has one trained role \\(worker\\)"),
        ({"org": "orchestrator"}, "one trained role \\(orchestrator\\)"),
        ({"org": "ceo", "advantage": "turn"}, "role_policies with advantage = 'turn'"),
    ],
)
def test_role_policies_refuse_what_they_cannot_do(over: dict, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        validate(small_train(role_policies=True, **over))


def test_role_policies_refuse_the_hf_backend_and_ray() -> None:
    with pytest.raises(ValueError, match=r"role_policies is built for model\.kind = 'tiny'"):
        small_train(role_policies=True, org="ceo", backend="hf", hf_model="x")
    with pytest.raises(ValueError, match=r"cluster\.backend = 'local'"):
        small_train(role_policies=True, org="ceo", cluster=ClusterConfig(backend="ray"))


@pytest.mark.heavy
def test_each_role_trains_its_own_model_and_a_resume_is_exact(tmp_path: Path) -> None:
    """Two steps of an orchestrator run with a policy per role (the sub-agents trained too):
    each role's checkpoint exists and has moved
    from the shared start, apart from the other's; each role's learner figures are in
    metrics.jsonl; a run stopped after one step and resumed is the uninterrupted run; and the
    command line plays the roles' checkpoints (``--policy roles:DIR``)."""
    cfg = small_train(role_policies=True, org="orchestrator:trained", team_sizes=(3,), steps=2)
    train(cfg, tmp_path / "a", progress=False)
    roles = tmp_path / "a" / "checkpoints" / "roles"
    start = TinyModel.fresh(cfg.tiny).net.state_dict()
    moved = {}
    for r in ("orchestrator", "sub"):
        w = TinyModel.load(roles / r / "latest.pt").net.state_dict()
        moved[r] = w
        assert any(not torch.equal(w[k], start[k]) for k in start), f"{r} did not learn"
    assert any(not torch.equal(moved["orchestrator"][k], moved["sub"][k]) for k in start)
    rows = comparable_metrics(tmp_path / "a")
    assert set(rows[-1]["roles"]) == {"orchestrator", "sub"}
    assert rows[-1]["trained_tokens"] == sum(
        m["trained_tokens"] for m in rows[-1]["roles"].values()
    )
    train(cfg, tmp_path / "b", progress=False, stop_after=1)
    train(cfg, tmp_path / "b", progress=False, resume=True)
    assert comparable_metrics(tmp_path / "b") == rows
    for r in ("orchestrator", "sub"):  # the checkpoints too, byte for byte (versions included)
        again = tmp_path / "b" / "checkpoints" / "roles" / r / "latest.pt"
        assert again.read_bytes() == (roles / r / "latest.pt").read_bytes()
        assert TinyModel.load(again).version == 2
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "collective.cli",
            "run",
            "tally",
            "--org",
            "orchestrator:trained",
            "--agents",
            "3",
            "--time-limit",
            "30",
            "--policy",
            f"roles:{roles}",
        ],
        capture_output=True,
        text=True,
        timeout=scaled(120),
    )
    assert out.returncode == 0, out.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "collective.cli", "run", "tally", "--policy", f"roles:{tmp_path}"],
        capture_output=True,
        text=True,
        timeout=scaled(120),
    )
    assert bad.returncode == 2 and "no ROLE/latest.pt in it" in bad.stderr, bad.stderr


@pytest.mark.heavy
def test_two_roles_trained_apart_improve_together(tmp_path: Path) -> None:
    """Six steps of an orchestrator and one sub-agent, each role its own policy, on tally: held
    out, the two trained roles together must beat each role trained alone beside the other's
    untrained weights by MARGIN, and each of those the untrained pair: both roles' own learning
    counts. (Seeded, so the figures are the same on every run; bench/role_policies.py measures
    the same on the workshop over seeds, with intervals.)"""
    MARGIN = 0.05  # measured: untrained 0.375, orchestrator 0.510, sub 0.661, both 0.792
    cfg = small_train(
        role_policies=True,
        org="orchestrator:trained",
        team_sizes=(2,),
        steps=6,
        learning_rate=1e-2,
        groups_per_step=4,
        group_size=4,
        concurrency=16,
        std_normalise=True,
    )
    train(cfg, tmp_path / "run", progress=False)
    roles = ("orchestrator", "sub")
    trained = {
        r: TinyModel.load(tmp_path / "run" / "checkpoints" / "roles" / r / "latest.pt")
        for r in roles
    }
    fresh = TinyModel.fresh(cfg.tiny)
    held_out = [
        msgspec.structs.replace(EPISODE, agents=2, world_seed=10_000 + k, sample_seed=k)
        for k in range(16)
    ]

    def score(*which: str) -> float:
        pol = RolePolicy({r: TinyPolicy(trained[r] if r in which else fresh) for r in roles})
        return float(np.mean([e.score for e in run_episodes(held_out, pol, concurrency=16)]))

    untrained, both = score(), score(*roles)
    orchestrator, sub = score("orchestrator"), score("sub")
    print(
        f"untrained {untrained:.3f}, orchestrator {orchestrator:.3f}, sub {sub:.3f}, "
        f"both {both:.3f}"
    )
    assert both >= max(orchestrator, sub) + MARGIN
    assert min(orchestrator, sub) >= untrained + MARGIN
