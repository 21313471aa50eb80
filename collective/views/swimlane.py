"""An episode as a swimlane picture (``collective show ep.msgpack --png timeline.png``).

One lane per agent, on the simulated clock: thinking, working (world tools), communicating, a
refused call and waiting in five colours, each lane spanning the agent's life (a hired agent's
lane starts when it was hired, a fired one's ends with a cross); every delivered message a thin
arrow from the sender's lane when it was delivered to the receiver's lane when it was read;
posts as ticks; and above the lanes, the anytime score. What the world does itself (its
scheduled events, its posts, a world error) is on a ``world`` lane above the agents', where an
episode has any: for a world with timed events they are what explains the agents' lanes. Past
``MAX_LANES`` agents the picture shows the first ``MAX_LANES`` and says so in its title: a lane
thinner than that is no longer readable.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from collective.base.outputs import save_figure
from collective.records import Episode, EpisodeStream, Spawned
from collective.views.timeline import (
    COMM,
    LIFE,
    THINK,
    WAIT,
    WORK,
    ArrowIn,
    ArrowOut,
    Board,
    Close,
    Mark,
    Open,
    activity,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

MAX_LANES = 64
REFUSED = "refused"  # a tool call or primitive the world or engine refused (ok = False)
COLOURS = {
    THINK: "#4c72b0",
    WORK: "#55a868",
    COMM: "#dd8452",
    REFUSED: "#c44e52",
    WAIT: "#d5d5d5",
}
LABELS = {
    THINK: "thinking",
    WORK: "working (world tools)",
    COMM: "communicating",
    REFUSED: "refused call",
    WAIT: "waiting",
}
WORLD_COLOUR = "#c9a100"  # the world's own events and posts, on its lane


@dataclass
class Lanes:
    """What the picture draws, read from the episode's activity."""

    agents: list[int]  # the lanes, top to bottom
    total: int  # agents in the episode, hired ones included
    hired: int  # of them, hired during it
    spans: dict[str, list[tuple[int, float, float]]] = field(default_factory=dict)  # kind -> ...
    life: dict[int, tuple[float, float, str]] = field(default_factory=dict)  # agent -> born, end
    roles: dict[int, str] = field(default_factory=dict)
    messages: list[tuple[int, float, int, float]] = field(default_factory=list)  # from, t, to, t
    hires: list[tuple[int, float, int]] = field(default_factory=list)  # by, t, new
    posts: list[tuple[int, float]] = field(default_factory=list)
    rejected: list[tuple[int, float]] = field(default_factory=list)
    calls: int = 0  # tool calls and primitives that ended, on every lane drawn or not
    refused: int = 0  # of them, refused
    world: list[tuple[float, str, str]] = field(default_factory=list)  # t, event|post|error, what


def lanes(
    ep: Episode | EpisodeStream,
    max_lanes: int = MAX_LANES,
    progress: Callable[[float], None] | None = None,
) -> Lanes:
    """What the picture draws; ``progress`` is told the simulated time read so far, now and
    then (the reading is most of a big episode's drawing)."""
    spawned = [e for e in ep.events if type(e) is Spawned]
    shown = set(sorted(e.agent for e in spawned)[:max_lanes])
    hired = sum(e.by >= 0 for e in spawned)
    out = Lanes(sorted(shown), len(spawned), hired, {k: [] for k in COLOURS})
    open_: dict[int, list[float]] = {}
    tails: dict[int, ArrowOut] = {}
    for n, item in enumerate(activity(ep)):
        if progress is not None and n % 4096 == 0:
            progress(item.t)
        match item:
            case Open(agent=a, t=t, kind=kind, args=args) if a in shown:
                open_.setdefault(a, []).append(t)
                if kind == LIFE:
                    out.roles[a] = args["role"]
            case Close(agent=a, t=t, kind=kind, args=args) if a in shown:
                start = open_[a].pop()
                if kind == LIFE:
                    out.life[a] = (start, t, args.get("end", ""))
                    continue
                # A refused call took its time as one that landed did, but achieved nothing:
                # drawn in its own colour, so a team that is mostly refused does not look busy.
                refused = kind in (WORK, COMM) and args.get("ok") is False
                out.spans[REFUSED if refused else kind].append((a, start, t))
                out.calls += kind in (WORK, COMM)
                out.refused += refused
            case Close(kind=kind, args=args) if kind in (WORK, COMM):
                out.calls += 1
                out.refused += args.get("ok") is False
            case Mark(agent=a, t=t, name="tool error" | "rejected" as name):
                # a call refused before it began, or an answer that was no action at all
                out.calls += name == "tool error"
                out.refused += name == "tool error"
                if a in shown:
                    out.rejected.append((a, t))
            case Board(t=t, name=name, args=args) if args.get("by") == "world":
                what = args.get("text", name) if name == "post" else name
                kind = "post" if name == "post" else "error" if name == "world error" else "event"
                out.world.append((t, kind, what))
            case ArrowOut(kind="post", agent=a, t=t) if a in shown:
                out.posts.append((a, t))
            case ArrowOut(id=i):
                tails[i] = item
            case ArrowIn(id=i, kind=kind, to=to, t=t):
                tail = tails.pop(i, None)
                if tail is None or tail.agent not in shown or to not in shown:
                    continue
                assert isinstance(to, int)
                if kind == "msg":
                    out.messages.append((tail.agent, tail.t, to, t))
                else:
                    out.hires.append((tail.agent, tail.t, to))
    return out


