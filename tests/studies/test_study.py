"""The village-to-city study, small: every metric is produced for every policy and count."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
import trio

from collective import Conductor, EpisodeConfig, latency_preset
from collective.records.signs import signs
from collective.studies.study import (
    ScaleConfig,
    cell,
    cell_seconds,
    heading,
    plot,
    unreached,
)
from policy.scripted import ScriptedPolicy
from policy.tiny import TinyConfig, TinyModel, save_checkpoint
from policy.uniform import RandomPolicy
from tests.support.busy import scaled


def test_scale_study_smoke(tmp_path: Path) -> None:
    ckpt = save_checkpoint(
        TinyModel.fresh(TinyConfig(d_model=32, n_heads=2, d_ff=64, context=96)),
        tmp_path / "tiny.pt",
    )
    out = tmp_path / "study"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "collective.cli",
            "study",
            "scale",
            str(ckpt),
            "--world",
            "workshop",
            "--agents",
            "1,4,16",
            "--seeds",
            "2",
            "--horizon",
            "40",
            "--out",
            str(out),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=scaled(300),
    )
    assert r.returncode == 0, r.stderr
    data = json.loads((out / "scale.json").read_text())
    rows = data["rows"]
    assert {(row["policy"], row["agents"]) for row in rows} == {
        (p, n) for p in ("trained", "untrained", "random") for n in (1, 4, 16)
    }
    for row in rows:
        assert 0.0 <= row["score"] <= 1.0 and row["seeds"] == 2
        assert set(row["score_at"]) == {"10", "20", "40"}
        assert row["batch_mean"] >= 1.0 and row["turns_per_agent"] > 0
    one = next(row for row in rows if row["agents"] == 16 and row["policy"] == "random")
    assert one["batch_largest"] >= 16 * 2, "all agents of both seeds think at t=0: one batch"
    assert (out / "scale.png").stat().st_size > 10_000


def _study(tmp_path: Path, world: str, *more: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / world
    study = ["study", "scale", "", "--policies", "random", "--world", world]
    cell = ["--agents", "1,4", "--seeds", "2", "--horizon", "60"]
    r = subprocess.run(
        [sys.executable, "-m", "collective.cli", *study, *cell, "--out", str(out), *more],
        capture_output=True,
        text=True,
        timeout=scaled(300),
    )
    assert r.returncode == 0, r.stderr
    return r, json.loads((out / "scale.json").read_text())


def test_the_random_baseline_says_each_cell_and_keeps_to_its_bound(tmp_path: Path) -> None:
    r, data = _study(tmp_path, "workshop")
    # the study's answers are bounded at 24 tokens; the random policy drew past it, and the
    # engine rejected its answers ("an answer over its bound: rejected ... policy=random")
    assert data["config"]["max_output_tokens"] == 24
    assert "over its bound" not in r.stderr, r.stderr
    lines = r.stderr.splitlines()
    assert lines[0].startswith(
        "study scale: 2 cells (1 policy(ies) x 2 agent count(s)), 4 episodes"
    )
    assert lines[1].startswith("study scale: cell 1/2: random x 1 agents, score ")
    assert "left (expected: about" in lines[1]
    assert lines[2].startswith("study scale: cell 2/2: random x 4 agents")
    assert all(isinstance(row["duplicate_rate"], float) for row in data["rows"])  # it counts them


def test_a_world_without_a_duplicates_metric_is_not_said_to_have_none(tmp_path: Path) -> None:
    r, data = _study(tmp_path, "tally", "--quiet")
    assert r.stderr == ""
    assert [row["duplicate_rate"] for row in data["rows"]] == [None, None]
    assert all('"duplicate_rate": null' in line for line in r.stdout.splitlines()[:2])


def test_every_study_option_says_what_it_is() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "collective.cli", "study", "scale", "--help"],
        capture_output=True,
        text=True,
        timeout=scaled(60),
    )
    assert r.returncode == 0
    lines = r.stdout.splitlines()
    for option in ("--world", "--org", "--agents", "--seeds", "--targets", "--policies", "--out"):
        # argparse puts an option's help on its line, or on the next where the name is long
        named = f"{option} {option[2:].upper()}"
        at = next(i for i, line in enumerate(lines) if line.strip().startswith(named))
        said = lines[at].strip().removeprefix(named).strip() or lines[at + 1].strip()
        assert len(said) > 10, (option, lines[at])


def test_useful_work_is_the_work_that_landed() -> None:
    """useful_per_agent counts world calls that landed, not those begun: on a workshop where
    every module needs a key only agent 0 holds, agent 1's every attempt is refused."""
    cfg = ScaleConfig(
        checkpoint="",
        params={"knowledge": 1.0, "holders": "first", "modules": 12},
        seeds=2,
        horizon=60.0,
        policies=("random",),
    )
    script = ScriptedPolicy(lambda r: "work 1", name="work")
    row = cell(cfg, "work", script, 2)
    configs = [
        EpisodeConfig(
            world="workshop",
            params=dict(cfg.params),
            agents=2,
            world_seed=s,
            sample_seed=s,
            time_limit=60.0,
            latency=latency_preset("tiny"),
            max_output_tokens=24,
            policy="work",
            keep_prompts=False,
        )
        for s in range(2)
    ]
    eps = trio.run(lambda: Conductor(script).play(configs, concurrency=2))
    landed = [signs(e) for e in eps]
    assert all(s.refused_units > 0 and s.landed_units > 0 for s in landed)
    assert row.useful_per_agent == sum(s.landed_tokens / 2 for s in landed) / 2
    assert row.useful_per_agent < sum(e.stats.world_tokens / 2 for e in eps) / 2


def test_a_cells_time_is_grown_from_the_cells_long_enough_to_time() -> None:
    # in proportion from the one measurable cell; the 0.04 s cell (its start-up) is not read
    assert cell_seconds([(1, 0.04), (8, 2.0)], 64) == pytest.approx(16.0)
    # faster than in proportion between two measurable cells: 8 -> 64 took 4x per agent
    assert cell_seconds([(8, 2.0), (64, 64.0)], 512) == pytest.approx(64.0 * 8**1 * 4)
    # bounded: never below proportion, never above the square
    assert cell_seconds([(8, 4.0), (64, 8.0)], 512) == pytest.approx(64.0)
    assert cell_seconds([(2, 1.0), (4, 100.0)], 8) == pytest.approx(400.0)
    # nothing measurable: the latest cell, in proportion
    assert cell_seconds([(1, 0.01), (4, 0.02)], 16) == pytest.approx(0.08)


def test_the_plot_says_one_seed_and_when_no_cell_reaches_the_target(tmp_path: Path) -> None:
    one = ScaleConfig(checkpoint="", policies=("random",), agents=(1, 2), seeds=1, horizon=20)
    assert heading(one).endswith("horizon 20 s, 1 seed")
    assert heading(msgspec.structs.replace(one, seeds=3)).endswith(", 3 seeds")
    rows = [cell(one, "random", RandomPolicy(), n) for n in one.agents]
    target = f"{one.targets[0]:g}"
    assert all(r.time_to[target] is None for r in rows), "20 s is too short to reach 0.25"
    assert unreached(rows, target, 20) == "no cell reached a score\nof 0.25 within 20 s"
    plot(rows, tmp_path / "scale.png", one)  # the note drawn where the points would be
    assert (tmp_path / "scale.png").stat().st_size > 10_000
    reached = msgspec.structs.replace(rows[0], time_to={target: 12.0})
    assert unreached([reached, rows[1]], target, 20) is None
