"""A run's plots say what the run did: returns.png of real (short) training runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from collective.rl.config import read_config
from collective.rl.plots import plot_run, returns_figure
from collective.rl.rundir import read_metrics
from collective.rl.train import train
from policy.tiny import TinyConfig

SMALL = dict(
    world="tally",
    params={"target": 12},
    team_sizes=(2,),
    steps=2,
    groups_per_step=1,
    group_size=2,
    concurrency=2,
    max_output_tokens=12,
    plots=False,
    model=TinyConfig(d_model=32, n_layers=1, n_heads=2, d_ff=64, context=96),
)


@pytest.mark.parametrize(
    ("schedule", "start", "end"), [("constant", 60.0, 60.0), ("linear", 30.0, 60.0)]
)
def test_returns_draws_a_time_limit_axis_only_where_the_limit_changes(
    tmp_path: Path, schedule: str, start: float, end: float
) -> None:
    cfg = read_config(
        dict(**SMALL, time_limit=schedule, time_limit_start=start, time_limit_end=end)
    )
    train(cfg, tmp_path / "run", progress=False)
    rows = read_metrics(tmp_path / "run")
    fig = returns_figure(rows)
    return_axis = fig.axes[0]
    assert return_axis.get_ylim() == (0, 1.02)  # returns are in [0, 1]: no zoom onto noise
    if schedule == "constant":
        # a constant limit in the title, not a flat dashed line across the middle of the plot
        assert len(fig.axes) == 1
        assert return_axis.get_title() == "Return (T_max 60 s throughout)"
        assert [line.get_linestyle() for line in return_axis.get_lines()] == ["-"]
    else:
        assert len(fig.axes) == 2
        limit_axis = fig.axes[1]
        assert [list(line.get_ydata()) for line in limit_axis.get_lines()] == [[30.0, 60.0]]
        assert limit_axis.get_ylim()[0] == 0
        labels = [t.get_text() for t in return_axis.get_legend().get_texts()]
        assert labels == ["min-max", "mean return", "T_max (right axis)"]
    assert (tmp_path / "run" / "plots" / "returns.png") in plot_run(tmp_path / "run")
