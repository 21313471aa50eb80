"""The village-to-city study, small: every metric is produced for every policy and count."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from policy.tiny import TinyConfig, TinyModel, save_checkpoint


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
        timeout=300,
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
