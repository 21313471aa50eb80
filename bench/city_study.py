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

    python bench/city_study.py --checkpoint runs/village_ceo/checkpoints/latest.pt
    python bench/city_study.py \
        --checkpoint runs/village_ceo_s1/checkpoints/latest.pt --agents 8,64 \
        --conditions flat,keys_public,islands --policies trained,untrained
    python bench/city_study.py --summarise-only

writes ``bench/results/city/causal/{city,summary}.json`` and ``{scores,keys}.png``; cells
already in ``city.json`` under the same digest are kept (a stopped run resumes; a changed
cell, or one recorded before digests, runs again). A checkpoint's cells are named by its
training seed (``trained_s1/flat/8``), so several seeds share one ``city.json``. Every figure
is a mean with a 95% bootstrap interval from ``collective.studies.intervals``: over training seeds,
then each seed's task instances, where more than one seed ran the cell (``seeds`` in the
summary says how many), over instances alone where one did; ``summary.json``'s ``per_seed``
holds each seed's own.
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

from collective import (
    Conductor,
    Episode,
    EpisodeConfig,
    latency_preset,
    make_organisation,
    register_organisation,
)
from collective.engine.organisation import Islands
from collective.engine.registry import make_world
from collective.records import Committed, Delivered, Posted, Sent
from collective.studies.intervals import (
    BOOT,
    Interval,
    bootstrap,
    bootstrap_contrast,
    bootstrap_diff,
    bootstrap_fn,
)
from collective.studies.resumable import digest, file_digest
from collective.studies.study import score_at
from worlds.workshop import Workshop

ROOT = Path(__file__).resolve().parent.parent

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

    trained = TinyModel.load(checkpoint)  # its config's seed is the run's training seed
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
    # play returns episodes as they end; keep them in instance order, each with its instance
    eps = sorted(eps, key=lambda e: e.config.world_seed)
    return {
        "episodes": [{"instance": e.config.world_seed - 1000, **summarise_episode(e)} for e in eps],
        "wall_seconds": wall,
    }


def cell_key(policy: str, condition: str, n: int) -> str:
    return f"{policy}/{condition}/{n}"


def instances(policy: str, condition: str, n: int, most: int | None = None) -> int:
    """Task instances of a cell (0: not run). Many where a cell is cheap, so the 8 -> 64 drop has
    tight intervals; fewer at 512 and 4,096. The untrained policy thinks and talks several times
    as often as the others, which makes its cells the dearest on 2 cores: it gets fewer
    instances, and beyond 64 agents only ``flat`` and ``keys_off``. At 4,096 only ``flat``,
    ``keys_public`` and ``islands`` run (``keys_off`` plays exactly as ``keys_public`` does, and
    ``dm_only`` as ``flat`` for the trained policy: see the README). ``most`` caps it (more
    training seeds in the same time)."""
    if policy == "untrained":
        if n > 512:
            return 0
        want = {8: 8, 64: 6}.get(n, 3) if n <= 64 or condition in ("flat", "keys_off") else 0
    elif n >= 4096 and condition not in ("flat", "keys_public", "islands"):
        return 0
    else:
        want = INSTANCES.get(n, 2)
    return want if most is None else min(want, most)


# bump when what a cell records changes: a cell is re-used only under its own digest (its
# episode configs, its policy's identity, the grid and this version; collective.studies.resumable)
CELL_VERSION = 1


