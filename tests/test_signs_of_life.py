"""Smoke test of the signs-of-life experiment, run as a user would run it:
``collective experiment signs-of-life --quick --out DIR`` (real training runs of the tiny policy,
two steps instead of the full run's ten). It checks that the pipeline produces every figure, the
JSON and the README, and that every finding carries what the issue asks of it (value, 95%
interval, random and untrained baselines, the seed's figure, a verdict by the rule); whether a
finding reproduces is the full run's business (``bench/results/signs_of_life/``), not this
test's.

The suite runs the main run alone (``--only main``: every finding but the ablations); all four
variants are marked slow, run with ``pytest -m slow tests/test_signs_of_life.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from collective.train import load_config, read_metrics

ROOT = Path(__file__).resolve().parent.parent
RUNS = ("main", "no_pressure", "per_agent", "flat")
FIGURES = ("useful_work.png", "communication_and_score.png", "latency.png", "ablations.png")


def _experiment(tmp_path: Path, *args: str) -> tuple[Path, dict]:
    out = tmp_path / "sol"
    cli = [sys.executable, "-m", "collective.cli"]
    done = subprocess.run(
        [*cli, "experiment", "signs-of-life", "--quick", *args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,  # the command finds the script from the package, not the working directory
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for name in FIGURES:
        assert (out / name).stat().st_size > 10_000, name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["quick"] is True
    assert sorted(summary["figures"]) == sorted(FIGURES)
    for f in summary["findings"]:
        assert f["verdict"] in ("yes", "no") and f["seed_figure"] and f["why"]
        assert {"random", "untrained"} <= set(f["baselines"]) or "1.0 (the average)" in f[
            "baselines"
        ]
        lo, hi = f["interval"]
        if f["value"] is None or lo is None:
            assert f["verdict"] == "no", f  # never yes on a missing value
        else:
            assert lo <= f["value"] <= hi
    readme = (out / "README.md").read_text()
    assert "| finding | trained | random | untrained |" in readme
    assert all(f["finding"] in readme for f in summary["findings"])
    return out, summary


@pytest.mark.heavy
@pytest.mark.timeout(950)
def test_quick_main_run_writes_every_figure(tmp_path: Path) -> None:
    out, summary = _experiment(tmp_path, "--only", "main")
    assert list(summary["metrics"]) == ["main-s0"] and len(summary["metrics"]["main-s0"]) == 2
    cfg = load_config(out / "runs" / "main-s0" / "config.toml")
    assert cfg.world == "workshop" and cfg.params["holders"] == "first"
    assert len(summary["findings"]) == 6, "the findings the main run alone can judge"
    held = summary["heldout"]["main"]
    assert set(held) == {"random", "untrained", "trained"}


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_quick_experiment_writes_every_figure(tmp_path: Path) -> None:
    out, summary = _experiment(tmp_path)
    assert len(summary["findings"]) == 9, [f["finding"] for f in summary["findings"]]
    configs = {name: load_config(out / "runs" / f"{name}-s0" / "config.toml") for name in RUNS}
    for name, cfg in configs.items():  # each run's config as used, beside its metrics
        assert cfg.steps == len(read_metrics(out / "runs" / f"{name}-s0")) == 2
    assert configs["no_pressure"].time_limit_end > configs["main"].time_limit_end
    assert configs["per_agent"].advantage == "individual" != configs["main"].advantage
    assert configs["flat"].org == "flat" != configs["main"].org
    assert summary["no_pressure_at_own_limit"]["mean"] is not None
