"""The signs-of-life study's starting prior: made from a pre-registered script, measured before
any RL (``bench/prior.py`` is the program; the study calls :func:`make_prior` for a quick prior
away from a checkout).

The recipe (``policy.scripted.PriorScript``): a script that works its own desk sensibly and, on
15% of its turns, messages a random teammate one to three words drawn uniformly from the world's
lexicon (key names among them), so that keys are named only by chance. Its episodes are played
on training instances (world seeds 0..N, never the held-out ones, which start at 90,000),
every team size of the study alike, at limits spread over the study's schedule (90 to 180 s);
the study's tiny model (``MODEL``: context 256) imitates them (:mod:`collective.rl.sft`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from collective import EpisodeConfig, latency_preset, run_episodes
from collective.records import Episode, save_episode
from collective.records.signs import signs
from collective.rl.config import TrainConfig, read_config
from collective.rl.sft import Epoch, SFTConfig, sft
from experiments.setting import EVAL_T, LATENCY, MODEL, WORLD
from policy import tokenizer
from policy.scripted import PriorScript, ScriptedPolicy
from policy.tiny import TinyModel

TEAMS = (1, 2, 3, 4, 8)
SFT = SFTConfig(epochs=4, learning_rate=1e-3, batch=64, holdout=0.1, seed=0)


def episode_config(team: int, instance: int, limit: float, base: int) -> EpisodeConfig:
    return EpisodeConfig(
        world="workshop",
        params=dict(WORLD),
        org="flat",
        agents=team,
        world_agents=team,
        world_seed=base + instance,
        sample_seed=instance,
        time_limit=limit,
        max_output_tokens=24,
        latency=latency_preset(LATENCY),
        tokenizer="bytes",
    )


def scripted_episodes(n: int, out: Path) -> list[Path]:
    """``n`` prior episodes on training instances, team sizes cycled, limits 90..180 s."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        team = TEAMS[i % len(TEAMS)]
        limit = 90.0 + 90.0 * (i % 10) / 9
        cfg = episode_config(team, i, limit, base=0)
        path = out / f"prior-{i:04d}.msgpack"
        if not path.exists():
            ep = run_episodes([cfg], ScriptedPolicy(PriorScript(), name="prior"), concurrency=1)[0]
            save_episode(ep, path)
        paths.append(path)
    return paths


def train_config() -> TrainConfig:
    """The model the study trains (its shape, its answer length): what the prior must be."""
    return read_config(
        dict(world="workshop", params=dict(WORLD), model=MODEL, max_output_tokens=24)
    )


def teach_probability(model: TinyModel, eps: list[Episode]) -> list[float]:
    """For each turn of agent 0 (who holds every key) in a team of two or more: the probability
    the model gives the shortest teaching action, ``msg A "kJ"`` for any teammate A and key J
    (summed over them), under the mask it samples with."""
    probs = []
    for ep in eps:
        if ep.config.agents < 2:
            continue
        for t in ep.turns:
            if t.agent != 0 or not t.prompt:
                continue
            space = ep.spaces[t.space]
            texts = [f'msg {a} "k{j}"' for a in range(1, ep.config.agents) for j in range(4)]
            outs = [[*tokenizer.encode(x), tokenizer.EOS] for x in texts]
            with torch.no_grad():
                logp, _ = model.token_logprobs(
                    [t.prompt] * len(texts), outs, [space] * len(texts), 1.0, max_tokens=24
                )
            probs.append(float(sum(math.exp(float(x.sum())) for x in logp)))
    return probs


def measure(policy: Any, n: int, model: TinyModel | None) -> dict[str, Any]:
    """Held-out instances (world seeds 90,000 + i, the study's), n per team size, at EVAL_T."""
    cfgs = [episode_config(t, i, EVAL_T, base=90_000) for t in TEAMS for i in range(n)]
    if policy == "script":  # a script keeps state per agent id: a fresh one an episode
        eps = [
            run_episodes([c], ScriptedPolicy(PriorScript(), name="prior"), concurrency=1)[0]
            for c in cfgs
        ]
    else:
        eps = run_episodes(cfgs, policy, concurrency=20)
    sg = [signs(e) for e in eps]
    out: dict[str, Any] = {
        "score": float(np.mean([e.score for e in eps])),
        "score_by_team": {
            str(t): float(np.mean([e.score for e in eps if e.config.agents == t])) for t in TEAMS
        },
        "keys_taught": float(np.mean([e.world_metrics.get("taught", 0) for e in eps])),
        "talk_per_agent_second": float(np.mean([x.talk_per_agent_second for x in sg])),
        "talk_share": float(
            np.mean([t.tool in ("msg", "post") for e in eps for t in e.turns if t.tool])
        ),
        "refused_share": float(
            sum(x.refused_tokens for x in sg)
            / max(1, sum(x.refused_tokens + x.landed_tokens for x in sg))
        ),
    }
    if model is not None:
        p = teach_probability(model, eps)
        out["teach_probability_mean"] = float(np.mean(p))
        out["teach_probability_median"] = float(np.median(p))
        out["teach_prompts"] = len(p)
    return out


def make_prior(out: Path, episodes: int, cfg: SFTConfig = SFT) -> tuple[Path, list[Epoch]]:
    """The prior's episodes in ``out/episodes`` and its imitation in ``out/prior`` (resumed if
    stopped): returns the checkpoint a study starts from, and the epochs."""
    paths = scripted_episodes(episodes, out / "episodes")
    prior_dir = out / "prior"
    resume = (prior_dir / "sft-state.pt").is_file()
    epochs = sft(paths, train_config(), cfg, prior_dir, resume=resume, progress=False)
    return prior_dir / "latest.pt", epochs
