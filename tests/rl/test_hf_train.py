"""The LLM recipe end to end on a CPU: ``configs/llm-cpu.toml`` trains tiny-lm (a real Hugging
Face model directory, built here) with RLCR, sampled in-process under xgrammar, learner on exact
masked logprobs; it reproduces, and its checkpoint runs and replays from the command line. That
it learns is a long experiment (``pytest -m slow``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from collective import load_episode
from collective.rl.train import load_config, train
from tests.support import ROOT
from tests.support.busy import scaled
from tests.support.hf_tiny import tiny_lm  # noqa: F401  (a fixture)
from tests.support.training import comparable_metrics

CONFIG = ROOT / "configs" / "llm-cpu.toml"
CLI = [sys.executable, "-m", "collective.cli"]


def _set(key: str, value: object) -> str:
    return f"{key}={json.dumps(value)}"


def _run_and_replay(checkpoint: Path, episode: Path) -> float:
    """``collective run tally`` with the checkpoint's policy, then ``collective replay`` of the
    episode it wrote (which must be identical); the episode's score."""
    r = subprocess.run(
        [
            *CLI,
            "run",
            "tally",
            "--agents",
            "2",
            "--time-limit",
            "60",
            "--seed",
            "101",
            "--policy",
            f"hf:{checkpoint}",
            "--out",
            str(episode),
        ],
        capture_output=True,
        text=True,
        timeout=scaled(300),
    )
    assert r.returncode == 0, r.stderr
    score = float(json.loads(r.stdout)["score"])
    r = subprocess.run(
        [*CLI, "replay", str(episode)], capture_output=True, text=True, timeout=scaled(300)
    )
    assert r.returncode == 0 and json.loads(r.stdout)["replay"] == "identical", r.stdout
    return score


@pytest.mark.heavy
def test_the_llm_recipe_from_a_clean_start_and_its_checkpoint_runs_and_replays(
    tmp_path: Path,
) -> None:
    """llm-cpu.toml cut to 2 steps, from a clean start: the model directory is absent, so it is
    built first. The first step is on-policy (episodes of version 0, learner at version 0): its
    importance ratio must be 1 within 1e-4. The checkpoint then plays and replays from the
    command line. (That the recipe learns is the slow test below: 16 steps.)"""
    model_dir = tmp_path / "models" / "tiny-lm"
    cfg = load_config(CONFIG, ["steps=2", _set("hf_model", str(model_dir)), "plots=false"])
    rows = train(cfg, tmp_path / "run", progress=False)
    assert (model_dir / "config.json").is_file(), "hf_build made the model directory"
    assert rows[0].ratio_mean == pytest.approx(1.0, abs=1e-4)
    assert rows[0].clip_fraction == 0.0
    ep = tmp_path / "trained.msgpack"
    _run_and_replay(tmp_path / "run" / "checkpoints" / "latest", ep)
    assert {t.version for t in load_episode(ep).turns} == {cfg.steps}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_llm_recipe_learns(tmp_path: Path) -> None:
    """llm-cpu.toml cut to 16 steps (about 80 s alone, twice that beside the suite's other
    worker: a long experiment, so ``pytest -m slow``): the mean return of the last four steps
    must beat the first four's by MARGIN, and the trained checkpoint must score where the
    untrained policy does not."""
    MARGIN = 0.25  # measured: first four 0.31, last four 0.75 (seed 0)
    cfg = load_config(
        CONFIG, ["steps=16", _set("hf_model", str(tmp_path / "tiny-lm")), "plots=false"]
    )
    rows = train(cfg, tmp_path / "run", progress=False)
    first = float(np.mean([r.return_mean for r in rows[:4]]))
    last = float(np.mean([r.return_mean for r in rows[-4:]]))
    print(f"mean return: first four steps {first:.3f}, last four {last:.3f}")
    assert last >= first + MARGIN
    score = _run_and_replay(tmp_path / "run" / "checkpoints" / "latest", tmp_path / "t.msgpack")
    assert score >= 0.5  # the trained policy adds (untrained: ~0.3)


