"""The swimlane picture: what it draws is the episode's activity, and the PNG shows it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from collective import EpisodeConfig, draw_timeline, load_episode, run_episode, save_episode
from collective.cli import main
from collective.records import Asked, Began, Committed, Fired, Happened, Posted
from collective.views.swimlane import COLOURS, MAX_LANES, REFUSED, WORLD_COLOUR, lanes, title
from policy.uniform import RandomPolicy
from tests.support import FRAGILE
from tests.support.episodes import run


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
    acts = sum(len(data.spans[k]) for k in ("work", "comm", "wait", "refused"))
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


def test_the_world_lane_draws_the_worlds_events_and_posts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`show --png` of a world with timed events (wildfire: fires break out and are posted)
    draws each on a lane of its own; a world without any draws no such lane."""
    for world in ("wildfire", "tally"):
        ep_path, png = tmp_path / f"{world}.msgpack", tmp_path / f"{world}.png"
        run = ["run", world, "--agents", "3", "--time-limit", "200", "--out", str(ep_path)]
        assert main(run) == 0
        assert main(["show", str(ep_path), "--png", str(png)]) == 0
        ep = load_episode(ep_path)
        world_lane = lanes(ep).world
        happened = [e for e in ep.events if isinstance(e, Happened)]
        posted = [e for e in ep.events if isinstance(e, Posted) and e.agent < 0]
        assert [t for t, k, _ in world_lane if k == "event"] == [e.t for e in happened]
        assert [(t, w) for t, k, w in world_lane if k == "post"] == [(e.t, e.text) for e in posted]
        if world == "wildfire":
            assert happened and posted
            assert _pixels(png, WORLD_COLOUR) > 20 * len(happened)
        else:
            assert not world_lane and _pixels(png, WORLD_COLOUR) == 0
    capsys.readouterr()


def test_the_title_counts_the_team_and_the_hires_apart(tmp_path: Path) -> None:
    ep_path = tmp_path / "ceo.msgpack"
    run = ["run", "workshop", "--agents", "4", "--org", "ceo", "--budget", "4", "--seed", "1"]
    assert main([*run, "--time-limit", "300", "--out", str(ep_path)]) == 0
    ep = load_episode(ep_path)
    data = lanes(ep)
    assert ep.stats.hires > 0 and data.total == 4 + ep.stats.hires
    assert title(ep, data).startswith(f"workshop, 4 agents + {ep.stats.hires} hired, org ceo")


def test_refused_calls_are_drawn_apart_from_the_calls_that_landed(tmp_path: Path) -> None:
    """Agents that call a tool the world always refuses (``Refuses.spend``), every other turn:
    half their work is drawn in the refused colour and none of it in the working green, and the
    title counts the refusals."""
    ep = run(
        lambda r: "spend" if r.turn % 2 == 0 else 'post all "hello"',
        world=f"{FRAGILE}:Refuses",
        agents=3,
        time_limit=40,
    )
    data = lanes(ep)
    refused = [e for e in ep.events if isinstance(e, Committed) and not e.ok]
    assert refused and len(data.spans[REFUSED]) == len(refused)
    # (only a call the end cut short, neither landed nor refused, is drawn as work)
    assert all(end == ep.duration for _, _, end in data.spans["work"]), data.spans["work"]
    assert data.spans["comm"], "the posts landed"
    assert data.refused == len(refused) and data.calls == sum(
        isinstance(e, Committed) for e in ep.events
    )
    assert f"{len(refused):,} of {data.calls:,} calls refused" in title(ep, data)
    png = draw_timeline(ep, tmp_path / "t.png")
    # (green is left in the legend and the call the end cut short)
    assert _pixels(png, COLOURS[REFUSED]) > 20 * _pixels(png, COLOURS["work"])
