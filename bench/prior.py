"""The signs-of-life study's starting prior, made and measured before any RL (fourth edition).

The recipe, named in advance (``policy.scripted.PriorScript``): a script that works its own desk
sensibly and, on 15% of its turns, messages a random teammate one to three words drawn uniformly
from the world's lexicon (key names among them), so that keys are named only by chance. Its
episodes are played on training instances (world seeds 0..N, never the held-out ones, which
start at 90,000), every team size of the study alike, at limits spread over the study's
schedule (90 to 180 s); the tiny model of the study (``MODEL``: context 256) imitates them by
``collective sft``. Then, before any RL, this measures the prior beside the untrained byte
model on held-out instances: score, talk, keys taught, and the probability the model gives the
shortest teaching action (agent 0, who holds every key, saying ``msg A "kJ"``), the action the
third edition's review found the untrained model reaches with probability ~2e-8.

    python bench/prior.py                  # episodes, imitation, measurement (~15 CPU-min)
    python bench/prior.py --quick --out /tmp/prior

Writes ``bench/results/prior/``: ``prior/latest.pt`` (what the study starts from),
``prior/sft.json`` (its provenance: every episode's digest), ``summary.json``, ``README.md``.
The episodes are regenerated from their seeds (not committed).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import torch

from collective import EpisodeConfig, latency_preset, run_episodes
from collective.base.outputs import write_file
from collective.records import Episode, save_episode
from collective.records.signs import signs
from collective.rl.config import TrainConfig
from collective.rl.sft import SFTConfig, sft
from collective.studies.signs_of_life import EVAL_T, LATENCY, MODEL, WORLD
from policy import tokenizer
from policy.scripted import PriorScript, ScriptedPolicy
from policy.tiny import TinyModel, TinyPolicy

OUT = Path(__file__).resolve().parent / "results" / "prior"
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
    return TrainConfig(world="workshop", params=dict(WORLD), model=MODEL, max_output_tokens=24)


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--quick", action="store_true", help="20 episodes, 1 epoch, 4 instances")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--episodes", type=int, default=200)
    ap.add_argument("--instances", type=int, default=16, help="held-out instances a team size")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    n_eps = 20 if a.quick else a.episodes
    sft_cfg = msgspec.structs.replace(SFT, epochs=1) if a.quick else SFT
    t0 = time.process_time()
    paths = scripted_episodes(n_eps, a.out / "episodes")
    print(
        f"[prior] {len(paths)} scripted episodes ({time.process_time() - t0:.0f} CPU-s)",
        file=sys.stderr,
    )
    prior_dir = a.out / "prior"
    resume = (prior_dir / "sft-state.pt").is_file()
    epochs = sft(paths, train_config(), sft_cfg, prior_dir, resume=resume)
    print(
        f"[prior] imitation: {epochs[-1]} ({time.process_time() - t0:.0f} CPU-s)", file=sys.stderr
    )
    n = 4 if a.quick else a.instances
    prior = TinyModel.load(prior_dir / "latest.pt")
    untrained = TinyModel.fresh(MODEL)
    summary = {
        "recipe": "policy.scripted.PriorScript(talk=0.15), imitated by collective sft",
        "sft": msgspec.to_builtins(sft_cfg),
        "epochs": [msgspec.to_builtins(e) for e in epochs],
        "episodes": n_eps,
        "instances_per_team": n,
        "script": measure("script", n, None),
        "prior": measure(TinyPolicy(prior), n, prior),
        "untrained": measure(TinyPolicy(untrained), n, untrained),
        "cpu_seconds": time.process_time() - t0,
    }
    write_file(a.out / "summary.json", json.dumps(summary, indent=1).encode(), "summary")
    print(json.dumps({k: summary[k] for k in ("script", "prior", "untrained")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