@pytest.mark.heavy
def test_same_config_same_run_on_the_hf_path(tmp_path: Path, tiny_lm: Path) -> None:  # noqa: F811
    """Rollouts are pinned to versions and sampled batch-invariantly, the learner is seeded:
    a run is a function of its config (metrics but wall-clock figures, and every episode)."""
    sets = [
        "steps=2",
        "groups_per_step=1",
        "group_size=2",
        "time_limit_start=30.0",
        "time_limit_end=30.0",
        _set("hf_model", str(tiny_lm)),
        "plots=false",
    ]
    runs = [tmp_path / "a", tmp_path / "b"]
    for run in runs:
        train(load_config(CONFIG, sets), run, progress=False)
    metrics = [comparable_metrics(run) for run in runs]
    assert metrics[0] == metrics[1] and len(metrics[0]) == 2
    names = sorted(p.name for p in (runs[0] / "episodes").glob("*.msgpack"))
    assert names
    for name in names:
        a, b = (load_episode(run / "episodes" / name) for run in runs)
        assert a.events == b.events and a.turns == b.turns
    assert (runs[0] / "checkpoints" / "latest" / "model.safetensors").read_bytes() == (
        runs[1] / "checkpoints" / "latest" / "model.safetensors"
    ).read_bytes()


def test_bad_learner_settings_stop_the_run_before_any_episode(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: device = 'cuda' is not bad input here")
    r = subprocess.run(
        [
            *CLI,
            "train",
            str(CONFIG),
            "--out",
            str(tmp_path / "run"),
            "--set",
            'device="cuda"',
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=scaled(300),
    )
    assert r.returncode == 2
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(
        "collective train: error: train config: device 'cuda' was asked for, but torch"
    )
    assert not list((tmp_path / "run" / "episodes").glob("*.msgpack"))
    missing = tmp_path / "nowhere"
    cfg = load_config(CONFIG, [_set("hf_model", str(missing)), _set("hf_build", "")])
    with pytest.raises(FileNotFoundError, match=f"model directory '{missing}' does not exist"):
        train(cfg, tmp_path / "run2", progress=False)
    with pytest.raises(
        ValueError,
        match=r"train config: model\.lora_rank must be >= 0 \(a 64-bit integer\), not -1",
    ):
        load_config(CONFIG, ["lora_rank=-1"])
    assert not list((tmp_path / "run2" / "episodes").glob("*.msgpack"))


def test_chunking_a_step_by_tokens_changes_the_hf_gradient_by_rounding_only(
    tiny_lm: Path,  # noqa: F811
) -> None:
    """tiny-lm under LoRA: the step's gradient in one backward pass and in passes of at most
    300 tokens (chat prompts as the model reads them) agree to float tolerance."""
    from collective.rl.backend import HFBackend
    from collective.rl.config import read_config
    from collective.rl.learner import Learner, token_chunks
    from experiments.learner_cost import samples_for

    grads = []
    for budget in (0, 300):
        cfg = read_config(
            dict(
                backend="hf", hf_model=str(tiny_lm), device="cpu", lora_rank=4, chunk_tokens=budget
            )
        )
        backend = HFBackend(cfg, Path("unused"))
        torch.manual_seed(0)  # (LoRA's adapters start random)
        model = backend.fresh()
        samples = samples_for(model, 6, 120, 8)
        sizes = backend.token_counts(
            model,
            [s.prompt for s in samples],
            [s.tokens for s in samples],
            [s.space for s in samples],
        )
        assert len(token_chunks(sizes, budget, cfg.chunk)) == (1 if budget == 0 else 3), sizes
        Learner(model, cfg, backend).step(samples)
        grads.append([p.grad.clone() for p in model.parameters()])
    for g, h in zip(*grads, strict=True):
        torch.testing.assert_close(g, h, rtol=1e-4, atol=1e-7)
