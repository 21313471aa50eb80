"""Village to city: how a policy trained with a few agents behaves with many.

``collective study scale CHECKPOINT --world W --agents 1,2,4,...,4096`` runs the trained
policy, the same network untrained, and the random policy at every agent count, with several
seeds, and reports per count what carries over and what breaks: score at fixed time limits,
time to reach given scores, useful work per agent (the output tokens of world tool calls that
landed, ``collective.signs``: a refused call is not work), the duplicate-work rate, messages
per agent and per channel, mailbox overflow and the mean policy batch size. Worlds scale their
task with the agent count by their own knobs (workshop: ``size`` modules per agent; ``--param
modules=N`` fixes the task instead).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import trio

from collective.conductor import Conductor
from collective.config import ClusterConfig
from collective.latency import latency_preset
from collective.outputs import save_figure, write_file
from collective.records import Dropped, Episode, EpisodeConfig, Posted
from collective.signs import signs
from policy.base import Policy


class ScaleConfig(msgspec.Struct, kw_only=True):
    checkpoint: str  # a tiny checkpoint (the trained policy); "" to skip trained/untrained
    world: str = "workshop"
    params: dict[str, Any] = {}
    org: str = "flat"
    agents: tuple[int, ...] = (1, 2, 4, 8, 16, 64, 256, 1024, 4096)
    seeds: int = 3
    horizon: float = 240.0  # T_max of every episode, simulated seconds
    limits: tuple[float, ...] = (60.0, 120.0, 240.0)  # read the anytime score at these times
    targets: tuple[float, ...] = (0.25, 0.5, 0.75)  # report the time to reach these scores
    policies: tuple[str, ...] = ("trained", "untrained", "random")
    latency: str = "tiny"
    max_output_tokens: int = 24
    seed: int = 0


class ScaleRow(msgspec.Struct, kw_only=True):
    """One (policy, agent count) cell, averaged over seeds."""

    policy: str
    agents: int
    seeds: int
    score: float  # at the horizon
    score_at: dict[str, float]  # at each fixed limit
    time_to: dict[str, float | None]  # mean time to reach each target (None: no seed did)
    reached: dict[str, float]  # fraction of seeds that reached each target
    useful_per_agent: float  # output tokens of world calls that landed, per agent taking part
    world_actions_per_agent: float
    duplicate_rate: float  # duplicated world actions / world actions (if the world counts them)
    messages_per_agent: float
    posts_per_channel: float
    overflow_per_agent: float  # messages dropped at full mailboxes or evicted
    batch_mean: float  # mean policy batch size
    batch_largest: int
    turns_per_agent: float
    wall_seconds: float


def score_at(ep: Episode, t: float) -> float:
    """The anytime score at simulated time t (a step function of the episode's curve)."""
    value = 0.0
    for when, s in ep.curve:
        if when > t:
            break
        value = s
    return value


def time_to(ep: Episode, target: float) -> float | None:
    return next((t for t, s in ep.curve if s >= target - 1e-12), None)


def _policies(cfg: ScaleConfig) -> dict[str, Policy]:
    """The study's policies by name, built from ``cfg.checkpoint`` (the random one needs none)."""
    from policy.tiny import TinyModel, TinyPolicy
    from policy.uniform import RandomPolicy

    out: dict[str, Policy] = {}
    if cfg.checkpoint:
        trained = TinyModel.load(cfg.checkpoint)
        out["trained"] = TinyPolicy(trained, name=f"tiny:{cfg.checkpoint}")
        out["untrained"] = TinyPolicy(TinyModel.fresh(trained.config), name="tiny (untrained)")
    out["random"] = RandomPolicy()
    missing = [p for p in cfg.policies if p not in out]
    if missing:
        raise ValueError(f"study: policies {missing} need a checkpoint")
    return {p: out[p] for p in cfg.policies}


_OVERFLOW = ("mailbox_full", "evicted")


def cell(cfg: ScaleConfig, name: str, policy: Policy, n: int) -> ScaleRow:
    configs = [
        EpisodeConfig(
            world=cfg.world,
            params=dict(cfg.params),
            org=cfg.org,
            agents=n,
            world_seed=cfg.seed * 1000 + s,
            sample_seed=s,
            time_limit=cfg.horizon,
            latency=latency_preset(cfg.latency),
            max_output_tokens=cfg.max_output_tokens,
            policy=policy.name,
            keep_prompts=False,
        )
        for s in range(cfg.seeds)
    ]
    conductor = Conductor(policy)
    t0 = time.perf_counter()
    eps: list[Episode] = trio.run(lambda: conductor.play(configs, concurrency=len(configs)))
    wall = time.perf_counter() - t0
    world_acts = [sum(1 for t in e.turns if t.kind == "world") for e in eps]
    channels = [max(1, len({ev.channel for ev in e.events if isinstance(ev, Posted)})) for e in eps]
    times = {f"{x:g}": [time_to(e, x) for e in eps] for x in cfg.targets}
    # Overflow: messages lost to a full mailbox (refused, or pushed out unread); not those
    # refused for an address that does not exist or may not be reached.
    overflow = [
        sum(1 for ev in e.events if isinstance(ev, Dropped) and ev.reason in _OVERFLOW) for e in eps
    ]
    return ScaleRow(
        policy=name,
        agents=n,
        seeds=len(eps),
        score=float(np.mean([e.score for e in eps])),
        score_at={f"{t:g}": float(np.mean([score_at(e, t) for e in eps])) for t in cfg.limits},
        time_to={
            k: (
                float(np.mean([t for t in v if t is not None]))
                if any(t is not None for t in v)
                else None
            )
            for k, v in times.items()
        },
        reached={k: sum(t is not None for t in v) / len(v) for k, v in times.items()},
        useful_per_agent=float(np.mean([signs(e).landed_per_agent for e in eps])),
        world_actions_per_agent=float(np.mean(world_acts)) / n,
        duplicate_rate=float(
            np.mean(
                [
                    e.world_metrics.get("duplicates", 0.0) / max(w, 1)
                    for e, w in zip(eps, world_acts, strict=True)
                ]
            )
        ),
        messages_per_agent=float(np.mean([e.stats.sent / n for e in eps])),
        posts_per_channel=float(
            np.mean([e.stats.posts / c for e, c in zip(eps, channels, strict=True)])
        ),
        overflow_per_agent=float(np.mean(overflow)) / n,
        batch_mean=conductor.batch_stats.mean,
        batch_largest=conductor.batch_stats.largest,
        turns_per_agent=float(np.mean([e.stats.turns / n for e in eps])),
        wall_seconds=wall,
    )


def remote_cell(cfg: ScaleConfig, name: str, n: int, checkpoint: bytes | None) -> ScaleRow:
    """(A Ray task.) One cell, its policy built here from the checkpoint's bytes (the node
    running it need not have the file)."""
    import os
    import tempfile

    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        if checkpoint is not None:
            path = os.path.join(tmp, "policy.pt")
            with open(path, "wb") as f:
                f.write(checkpoint)
            cfg = msgspec.structs.replace(cfg, checkpoint=path)
        policy = _policies(msgspec.structs.replace(cfg, policies=(name,)))[name]
        return cell(cfg, name, policy, n)


def scale_study(
    cfg: ScaleConfig,
    out: Path | None = None,
    progress: bool = True,
    cluster: ClusterConfig | None = None,
) -> list[ScaleRow]:
    """Every (policy, agent count) cell, in order; with a Ray ``cluster``, the cells run as Ray
    tasks spread over its workers (``remote_cell`` by ``collective.cluster.tasks_on_workers``),
    with the same results (each cell is one conductor over its seeds, wherever it runs; only
    ``wall_seconds`` differs).
    """
    from tqdm import tqdm

    policies = _policies(cfg)
    rows: list[ScaleRow] = []
    jobs = [(name, n) for n in cfg.agents for name in policies]
    if cluster is not None and cluster.backend == "ray":
        from collective.cluster import tasks_on_workers

        blob = Path(cfg.checkpoint).read_bytes() if cfg.checkpoint else None
        cells: Iterable[ScaleRow] = tasks_on_workers(
            remote_cell, [(cfg, name, n) for name, n in jobs], cluster, blob
        )
    else:
        cells = (cell(cfg, name, policies[name], n) for name, n in jobs)
    for row in tqdm(cells, total=len(jobs), disable=not progress, desc="scale", unit="cell"):
        rows.append(row)
        if out is not None:  # keep what is done: a long study shows its results as it goes
            write(cfg, rows, out, plots=False)
    if out is not None:
        write(cfg, rows, out, plots=True)
    return rows


def write(cfg: ScaleConfig, rows: Sequence[ScaleRow], out: Path, plots: bool) -> None:
    write_file(
        out / "scale.json",
        msgspec.json.format(msgspec.json.encode({"config": cfg, "rows": rows}), indent=1),
        "--out",
    )
    if plots:
        plot(rows, out / "scale.png", cfg)


PANELS = (
    ("score", "score at the horizon"),
    ("useful_per_agent", "landed work tokens per agent"),
    ("duplicate_rate", "duplicated work / world actions"),
    ("messages_per_agent", "messages per agent"),
    ("posts_per_channel", "posts per channel"),
    ("overflow_per_agent", "mailbox overflow per agent"),
    ("batch_mean", "mean policy batch size"),
    ("time_to", "time to reach score {target} (s)"),
)


def plot(rows: Sequence[ScaleRow], path: Path, cfg: ScaleConfig) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 4, figsize=(16, 7.5))
    target = f"{cfg.targets[0]:g}"
    for ax, (field, title) in zip(axes.flat, PANELS, strict=True):
        for name in cfg.policies:
            pts = [
                (r.agents, r.time_to.get(target) if field == "time_to" else getattr(r, field))
                for r in rows
                if r.policy == name
            ]
            pts = [(x, y) for x, y in pts if y is not None and not math.isnan(y)]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set(xlabel="agents", title=title.format(target=target))
        if field in ("batch_mean",):
            ax.set_yscale("log")
    axes.flat[0].legend()
    fig.suptitle(f"Village to city: {cfg.world}, horizon {cfg.horizon:g} s, {cfg.seeds} seeds")
    fig.tight_layout()
    save_figure(fig, path, "--out", dpi=100)
    plt.close(fig)