def title(ep: Episode | EpisodeStream, data: Lanes) -> str:
    """The picture's title: the team as configured (``--agents``), the hires beside it, not in
    it, and which lanes are drawn when not all are."""
    c, n = ep.config, len(data.agents)
    team = f"{c.agents} agent{'s' * (c.agents != 1)}"
    if data.hired:
        team += f" + {data.hired} hired"
    if data.total > n:
        team += f" (lanes of agents {data.agents[0]}-{data.agents[-1]} of {data.total})"
    policy = f", policy {c.policy}" if c.policy else ""
    text = f"{c.world}, {team}, org {c.org}{policy}: score {ep.score:.3f}"
    text += f" at {ep.duration:g} s ({ep.end})"
    if data.refused:
        text += f"; {data.refused:,} of {data.calls:,} calls refused"
    if data.total > n:
        text += f"\n(only the first {n} lanes are drawn; `collective trace` shows every agent)"
    return text


def draw_timeline(
    ep: Episode | EpisodeStream,
    path: str | Path,
    max_lanes: int = MAX_LANES,
    progress: Callable[[float], None] | None = None,
) -> Path:
    """Draw the episode's swimlanes and score curve into a PNG; returns the path. ``progress``:
    see ``lanes``. The score above, the agents' lanes (and the world's) below, their labels,
    the legend: one function each, in the order they are drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = lanes(ep, max_lanes, progress)
    end = max(ep.duration, 1e-9)
    lane_height = min(max(1.6, 0.42 * len(data.agents)), 10.0)
    fig, (top, ax) = plt.subplots(
        2,
        1,
        figsize=(11, 1.9 + lane_height),
        sharex=True,
        gridspec_kw={"height_ratios": [1.4, lane_height], "hspace": 0.06},
    )
    fig.subplots_adjust(
        left=0.09,
        right=0.985,
        top=1 - 0.42 / (1.9 + lane_height),
        bottom=0.78 / (1.9 + lane_height),
    )
    _draw_score(top, ep, title(ep, data), end)
    _draw_lanes(ax, data, end)
    _draw_world(ax, data)
    _label_lanes(fig, ax, data, end)
    _draw_legend(fig, data)
    path = Path(path)
    save_figure(fig, path, "--png")
    plt.close(fig)
    return path


def _draw_score(top: Axes, ep: Episode | EpisodeStream, heading: str, end: float) -> None:
    """The anytime score as a step curve over the episode, under the picture's title."""
    ts = [t for t, _ in ep.curve] + [end]
    scores = [s for _, s in ep.curve] + [ep.curve[-1][1]]
    top.step(ts, scores, where="post", color="black", lw=1.4)
    top.fill_between(ts, scores, step="post", color="black", alpha=0.08)
    top.set_ylim(0, 1.02)
    top.set_ylabel("score")
    top.grid(axis="y", color="#e5e5e5", lw=0.6)
    for side in ("top", "right"):
        top.spines[side].set_visible(False)
    top.set_title(heading, fontsize=10, loc="left")