def run_all(
    checkpoint: str,
    out: Path,
    agents: Sequence[int],
    conditions: Sequence[str],
    names: Sequence[str],
    most: dict[int, int] | None = None,
) -> dict[str, Any]:
    """Run the cells not yet in ``out/city.json`` under their own digest (a cell made with other
    configs, another checkpoint or none recorded is run again). The checkpoint's training seed
    names its cells (``trained_s1/flat/8``) and the untrained policy's (fresh weights of that
    seed)."""
    path = out / "city.json"
    cells: dict[str, Any] = json.loads(path.read_text())["cells"] if path.exists() else {}
    pols = policies(checkpoint)
    seed = pols["trained"].model.config.seed
    idents = {  # what each policy is, for the cells' digests
        "trained": f"tiny:{file_digest(Path(checkpoint))}",
        "untrained": f"fresh:{digest(pols['trained'].model.config)}",
        "random": "random",
    }
    out.mkdir(parents=True, exist_ok=True)
    for n in agents:
        for condition in conditions:
            for name in names:
                key = cell_key(policy_label(name, seed), condition, n)
                want = instances(name, condition, n, (most or {}).get(n))
                if not want:
                    continue
                configs = [episode_config(condition, n, i, pols[name].name) for i in range(want)]
                stamp = digest("city cell", idents[name], configs, GRID, CELL_VERSION)
                if cells.get(key, {}).get("digest") == stamp:
                    continue  # made exactly so: re-used (a cell without a digest is re-run)
                cells[key] = {**run_cell(pols[name], condition, n, want), "digest": stamp}
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
#
# A cell of city.json is one policy at one condition and size; a trained (or untrained) policy's
# cells carry its training seed in their name (``trained_s1/flat/8``); the random policy has no
# seed. Figures pooled over seeds bootstrap over training seeds, then over each seed's task
# instances (``collective.studies.intervals``); where a cell ran at one seed only, the interval
# covers
# its instances only, and ``seeds`` says so.

