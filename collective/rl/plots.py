"""Plots of a training run, drawn from its metrics.jsonl (``collective plot RUN_DIR``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from collective.base.outputs import check_dir, check_file, save_figure
from collective.rl.rundir import TEAM_BUCKETS, StepMetrics, read_metrics


def _pyplot():  # matplotlib is an optional extra; import it only when drawing
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def landed(rows: Sequence[StepMetrics]) -> bool:
    """Whether a run's lines have the landed_* and talk_* signs (runs written before they
    existed have only the attempts, which the plots then draw, saying so)."""
    return any(r.landed_rel for r in rows)


def useful_work_lines(ax: Any, rows: Sequence[StepMetrics]) -> None:
    """One line per team size: useful work per rollout over that step's average rollout (the
    landed work; an older run's attempts)."""
    new = landed(rows)
    for b in TEAM_BUCKETS:
        pts = [
            (r.step, (r.landed_rel if new else r.useful_rel)[b])
            for r in rows
            if b in (r.landed_rel if new else r.useful_rel)
        ]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker=".", label=b)
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.legend(title="team")


def returns_figure(rows: Sequence[StepMetrics]) -> Any:
    """The mean return with its min-max band, on a return axis of [0, 1]. The time limit gets
    an axis of its own only where it changes over the run; a constant one is in the title (on
    a second axis, matplotlib centred its flat line there, a dashed line at the 0.5 return
    level that read as a threshold)."""
    plt = _pyplot()
    steps = [r.step for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.fill_between(
        steps,
        [r.return_min for r in rows],
        [r.return_max for r in rows],
        alpha=0.2,
        label="min-max",
    )
    ax.plot(steps, [r.return_mean for r in rows], label="mean return")
    ax.set_ylim(0, 1.02)
    limits = [r.time_limit for r in rows]
    if min(limits) == max(limits):
        ax.set(xlabel="step", ylabel="return", title=f"Return (T_max {limits[0]:g} s throughout)")
        ax.legend(loc="upper left")
        return fig
    ax.set(xlabel="step", ylabel="return", title="Return, and the time limit T_max")
    twin = ax.twinx()
    twin.plot(steps, limits, color="grey", ls="--", label="T_max (right axis)")
    twin.set_ylim(0, max(limits) * 1.05)
    twin.set_ylabel("time limit (simulated s)")
    handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    ax.legend(handles=handles, loc="upper left")
    return fig


def plot_run(run_dir: str | Path, on_saved: Callable[[Path], None] | None = None) -> list[Path]:
    """Draw every panel of a run into RUN_DIR/plots; return the files written (``on_saved``
    is told each as it is written: drawing them all can take most of a minute)."""
    run_dir = Path(run_dir)
    rows = read_metrics(run_dir)
    if not rows:
        raise ValueError(f"{run_dir}: metrics.jsonl has no steps yet")
    out = check_dir(run_dir / "plots", "plot")
    plt = _pyplot()
    steps = [r.step for r in rows]
    written = []

    def save(fig, name: str) -> None:
        fig.tight_layout()
        path = check_file(out / name, "plot", [run_dir / "metrics.jsonl"])
        save_figure(fig, path, "plot", dpi=110)
        plt.close(fig)
        written.append(path)
        if on_saved is not None:
            on_saved(path)

    save(returns_figure(rows), "returns.png")

    fig, ax = plt.subplots(figsize=(6, 4))
    useful_work_lines(ax, rows)
    new = landed(rows)
    ax.set(
        xlabel="step",
        ylabel=("landed" if new else "attempted (an older run)")
        + " work tokens per rollout / this step's average",
        title="Useful work relative to the average rollout, by team size",
    )
    save(fig, "useful_work.png")

    fig, ax = plt.subplots(figsize=(6, 4))
    if new:
        ax.plot(steps, [r.talk_per_agent_second for r in rows])
        ylabel = "message and post tokens / agent-second"
    else:
        ax.plot(steps, [r.comm_tokens_per_hour for r in rows])
        ylabel = "primitive tokens / simulated hour (an older run)"
    ax.set(xlabel="step", ylabel=ylabel, title="Communication intensity")
    save(fig, "communication.png")

    fig, axes = plt.subplots(2, 2, figsize=(9, 6))
    panels: list[tuple[str, str]] = [
        ("entropy", "policy entropy (nats/token)"),
        ("clip_fraction", "clip fraction"),
        ("staleness_mean", "staleness (versions)"),
        ("learner_tokens_per_s", "learner tokens/s"),
    ]
    for a, (field, label) in zip(axes.flat, panels, strict=True):
        a.plot(steps, [getattr(r, field) for r in rows])
        a.set(xlabel="step", title=label)
    save(fig, "learner.png")

    if any(r.worlds for r in rows):  # a mix of worlds: each world's score, and the normalised
        fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
        for label in dict.fromkeys(k for r in rows for k in r.worlds):
            pts = [(r.step, r.worlds[label]["score_mean"]) for r in rows if label in r.worlds]
            left.plot(*zip(*pts, strict=True), marker=".", label=label)
            normal = [
                (r.step, r.worlds[label]["normalised_gain"])
                for r in rows
                if "normalised_gain" in r.worlds.get(label, {})
            ]
            if normal:
                right.plot(*zip(*normal, strict=True), marker=".", alpha=0.5, label=label)
        gain = [(r.step, r.normalised_gain) for r in rows if r.normalised_gain is not None]
        if gain:
            right.plot(*zip(*gain, strict=True), color="black", lw=2, label="mean of the worlds")
        right.axhline(0.0, color="grey", lw=0.8, ls=":")
        left.set(xlabel="step", ylabel="mean score", title="Each world's score (a step's draws)")
        right.set(
            xlabel="step",
            ylabel="(score - untrained) / baselines' spread",
            title="Normalised gain over the untrained weights",
        )
        left.legend(title="world")
        right.legend()
        save(fig, "worlds.png")
    return written
