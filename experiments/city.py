"""Village to city, with its controls: what of a village policy's score at scale survives them?

The causal study (``bench/results/city/causal``; its script, ``bench/city_study.py``, is gone
since, superseded by this one) found the trained policy's score falling from 8 to 64 agents and
named the keys as the cause; an audit (issue 25) found a three-line script that never passes a
key drops more, because on the workshop a module appears on about ``view`` desks out of n, so
its key's one holder sees it with a chance ~view/n that falls with the team: the world, not the
policy. This study builds a world whose task, keys and desks scale with n, runs every control
under every condition, and claims only what remains after them.

**The world** (:class:`worlds.city.CityWorkshop`): the workshop cut into *blocks* of
``BLOCK`` = 8 agents (the village), scaled with the team ``n`` so that nothing a village sees
changes with n:

- task ∝ n: ``size`` = 4 modules per agent (32 for a village of 8, 256 at 64), one dependency
  graph over them all (a module may depend on modules of other blocks: the city is one project);
- keys ∝ n: each block has 4 keys (``min(4, block size)``), each held at the start by one of its
  agents (4 keys at 8, 32 at 64), and a block's key-gated modules need one of its own keys, so
  the key-gated work per holder is the same at every n (a quarter of the modules are gated);
- desks ∝ n: module m belongs to block ``m mod blocks``; an agent's desk shows up to ``view`` = 3
  ready modules of its own block, chosen as the workshop chooses them, so a module's key holder
  sees it with a chance independent of n (about view / its block's ready modules).

What still grows with n: the one channel ``all`` every post reaches (n authors filling each
inbox), direct messages to anyone, and dependencies across blocks. At n <= 8 the world is one
block: the village the policy was trained in.

**Conditions**, each the city with one thing changed: ``city`` (flat); ``keys_public`` (every key
public from t = 0: key gating itself removed); ``islands`` (islands of 8, each its own 32-module
project, keys and channel ``g<k>``, scored as the mean over islands: eight villages side by side by
construction); ``global_desk`` (one block of all n: the plain workshop's desks, visibility ~view/n,
keys still ∝ n: the audit's mechanism, on its own).

**Policies**, every one under every condition and size, on the same world seeds (instance i is
``world_seed`` 7000 + i, sample seed i, in every cell: cells pair by instance): ``trained`` (the
village policy, trained flat on this world at teams of 1, 2, 4, 8: ``village_config``), its
``untrained`` initial weights, ``random``, and two scripts (here, beside the study, as
``policy/scripted.py`` is another helper's): ``oracle`` posts a key as soon as its desk says it
is wanted, else works the first slot it can (else slot 1, whose refusal marks the key wanted),
and ``nopass`` does the same but never posts nor messages.

    python bench/city_controlled.py            # train (resumable), run, summarise
    python bench/city_controlled.py --summarise-only

writes ``bench/results/city/controlled/{cells,summary}.json`` and ``scores.png`` (from an
installed copy, ``python -m experiments.city`` writes ``./city``). Every run and
cell is re-used only when its digest matches (``experiments.resumable``): the village's full
TrainConfig; a cell's episode configs, its policy's identity (the checkpoint's bytes) and
``CELL_VERSION``.
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

from collective import Conductor, EpisodeConfig, latency_preset
from collective.engine.organisation import make_organisation
from collective.engine.registry import make_world
from collective.records import Committed, Delivered, Episode, Posted, Sent
from collective.records.signs import signs
from collective.rl.config import TrainConfig, read_config
from collective.rl.train import read_metrics
from collective.studies.intervals import MISSING, Interval, claim_p, holm, seed_interval
from collective.studies.study import score_at
from experiments.resumable import digest, file_digest, train_exact
from policy.base import PolicyRequest
from policy.scripted import ScriptedPolicy
from policy.tiny import TinyConfig, TinyModel, TinyPolicy
from policy.uniform import RandomPolicy
from worlds.city import BLOCK
from worlds.workshop import Workshop

#: Where the results go by default: bench/results/city/controlled in a checkout of the project
#: (the figures its README cites; the village's run beside it in bench/results/city/runs, not
#: committed), ./city and ./city/runs from an installed copy.
_CHECKOUT = Path(__file__).resolve().parents[1]
_IN_CHECKOUT = (_CHECKOUT / "bench" / "city_controlled.py").exists()
OUT = _CHECKOUT / "bench" / "results" / "city" / "controlled" if _IN_CHECKOUT else Path("city")
RUNS = _CHECKOUT / "bench" / "results" / "city" / "runs" if _IN_CHECKOUT else Path("city/runs")
AGENTS = (8, 16, 32, 64)
INSTANCES = 6
HORIZON = 120.0  # the limit the village trains under
TIMES = (60.0, 120.0)
CONDITIONS = ("city", "keys_public", "islands", "global_desk")
POLICIES = ("trained", "untrained", "random", "oracle", "nopass")
CONTROLS = ("untrained", "random", "oracle", "nopass")
# bump when what a cell records changes, or the code it runs (2: re-measured after main's random
# policy began to keep to max_tokens)
CELL_VERSION = 2


WORLD = "worlds.city:CityWorkshop"


def episode_config(condition: str, n: int, instance: int, policy: str) -> EpisodeConfig:
    """Instance ``instance`` of the city at ``n`` agents under ``condition``: the same world and
    sampling seeds under every condition and policy (cells pair by instance)."""
    world, params, org = WORLD, {}, "flat"
    if condition == "keys_public":
        world = "worlds.city:CityPublicKeys"
    elif condition == "islands":
        org = f"islands_mean:{max(1, n // BLOCK)}"
    elif condition == "global_desk":
        params = {"block": 0}
    return EpisodeConfig(
        world=world,
        params=params,
        org=org,
        agents=n,
        world_seed=7000 + instance,  # the village trained on seed 0's stream of instances
        sample_seed=instance,
        time_limit=HORIZON,
        latency=latency_preset("tiny"),
        max_output_tokens=24,
        policy=policy,
        keep_prompts=False,
    )


# -- who learned which key when, from the record -----------------------------------------------

_REFUSED = re.compile(r"needs key k(\d+), which you do not know")


def key_times(ep: Episode) -> dict[str, Any]:
    """Replay the keys' spread through fresh copies of the episode's worlds (their own
    ``heard``): for every (world, key), when it became public (None: not by the end); for every
    agent refused for lacking a key, how long from its first refusal until it knew the key (None:
    never). Keys are held from t = 0, so a key's publication time is the time it became public.
    """
    cfg = ep.config
    org = make_organisation(cfg.org, cfg.budget)
    sizes = org.groups(cfg.agents)
    worlds: list[Workshop] = []
    for g, size in enumerate(sizes):
        w = make_world(cfg.world, size, org.variant_seed(g, cfg.world_seed), cfg.params)
        if not isinstance(w, Workshop):  # keys are the workshop's
            raise ValueError(f"key_times: {cfg.world} is no workshop; it has no keys to follow")
        worlds.append(w)
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


# -- the scripts -------------------------------------------------------------------------------

_WANTED = re.compile(r"wanted: (k\d+)")
_SLOT = re.compile(r"(\d+)=m\d+ \([\d.]+ left(, needs k\d+)?\)")


def _channel(req: PolicyRequest) -> str | None:
    post = next((t for t in req.space.tools if t.name == "post"), None)
    if post is None:
        return None
    return next((a.choices[0] for a in post.args if a.choices), None)


def _work(obs: str) -> str:
    slots = _SLOT.findall(obs)
    free = [i for i, needs in slots if not needs]
    if free:
        return f"work {free[0]}"
    return "work 1" if slots else "wait 5"  # a refusal marks the key wanted for its holder


def oracle(req: PolicyRequest) -> str:
    """Post a wanted key the moment the desk says so; else work what can be worked."""
    obs = req.prompt.split("\n", 1)[0]
    wanted, channel = _WANTED.search(obs), _channel(req)
    if wanted and channel:
        return f'post {channel} "{wanted.group(1)}"'
    return _work(obs)


def nopass(req: PolicyRequest) -> str:
    """The oracle without its posts: never passes a key, never says anything."""
    return _work(req.prompt.split("\n", 1)[0])


# -- the village -------------------------------------------------------------------------------


def village_config(steps: int, seed: int = 0) -> TrainConfig:
    """The village: flat teams of 1, 2, 4 and 8 on this world (one block), at the deployment's
    limit, the model of configs/village.toml."""
    return read_config(
        dict(
            world=WORLD,
            org="flat",
            team_sizes=(1, 2, 4, 8),
            steps=steps,
            groups_per_step=5,
            group_size=4,
            seed=seed,
            time_limit_start=HORIZON,
            time_limit_end=HORIZON,
            learning_rate=1e-2,
            std_normalise=True,
            max_output_tokens=24,
            concurrency=20,
            plots=False,
            model=TinyConfig(d_model=64, n_layers=2, n_heads=4, d_ff=128, context=128),
        )
    )


def make_policies(checkpoint: Path) -> dict[str, tuple[Any, str]]:
    """Each policy with its identity (what a cell's digest covers)."""
    trained = TinyModel.load(str(checkpoint))
    ident = file_digest(checkpoint)
    return {
        "trained": (TinyPolicy(trained, name="trained"), f"tiny:{ident}"),
        "untrained": (
            TinyPolicy(TinyModel.fresh(trained.config), name="untrained"),
            f"fresh:{digest(trained.config)}",
        ),
        "random": (RandomPolicy(), "random"),
        "oracle": (ScriptedPolicy(oracle, name="oracle"), "oracle:1"),
        "nopass": (ScriptedPolicy(nopass, name="nopass"), "nopass:1"),
    }


# -- the cells ---------------------------------------------------------------------------------


def record(ep: Any) -> dict[str, Any]:
    """What a cell keeps of one episode."""
    s = signs(ep)
    kt = key_times(ep)
    return {
        "instance": ep.config.sample_seed,
        "score": {f"{t:g}": score_at(ep, t) for t in TIMES},
        "landed_per_agent": s.landed_units / ep.config.agents,
        "refused_share": s.refused_units / max(1, s.refused_units + s.landed_units),
        "talk_per_agent_second": s.talk_per_agent_second,
        "published": sum(p is not None for p in kt["public_at"]) / max(1, kt["keys"]),
        "teaching_messages": kt["teaching_messages"],
    }


def play(policy: Any, configs: list[EpisodeConfig]) -> list[Any]:
    """Episodes of ``configs`` under one policy (one conductor, batched), in instance order."""
    eps = trio.run(lambda: Conductor(policy).play(configs, concurrency=len(configs)))
    return sorted(eps, key=lambda e: e.config.sample_seed)


def run_cells(
    checkpoint: Path,
    out: Path,
    agents: Sequence[int],
    conditions: Sequence[str],
    names: Sequence[str],
    instances: int,
) -> dict[str, Any]:
    """Every (policy, condition, n) cell not already in ``cells.json`` under its own digest."""
    path = out / "cells.json"
    cells: dict[str, Any] = json.loads(path.read_text())["cells"] if path.exists() else {}
    pols = make_policies(checkpoint)
    out.mkdir(parents=True, exist_ok=True)
    reused = 0
    for n in agents:
        for cond in conditions:
            for name in names:
                policy, ident = pols[name]
                configs = [episode_config(cond, n, i, name) for i in range(instances)]
                key = digest("city cell", ident, configs, TIMES, CELL_VERSION)
                label = f"{name}/{cond}/{n}"
                if cells.get(label, {}).get("digest") == key:
                    reused += 1
                    continue
                t0 = time.perf_counter()
                eps = play(policy, configs)
                cells[label] = {
                    "digest": key,
                    "episodes": [record(e) for e in eps],
                    "wall_seconds": time.perf_counter() - t0,
                }
                sc = np.mean([e["score"][f"{HORIZON:g}"] for e in cells[label]["episodes"]])
                print(f"{label:28s} {sc:.3f}  {cells[label]['wall_seconds']:.1f} s", flush=True)
                path.write_text(json.dumps({"cells": cells}, indent=1))
    if reused:
        print(f"[cells] {reused} re-used (digests match)", flush=True)
    return cells


# -- the analysis ------------------------------------------------------------------------------


def column(cells: dict[str, Any], name: str, cond: str, n: int, field: str = "score") -> np.ndarray:
    """A cell's per-instance values, in instance order (the pairing)."""
    eps = sorted(cells[f"{name}/{cond}/{n}"]["episodes"], key=lambda e: e["instance"])
    return np.array([e[field][f"{HORIZON:g}"] if field == "score" else e[field] for e in eps])


def over_instances(values: np.ndarray) -> Interval:
    """Mean and 95% t-interval over task instances (rows of one), each instance's value kept
    in ``per_seed``: with one training seed this says nothing of training's own variance."""
    v = np.asarray(values, dtype=float)
    if v.size < 2 or not np.isfinite(v).all():
        return MISSING
    iv = seed_interval(v)
    iv.method, iv.instances = "t over instances (paired by instance)", int(v.size)
    return iv


def drop(cells: dict[str, Any], name: str, cond: str, n: int) -> np.ndarray:
    """Per instance: score at 8 minus score at n (the same instance index at both sizes)."""
    return column(cells, name, cond, 8) - column(cells, name, cond, n)


def _r(iv: Interval) -> dict[str, Any]:
    def f(x: float | None) -> float | None:
        return None if x is None else round(float(x), 4)

    return {"mean": f(iv.mean), "lo": f(iv.lo), "hi": f(iv.hi), "instances": iv.instances}


#: Named before anything was measured; Holm's correction runs over all of them.
PRIMARY = (
    "trained_beats_controls_at_64",  # city, 64: trained above untrained, random and nopass
    "trained_drop_beyond_nopass",  # city: trained's 8 -> 64 drop minus nopass's, > 0
    "trained_drop_beyond_oracle",  # city: trained's 8 -> 64 drop minus the oracle's, > 0
    "keys_explain_trained_drop",  # (city - keys_public) drop: trained's minus nopass's, > 0
    "global_desk_forces_a_drop",  # global_desk: nopass's 8 -> 64 drop > 0 (the world's)
    "trained_passes_keys",  # city, 64: trained publishes more keys than nopass (0)
)


def summarise(cells: dict[str, Any], agents: Sequence[int]) -> dict[str, Any]:
    have = {tuple(k.split("/")[:2]) for k in cells}
    table: dict[str, Any] = {}
    for key in sorted(cells):
        name, cond, n = key.split("/")
        table[key] = {
            "score": _r(over_instances(column(cells, name, cond, int(n)))),
            **{
                f: _r(over_instances(column(cells, name, cond, int(n), f)))
                for f in ("landed_per_agent", "talk_per_agent_second", "published")
            },
        }
    big = max(agents)
    drops = {
        f"{name}/{cond}/8-{n}": _r(over_instances(drop(cells, name, cond, n)))
        for name, cond in sorted(have)
        for n in agents
        if n != 8
    }
    vs = {  # trained minus each control, paired by instance, per condition and size
        f"trained-{c}/{cond}/{n}": _r(
            over_instances(column(cells, "trained", cond, n) - column(cells, c, cond, n))
        )
        for cond in CONDITIONS
        for n in agents
        for c in CONTROLS
        if ("trained", cond) in have and (c, cond) in have
    }
    did = {  # trained's drop minus each control's, paired by instance
        f"trained-{c}/{cond}/8-{n}": _r(
            over_instances(drop(cells, "trained", cond, n) - drop(cells, c, cond, n))
        )
        for cond in CONDITIONS
        for n in agents
        if n != 8
        for c in CONTROLS
        if ("trained", cond) in have and (c, cond) in have
    }

    def iv(x: np.ndarray) -> Interval:
        return over_instances(x)

    parts = {
        "trained_beats_controls_at_64": [
            (iv(column(cells, "trained", "city", big) - column(cells, c, "city", big)), 0.0)
            for c in ("untrained", "random", "nopass")
        ],
        "trained_drop_beyond_nopass": [
            (iv(drop(cells, "trained", "city", big) - drop(cells, "nopass", "city", big)), 0.0)
        ],
        "trained_drop_beyond_oracle": [
            (iv(drop(cells, "trained", "city", big) - drop(cells, "oracle", "city", big)), 0.0)
        ],
        "keys_explain_trained_drop": [
            (
                iv(
                    drop(cells, "trained", "city", big)
                    - drop(cells, "trained", "keys_public", big)
                    - drop(cells, "nopass", "city", big)
                    + drop(cells, "nopass", "keys_public", big)
                ),
                0.0,
            )
        ],
        "global_desk_forces_a_drop": [(iv(drop(cells, "nopass", "global_desk", big)), 0.0)],
        "trained_passes_keys": [
            (
                iv(
                    column(cells, "trained", "city", big, "published")
                    - column(cells, "nopass", "city", big, "published")
                ),
                0.0,
            )
        ],
    }
    raw = {k: claim_p(v) for k, v in parts.items()}
    adj = holm(raw)
    findings = {
        k: {
            "parts": [_r(p) for p, _ in parts[k]],
            "p": round(raw[k], 4),
            "p_holm": round(adj[k], 4),
            "verdict": "yes" if adj[k] < 0.05 else "no",
        }
        for k in PRIMARY
    }
    return {
        "cells": table,
        "drop": drops,
        "trained_minus_control": vs,
        "drop_trained_minus_control": did,
        "findings": findings,
        "statistics": "every interval: mean and 95% Student-t interval over task instances, "
        "paired by instance (the same world and sampling seeds in every cell); one training "
        "seed, so no interval covers training's own variance. Findings: two-sided t-test "
        f"p-values over instances, Holm-adjusted over the {len(PRIMARY)} primary findings "
        "named in advance (PRIMARY); yes when below 0.05 and on the claimed side.",
    }


def plot(summary: dict[str, Any], out: Path, agents: Sequence[int]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = summary["cells"]
    fig, axes = plt.subplots(1, len(CONDITIONS), figsize=(4.2 * len(CONDITIONS), 4), sharey=True)
    for ax, cond in zip(axes, CONDITIONS, strict=True):
        for name in POLICIES:
            pts = [
                (n, cells[f"{name}/{cond}/{n}"]["score"])
                for n in agents
                if f"{name}/{cond}/{n}" in cells
            ]
            pts = [(n, v) for n, v in pts if v["mean"] is not None]
            if not pts:
                continue
            ax.errorbar(
                [n for n, _ in pts],
                [v["mean"] for _, v in pts],
                yerr=[
                    [v["mean"] - v["lo"] for _, v in pts],
                    [v["hi"] - v["mean"] for _, v in pts],
                ],
                marker="o",
                capsize=3,
                label=name,
            )
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(agents), [str(n) for n in agents])
        ax.set(title=cond, xlabel="agents", ylim=(0, 1.02))
    axes[0].set_ylabel(f"score at {HORIZON:g} s (mean, 95% t over instances)")
    axes[0].legend(fontsize=8)
    fig.suptitle("Village to city with its controls: every policy under every condition")
    fig.tight_layout()
    fig.savefig(out / "scores.png", dpi=100)
    plt.close(fig)


def _t(v: dict[str, Any] | None) -> str:
    if v is None or v["mean"] is None:
        return "—"
    return f"{v['mean']:.3f} [{v['lo']:.3f}, {v['hi']:.3f}]"


def tables(summary: dict[str, Any], agents: Sequence[int]) -> str:
    """The README's tables, from the summary."""
    big = max(agents)
    head = "| condition | policy | " + " | ".join(str(n) for n in agents) + f" | drop 8 → {big} |"
    lines = [head, "|---|---|" + "---:|" * (len(agents) + 1)]
    for cond in CONDITIONS:
        for name in POLICIES:
            row = [_t(summary["cells"].get(f"{name}/{cond}/{n}", {}).get("score")) for n in agents]
            d = _t(summary["drop"].get(f"{name}/{cond}/8-{big}"))
            lines.append(f"| {cond} | {name} | " + " | ".join(row) + f" | {d} |")
    lines += [
        "",
        f"| trained minus control, paired by instance | at 8 | at {big} | drop 8 → {big} |",
    ]
    lines.append("|---|---:|---:|---:|")
    for cond in CONDITIONS:
        for c in CONTROLS:
            v = summary["trained_minus_control"]
            lines.append(
                f"| {cond}: trained − {c} | {_t(v.get(f'trained-{c}/{cond}/8'))} | "
                f"{_t(v.get(f'trained-{c}/{cond}/{big}'))} | "
                f"{_t(summary['drop_trained_minus_control'].get(f'trained-{c}/{cond}/8-{big}'))} |"
            )
    lines += ["", "| primary finding | parts (mean [95% CI]) | p | p (Holm) | verdict |"]
    lines.append("|---|---|---:|---:|---|")
    for k, f in summary["findings"].items():
        parts = "; ".join(_t(p) for p in f["parts"])
        lines.append(f"| {k} | {parts} | {f['p']:.3g} | {f['p_holm']:.3g} | {f['verdict']} |")
    lines += ["", "| keys made public by the end, city | " + " | ".join(map(str, agents)) + " |"]
    lines.append("|---|" + "---:|" * len(agents))
    for name in POLICIES:
        row = [_t(summary["cells"].get(f"{name}/city/{n}", {}).get("published")) for n in agents]
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--runs", type=Path, default=RUNS)
    ap.add_argument("--steps", type=int, default=30, help="the village's training steps")
    ap.add_argument("--agents", default=",".join(map(str, AGENTS)))
    ap.add_argument("--instances", type=int, default=INSTANCES)
    ap.add_argument("--summarise-only", action="store_true")
    a = ap.parse_args(argv)
    try:
        agents = [int(x) for x in a.agents.split(",")]
    except ValueError:
        print(f"city_controlled: --agents {a.agents!r}: want N,N,...", file=sys.stderr)
        return 2
    if 8 not in agents or any(n < 1 for n in agents) or a.instances < 2 or a.steps < 1:
        print(
            "city_controlled: --agents must include 8 (the village), --instances >= 2, "
            "--steps >= 1",
            file=sys.stderr,
        )
        return 2
    path = a.out / "cells.json"
    t0 = time.perf_counter()
    if a.summarise_only:
        if not path.exists():
            print(f"city_controlled: --summarise-only needs {path}", file=sys.stderr)
            return 2
        cells = json.loads(path.read_text())["cells"]
    else:
        cfg = village_config(a.steps)
        run = a.runs / "village-s0"
        what = train_exact(cfg, run, log=lambda s: print(s, flush=True))
        print(f"[village] {what} in {time.perf_counter() - t0:.0f} s", flush=True)
        cells = run_cells(
            run / "checkpoints" / "latest.pt", a.out, agents, CONDITIONS, POLICIES, a.instances
        )
    summary = summarise(cells, agents)
    summary["agents"], summary["instances"] = agents, a.instances
    metrics = a.runs / "village-s0" / "metrics.jsonl"
    summary["wall_seconds"] = {  # the run's and the cells' own, whichever invocation made them
        "village_training": round(read_metrics(metrics.parent)[-1].wall_time, 1)
        if metrics.exists()
        else None,
        "cells": round(sum(c["wall_seconds"] for c in cells.values()), 1),
    }
    (a.out / "summary.json").write_text(json.dumps(summary, indent=1))
    plot(summary, a.out, agents)
    (a.out / "tables.md").write_text(tables(summary, agents) + "\n")
    for k, f in summary["findings"].items():
        print(f"{f['verdict']:>3}  {k}: p {f['p']:.3g} (Holm {f['p_holm']:.3g})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
