"""Village to city, causally: why does a policy trained in teams of at most 9 score less at 64?

The policy trained with the main recipe (``configs/village.toml``: CEO, rising time limit, teams
of at most 9) is deployed at 8, 64, 512 and 4,096 agents on the workshop world, whose task grows
with the team (4 modules per agent), beside the same network untrained and the random policy,
under five conditions that differ in one thing each:

- ``flat``: everybody on one channel (the deployment of ``bench/results/city/study``);
- ``islands``: islands of 8 agents, each with its own project of 32 modules (its own 4 keys) and
  channel, scored as the MEAN over islands (``islands_mean``: the built-in ``islands`` scores
  the best island, which rises with the number of islands by selection alone);
- ``keys_off``: no module needs a key (``knowledge=0``);
- ``keys_public``: modules need keys as in ``flat``, but every key is public from the start
  (:class:`PublicKeys`): the ablation that removes only the keys' travel;
- ``dm_only``: a key teaches only by direct message, never by a post (``posts_teach=False``).

The workshop has ``min(keys, agents)`` = 4 keys at every size, each known at the start by one
agent: half of an 8-agent team holds a key, one agent in 16 at 64. A key is learned by hearing
it from someone who knows it; a post makes it public at once. From each episode's record the
study replays who learned which key when (:func:`key_times`, through the world's own ``heard``),
so it measures how long each key takes to become public and how long an agent refused for
lacking a key waits until it knows it.

    PYTHONPATH=$PWD python bench/city_study.py --checkpoint runs/village_ceo/checkpoints/latest.pt

writes ``bench/results/city/causal/{city,summary}.json`` and ``{scores,keys}.png``; cells already in
``city.json`` are kept (a stopped run resumes). Every figure is a mean over task instances with
a 95% bootstrap interval (``bench/bootstrap.py``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import trio

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.bootstrap import diff_ci, mean_ci  # noqa: E402
from collective import (  # noqa: E402
    Conductor,
    Episode,
    EpisodeConfig,
    latency_preset,
    make_organisation,
    register_organisation,
)
from collective.organisation import Islands  # noqa: E402
from collective.records import Committed, Delivered, Posted, Sent  # noqa: E402
from collective.registry import make_world  # noqa: E402
from collective.study import score_at  # noqa: E402
from worlds.workshop import Workshop  # noqa: E402

OUT = ROOT / "bench" / "results" / "city" / "causal"
AGENTS = (8, 64, 512, 4096)
INSTANCES = {8: 96, 64: 48, 512: 3, 4096: 2}  # task instances per cell: fewer where they are big
HORIZON = 120.0  # within the limits the policy trained under (90 -> 180 s)
GRID = tuple(float(t) for t in range(0, int(HORIZON) + 1, 10))
TIMES = (60.0, 120.0)  # scores reported at these times
ISLAND = 8
POLICIES = ("trained", "untrained", "random")
_REFUSED = re.compile(r"needs key k(\d+), which you do not know")


class PublicKeys(Workshop):
    """The workshop, but every key is public from the start: modules still name their keys,
    nobody is ever refused for one (the keys' travel, and only it, is taken away)."""

    def __init__(self, n_agents: int = 1, seed: int = 0, **params: Any) -> None:
        super().__init__(n_agents, seed, **params)
        self.public = set(range(self.n_keys))


@register_organisation
class IslandsMean(Islands):
    """``islands:K``, scored as the mean over islands and ended when all are done (the built-in
    takes the best island and ends with the first)."""

    name = "islands_mean"

    def combine(self, scores: Sequence[float]) -> float:
        return sum(scores) / len(scores)

    def finished(self, done: Sequence[bool]) -> bool:
        return all(done)


CONDITIONS: dict[str, dict[str, Any]] = {
    "flat": {},
    "islands": {"org": "islands_mean"},
    "keys_off": {"params": {"knowledge": 0.0}},
    "keys_public": {"world": "bench.city_study:PublicKeys"},
    "dm_only": {"params": {"posts_teach": False}},  # the workshop's own knob: no post teaches
}


def episode_config(condition: str, n: int, instance: int, policy: str) -> EpisodeConfig:
    c = CONDITIONS[condition]
    org = c.get("org", "flat")
    if org == "islands_mean":
        org = f"islands_mean:{max(1, n // ISLAND)}"
    return EpisodeConfig(
        world=c.get("world", "workshop"),
        params=dict(c.get("params", {})),
        org=org,
        agents=n,
        world_seed=1000 + instance,  # held out: training drew its instances from seed 0's stream
        sample_seed=instance,
        time_limit=HORIZON,
        latency=latency_preset("tiny"),
        max_output_tokens=24,
        policy=policy,
        keep_prompts=False,
    )


# -- who learned which key when, from the record ---------------------------------------------


def key_times(ep: Episode) -> dict[str, Any]:
    """Replay the keys' spread through fresh copies of the episode's worlds (their own
    ``heard``): for every (world, key), when it became public (None: not by the end); for every
    agent refused for lacking a key, how long from its first refusal until it knew the key (None:
    never). Keys are held from t = 0, so a key's publication time is the time it became public.
    """
    cfg = ep.config
    org = make_organisation(cfg.org, cfg.budget)
    sizes = org.groups(cfg.agents)
    worlds = [
        make_world(cfg.world, size, org.variant_seed(g, cfg.world_seed), cfg.params)
        for g, size in enumerate(sizes)
    ]
    starts = np.cumsum([0, *sizes])

    def where(agent: int) -> tuple[int, int]:
        g = int(np.searchsorted(starts, agent, side="right")) - 1
        return g, agent - int(starts[g])

    public_at: dict[tuple[int, int], float] = {}
    for g, w in enumerate(worlds):
        for k in w.public:
            public_at[(g, k)] = 0.0
    learned_at: dict[tuple[int, int, int], float] = {}  # (group, local agent, key) -> t
    refused_at: dict[tuple[int, int, int], float] = {}  # first refusal
    texts: dict[int, str] = {}
    publishing_posts = teaching_messages = 0
    for ev in ep.events:
        if isinstance(ev, Sent):
            texts[ev.msg] = ev.text
        elif isinstance(ev, Posted):
            g, local = where(ev.agent)
            w = worlds[g]
            before = set(w.public)
            w.heard(local, None, ev.text)
            new = w.public - before
            publishing_posts += bool(new)
            for k in new:
                public_at[(g, k)] = ev.t
        elif isinstance(ev, Delivered):
            g, local = where(ev.agent)
            g_to, to = where(ev.to)
            if g_to != g:
                continue
            w = worlds[g]
            before = set(w.known.get(to, ()))
            w.heard(local, to, texts.pop(ev.msg, ""))
            new = w.known.get(to, set()) - before
            teaching_messages += bool(new - w.public)
            for k in new:
                learned_at.setdefault((g, to, k), ev.t)
        elif isinstance(ev, Committed) and not ev.ok and ev.tool == "work":
            m = _REFUSED.search(ev.result)
            if m:
                g, local = where(ev.agent)
                refused_at.setdefault((g, local, int(m.group(1))), ev.t)
    keys = [(g, k) for g, w in enumerate(worlds) for k in range(w.n_keys)]
    waits: list[tuple[int, int, int, float, float | None]] = []  # group, agent, key, t, wait
    for (g, a, k), t in refused_at.items():
        got = [x for x in (public_at.get((g, k)), learned_at.get((g, a, k))) if x is not None]
        waits.append((g, a, k, t, max(0.0, min(got) - t) if got else None))
    return {
        "keys": len(keys),
        "public_at": [public_at.get(key) for key in keys],
        "refused": len(refused_at),  # distinct (agent, key) pairs refused
        "waits": waits,
        "publishing_posts": publishing_posts,
        "teaching_messages": teaching_messages,
    }


def summarise_episode(ep: Episode) -> dict[str, Any]:
    """What the study keeps of one episode: the score curve on the grid and the keys' times
    (a key not public by the end counts at the horizon: these means are lower bounds)."""
    kt = key_times(ep)
    h = ep.config.time_limit
    pub = kt["public_at"]
    waits = [w[-1] for w in kt["waits"]]
    return {
        "score": [score_at(ep, t) for t in GRID],
        "keys": kt["keys"],
        "published": sum(p is not None for p in pub) / max(1, len(pub)),
        "publication_time": float(np.mean([h if p is None else p for p in pub])) if pub else None,
        "refused_per_agent": kt["refused"] / ep.config.agents,
        "served": (sum(w is not None for w in waits) / len(waits)) if waits else None,
        "wait": float(np.mean([h if w is None else w for w in waits])) if waits else None,
        "publishing_posts": kt["publishing_posts"],
        "teaching_messages": kt["teaching_messages"],
        "posts": ep.stats.posts,
        "messages": ep.stats.sent,
    }


# -- running the cells -----------------------------------------------------------------------


def policies(checkpoint: str) -> dict[str, Any]:
    from policy.tiny import TinyModel, TinyPolicy
    from policy.uniform import RandomPolicy

    trained = TinyModel.load(checkpoint)
    return {
        "trained": TinyPolicy(trained, name=f"tiny:{checkpoint}"),
        "untrained": TinyPolicy(TinyModel.fresh(trained.config), name="tiny (untrained)"),
        "random": RandomPolicy(),
    }


def run_cell(policy: Any, condition: str, n: int, instances: int) -> dict[str, Any]:
    configs = [episode_config(condition, n, i, policy.name) for i in range(instances)]
    t0 = time.perf_counter()
    eps = trio.run(lambda: Conductor(policy).play(configs, concurrency=len(configs)))
    wall = time.perf_counter() - t0
    return {"episodes": [summarise_episode(e) for e in eps], "wall_seconds": wall}


def cell_key(policy: str, condition: str, n: int) -> str:
    return f"{policy}/{condition}/{n}"


def instances(policy: str, condition: str, n: int) -> int:
    """Task instances of a cell (0: not run). Many where a cell is cheap, so the 8 -> 64 drop has
    tight intervals; fewer at 512 and 4,096. The untrained policy thinks and talks several times
    as often as the others, which makes its cells the dearest on 2 cores: it gets fewer
    instances, and beyond 64 agents only ``flat`` and ``keys_off``. At 4,096 only ``flat``,
    ``keys_public`` and ``islands`` run (``keys_off`` plays exactly as ``keys_public`` does, and
    ``dm_only`` as ``flat`` for the trained policy: see the README)."""
    if policy == "untrained":
        if n > 512:
            return 0
        return {8: 8, 64: 6}.get(n, 3) if n <= 64 or condition in ("flat", "keys_off") else 0
    if n >= 4096 and condition not in ("flat", "keys_public", "islands"):
        return 0
    return INSTANCES.get(n, 2)


def run_all(
    checkpoint: str,
    out: Path,
    agents: Sequence[int],
    conditions: Sequence[str],
    names: Sequence[str],
) -> dict[str, Any]:
    path = out / "city.json"
    cells: dict[str, Any] = json.loads(path.read_text())["cells"] if path.exists() else {}
    pols = policies(checkpoint)
    out.mkdir(parents=True, exist_ok=True)
    for n in agents:
        for condition in conditions:
            for name in names:
                key = cell_key(name, condition, n)
                want = instances(name, condition, n)
                if not want or (key in cells and len(cells[key]["episodes"]) >= want):
                    continue
                cells[key] = run_cell(pols[name], condition, n, want)
                s = [e["score"][-1] for e in cells[key]["episodes"]]
                print(
                    f"{key:28s} score@{HORIZON:g} {np.mean(s):.3f}  "
                    f"published {np.mean([e['published'] for e in cells[key]['episodes']]):.2f}  "
                    f"{cells[key]['wall_seconds']:.1f} s",
                    flush=True,
                )
                path.write_text(json.dumps({"cells": cells}, indent=1))
    return cells


# -- the summary -----------------------------------------------------------------------------


def _ci(values: Sequence[float | None]) -> dict[str, float] | None:
    v = [x for x in values if x is not None]
    if not v:
        return None
    m, lo, hi = mean_ci(v)
    return {"mean": round(m, 4), "lo": round(lo, 4), "hi": round(hi, 4), "n": len(v)}


def at(scores: list[float], t: float) -> float:
    return scores[GRID.index(t)]


def summarise(cells: dict[str, Any]) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for key, c in sorted(cells.items()):
        eps = c["episodes"]
        table[key] = {
            "score_at": {f"{t:g}": _ci([at(e["score"], t) for e in eps]) for t in TIMES},
            "curve": [
                round(float(np.mean([e["score"][i] for e in eps])), 4) for i in range(len(GRID))
            ],
            **{
                f: _ci([e[f] for e in eps])
                for f in (
                    "published",
                    "publication_time",
                    "refused_per_agent",
                    "served",
                    "wait",
                    "publishing_posts",
                    "teaching_messages",
                    "posts",
                    "messages",
                )
            },
            "instances": len(eps),
            "wall_seconds": round(c["wall_seconds"], 1),
        }
    drops: dict[str, Any] = {}
    for key, c in cells.items():
        name, condition, n = key.split("/")
        if n != "64" or cell_key(name, condition, 8) not in cells:
            continue
        for t in TIMES:
            small = [at(e["score"], t) for e in cells[cell_key(name, condition, 8)]["episodes"]]
            big = [at(e["score"], t) for e in c["episodes"]]
            m, lo, hi = diff_ci(small, big)
            drops.setdefault(f"{name}/{condition}", {})[f"{t:g}"] = {
                "mean": round(m, 4),
                "lo": round(lo, 4),
                "hi": round(hi, 4),
            }
    # Paired by task instance (the same world and sampling seeds): what a condition adds to flat
    # at each size, and how much of flat's 8 -> 64 drop it removes (its gain at 64 minus at 8).
    gains: dict[str, Any] = {}
    removed: dict[str, Any] = {}
    t = HORIZON
    for key in cells:
        name, cond, n = key.split("/")
        base = cells.get(cell_key(name, "flat", int(n)))
        if cond == "flat" or base is None:
            continue
        pairs = zip(cells[key]["episodes"], base["episodes"], strict=False)
        gains[key] = [at(x["score"], t) - at(y["score"], t) for x, y in pairs]
    for key, g in gains.items():
        name, cond, n = key.split("/")
        small = gains.get(cell_key(name, cond, 8))
        if n != "64" or small is None:
            continue
        m, lo, hi = diff_ci(g, small)
        removed[f"{name}/{cond}"] = {"mean": round(m, 4), "lo": round(lo, 4), "hi": round(hi, 4)}
    return {
        "cells": table,
        "drop_8_to_64": drops,
        f"gain_over_flat_at_{t:g}": {k: _ci(v) for k, v in sorted(gains.items())},
        "drop_removed_8_to_64": removed,
    }


def plot(summary: dict[str, Any], out: Path, conditions: Sequence[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = summary["cells"]

    def series(name: str, cond: str, field: str, sub: str | None = None) -> list[tuple[int, Any]]:
        pts = []
        for n in AGENTS:
            c = cells.get(cell_key(name, cond, n))
            if c is None:
                continue
            v = c[field][sub] if sub else c[field]
            if v is not None:
                pts.append((n, v))
        return pts

    def errorbars(ax: Any, pts: list[tuple[int, Any]], label: str) -> None:
        """Means with their 95% intervals against agent count; none where cells are missing."""
        if pts:
            lo = [p[1]["mean"] - p[1]["lo"] for p in pts]
            hi = [p[1]["hi"] - p[1]["mean"] for p in pts]
            ax.errorbar(
                [p[0] for p in pts],
                [p[1]["mean"] for p in pts],
                yerr=[lo, hi],
                marker="o",
                capsize=3,
                label=label,
            )

    fig, axes = plt.subplots(1, len(conditions), figsize=(4 * len(conditions), 4), sharey=True)
    for ax, cond in zip(np.atleast_1d(axes), conditions, strict=True):
        for name in POLICIES:
            errorbars(ax, series(name, cond, "score_at", f"{HORIZON:g}"), name)
        ax.set_xscale("log", base=2)
        ax.set(title=cond, xlabel="agents", ylim=(0, 1))
    np.atleast_1d(axes)[0].set_ylabel(f"score at {HORIZON:g} s (mean, 95% CI)")
    np.atleast_1d(axes)[0].legend()
    fig.suptitle("Village to city: the village policy at 8-4,096 agents, per condition")
    fig.tight_layout()
    fig.savefig(out / "scores.png", dpi=100)
    plt.close(fig)

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    for name in POLICIES:  # under flat: the keys' publication, for each policy
        for ax, field in zip(axes[:2], ("published", "publication_time"), strict=True):
            errorbars(ax, series(name, "flat", field), name)
    for cond, style in (("flat", "-"), ("keys_public", "--"), ("islands", ":")):
        for n, colour in ((8, "C0"), (64, "C3")):
            c = cells.get(cell_key("trained", cond, n))
            if c is not None:
                axes[2].plot(GRID, c["curve"], style, color=colour, label=f"{cond}, {n}")
    axes[0].set(
        xscale="log",
        xlabel="agents",
        ylabel="share of keys public by the end",
        title="flat: keys made public (mean, 95% CI)",
        ylim=(-0.05, 1.05),
    )
    axes[1].set(
        xscale="log",
        xlabel="agents",
        ylabel=f"seconds from t=0 (never: counted as {HORIZON:g})",
        title="flat: time until a key is public",
    )
    axes[2].set(
        xlabel="simulated seconds",
        ylabel="score (mean over instances)",
        title="trained: score over time, 8 and 64 agents",
    )
    for ax in axes:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "keys.png", dpi=100)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", default=str(ROOT / "runs/village_ceo/checkpoints/latest.pt"))
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--agents", default=",".join(map(str, AGENTS)))
    ap.add_argument("--conditions", default=",".join(CONDITIONS))
    ap.add_argument("--policies", default=",".join(POLICIES))
    a = ap.parse_args(argv)
    agents = [int(x) for x in a.agents.split(",")]
    conditions = a.conditions.split(",")
    bad = [c for c in conditions if c not in CONDITIONS]
    if bad or not Path(a.checkpoint).exists():
        print(
            f"city_study: unknown conditions {bad} or no checkpoint {a.checkpoint}", file=sys.stderr
        )
        return 2
    cells = run_all(a.checkpoint, a.out, agents, conditions, a.policies.split(","))
    summary = summarise(cells)
    (a.out / "summary.json").write_text(json.dumps(summary, indent=1))
    plot(summary, a.out, list(CONDITIONS))  # every condition in city.json, not only this run's
    for k, v in summary["drop_8_to_64"].items():
        print(f"drop 8 -> 64 {k:24s} @60 {v['60']}  @120 {v['120']}")
    for k, v in summary["drop_removed_8_to_64"].items():
        print(f"of flat's drop, removed by {k:24s} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
