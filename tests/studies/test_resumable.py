"""A study re-uses a finished run or measurement only when its digest matches
(experiments/resumable.py): real training runs of a tiny config, a real CLI run killed
midway, real measurements."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from collective.rl.config import TrainConfig, dump_config
from collective.rl.train import read_metrics
from experiments.resumable import (
    cached,
    is_complete,
    run_digest,
    store,
    stored_digest,
    train_digest,
    train_exact,
)
from policy.tiny import TinyConfig
from tests.support.training import comparable_metrics, small_train

COLLECTIVE = Path(sys.executable).with_name("collective")


def tiny(**fields: object) -> TrainConfig:
    return small_train(**{"steps": 2, **fields})


def test_a_finished_run_is_reused_and_a_changed_field_retrains(tmp_path: Path) -> None:
    run = tmp_path / "run"
    cfg = tiny()
    assert train_exact(cfg, run, log=lambda _: None) == "trained"
    assert (run / "config.digest").read_text().strip() == train_digest(cfg)
    metrics = (run / "metrics.jsonl").read_bytes()
    ckpt = (run / "checkpoints" / "latest.pt").stat().st_mtime_ns
    assert train_exact(tiny(), run, log=lambda _: None) == "reused"  # an equal config, rebuilt
    assert (run / "metrics.jsonl").read_bytes() == metrics
    assert (run / "checkpoints" / "latest.pt").stat().st_mtime_ns == ckpt

    changed = tiny(learning_rate=cfg.learning_rate * 2)
    assert train_digest(changed) != train_digest(cfg)
    assert train_exact(changed, run, log=lambda _: None) == "retrained"
    assert run_digest(run) == train_digest(changed)
    assert f"learning_rate = {changed.learning_rate!r}" in (run / "config.toml").read_text()
    stale = list(tmp_path.glob("run.stale-*"))  # the old run kept aside, never re-used
    assert len(stale) == 1 and (stale[0] / "metrics.jsonl").read_bytes() == metrics
    # a nested default changed is a changed config too
    deeper = tiny(model=TinyConfig(d_model=32, n_layers=1, n_heads=2, d_ff=64, context=128))
    assert train_digest(deeper) != train_digest(cfg)


def test_a_killed_run_resumes_where_it_stopped(tmp_path: Path) -> None:
    """Kill -9 a real `collective train` after its second step's line (so the first step's
    checkpoint is surely whole); train_exact resumes it (the first step's metrics line, wall
    time included, is kept: a restart would rewrite it) and it ends where an uninterrupted run
    ends."""
    cfg = tiny(steps=4)
    toml = tmp_path / "cfg.toml"
    toml.write_text(dump_config(cfg))
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [str(COLLECTIVE), "train", str(toml), "--out", str(run), "--quiet"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    metrics = run / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        assert proc.poll() is None, "training ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    first = metrics.read_text().splitlines()[0]
    done = len(read_metrics(run))
    assert 2 <= done < cfg.steps, f"killed after {done} steps: nothing left to resume"
    assert not (run / "config.digest").exists()  # its digest is its config.toml's
    assert run_digest(run) == train_digest(cfg)

    assert train_exact(cfg, run, log=lambda _: None) == "resumed"
    lines = metrics.read_text().splitlines()
    assert len(lines) == cfg.steps and lines[0] == first
    whole = tmp_path / "whole"
    assert train_exact(cfg, whole, log=lambda _: None) == "trained"
    assert comparable_metrics(run) == comparable_metrics(whole)
    assert train_exact(cfg, run, log=lambda _: None) == "reused"


def test_a_measurement_is_reused_only_under_its_own_digest(tmp_path: Path) -> None:
    path = tmp_path / "m.npz"
    calls: list[int] = []

    def compute() -> dict[str, np.ndarray]:
        calls.append(1)
        return {"score": np.arange(3.0) + len(calls)}

    def save(p: Path, r: dict[str, np.ndarray]) -> None:
        np.savez(p, **r)

    def load(p: Path) -> dict[str, np.ndarray]:
        with np.load(p) as z:
            return {k: z[k] for k in z.files}

    a, reused = cached(path, "d1", {"n": 2}, compute, save, load)
    assert not reused and stored_digest(path) == "d1"
    b, reused = cached(path, "d1", {"n": 2}, compute, save, load)
    assert reused and len(calls) == 1 and (a["score"] == b["score"]).all()
    c, reused = cached(path, "d2", {"n": 3}, compute, save, load)  # other settings
    assert not reused and len(calls) == 2 and (c["score"] != a["score"]).all()
    # a result whose digest never landed (stopped between the two writes) is measured again
    path.with_name(path.name + ".digest.json").unlink()
    _, reused = cached(path, "d2", {"n": 3}, compute, save, load)
    assert not reused and len(calls) == 3
    store(path, "d3", {}, {"score": np.zeros(1)}, save)
    assert stored_digest(path) == "d3"


def test_signs_of_life_measurements_follow_their_run(tmp_path: Path) -> None:
    """experiments/signs_of_life/measure.py's measurement keys: a trained measurement's digest
    changes when its run is retrained with another config (its config digest and checkpoint
    change)."""
    from experiments import signs_of_life as sol

    run = tmp_path / "runs" / "main-s0"
    train_exact(tiny(), run, log=lambda _: None)
    part = "main|trained|180#0"
    k1, s1 = sol.measure_key(tmp_path, part, 2)
    assert sol.measure_key(tmp_path, part, 2)[0] == k1
    assert sol.measure_key(tmp_path, part, 3)[0] != k1  # other instances
    assert s1["checkpoint"] is not None and s1["run_digest"] == run_digest(run)
    train_exact(tiny(learning_rate=0.5), run, log=lambda _: None)
    k2, s2 = sol.measure_key(tmp_path, part, 2)
    assert k2 != k1 and s2["checkpoint"] != s1["checkpoint"]


def test_the_committed_runs_keep_their_digests() -> None:
    """Every run committed under bench/results was stamped with the digest of its config; a
    field added to TrainConfig since (at a value that cannot change the run) must not change
    that digest, or a checkout would train every committed run again."""
    from collective.rl.config import load_config
    from tests.support import ROOT

    runs = sorted((ROOT / "bench" / "results").glob("*/runs/*/config.digest"))
    assert runs, "no committed run with a digest"
    for stamp in runs:
        cfg = load_config(stamp.parent / "config.toml")
        assert train_digest(cfg) == stamp.read_text().strip(), stamp.parent


def test_an_hf_run_cut_short_is_not_complete_until_its_steps_are_done(tmp_path: Path) -> None:
    """An hf run's checkpoint is a model directory (``checkpoints/latest/``): stopped at 6 of
    its config's 10 steps it is not complete (``bench/llm_smol.py`` resumes it); at 10, or
    asked for 6, it is."""
    from collective.rl.config import load_config

    config = Path(__file__).resolve().parents[2] / "configs" / "llm-smol.toml"
    run = tmp_path / "s0"
    (run / "checkpoints" / "latest").mkdir(parents=True)
    cfg = load_config(config)
    assert cfg.steps == 10
    # (a real step's record: metrics.jsonl is read as records)
    step = (Path(__file__).resolve().parents[1] / "data" / "flat_run" / "metrics.jsonl").read_text()
    (run / "metrics.jsonl").write_text(step * 6)
    assert not is_complete(run, cfg)
    assert is_complete(run, load_config(config, ["steps=6"]))
    (run / "metrics.jsonl").write_text(step * 10)
    assert is_complete(run, cfg)
    (run / "checkpoints" / "latest").rmdir()
    assert not is_complete(run, cfg)  # no weights
