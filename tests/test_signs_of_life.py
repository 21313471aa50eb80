"""Smoke test of the signs-of-life experiment, run as a user would run it:
``collective experiment signs-of-life --quick --out DIR`` (real training runs of the tiny policy,
four steps each instead of sixty). It checks that the pipeline produces every figure, the JSON
and the README, with a verdict on every reference finding; whether a finding reproduces is the
full run's business (``bench/results/signs_of_life/``), not this test's.

The suite runs the main run alone (``--only workshop``, about half a minute: every figure and
the verdicts that need only it); all five runs (two to three minutes on two cores) are marked
slow, run with ``pytest -m slow tests/test_signs_of_life.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from collective.train import load_config, read_metrics

ROOT = Path(__file__).resolve().parent.parent
RUNS = ("workshop", "relay", "penalty", "no_pressure", "per_agent")
FIGURES = ("useful_work.png", "communication_and_score.png", "latency.png", "ablations.png")


def _experiment(tmp_path: Path, *args: str) -> tuple[Path, dict]:
    out = tmp_path / "sol"
    cli = [sys.executable, "-m", "collective.cli"]
    done = subprocess.run(
        [*cli, "experiment", "signs-of-life", "--quick", *args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=280,
        cwd=tmp_path,  # the command finds the script from the package, not the working directory
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for name in FIGURES:
        assert (out / name).stat().st_size > 10_000, name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["quick"] is True
    assert sorted(summary["figures"]) == sorted(FIGURES)
    assert all(v["reproduced"] in ("yes", "partly", "no") for v in summary["verdicts"])
    readme = (out / "README.md").read_text()
    assert "| reference finding |" in readme
    assert all(v["finding"] in readme for v in summary["verdicts"])
    return out, summary


def test_quick_main_run_writes_every_figure(tmp_path: Path) -> None:
    out, summary = _experiment(tmp_path, "--only", "workshop")
    assert list(summary["metrics"]) == ["workshop"] and len(summary["metrics"]["workshop"]) == 4
    assert load_config(out / "runs" / "workshop" / "config.toml").world == "workshop"
    assert len(summary["verdicts"]) == 5, "the findings the main run alone can judge"
    assert summary["latency"]["t_max"] > 0


@pytest.mark.slow
def test_quick_experiment_writes_every_figure(tmp_path: Path) -> None:
    out, summary = _experiment(tmp_path)
    findings = [v["finding"] for v in summary["verdicts"]]
    assert len(findings) == 7, findings
    configs = {name: load_config(out / "runs" / name / "config.toml") for name in RUNS}
    for name, cfg in configs.items():  # each run's config as used, beside its metrics
        assert cfg.steps == len(read_metrics(out / "runs" / name)) == 4
        assert len(summary["metrics"][name]) == 4
    assert configs["relay"].world == "relay" and configs["workshop"].world == "workshop"
    assert configs["penalty"].latency_penalty > 0 == configs["no_pressure"].latency_penalty
    assert configs["per_agent"].advantage == "individual" != configs["workshop"].advantage
    latency = summary["latency"]
    assert latency["t_max"] > 0 and latency["collective_final_score"] >= 0