FIELDS = (
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


def split_name(name: str) -> tuple[str, int | None]:
    """``trained_s1`` -> (``trained``, 1); ``random`` -> (``random``, None)."""
    base, sep, seed = name.rpartition("_s")
    return (base, int(seed)) if sep and seed.isdigit() else (name, None)


def policy_label(base: str, seed: int) -> str:
    return "random" if base == "random" else f"{base}_s{seed}"


def _iv(table: Any, boot: int = BOOT) -> dict[str, Any] | None:
    """A (seeds x instances) table's mean and 95% interval (None marks an undefined value,
    e.g. no agent was refused: left out of the mean), rounded for the JSON."""
    t = np.array([[np.nan if v is None else v for v in row] for row in table], dtype=float)
    if t.size == 0 or np.isnan(t).all():
        return None
    if not np.isnan(t).any():
        return _rounded(bootstrap(t, boot=boot))  # the same interval as below, faster

    def stat(r: np.ndarray, c: np.ndarray) -> float | None:
        x = t[r[:, None], c]
        return None if np.isnan(x).all() else float(np.nanmean(x))

    return _rounded(bootstrap_fn(stat, t.shape[0], t.shape[1], boot=boot))


def _rounded(iv: Interval) -> dict[str, Any]:
    r = {
        k: None if v is None else round(v, 4)
        for k, v in (("mean", iv.mean), ("lo", iv.lo), ("hi", iv.hi))
    }
    return {**r, "seeds": iv.seeds, "instances": iv.instances}


def at(scores: list[float], t: float) -> float:
    return scores[GRID.index(t)]


def by_seed(cells: dict[str, Any]) -> dict[tuple[str, str, int], dict[int | None, list[Any]]]:
    """(policy, condition, agents) -> {training seed: that cell's episodes}."""
    out: dict[tuple[str, str, int], dict[int | None, list[Any]]] = {}
    for key, c in cells.items():
        name, cond, n = key.split("/")
        base, seed = split_name(name)
        out.setdefault((base, cond, int(n)), {})[seed] = c["episodes"]
    return out


def seed_table(
    runs: dict[int | None, list[Any]], value: Any, seeds: Sequence[Any]
) -> list[list[Any]]:
    """One row per seed, over the task instances every seed ran (instance i is the same world
    and sampling seeds in every row). Cells run before episodes carried their ``instance`` hold
    them in the order they ended, which says nothing of which instance each was: those are
    taken whole, and only when every seed ran as many."""
    rows = [runs[s] for s in seeds]
    if all("instance" in e for r in rows for e in r):
        both = set.intersection(*({e["instance"] for e in r} for r in rows))
        rows = [
            sorted((e for e in r if e["instance"] in both), key=lambda e: e["instance"])
            for r in rows
        ]
    elif len({len(r) for r in rows}) != 1:
        raise ValueError(
            f"city_study: seeds {list(seeds)} ran {[len(r) for r in rows]} instances of one cell, "
            "and its episodes do not say which: rerun the cell with equal --instances"
        )
    return [[value(e) for e in r] for r in rows]


def summarise(cells: dict[str, Any], boot: int = BOOT) -> dict[str, Any]:
    """Every cell per seed, pooled over seeds, the 8 -> 64 drops and what each condition
    removes of flat's; ``boot`` resamples per interval."""

    def iv(table: Any) -> dict[str, Any] | None:
        return _iv(table, boot)

    def diff(a: Any, b: Any) -> dict[str, Any]:
        return _rounded(bootstrap_diff(a, b, boot=boot))

    per_seed: dict[str, Any] = {}
    for key, c in sorted(cells.items()):
        eps = c["episodes"]
        per_seed[key] = {
            "score_at": {f"{t:g}": iv([[at(e["score"], t) for e in eps]]) for t in TIMES},
            "curve": [
                round(float(np.mean([e["score"][i] for e in eps])), 4) for i in range(len(GRID))
            ],
            **{f: iv([[e[f] for e in eps]]) for f in FIELDS},
            "instances": len(eps),
            "wall_seconds": round(c["wall_seconds"], 1),
        }
    groups = by_seed(cells)
    pooled: dict[str, Any] = {}
    for (base, cond, n), runs in sorted(groups.items()):
        seeds = sorted(runs, key=lambda s: -1 if s is None else s)
        pooled[cell_key(base, cond, n)] = {
            "score_at": {
                f"{t:g}": iv(seed_table(runs, lambda e, t=t: at(e["score"], t), seeds))
                for t in TIMES
            },
            "curve": [
                round(float(np.mean(seed_table(runs, lambda e, i=i: e["score"][i], seeds))), 4)
                for i in range(len(GRID))
            ],
            **{f: iv(seed_table(runs, lambda e, f=f: e[f], seeds)) for f in FIELDS},
            "seeds": [s for s in seeds if s is not None],
        }

    def common(base: str, conds: Sequence[tuple[str, int]]) -> list[int | None]:
        """The seeds that ran every (condition, size) in ``conds``."""
        have = [set(groups.get((base, c, n), {})) for c, n in conds]
        return sorted(set.intersection(*have), key=lambda s: -1 if s is None else s)

    def scores(base: str, cond: str, n: int, seeds: Sequence[Any], t: float) -> list[list[float]]:
        return seed_table(groups[(base, cond, n)], lambda e: at(e["score"], t), seeds)

    def contrast(
        base: str, terms: Sequence[tuple[float, str, int]], seeds: Sequence[Any]
    ) -> dict[str, Any]:
        """sum(w * mean score at the horizon of (condition, n)) over seeds, then instances."""
        tables = [(w, scores(base, c, n, seeds, HORIZON)) for w, c, n in terms]
        return _rounded(bootstrap_contrast(tables, boot=boot))

    drops: dict[str, Any] = {}
    gain: dict[str, Any] = {}
    removed: dict[str, Any] = {}
    per_seed_drops: dict[str, Any] = {}
    per_seed_removed: dict[str, Any] = {}
    for base, cond in sorted({(b, c) for b, c, _ in groups}):
        seeds = common(base, [(cond, 8), (cond, 64)])
        if seeds:
            drops[f"{base}/{cond}"] = {
                f"{t:g}": diff(scores(base, cond, 8, seeds, t), scores(base, cond, 64, seeds, t))
                for t in TIMES
            }
            for s in seeds:
                if s is not None:
                    per_seed_drops[f"{policy_label(base, s)}/{cond}"] = {
                        f"{t:g}": diff(
                            scores(base, cond, 8, [s], t), scores(base, cond, 64, [s], t)
                        )
                        for t in TIMES
                    }
        if cond == "flat":
            continue
        for n in AGENTS:
            seeds_n = common(base, [(cond, n), ("flat", n)])
            if seeds_n:
                gain[cell_key(base, cond, n)] = contrast(
                    base, [(1, cond, n), (-1, "flat", n)], seeds_n
                )
        # How much of flat's 8 -> 64 drop the condition removes: its gain over flat at 64 minus
        # at 8. Not paired by instance: the cells of seed 0 do not record which episode was which.
        seeds = common(base, [(cond, 8), (cond, 64), ("flat", 8), ("flat", 64)])
        terms = [(1.0, cond, 64), (-1.0, "flat", 64), (-1.0, cond, 8), (1.0, "flat", 8)]
        if seeds:
            removed[f"{base}/{cond}"] = contrast(base, terms, seeds)
            for s in seeds:
                if s is not None:
                    per_seed_removed[f"{policy_label(base, s)}/{cond}"] = contrast(base, terms, [s])
    return {
        "cells": pooled,
        "drop_8_to_64": drops,
        f"gain_over_flat_at_{HORIZON:g}": gain,
        "drop_removed_8_to_64": removed,
        "per_seed": {
            "cells": per_seed,
            "drop_8_to_64": per_seed_drops,
            "drop_removed_8_to_64": per_seed_removed,
        },
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
            if v is not None and v["lo"] is not None and v["hi"] is not None:
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
        for key, c in summary["per_seed"]["cells"].items():  # each training seed on its own
            name, c_cond, n = key.split("/")
            if split_name(name)[0] == "trained" and c_cond == cond:
                ax.plot(int(n), c["score_at"][f"{HORIZON:g}"]["mean"], "k.", ms=4, alpha=0.5)
        ax.set_xscale("log", base=2)
        ax.set(title=cond, xlabel="agents", ylim=(0, 1))
    np.atleast_1d(axes)[0].set_ylabel(
        f"score at {HORIZON:g} s (mean, 95% CI; dots: each training seed)"
    )
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
        ylabel="score (mean over seeds and instances)",
        title="trained: score over time, 8 and 64 agents",
    )
    for ax in axes:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "keys.png", dpi=100)
    plt.close(fig)


