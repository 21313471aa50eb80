"""Village to city: how a policy trained with a few agents behaves with many.

``collective study scale CHECKPOINT --world W --agents 1,2,4,...,4096`` runs the trained
policy, the same network untrained, and the random policy at every agent count, with several
seeds, and reports per count what carries over and what breaks: score at fixed time limits,
time to reach given scores, useful work per agent (the output tokens of world tool calls that
landed, ``collective.records.signs``: a refused call is not work), the duplicate-work rate, messages
per agent and per channel, mailbox overflow and the mean policy batch size. Worlds scale their
task with the agent count by their own knobs (workshop: ``size`` modules per agent; ``--param
modules=N`` fixes the task instead).
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import trio

from collective.base.latency import latency_preset
from collective.base.outputs import save_figure, write_file
from collective.engine.conductor import Conductor
from collective.records import Dropped, Episode, EpisodeConfig, Posted
from collective.records.signs import score_at, signs
from collective.rl.config import ClusterConfig
from policy.base import Policy


class ScaleConfig(msgspec.Struct, kw_only=True):
    checkpoint: str  # a tiny checkpoint (the trained policy); "" to skip trained/untrained
    world: str = "workshop"
    params: dict[str, Any] = {}
    org: str = "flat"
    agents: tuple[int, ...] = (1, 2, 4, 8, 16, 64, 256, 1024, 4096)
    seeds: int = 3
    horizon: float = 240.0  # T_max of every episode, simulated seconds
    limits: tuple[float, ...] = ()  # read the anytime score at these times (): T/4, T/2, T
    targets: tuple[float, ...] = (0.25, 0.5, 0.75)  # report the time to reach these scores
    policies: tuple[str, ...] = ("trained", "untrained", "random")
    latency: str = "tiny"
    max_output_tokens: int = 24
    seed: int = 0

    def __post_init__(self) -> None:
        h = self.horizon
        if not self.limits:
            self.limits = (h / 4, h / 2, h)
        checks = [
            (
                bool(self.agents) and min(self.agents) >= 1,
                f"--agents {self.agents}: at least one count, each >= 1",
            ),
            (self.seeds >= 1, f"--seeds {self.seeds}: must be >= 1"),
            (0 < h < math.inf, f"--horizon {h}: must be finite and > 0"),
            (
                bool(self.limits) and all(0 < x <= h for x in self.limits),
                f"--limits {self.limits}: each in (0, horizon {h:g}]",
            ),
            (
                bool(self.targets) and all(0 < x <= 1 for x in self.targets),
                f"--targets {self.targets}: scores, each in (0, 1]",
            ),
            (bool(self.policies) and all(self.policies), f"--policies {self.policies}: names"),
            (self.max_output_tokens >= 1, "max_output_tokens must be >= 1"),
            (0 <= self.seed < 2**64, "seed must be in 0..2**64-1"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(f"study: {msg}")


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
    # duplicated world actions / world actions; None: the world reports no "duplicates" metric
    duplicate_rate: float | None
    messages_per_agent: float
    posts_per_channel: float
    overflow_per_agent: float  # messages dropped at full mailboxes or evicted
    batch_mean: float  # mean policy batch size
    batch_largest: int
    turns_per_agent: float
    wall_seconds: float


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


def _configs(cfg: ScaleConfig, policy: str, n: int) -> list[EpisodeConfig]:
    return [
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
            policy=policy,
            keep_prompts=False,
        )
        for s in range(cfg.seeds)
    ]


def cell(cfg: ScaleConfig, name: str, policy: Policy, n: int) -> ScaleRow:
    configs = _configs(cfg, policy.name, n)
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
        duplicate_rate=(
            float(
                np.mean(
                    [
                        e.world_metrics["duplicates"] / max(w, 1)
                        for e, w in zip(eps, world_acts, strict=True)
                    ]
                )
            )
            if all("duplicates" in e.world_metrics for e in eps)
            else None  # not 0: a world that does not count duplicates has not shown there are none
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
    tasks spread over its workers (``remote_cell`` by ``collective.rl.cluster.tasks_on_workers``),
    with the same results (each cell is one conductor over its seeds, wherever it runs; only
    ``wall_seconds`` differs).
    """
    from collective.engine.limits import check_agents, world_footprint
    from collective.engine.registry import check_runnable, resolve_world
    from collective.world import convert_params

    cls = resolve_world(cfg.world)
    for n in sorted(set(cfg.agents)):  # a bad world or size: one line, before any cell runs
        # A cell runs its seeds' episodes at once: their agents and worlds, as a total, checked
        # before its configs are built (2^70 seeds would otherwise be built forever).
        each = world_footprint(cls, n, convert_params(cls, cfg.params, cfg.world), cfg.world)
        check_agents(
            cfg.seeds * n, f"study: a cell of {cfg.seeds:,} episodes", cfg.seeds * each, each
        )
        check_runnable(_configs(cfg, "", n)[0])
    policies = _policies(cfg)
    rows: list[ScaleRow] = []
    jobs = [(name, n) for n in cfg.agents for name in policies]
    say = Progress(cfg, jobs, cluster) if progress else None
    if cluster is not None and cluster.backend == "ray":
        from collective.rl.cluster import tasks_on_workers

        blob = Path(cfg.checkpoint).read_bytes() if cfg.checkpoint else None
        cells: Iterable[ScaleRow] = tasks_on_workers(
            remote_cell, [(cfg, name, n) for name, n in jobs], cluster, blob
        )
    else:
        cells = (cell(cfg, name, policies[name], n) for name, n in jobs)
    for row in cells:
        rows.append(row)
        if say is not None:
            say.done(row)
        if out is not None:  # keep what is done: a long study shows its results as it goes
            write(cfg, rows, out, plots=False)
    if out is not None:
        write(cfg, rows, out, plots=True)
    return rows


