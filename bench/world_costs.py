"""Calibrate the built-in worlds and measure what they cost per call as the collective grows.

Three measurements, printed and saved to ``bench/results/worlds/`` (``worlds.json`` and
``worlds.png``):

1. **calibration**: the mean score of the random policy and of a simple competent scripted
   policy, by world, team size and time limit (``tiny`` latency preset, the one training uses),
   so a training config can pick a time limit where a learner has room to improve;
2. **cost per call**: the real time of ``observe``, a tool call and ``score`` at 10 to 10,000
   agents, and the ratio of the largest to the smallest (flat means O(1) per call);
3. **sandbox**: the real time of one repo ``test`` run (a fresh confined Python answering the
   suite's calls), the cost a ``hybrid`` clock charges, with and without namespaces.

Run: ``python bench/world_costs.py [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import trio

from collective import EpisodeConfig, ToolError, World, run_episodes
from collective.base.latency import PRESETS
from policy.base import PolicyRequest
from policy.scripted import ScriptedPolicy
from policy.uniform import RandomPolicy
from worlds.market import Market
from worlds.relay import Relay
from worlds.repo import Repo, escape
from worlds.repo_tasks import TASKS
from worlds.sandbox import UNSHARE
from worlds.workshop import Workshop

_HERE = Path(__file__).resolve().parent

OUT = Path(__file__).parent / "results" / "worlds"


# -- competent scripted policies: what a trained collective should at least match ------------


def workshop_policy(req: PolicyRequest) -> str:
    wanted = re.search(r"wanted: (k\d+)", req.prompt)
    return f'post all "{wanted.group(1)}"' if wanted else "work 1"


def relay_policy(req: PolicyRequest) -> str:
    lines = req.prompt.split("\n")
    starts = re.findall(r"p(\d+) starts (\w+) \(end: agent (\d+)\)", lines[0])
    ends = dict(re.findall(r"p(\d+) ends (\w+)", lines[0]))
    inbox = " ".join(line for line in lines if line.startswith("inbox"))
    for part, first in re.findall(r"p(\d+) starts (\w+)", inbox):
        if part in ends:
            return f"submit {part} {first} {ends[part]}"
    for part, first, other in starts:
        if int(other) == req.agent:  # holds both halves (a solo agent)
            return f"submit {part} {first} {ends[part]}"
    if starts:
        part, first, other = starts[req.turn % len(starts)]
        return f'msg {other} "p{part} starts {first}"'
    return "wait 0"


def market_policy(req: PolicyRequest) -> str:
    obs = req.prompt.split("\n")[0]
    screen = obs.split("drifts")[0].split("holding")[0]
    prices = {int(i): float(p) for i, p in re.findall(r"i(\d+) (\d+\.\d)", screen)}
    drifts = dict(re.findall(r"i(\d+) (up|down) [\d.]+", obs))
    held = {int(i): (s, float(e)) for i, s, e in re.findall(r"i(\d+) (long|short)@(\d+\.\d)", obs)}
    for i, (side, entry) in held.items():
        p = prices.get(i)
        if p is not None and (p > entry + 4 if side == "long" else p < entry - 4):
            return f"{'sell' if side == 'long' else 'buy'} {i}"
    for i, d in drifts.items():
        if int(i) not in held and len(held) < 2:
            return f"{'buy' if d == 'up' else 'sell'} {i}"
    for i in prices:
        if str(i) not in drifts:
            return f"research {i}"
    return "wait 10"


POLICIES: dict[str, Callable[[PolicyRequest], str]] = {
    "workshop": workshop_policy,
    "relay": relay_policy,
    "market": market_policy,
}


def calibrate(teams: list[int], limits: list[float], seeds: int) -> list[dict[str, object]]:
    rows = []
    for world, script in POLICIES.items():
        for n in teams:
            for limit in limits:
                cfgs = [
                    EpisodeConfig(
                        world=world,
                        agents=n,
                        world_seed=s,
                        sample_seed=s,
                        time_limit=limit,
                        latency=PRESETS["tiny"],
                    )
                    for s in range(seeds)
                ]
                row: dict[str, object] = {"world": world, "agents": n, "time_limit": limit}
                for name, policy in (("random", RandomPolicy()), ("scripted", None)):
                    eps = run_episodes(cfgs, policy or ScriptedPolicy(script), concurrency=seeds)
                    row[name] = round(statistics.mean(e.score for e in eps), 3)
                    row[f"{name}_turns_per_agent"] = round(
                        statistics.mean(e.stats.turns for e in eps) / n, 1
                    )
                rows.append(row)
                print(
                    f"{world:9s} agents={n:3d} T={limit:5g}  random {row['random']:.3f}  "
                    f"scripted {row['scripted']:.3f}"
                )
    return rows


def _try(fn: Callable[..., object], *args: object) -> object:
    try:
        return fn(*args)
    except ToolError as e:  # a refused call costs the same bookkeeping
        return e


def _per_call(fn: Callable[[], object], repeat: int) -> float:
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - t0) / repeat


def _costs(w: World, call: Callable[[World, int], object]) -> dict[str, float]:
    """Seconds per call of observe, one tool and score, over agents spread across the world."""
    agents = list(range(0, w.n_agents, max(1, w.n_agents // 200)))
    w.now = 100.0
    return {
        "observe": _per_call(lambda: [w.observe(a) for a in agents], 5) / len(agents),
        "tool": _per_call(lambda: [call(w, a) for a in agents], 1) / len(agents),
        "score": _per_call(w.score, 2000),
    }


def cost(sizes: list[int]) -> dict[str, dict[str, list[float]]]:
    makers: dict[str, Callable[[int], World]] = {
        "workshop": lambda n: Workshop(n_agents=n, seed=1, knowledge=0.0),
        "relay": lambda n: Relay(n_agents=n, seed=1),
        "market": lambda n: Market(n_agents=n, seed=1),
    }
    tools: dict[str, Callable[[World, int], object]] = {
        "workshop": lambda w, a: w.work(a, 1),  # type: ignore[attr-defined]
        "relay": lambda w, a: _try(w.submit, a, a % w.parts, "ka", "ka"),  # type: ignore[attr-defined]
        "market": lambda w, a: w.research(a, a % w.instruments),  # type: ignore[attr-defined]
    }
    out: dict[str, dict[str, list[float]]] = {}
    for name, make in makers.items():
        res: dict[str, list[float]] = {"observe": [], "tool": [], "score": []}
        for n in sizes:
            for key, seconds in _costs(make(n), tools[name]).items():
                res[key].append(seconds)
        out[name] = res
        ratio = {k: round(v[-1] / v[0], 2) for k, v in res.items()}
        print(f"{name:9s} per call at {sizes[0]} vs {sizes[-1]} agents: ratio {ratio}")
    return out


def sandbox(runs: int) -> dict[str, object]:
    """Real time of one ``test`` run per task, the reference solution in place (every call
    answered), with the namespaces agents get and without them (opted in, as on a machine
    that has none)."""
    out: dict[str, object] = {}
    for label, unshare in (("namespaces", None), ("without_namespaces", "")):
        if unshare is not None:
            os.environ[UNSHARE] = unshare
        try:
            per_task: dict[str, float] = {}
            times: list[float] = []
            for task in TASKS:
                w = Repo(task=task.name, allow_without_namespaces=unshare is not None)
                try:
                    for path, text in task.solution.items():
                        w.write(0, path, escape(text))
                    mine = []
                    for _ in range(runs):
                        t0 = time.perf_counter()
                        assert trio.run(w.test, 0).endswith("passed") and w.score() == 1.0
                        mine.append(time.perf_counter() - t0)
                    per_task[f"{task.name} ({len(w.suite.calls)} calls)"] = round(
                        statistics.mean(mine), 4
                    )
                    times += mine
                    out[f"confinement_{label}"] = w.confinement
                finally:
                    w.close()
        finally:
            os.environ.pop(UNSHARE, None)
        out[f"test_run_mean_s_{label}"] = round(statistics.mean(times), 4)
        out[f"test_run_max_s_{label}"] = round(max(times), 4)
        out[f"per_task_mean_s_{label}"] = per_task
    return out


def plot(
    rows: list[dict[str, object]], costs: dict[str, dict[str, list[float]]], sizes: list[int]
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    worlds = list(POLICIES)
    fig, axes = plt.subplots(1, len(worlds) + 1, figsize=(5 * (len(worlds) + 1), 4))
    for ax, world in zip(axes, worlds, strict=False):
        for n in sorted({r["agents"] for r in rows}):  # type: ignore[type-var]
            mine = [r for r in rows if r["world"] == world and r["agents"] == n]
            xs = [r["time_limit"] for r in mine]
            (line,) = ax.plot(xs, [r["scripted"] for r in mine], "-o", label=f"{n} scripted")
            random_scores = [r["random"] for r in mine]
            ax.plot(xs, random_scores, "--x", color=line.get_color(), label=f"{n} random")
        ax.set_title(f"{world}: score at the time limit")
        ax.set_xlabel("time limit T_max (simulated s)")
        ax.set_ylim(-0.02, 1.02)
        ax.legend(fontsize=7, ncol=2)
    ax = axes[-1]
    for world, res in costs.items():
        ax.loglog(sizes, [t * 1e6 for t in res["observe"]], "-o", label=f"{world} observe")
        ax.loglog(sizes, [t * 1e6 for t in res["tool"]], "--x", label=f"{world} tool")
    ax.set_title("real cost per call")
    ax.set_xlabel("agents")
    ax.set_ylabel("microseconds")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(OUT / "worlds.png", dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer seeds, sizes and limits")
    a = p.parse_args(argv)
    teams = [1, 4] if a.quick else [1, 2, 4, 8, 16]
    limits = [150.0, 600.0] if a.quick else [75.0, 150.0, 300.0, 600.0]
    seeds = 3 if a.quick else 8
    sizes = [10, 1000] if a.quick else [10, 100, 1000, 10_000]
    OUT.mkdir(parents=True, exist_ok=True)
    rows = calibrate(teams, limits, seeds)
    costs = cost(sizes)
    box = sandbox(5 if a.quick else 20)
    print(f"repo test run: {box}")
    result = {
        "calibration": rows,
        "cost_sizes": sizes,
        "cost_seconds_per_call": costs,
        "cost_ratio_largest_to_smallest": {
            w: {k: round(v[-1] / v[0], 3) for k, v in res.items()} for w, res in costs.items()
        },
        "sandbox": box,
        "python": sys.version.split()[0],
    }
    (OUT / "worlds.json").write_text(json.dumps(result, indent=1))
    plot(rows, costs, sizes)
    print(f"wrote {OUT / 'worlds.json'} and {OUT / 'worlds.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
