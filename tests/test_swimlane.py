"""The swimlane picture: what it draws is the episode's activity, and the PNG shows it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import run
from matplotlib.image import imread

from collective import EpisodeConfig, draw_timeline, run_episode, save_episode
from collective.cli import main
from collective.records import Asked, Began, Fired
from collective.swimlane import COLOURS, MAX_LANES, lanes
from policy.uniform import RandomPolicy


def _pixels(png: Path, colour: str) -> int:
    img = imread(png)[..., :3]
    rgb = np.array([int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5)])
    return int((np.abs(img - rgb).max(axis=-1) < 0.02).sum())


def test_four_agents_every_activity_drawn_and_coloured(tmp_path: Path) -> None:
    ep = run_episode(
        EpisodeConfig(world="workshop", agents=4, world_seed=1, sample_seed=1, time_limit=300),
        RandomPolicy(),
    )
    data = lanes(ep)
    assert data.agents == [0, 1, 2, 3] and data.total == 4
    assert len(data.spans["think"]) == sum(isinstance(e, Asked) for e in ep.events)
    acts = sum(len(data.spans[k]) for k in ("work", "comm", "wait"))
    assert acts == sum(isinstance(e, Began) for e in ep.events)
    assert len(data.messages) == ep.stats.delivered and len(data.posts) == ep.stats.posts
    assert all(sent <= read for _, sent, _, read in data.messages)
    png = draw_timeline(ep, tmp_path / "t.png")
    height, width = imread(png).shape[:2]
    assert width >= 1500 and 400 <= height <= width  # a wide, short picture at 4 lanes
    for kind, colour in COLOURS.items():
        assert _pixels(png, colour) > 200, f"no {kind} on the picture"


def test_hired_lanes_start_late_and_fired_lanes_stop(tmp_path: Path) -> None:
    plan = ["hire specialist", "hire specialist", 'msg 1 "x"', "fire 1"]
    ep = run(
        lambda r: plan[r.turn] if r.agent == 0 and r.turn < len(plan) else "work 1",
        world="workshop",
        org="ceo",
        budget=2,
        agents=1,
        time_limit=60,
    )
    data = lanes(ep)
    fired = next(e for e in ep.events if isinstance(e, Fired))
    assert data.life[1][1] == fired.t and data.life[1][2] == "fired by 0"
    assert data.life[2][0] > 0 and data.life[2][1] == ep.duration
    assert [(by, new) for by, _, new in data.hires] == [(0, 1), (0, 2)]
    assert data.roles == {0: "ceo", 1: "specialist", 2: "specialist"}
    draw_timeline(ep, tmp_path / "ceo.png")


def test_past_the_cap_the_first_lanes_are_drawn_and_the_picture_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ep = run_episode(
        EpisodeConfig(world="tally", agents=MAX_LANES + 6, time_limit=10), RandomPolicy()
    )
    data = lanes(ep)
    assert data.agents == list(range(MAX_LANES)) and data.total == MAX_LANES + 6
    assert all(a < MAX_LANES and b < MAX_LANES for a, _, b, _ in data.messages)
    save_episode(ep, tmp_path / "ep.msgpack")
    assert main(["show", str(tmp_path / "ep.msgpack"), "--png", str(tmp_path / "t.png")]) == 0
    out = capsys.readouterr()
    assert out.out.strip() == str(tmp_path / "t.png")
    assert f"only the first {MAX_LANES} agents" in out.err
    assert imread(tmp_path / "t.png").shape[0] > 1500  # 64 lanes get a tall picture