def _draw_lanes(ax: Axes, data: Lanes, end: float) -> None:
    """Each agent's lane: its life, its spans by colour, the messages between lanes as arrows,
    hires, posts and the answers that were no action. Lane ``i`` is at ``y = i``."""
    n = len(data.agents)
    row = {a: i for i, a in enumerate(data.agents)}
    h = 0.72
    for a, (born, died, why) in data.life.items():
        y = row[a]
        ax.barh(y, died - born, left=born, height=0.9, color="#f4f4f4", edgecolor="none", zorder=0)
        if why.startswith("fired"):
            ax.plot(died, y, marker="x", color="#b22222", ms=7, mew=1.6, zorder=5)
    for kind, spans in data.spans.items():
        by_lane: dict[int, list[tuple[float, float]]] = {}
        for a, s, e in spans:
            by_lane.setdefault(a, []).append((s, max(e - s, end * 1e-4)))
        for a, bars in by_lane.items():
            ax.broken_barh(
                bars, (row[a] - h / 2, h), facecolors=COLOURS[kind], edgecolor="none", zorder=1
            )
    if data.messages:
        x0 = [m[1] for m in data.messages]
        y0 = [row[m[0]] for m in data.messages]
        dx = [m[3] - m[1] for m in data.messages]
        dy = [row[m[2]] - row[m[0]] for m in data.messages]
        many = len(data.messages)  # fainter as they crowd, so the lanes stay legible
        ax.quiver(
            x0,
            y0,
            dx,
            dy,
            angles="xy",
            scale_units="xy",
            scale=1,
            color="#5b2a86",
            width=0.0012 if n <= 16 else 0.0007,
            headwidth=5,
            headlength=6,
            headaxislength=5,
            alpha=min(0.8, 0.15 + 60 / many),
            zorder=3,
        )
    for by, t, new in data.hires:
        ax.annotate(
            "",
            xy=(t, row[new]),
            xytext=(t, row[by]),
            zorder=4,
            arrowprops={"arrowstyle": "-|>", "color": "#b22222", "lw": 1.0},
        )
    if data.posts:
        ax.scatter(
            [t for _, t in data.posts],
            [row[a] - h / 2 for a, _ in data.posts],
            marker="^",
            s=14 if n <= 16 else 6,
            color="black",
            lw=0,
            zorder=4,
        )
    if data.rejected:
        ax.scatter(
            [t for _, t in data.rejected],
            [row[a] for a, _ in data.rejected],
            marker="|",
            s=30,
            color="#b22222",
            zorder=4,
        )


def _draw_world(ax: Axes, data: Lanes) -> None:
    """The world's own events, posts and error on its lane above the agents' (``y = -1``)."""
    # events a little above the lane's middle and posts a little below, so that an event that
    # posts (a fire breaking out, announced) shows both
    marks = {"event": ("D", -1.18), "post": ("^", -0.8), "error": ("X", -1.0)}
    for kind, (marker, level) in marks.items():
        at = [t for t, k, _ in data.world if k == kind]
        if at:
            colour = "#b22222" if kind == "error" else WORLD_COLOUR
            ax.scatter(at, [level] * len(at), marker=marker, s=22, color=colour, lw=0, zorder=4)


def _label_lanes(fig: Figure, ax: Axes, data: Lanes, end: float) -> None:
    """The lanes' names (by role where roles differ), thinned as lanes crowd, with the left
    margin widened to fit them; the time axis."""
    n = len(data.agents)
    ax.set_ylim(n - 0.5, -1.5 if data.world else -0.5)
    step = 1 if n <= 32 else 2 if n <= 64 else 4
    roles = len(set(data.roles.values())) > 1  # name them where they differ (a CEO's team)
    labels = [f"{data.roles[a]} {a}" if roles else f"agent {a}" for a in data.agents]
    width = max(len(label) for label in labels) * (0.075 if n <= 16 else 0.055) + 0.2
    fig.subplots_adjust(left=width / fig.get_figwidth())
    ticks, tick_labels = list(range(0, n, step)), labels[::step]
    if data.world:
        ticks, tick_labels = [-1, *ticks], ["world", *tick_labels]
    ax.set_yticks(ticks)
    ax.set_yticklabels(tick_labels, fontsize=9 if n <= 16 else 6.5)
    ax.tick_params(axis="y", length=0)
    ax.set_xlim(0, end)
    ax.set_xlabel("simulated time (s)")
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)


def _draw_legend(fig: Figure, data: Lanes) -> None:
    """The legend below the lanes: the colours, then the marks this picture has."""
    from matplotlib.artist import Artist
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles: list[Artist] = [Patch(color=COLOURS[k], label=LABELS[k]) for k in COLOURS]
    handles.append(Line2D([], [], color="#5b2a86", lw=1, label="message (sent → read)"))
    handles.append(Line2D([], [], color="black", marker="^", lw=0, ms=5, label="post"))
    if data.rejected:
        handles.append(
            Line2D([], [], color="#b22222", marker="|", lw=0, ms=7, label="no action / refused")
        )
    if data.world:
        for marker, label in (("D", "world event"), ("^", "world post")):
            handles.append(
                Line2D([], [], color=WORLD_COLOUR, marker=marker, lw=0, ms=5, label=label)
            )
    if data.hires or any(w.startswith("fired") for _, _, w in data.life.values()):
        handles.append(Line2D([], [], color="#b22222", marker="x", lw=1, label="hire → / fired ✕"))
    rows = 1 if len(handles) <= 7 else 2  # more in one row would run off the picture's sides
    fig.subplots_adjust(bottom=(0.78 + 0.2 * (rows - 1)) / fig.get_figheight())
    ncol = -(-len(handles) // rows)
    fig.legend(handles=handles, loc="lower center", ncol=ncol, fontsize=8.5, frameon=False)
