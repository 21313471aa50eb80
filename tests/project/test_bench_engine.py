"""Smoke test of the engine benchmark's ``--quick`` mode: it runs and writes its figures.

Only what the files hold is checked, never how fast anything was: performance is measured by
the benchmark itself, on a quiet machine, not asserted by tests.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT
from tests.support.busy import scaled


@pytest.mark.heavy
def test_quick_bench_writes_its_figures(tmp_path: Path) -> None:
    engine, city = tmp_path / "engine", tmp_path / "city"
    script = str(ROOT / "bench" / "engine.py")
    done = subprocess.run(
        [
            sys.executable,
            script,
            "--quick",
            "--quiet",
            "--out",
            str(engine),
            "--city-out",
            str(city),
        ],
        capture_output=True,
        text=True,
        timeout=scaled(120),
    )
    assert done.returncode == 0, done.stderr
    for path in (engine / "engine.png", engine / "comparison.png", city / "comparison.png"):
        assert path.stat().st_size > 10_000, path
    sweep = json.loads((engine / "engine.json").read_text())["sweep"]
    assert sorted({r["agents"] for r in sweep}) == [10, 100, 1000]
    for r in sweep:
        assert r["turns"] > 0 and r["events"] > r["turns"]
        if not r["idle"]:
            # Every instant's thinks went out in one batch (a wake at that very instant may
            # add a second batch, so allow a little).
            assert r["instants_in_one_batch"] > 0.95
            assert abs(r["batch_mean"] - r["thinking_mean"]) < 0.1 * r["thinking_mean"]
    result = json.loads((city / "comparison.json").read_text())
    for row in result["comparison"]:
        for system in ("engine", "asyncio_rounds", "simpy"):
            assert row[system]["turns"] > 0
            assert len(row[system]["digests"]) == 2
        # The floor wakes the engine's agents at the engine's instants: as many turns, and the
        # same schedule every run; its ratio is a measurement, not checked here.
        assert row["floor"]["turns"] == row["engine"]["turns"]
        assert len(set(row["floor"]["digests"])) == 1
        assert math.isfinite(row["engine_over_floor_cpu"]) and row["engine_over_floor_cpu"] > 0.0
        # The work does the engine's own turns with no scheduler, the same every run.
        assert row["work"]["turns"] == row["engine"]["turns"]
        assert len(set(row["work"]["digests"])) == 1
        assert 0.0 < row["ceiling_cpu"] < math.inf
        assert row["engine"]["cpu_us_per_turn"] > 0.0
    for floor in ("trio_floor", "simpy_floor"):
        assert result[floor]["agent_lifecycle_us"] > 0.0
    det = result["determinism"]
    assert det["engine"]["same_order_twice"] and det["engine"]["replay_identical"]