def _load() -> float:
    """Runnable processes per core this process may use (1: every core busy)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return os.getloadavg()[0] / (cores or 1)


def _took(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


# How a cell's seconds may grow with its agents, between two counts: no slower than in
# proportion (a fixed cost shared by more agents would otherwise predict a big cell nearly free)
# and no faster than the square (two noisy cells must not predict hours).
GROWTH = (1.0, 2.0)
# A cell shorter than this measures its start-up, not its agents: the first cell of a study of
# 1, 8, 64 and 512 agents took 0.04 s and predicted a fifth of what the others took.
MEASURABLE = 1.0


def cell_seconds(done: Sequence[tuple[int, float]], agents: int) -> float:
    """The seconds a cell of ``agents`` should take, from one policy's finished cells
    ``(agents, seconds)``: the latest measurable cell's time grown as ``agents ** b``, where
    ``b`` is read from the two latest measurable cells of different counts (bounded by
    ``GROWTH``; in proportion with only one, or from the latest cell when none is measurable)."""
    timed = [(n, s) for n, s in done if s >= MEASURABLE] or list(done[-1:])
    n1, s1 = timed[-1]
    b = GROWTH[0]
    earlier = next(((n, s) for n, s in reversed(timed) if n != n1), None)
    if earlier is not None:
        n0, s0 = earlier
        b = min(max(math.log(s1 / s0) / math.log(n1 / n0), GROWTH[0]), GROWTH[1])
    return s1 * (agents / n1) ** b


class Progress:
    """A line on stderr per finished cell, and the time left. A cell's cost grows with its
    agents, so a bar over cells would tell nothing: four cells of 1, 8, 64 and 512 agents are
    1% done after three. The estimate grows each policy's latest cell's
    time to the agents of each cell still to run (``cell_seconds``, divided over Ray's
    workers): rough (a busy machine slows what is left, and the line says when it is busy),
    refined with every cell, and given in all once every policy has run its first cell (the
    smallest counts come first when the counts are given smallest first)."""

    def __init__(
        self, cfg: ScaleConfig, jobs: Sequence[tuple[str, int]], cluster: ClusterConfig | None
    ) -> None:
        self.jobs, self.finished = list(jobs), 0
        self.cells: dict[str, list[tuple[int, float]]] = {}
        self.workers = cluster.rollout_workers if cluster and cluster.backend == "ray" else 1
        self.t0 = time.perf_counter()
        self.total_said = False
        episodes = len(jobs) * cfg.seeds
        self.say(
            f"study scale: {len(jobs)} cells ({len({p for p, _ in jobs})} policy(ies) x "
            f"{len(cfg.agents)} agent count(s)), {episodes} episodes of {cfg.horizon:g} simulated "
            f"s; a cell's time grows with its agents ({sum(n for _, n in jobs) * cfg.seeds:,} "
            "agent-episodes in all): the time expected is given once every policy has run a cell"
        )

    @staticmethod
    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    def done(self, row: ScaleRow) -> None:
        self.finished += 1
        self.cells.setdefault(row.policy, []).append((row.agents, row.wall_seconds))
        rest = self.jobs[self.finished :]
        line = (
            f"study scale: cell {self.finished}/{len(self.jobs)}: {row.policy} x {row.agents} "
            f"agents, score {row.score:.3f}, {_took(row.wall_seconds)}"
        )
        if rest and all(p in self.cells for p, _ in rest):
            left = sum(cell_seconds(self.cells[p], n) for p, n in rest) / self.workers
            line += f"; about {_took(left)} left"
            if not self.total_said:
                self.total_said = True
                spent = time.perf_counter() - self.t0
                line += f" (expected: about {_took(spent + left)} in all)"
            if (load := _load()) > 1.5:
                line += f" if the machine stays as busy (load {load:.1f} a core)"
        self.say(line)


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
    ("time_to", "time to score {target} (s), over the seeds\nthat reached it (k/n: how many)"),
)


def heading(cfg: ScaleConfig) -> str:
    seeds = f"{cfg.seeds} seed{'s' * (cfg.seeds != 1)}"
    return f"Village to city: {cfg.world}, horizon {cfg.horizon:g} s, {seeds}"


def unreached(rows: Sequence[ScaleRow], target: str, horizon: float) -> str | None:
    """What the time-to-score panel says when it has nothing to draw: no cell reached it."""
    if any(r.time_to.get(target) is not None for r in rows):
        return None
    return f"no cell reached a score\nof {target} within {horizon:g} s"


def plot(rows: Sequence[ScaleRow], path: Path, cfg: ScaleConfig) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 4, figsize=(16, 7.5))
    target = f"{cfg.targets[0]:g}"
    for ax, (field, title) in zip(axes.flat, PANELS, strict=True):
        for name in cfg.policies:
            mine = [r for r in rows if r.policy == name]
            pts = [
                (r.agents, r.time_to.get(target) if field == "time_to" else getattr(r, field), r)
                for r in mine
            ]
            pts = [(x, y, r) for x, y, r in pts if y is not None and not math.isnan(y)]
            if pts:
                (line,) = ax.plot([x for x, _, _ in pts], [y for _, y, _ in pts], marker="o")
                line.set_label(name)
            if field == "time_to":  # a mean of the seeds that got there: say how many did
                for x, y, r in pts:
                    k = round(r.reached[target] * r.seeds)
                    ax.annotate(
                        f"{k}/{r.seeds}",
                        (x, y),
                        fontsize=7,
                        xytext=(3, 3),
                        textcoords="offset points",
                        color=line.get_color(),
                    )
        if field == "time_to" and (note := unreached(rows, target, cfg.horizon)):
            ax.text(0.5, 0.5, note, ha="center", va="center", transform=ax.transAxes, color="grey")
        if field == "duplicate_rate" and all(r.duplicate_rate is None for r in rows):
            ax.text(
                0.5,
                0.5,
                f"not reported:\n{cfg.world} counts no\n'duplicates' metric",
                ha="center",
                va="center",
                transform=ax.transAxes,
                color="grey",
            )
        ax.set_xscale("log", base=2)
        ax.set(xlabel="agents", title=title.format(target=target))
        if field in ("batch_mean",):
            ax.set_yscale("log")
    axes.flat[0].legend()
    fig.suptitle(heading(cfg))
    fig.tight_layout()
    save_figure(fig, path, "--out", dpi=100)
    plt.close(fig)
