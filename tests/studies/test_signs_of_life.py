"""Smoke test of the signs-of-life experiment, run as a user would run it, from an installed
copy: ``collective experiment signs-of-life --quick`` (real training runs of the tiny policy,
two steps instead of the full run's sixty). It checks that the pipeline produces every figure, the
JSON and the README, and that every finding carries what the issue asks of it (value, 95%
interval, random and untrained baselines, the seed's figure, a verdict by the rule); whether a
finding reproduces is the full run's business (``bench/results/signs_of_life/``), not this
test's.

The suite runs the main run alone (``--only main``: every finding but the ablations); all seven
variants are marked slow, run with ``pytest -m slow tests/studies/test_signs_of_life.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from collective.rl.config import read_config
from collective.rl.train import load_config, read_metrics
from tests.support import ROOT
from tests.support.busy import scaled

RUNS = ("main", "no_pressure", "latency_penalty", "per_agent", "ceo", "orchestrator", "islands")
FIGURES = (
    "training_curve.png",
    "useful_work.png",
    "communication_and_score.png",
    "latency.png",
    "ablations.png",
)


#: ``collective ARGS`` with this checkout off the path: the editable install's finder and the
#: checkout's root (scripts/setup) left out, so only ``PYTHONPATH``'s copy can be imported.
_INSTALLED = f"""
import sys
sys.path[:] = [p for p in sys.path if p.rstrip("/") != {str(ROOT)!r}]
sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]
import collective
from collective.cli import main
print(collective.__file__, file=sys.stderr)
sys.exit(main(sys.argv[1:]))
"""


def installed_copy(tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    """The command and environment of ``collective`` from an installed copy: the packages the
    wheel ships alone (no bench/, no checkout) in a folder of their own, heading the path (the
    experiment's own process, ``python -m experiments``, finds them there too)."""
    site = tmp_path / "site"
    for pkg in ("collective", "policy", "worlds", "experiments"):
        shutil.copytree(ROOT / pkg, site / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    return [sys.executable, "-c", _INSTALLED], {**os.environ, "PYTHONPATH": str(site)}


def _experiment(tmp_path: Path, *args: str) -> tuple[Path, dict]:
    """``collective experiment signs-of-life --quick ARGS`` from an installed copy, run in a
    working directory of its own; its results go to the default ``--out`` there."""
    cli, env = installed_copy(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    done = subprocess.run(
        [*cli, "experiment", "signs-of-life", "--quick", *args],
        capture_output=True,
        text=True,
        timeout=scaled(900),
        cwd=work,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert str(tmp_path / "site" / "collective" / "__init__.py") in done.stderr, "not the copy"
    out = work / "signs_of_life"  # the default --out, away from a checkout
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
        # judged by paired contrasts over training seeds, Holm-corrected over the named family
        named = summary["statistics"]["primary"] + summary["statistics"]["secondary"]
        assert f["key"] in named and f["contrasts"]
        assert 0 <= f["p"] <= f["p_holm"] <= 1
        # yes: significant after Holm and shown by no scripted control that lacks the skill
        assert (f["verdict"] == "yes") == (f["p_holm"] < 0.05 and not f["built_in_by"])
        assert set(f["built_in_by"]) <= set(f["reproduced_by"]) <= set(f["scripts"])
        if f["built_in_by"]:
            assert f["verdict"] == "no" and "built in" in f["why"]
        for c in f["contrasts"].values():
            assert c["method"] == "t over seeds"
            # (a missing contrast, from a non-finite figure such as a ratio on instances where
            # the collective scored nothing, carries no per-seed values)
            assert len(c["per_seed"]) == c["seeds"] or c["mean"] is None
        if len(summary["seeds"]) < 2:
            assert f["verdict"] == "no" and "fewer than two training seeds" in f["why"]
    readme = (out / "README.md").read_text()
    assert "| finding | trained | random | untrained | other baselines | scripts" in readme
    assert sorted(summary["statistics"]["controls"]) == sorted(
        ["hire_everyone", "never_pass_keys", "no_communication"]
    )
    assert all(f["finding"] in readme for f in summary["findings"])
    return out, summary


@pytest.mark.heavy
@pytest.mark.timeout(950)
def test_quick_main_run_writes_every_figure(tmp_path: Path) -> None:
    out, summary = _experiment(tmp_path, "--only", "main")
    assert list(summary["metrics"]) == ["main-s0"] and len(summary["metrics"]["main-s0"]) == 2
    cfg = load_config(out / "runs" / "main-s0" / "config.toml")
    (world,) = cfg.worlds
    assert world.world == "workshop" and world.params["desks"] == "shared" and cfg.org == "flat"
    assert cfg.tiny.context == 256 and cfg.latency == "tiny-paced"
    assert len(summary["findings"]) == 7, "the findings the main run alone can judge"
    # the training curve is read from saved checkpoints, held-out at one limit: step 0 (the
    # initial weights), the kept step, the last
    curve = summary["training_curve_heldout"]
    assert curve["steps"] == [0, 1, 2] and curve["eval_time_limit"] == 180.0
    assert all(len(v) == 3 for v in curve["per_metric"].values())
    assert (out / "runs" / "main-s0" / "checkpoints" / "step-000001.pt").is_file()
    held = summary["heldout"]["main"]
    scripts = {"oracle", "hire_everyone", "never_pass_keys", "no_communication"}
    assert set(held) == {"random", "untrained", "trained"} | scripts
    assert scripts <= set(summary["latency"])  # the solo comparison under every script too
    two_x = next(f for f in summary["findings"] if f["key"] == "big_team_reaches_2x")
    assert set(two_x["scripts"]) == scripts and two_x["judged_against_scripts"]


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_quick_experiment_writes_every_figure(tmp_path: Path) -> None:
    out, summary = _experiment(tmp_path)
    assert len(summary["findings"]) == 13, [f["finding"] for f in summary["findings"]]
    configs = {name: load_config(out / "runs" / f"{name}-s0" / "config.toml") for name in RUNS}
    for name, cfg in configs.items():  # each run's config as used, beside its metrics
        assert cfg.steps == len(read_metrics(out / "runs" / f"{name}-s0")) == 2
    assert configs["no_pressure"].time_limit_end > configs["main"].time_limit_end
    assert configs["per_agent"].advantage == "individual" != configs["main"].advantage
    assert configs["ceo"].org == "ceo" != configs["main"].org == "flat"
    assert configs["latency_penalty"].latency_penalty > 0 == configs["main"].latency_penalty
    assert configs["orchestrator"].org == "orchestrator" and configs["islands"].org == "islands"
    assert summary["no_pressure_at_own_limit"]["mean"] is not None
    loose = summary["no_pressure_limit"]
    assert loose["limit"] == configs["no_pressure"].time_limit_end
    assert loose["training"]["episodes"] == 2 * 5 * 2  # steps x groups x rollouts
    assert 0 <= loose["training"]["share_at_limit"] <= 1
    for name in ("ceo", "islands"):  # baselines through their own protocol
        assert summary["heldout"][name]["untrained"] != summary["heldout"]["main"]["untrained"]
    # the orchestrator with one policy answering every agent is the flat main run's team: its
    # own untrained (and random) baseline is the flat one, measured again through its protocol
    for kind in ("untrained", "random"):
        assert summary["heldout"]["orchestrator"][kind] == summary["heldout"]["main"][kind]
    frozen = summary["orchestrator_frozen"]
    assert frozen["sub_agents_frozen"] is True, frozen


@pytest.mark.timeout(300)
def test_orchestrator_check_tells_frozen_sub_agents_from_trained_ones(tmp_path: Path) -> None:
    """The check the full run reports (``orchestrator_frozen``) on real one-step runs: the
    orchestrator's sub-agents answer with the frozen policy and only agent 0's tokens are
    trained; a flat team, where every agent answers with the trained policy, fails it."""
    from collective.rl.train import train
    from experiments.signs_of_life import frozen_check, limit_share, variants

    specs = variants(quick=True, steps=1)
    runs = {}
    for name, variant in (("orchestrator", "orchestrator"), ("flat", "main")):
        fields = {**specs[variant], "groups_per_step": 5, "group_size": 2, "team_sizes": (3,)}
        runs[name] = tmp_path / name
        train(read_config(fields), runs[name], progress=False)
    orch = frozen_check([runs["orchestrator"]])
    assert orch["sub_agents_frozen"] is True, orch
    from experiments.signs_of_life import training_facts as facts_of

    orch_facts = facts_of(runs["orchestrator"])
    assert orch["turns"]["frozen by sub-agent"] > 0 and orch["turns"]["trained by orchestrator"] > 0
    flat = frozen_check([runs["flat"]])
    assert flat["sub_agents_frozen"] is False and flat["turns"]["trained by sub-agent"] > 0
    share = limit_share([runs["flat"]])
    assert share["episodes"] == 10 and sum(share["ends"].values()) == 10
    # a checkout keeps a run without its episodes: the checks read the facts kept beside it
    import shutil

    from experiments.signs_of_life import FACTS

    for run in runs.values():
        shutil.rmtree(run / "episodes")
    assert frozen_check([runs["orchestrator"]]) == orch
    assert limit_share([runs["flat"]]) == share
    (runs["flat"] / FACTS).unlink()
    with pytest.raises(ValueError, match=r"flat: its training episodes are not here"):
        limit_share([runs["flat"]])
    # a run resumed in another checkout has some of its episodes: those are read, the rest
    # counted as missing, not fatal
    (runs["flat"] / "episodes").mkdir()
    assert limit_share([runs["flat"]])["episodes_missing"] == 10
    # ... unless an earlier facts file of the same run kept them: a partial run committed with
    # its facts, resumed elsewhere (its ledger grew), keeps its early steps' facts
    import json

    from experiments.signs_of_life import training_facts

    facts = json.loads((runs["orchestrator"] / FACTS).read_text())
    facts["ledger_steps"] -= 1  # as if kept one step earlier
    (runs["orchestrator"] / FACTS).write_text(json.dumps(facts))
    (runs["orchestrator"] / "episodes").mkdir()
    again = training_facts(runs["orchestrator"])
    assert again["steps"] == orch_facts["steps"] and again["missing"] == {}


def test_contrasts_pair_runs_by_training_seed_and_holm_spans_the_named_family() -> None:
    """A variant that finished fewer seeds (``--complete-only``) is paired with the main run's
    rows of the same seeds, not by position; a seedless baseline is set against every seed;
    and the Holm family is PRIMARY whatever was run."""
    import numpy as np

    from collective.studies.intervals import seed_interval
    from experiments.signs_of_life import PRIMARY, contrast, finding, judge_findings, versus

    main = np.array([[1.0, 1.2], [5.0, 5.1], [9.0, 9.3]])  # seeds 0, 1, 2: seed effects
    variant = np.array([[0.5, 0.6], [8.4, 8.9]])  # seeds 0 and 2 only
    d = contrast(main, [0, 1, 2], variant, [0, 2])
    assert d.seeds == 2 and d.per_seed == pytest.approx([0.55, 0.5])
    r = contrast(main, [0, 1, 2], np.array([[0.0, 0.0]]), None)
    assert r.per_seed == pytest.approx([1.1, 5.05, 9.15])
    v = versus(np.array([2.0, 3.0, 4.0]), np.array([1.0, 1.5, 2.0]), [0, 1, 2], [0, 1, 2])
    assert v.per_seed == pytest.approx([1.0, 1.5, 2.0])
    clear = seed_interval([0.30, 0.32, 0.28, 0.31])
    weak = seed_interval([0.05, -0.01, 0.07, 0.04, 0.06, 0.0])  # p ~ 0.03
    fs = [
        finding("learning", "a", clear, {}, "-", {"x": (clear, 0.0)}),
        finding("ceo", "b", weak, {}, "-", {"x": (weak, 0.0)}),
    ]
    judge_findings(fs)
    assert fs[0]["verdict"] == "yes" and fs[1]["verdict"] == "no"  # weak fails over 12
    assert fs[1]["p_holm"] == pytest.approx(min(1.0, (len(PRIMARY) - 1) * fs[1]["p"]))
    assert "_parts" not in fs[0]  # nothing unserialisable is left for summary.json
    # a yes that a control script (one lacking the skill) also shows is built in: no yes
    script = {"oracle": seed_interval([2.1]), "hire_everyone": seed_interval([1.7])}
    two_x = [
        finding(
            "learning",
            "a",
            clear,
            {},
            "-",
            {"x": (clear, 0.0)},
            scripts=script,
            reproduces=lambda x: x >= 1.5,
        ),
        finding(
            "ceo",
            "b",
            clear,
            {},
            "-",
            {"x": (clear, 0.0)},
            scripts=script,
            reproduces=lambda x: x >= 2.0,
        ),
    ]
    judge_findings(two_x)
    assert two_x[0]["p_holm"] < 0.05 and two_x[0]["verdict"] == "no"
    assert two_x[0]["built_in_by"] == ["hire_everyone"] and "built in" in two_x[0]["why"]
    assert two_x[1]["verdict"] == "yes" and two_x[1]["reproduced_by"] == ["oracle"]
    assert "attainable" in two_x[1]["why"]


def _write(path: Path, text: str) -> None:
    path.write_text(f"{text} {os.getpid()}")


def _fail() -> None:
    raise RuntimeError("this job breaks")


def test_the_pool_runs_each_job_in_a_child_and_stops_at_the_first_failure(tmp_path: Path) -> None:
    """The experiment's parallel jobs (training runs, measurements): each in a child process,
    ``jobs`` at a time, every one reported done and counted; a job that raises stops the pool
    with a line naming it, and the jobs not yet started never start."""
    import functools

    from experiments.signs_of_life import pool

    done: list[tuple[int, str]] = []
    work = [(f"job{k}", functools.partial(_write, tmp_path / f"{k}.txt", str(k))) for k in range(5)]
    pool(work, 2, lambda k, label: done.append((k, label)))
    assert [k for k, _ in done] == [1, 2, 3, 4, 5]
    assert sorted(label for _, label in done) == [f"job{k}" for k in range(5)]
    written = [(tmp_path / f"{k}.txt").read_text().split() for k in range(5)]
    assert [text for text, _ in written] == [str(k) for k in range(5)]
    pids = {int(pid) for _, pid in written}
    assert len(pids) == 5 and os.getpid() not in pids, "one child process a job"

    late = tmp_path / "late.txt"
    broken = [("broken", _fail), ("late", functools.partial(_write, late, "x"))]
    with pytest.raises(SystemExit, match=r"signs_of_life: broken failed \(exit 1\)"):
        pool(broken, 1, lambda *_: None)
    assert not late.exists()