def _txt(v: dict[str, Any] | None) -> str:
    if v is None or v["lo"] is None:
        return "—" if v is None else f"{v['mean']:.3f}"
    return f"{v['mean']:.3f} [{v['lo']:.3f}, {v['hi']:.3f}]"


def _n(v: dict[str, Any]) -> str:
    return f"{v['seeds']}×{v['instances']}"


def table(summary: dict[str, Any]) -> str:
    """The README's tables, from the summary: score at the horizon per condition, policy and
    size (seeds × instances in brackets), the 8 -> 64 drop, and each seed's own figures."""
    h = f"{HORIZON:g}"
    lines = [
        "| condition | policy | " + " | ".join(f"{n:,}" for n in AGENTS) + " | drop 8 → 64 |",
        "|---|---|" + "---:|" * (len(AGENTS) + 1),
    ]
    for cond in CONDITIONS:
        for name in POLICIES:
            row = []
            for n in AGENTS:
                c = summary["cells"].get(cell_key(name, cond, n))
                v = c["score_at"][h] if c else None
                row.append("—" if v is None else f"{_txt(v)} ({_n(v)})")
            d = summary["drop_8_to_64"].get(f"{name}/{cond}")
            drop = f"{_txt(d[h])} ({_n(d[h])})" if d else "—"
            if any(x != "—" for x in row):
                lines.append(f"| {cond} | {name} | " + " | ".join(row) + f" | {drop} |")
    lines += [
        "",
        "| of flat's 8 → 64 drop, removed | value |",
        "|---|---:|",
    ]
    for k, v in summary["drop_removed_8_to_64"].items():
        lines.append(f"| {k} | {_txt(v)} ({_n(v)}) |")
    lines += [
        "",
        "| each training seed | flat 8 | flat 64 | drop | keys_public removes | islands removes |",
    ]
    lines.append("|---|---:|---:|---:|---:|---:|")
    ps = summary["per_seed"]
    for name in sorted({k.split("/")[0] for k in ps["drop_8_to_64"]}):
        if split_name(name)[0] != "trained":
            continue
        score = [ps["cells"].get(cell_key(name, "flat", n)) for n in (8, 64)]
        lines.append(
            f"| {name} | "
            + " | ".join(_txt(c["score_at"][h]) if c else "—" for c in score)
            + f" | {_txt(ps['drop_8_to_64'].get(f'{name}/flat', {}).get(h))}"
            + "".join(
                f" | {_txt(ps['drop_removed_8_to_64'].get(f'{name}/{cond}'))}"
                for cond in ("keys_public", "islands")
            )
            + " |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", default=str(ROOT / "runs/village_ceo/checkpoints/latest.pt"))
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--agents", default=",".join(map(str, AGENTS)))
    ap.add_argument("--conditions", default=",".join(CONDITIONS))
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument(
        "--summarise-only",
        action="store_true",
        help="run no episode: re-summarise city.json into summary.json and the plots",
    )
    ap.add_argument(
        "--instances",
        default="",
        help="at most this many task instances per cell, per size, e.g. 8:48,64:24",
    )
    ap.add_argument(
        "--no-summary", action="store_true", help="only run the cells (e.g. seeds run in parallel)"
    )
    ap.add_argument(
        "--merge",
        nargs="*",
        type=Path,
        default=[],
        help="first add the cells of these city.json files (other runs' --out) to this one's",
    )
    a = ap.parse_args(argv)
    agents = [int(x) for x in a.agents.split(",")]
    conditions = a.conditions.split(",")
    names = a.policies.split(",")
    bad = [c for c in conditions if c not in CONDITIONS] + [p for p in names if p not in POLICIES]
    try:
        most = {int(k): int(v) for k, v in (x.split(":") for x in a.instances.split(",") if x)}
    except ValueError:
        print(f"city_study: --instances {a.instances!r}: want AGENTS:N,...", file=sys.stderr)
        return 2
    if bad:
        print(f"city_study: unknown conditions or policies {bad}", file=sys.stderr)
        return 2
    path = a.out / "city.json"
    missing = [str(m) for m in a.merge if not m.exists()]
    if missing:
        print(f"city_study: --merge: no file {', '.join(missing)}", file=sys.stderr)
        return 2
    if a.merge:
        cells = json.loads(path.read_text())["cells"] if path.exists() else {}
        for m in a.merge:
            cells.update(json.loads(m.read_text())["cells"])  # cells are named by policy and seed
        a.out.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"cells": cells}, indent=1))
    if a.summarise_only:
        if not path.exists():
            print(
                f"city_study: --summarise-only needs {path}, which does not exist", file=sys.stderr
            )
            return 2
        cells = json.loads(path.read_text())["cells"]
    else:
        if not Path(a.checkpoint).exists():
            print(f"city_study: no checkpoint {a.checkpoint}", file=sys.stderr)
            return 2
        cells = run_all(a.checkpoint, a.out, agents, conditions, names, most)
    if a.no_summary:
        return 0
    summary = summarise(cells)
    (a.out / "summary.json").write_text(json.dumps(summary, indent=1))
    plot(summary, a.out, list(CONDITIONS))  # every condition in city.json, not only this run's
    print(table(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
