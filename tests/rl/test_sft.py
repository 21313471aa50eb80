"""``collective sft``: supervised imitation of recorded episodes, on real scripted episodes and
the real tiny model, through the command line as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from collective import EpisodeConfig, latency_preset, run_episodes, save_episode
from collective.rl.train import read_metrics, train
from policy.scripted import PriorScript, ScriptedPolicy
from policy.tiny import TinyModel
from tests.support.busy import scaled
from tests.support.hf_tiny import tiny_lm  # noqa: F401  (a fixture)
from worlds.workshop import FINDINGS

CONFIG = """
world = "workshop"
params = {modules = 64, holders = "first", onboard_seconds = 20.0, knowledge = 0.5, keys = 4, \
view = 5, desks = "shared", clash = "refuse", interrupts = true, posts_teach = false, \
keys_per_message = 0, terse = true}
team_sizes = [2, 3]
max_output_tokens = 24
steps = 1
groups_per_step = 1
group_size = 2
time_limit_start = 40.0
time_limit_end = 40.0
plots = false

[model]
d_model = 32
n_layers = 1
n_heads = 2
d_ff = 64
context = 128
"""


def _episodes(folder: Path, n: int = 8) -> list[Path]:
    folder.mkdir()
    paths = []
    for i in range(n):
        cfg = EpisodeConfig(
            world="workshop",
            params=dict(FINDINGS),
            agents=2 + i % 2,
            world_agents=2 + i % 2,
            world_seed=i,
            sample_seed=i,
            time_limit=60,
            max_output_tokens=24,
            latency=latency_preset("tiny-paced"),
            tokenizer="bytes",
        )
        ep = run_episodes([cfg], ScriptedPolicy(PriorScript(), name="prior"), concurrency=1)[0]
        save_episode(ep, folder / f"e{i}.msgpack")
        paths.append(folder / f"e{i}.msgpack")
    return paths


def _sft(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "collective.cli", "sft", *map(str, args), "--quiet"],
        capture_output=True,
        text=True,
        timeout=scaled(300),
        cwd=cwd,
    )


@pytest.mark.heavy
def test_imitation_learns_the_episodes_resumes_exactly_and_train_starts_from_it(
    tmp_path: Path,
) -> None:
    eps = _episodes(tmp_path / "eps")
    (tmp_path / "cfg.toml").write_text(CONFIG)
    done = _sft(
        tmp_path / "eps",
        "--out",
        "a",
        "--config",
        "cfg.toml",
        "--epochs",
        "3",
        "--holdout",
        "0.25",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    a = tmp_path / "a"
    epochs = [json.loads(x) for x in (a / "epochs.jsonl").read_text().splitlines()]
    assert [e["epoch"] for e in epochs] == [0, 1, 2]
    held = [e["heldout_loss"] for e in epochs]
    assert held[-1] < held[0], f"held-out loss should fall: {held}"
    record = json.loads((a / "sft.json").read_text())
    assert record["heldout_episodes"] == 2 and record["trained_episodes"] == 6
    import hashlib

    assert sorted(e["sha256"] for e in record["episodes"]) == sorted(
        hashlib.sha256(p.read_bytes()).hexdigest() for p in eps
    )
    # stopped after one epoch, resumed to three: the same weights, bit for bit
    assert (
        _sft(
            tmp_path / "eps",
            "--out",
            "b",
            "--config",
            "cfg.toml",
            "--epochs",
            "1",
            "--holdout",
            "0.25",
            cwd=tmp_path,
        ).returncode
        == 0
    )
    again = _sft(
        tmp_path / "eps",
        "--out",
        "b",
        "--config",
        "cfg.toml",
        "--epochs",
        "3",
        "--holdout",
        "0.25",
        "--resume",
        cwd=tmp_path,
    )
    assert again.returncode == 0, again.stderr
    wa = TinyModel.load(a / "latest.pt").net.state_dict()
    wb = TinyModel.load(tmp_path / "b" / "latest.pt").net.state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    # train starts from it: its step-0 episodes are played by exactly these weights
    from collective.rl.config import load_config

    cfg = load_config(tmp_path / "cfg.toml", [f'init="{a / "latest.pt"}"'])
    train(cfg, tmp_path / "run", progress=False)
    assert read_metrics(tmp_path / "run")[0].step == 0
    from collective import load_episode
    from collective.rl.rundir import episode_name

    ep = load_episode(tmp_path / "run" / "episodes" / episode_name(0, 0))
    turn = next(t for t in ep.turns if t.token_ids)
    model = TinyModel.load(a / "latest.pt")
    with torch.no_grad():
        (logp,), _ = model.token_logprobs(
            [turn.prompt], [turn.token_ids], [ep.spaces[turn.space]], 1.0, max_tokens=24
        )
    assert torch.allclose(logp, torch.tensor(turn.logprobs, dtype=logp.dtype), atol=1e-5)


def test_bad_input_is_one_line_and_exit_2_before_any_work(tmp_path: Path) -> None:
    _episodes(tmp_path / "eps", n=2)
    other = run_episodes(
        [EpisodeConfig(world="tally", agents=1, world_seed=1, sample_seed=1, time_limit=10)],
        ScriptedPolicy(lambda r: "wait 1"),
    )[0]
    save_episode(other, tmp_path / "tally.msgpack")
    (tmp_path / "cfg.toml").write_text(CONFIG)
    from policy.tiny import TinyConfig

    narrow = TinyModel.fresh(TinyConfig(d_model=32, n_layers=1, n_heads=2, d_ff=64, context=128))
    narrow.save_to(tmp_path / "narrow.pt")
    wide = CONFIG.replace("d_model = 32", "d_model = 48")
    (tmp_path / "wide.toml").write_text(f'init = "{tmp_path / "narrow.pt"}"\n' + wide)
    cases = [
        ([tmp_path / "tally.msgpack", "--config", "cfg.toml"], "world 'tally'"),
        ([tmp_path / "eps", "--config", "cfg.toml", "--min-score", "2"], "keeps none"),
        ([tmp_path / "eps", "--config", "cfg.toml", "--best", "0"], "best must be"),
        ([tmp_path / "eps", "--config", "cfg.toml", "--epochs", "0"], "epochs must be"),
        ([tmp_path / "nothing.msgpack"], "nothing.msgpack"),
        ([tmp_path / "eps", "--config", "wide.toml"], "d_model = 32 (config says 48)"),
    ]
    for args, says in cases:
        done = _sft(*args, "--out", tmp_path / "out", cwd=tmp_path)
        assert done.returncode == 2, (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and says in done.stderr, done.stderr
        assert not (tmp_path / "out").exists(), "nothing written"


@pytest.mark.heavy
def test_an_hf_model_imitates_byte_level_episodes_with_lora_and_train_starts_from_it(
    tmp_path: Path,
    tiny_lm: Path,  # noqa: F811
) -> None:
    """The hf path: a LoRA imitation of a script's (byte-level) episodes, re-tokenized by the
    model's own tokenizer; its held-out loss falls, and ``hf_model = OUT/latest`` trains."""
    _episodes(tmp_path / "eps", n=4)
    hf = CONFIG.split("[model]")[0] + f'backend = "hf"\nhf_model = "{tiny_lm}"\nlora_rank = 4\n'
    (tmp_path / "hf.toml").write_text(hf)
    done = _sft(
        tmp_path / "eps",
        "--out",
        "out",
        "--config",
        "hf.toml",
        "--epochs",
        "2",
        "--holdout",
        "0.25",
        "--lr",
        "3e-3",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    held = [json.loads(x)["heldout_loss"] for x in (tmp_path / "out" / "epochs.jsonl").open()]
    assert len(held) == 2 and held[1] < held[0], held
    assert (tmp_path / "out" / "latest" / "model.safetensors").is_file()
    from collective.rl.config import load_config

    cfg = load_config(tmp_path / "hf.toml", [f'hf_model="{tmp_path / "out" / "latest"}"'])
    train(cfg, tmp_path / "run", progress=False)
    assert read_metrics(tmp_path / "run")[0].ratio_mean == pytest.approx(1.0, abs=1e-4)
