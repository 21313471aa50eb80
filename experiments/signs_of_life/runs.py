"""Training the study's runs and reading what they kept: every (variant, seed) run trained,
resumed or re-used by its config's digest (:func:`run_all`, :func:`complete_runs`), in forked
children ``jobs`` at a time (:func:`pool`, which the measurements use too); a run's checkpoints
(:func:`checkpoint_of`, :func:`snapshot_steps`) and its training facts, kept beside it so that a
checkout without its episodes still summarises it (:func:`training_facts`, :func:`limit_share`,
:func:`frozen_check`)."""

from __future__ import annotations

import functools
import json
import multiprocessing
import multiprocessing.connection
import resource
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import msgspec
import numpy as np

from collective import (
    Episode,
)
from collective.base.outputs import write_file
from collective.records import load_episode
from collective.rl.rundir import read_run_file, snapshot_name, snapshot_step
from collective.rl.train import load_config, read_config, read_metrics
from experiments.resumable import (
    is_complete,
    run_digest,
    train_digest,
    train_exact,
)
from experiments.signs_of_life.design import CHECKOUT, PRIOR


def snapshot_steps(runs: list[Path]) -> list[int]:
    """The training steps every run kept a checkpoint of (``snapshot_every``), before its
    last: with the untrained (step 0) and trained (last step) weights they are the held-out
    training curve's points. Each is measured as kind ``stepN``."""
    kept: set[int] | None = None
    for run in runs:
        last = load_config(run / "config.toml").steps
        named = (snapshot_step(f.name) for f in (run / "checkpoints").glob("*.pt"))
        steps = {s for s in named if s is not None and s < last}
        kept = steps if kept is None else kept & steps
    return sorted(kept or ())


def checkpoint_of(run: Path, kind: str) -> Path | None:
    """The weights a kind is measured with: ``trained`` the last, ``stepN`` step N's."""
    if kind == "trained":
        return run / "checkpoints" / "latest.pt"
    if kind.startswith("step"):
        return run / "checkpoints" / f"{snapshot_name(int(kind[4:]))}.pt"
    return None


def train_one(out: Path, fields: dict[str, Any], name: str, seed: int) -> Path:
    """Train (or finish, or re-use) run ``name`` with training seed ``seed`` (from the prior, or
    from fresh weights of the same seed where the variant has no ``init``). A run is
    re-used only when its config digest (the full resolved config) matches, resumed when it
    matches but stopped midway, and trained afresh when it differs
    (:mod:`experiments.resumable`)."""
    cfg = read_config({**fields, "seed": seed})
    run = out / "runs" / f"{name}-s{seed}"
    t1 = time.perf_counter()
    what = train_exact(cfg, run, log=lambda s: print(s, flush=True))
    if (run / "episodes").is_dir():  # while its episodes are here (a checkout does not keep them)
        training_facts(run)
    if what != "reused":
        print(
            f"[{run.name}] {what}: {cfg.steps} steps in {time.perf_counter() - t1:.0f} s",
            flush=True,
        )
    return run


def run_all(
    out: Path, specs: dict[str, dict[str, Any]], seeds: list[int], jobs: int = 1
) -> dict[str, list[Path]]:
    """Every (variant, seed) run, ``jobs`` at a time: with more than one, each in a child
    process (:func:`pool`). Runs are independent and seeded, so the order and the parallelism
    change nothing."""
    todo = [(name, seed) for name in specs for seed in seeds]
    # the longest runs (a loose limit) first: better packing
    todo.sort(key=lambda job: job[0] not in ("no_pressure", "latency_penalty"))
    dirs = {name: [out / "runs" / f"{name}-s{seed}" for seed in seeds] for name in specs}
    t0 = time.perf_counter()

    def done(k: int, what: str) -> None:
        print(
            f"[train {k}/{len(todo)}] {what} ({(time.perf_counter() - t0) / 60:.1f} min so far)",
            flush=True,
        )

    if jobs <= 1:
        for k, (name, seed) in enumerate(todo, 1):
            done(k, train_one(out, specs[name], name, seed).name)
        return dirs
    pool(
        [(f"{n}-s{s}", functools.partial(train_one, out, specs[n], n, s)) for n, s in todo],
        jobs,
        done,
    )
    return dirs


def pool(
    work: list[tuple[str, Callable[[], object]]], jobs: int, done: Callable[[int, str], None]
) -> None:
    """Run each (label, job) in a child process of its own, ``jobs`` at a time; stop at the
    first failure, saying which. A child is a fork of this process, so it starts with torch and
    the project imported (a fresh interpreter spent about 3 s of CPU on that, a fifth of a quick
    run's measurements) and with nothing of another job's: a job's results are the files it
    writes. Fork copies no threads: the samplers make their pools anew in a child
    (:mod:`policy.threads`), and this process must not have run a multi-threaded torch kernel
    (:func:`main` runs none: its jobs do); each child runs torch on one intra-op thread, as
    training and sampling always do. Ended by a failure or Ctrl-C, it stops every child it
    started before it returns (a kill -9 leaves them running, as it would any child process)."""
    fork = multiprocessing.get_context("fork")
    pending = list(work)
    live: dict[int, tuple[str, multiprocessing.process.BaseProcess]] = {}
    finished = 0
    try:
        while pending or live:
            while pending and len(live) < jobs:
                label, job = pending.pop(0)
                started: multiprocessing.process.BaseProcess = fork.Process(
                    target=_child, args=(job,), name=label
                )
                started.start()
                live[started.sentinel] = (label, started)
            for sentinel in multiprocessing.connection.wait(list(live)):
                label, child = live.pop(cast(int, sentinel))  # a child's end: its sentinel
                child.join()
                if child.exitcode != 0:
                    raise SystemExit(f"signs_of_life: {label} failed (exit {child.exitcode})")
                finished += 1
                done(finished, label)
    finally:
        for _, left in live.values():
            left.terminate()
            left.join()


def _child(job: Callable[[], object]) -> None:
    import torch

    torch.set_num_threads(1)
    job()


def training_episodes(run: Path) -> tuple[list[tuple[int, Episode]], dict[str, int]]:
    """(step, episode) for every episode a step of the run trained on (its ledger) whose file
    is here, and how many files each step is missing: a run resumed in another checkout keeps
    only the episodes of the steps played there (episodes are not committed)."""
    out: list[tuple[int, Episode]] = []
    missing: dict[str, int] = {}
    for line in (read_run_file(run / "ledger.jsonl") or b"").decode().splitlines():
        entry = json.loads(line)
        for f in entry["used"]:
            if (run / "episodes" / f).exists():
                out.append((entry["step"], load_episode(run / "episodes" / f)))
            else:
                missing[str(entry["step"])] = missing.get(str(entry["step"]), 0) + 1
    return out, missing


#: What the summary reads from a run's training episodes, kept beside the run (its episodes
#: are not committed), so another checkout summarises without them.
FACTS = "training-facts.json"


def training_facts(run: Path) -> dict[str, Any]:
    """Per step of the run: how each trained-on episode ended, how many turns each policy took
    by role (the orchestrator is agent 0), and the trained policy's tokens. Read from the
    episodes while they are there and kept in ``RUN/training-facts.json`` under the run's digest
    and the steps its ledger holds (a run that grew or was retrained makes it stale); read from
    there when the episodes are not (a checkout that has the run but not its episodes); an error
    naming the run when neither holds. A run resumed in another checkout has only some of its
    episodes: the facts cover those and the steps an earlier facts file of the same run kept,
    and ``missing`` counts the rest by step (never silently)."""
    path = run / FACTS
    key = {"run_digest": run_digest(run), "ledger_steps": _ledger_steps(run)}
    kept: dict[str, Any] = {}
    if path.exists():
        try:
            kept = json.loads(path.read_text())
        except json.JSONDecodeError:
            kept = {}  # (a torn write: stale, read again from the episodes)
        if {k: kept.get(k) for k in key} == key:
            return kept
    # the same run, kept at fewer steps (a partial run committed with its facts, resumed in
    # another checkout): its steps' facts stand where their episodes are gone
    earlier = kept.get("steps", {}) if kept.get("run_digest") == key["run_digest"] else {}
    if not (run / "episodes").is_dir():
        raise ValueError(
            f"{run}: its training episodes are not here and {FACTS} is missing or does not "
            "match the run; move the run aside and train it again (it is deterministic) so "
            "that its episodes are written"
        )
    present, gone = training_episodes(run)
    steps: dict[str, dict[str, Any]] = {k: v for k, v in earlier.items() if k in gone}
    missing = {k: n for k, n in gone.items() if k not in steps}
    for step, ep in present:
        row = steps.setdefault(str(step), {"ends": [], "turns": {}, "trained_tokens": 0})
        row["ends"].append(ep.end)
        for t in ep.turns:
            role = f"{t.policy} by {'orchestrator' if t.agent == 0 else 'sub-agent'}"
            row["turns"][role] = row["turns"].get(role, 0) + 1
            if t.policy == "trained":
                row["trained_tokens"] += len(t.token_ids)
    facts = {**key, "steps": steps, "missing": missing}
    write_file(path, (json.dumps(facts, indent=1) + "\n").encode(), "training facts")
    return facts


def _ledger_steps(run: Path) -> int:
    return len((read_run_file(run / "ledger.jsonl") or b"").splitlines())


def limit_share(runs: list[Path]) -> dict[str, Any]:
    """How often the time limit, not the task's end or idleness, ended a run's training
    episodes: overall, in the last 20% of steps, and by what ended them."""
    ends = [
        (int(step), end, load_config(r / "config.toml").steps)
        for r in runs
        for step, row in training_facts(r)["steps"].items()
        for end in row["ends"]
    ]
    last = [e for s, e, n in ends if s >= n - max(1, n // 5)]
    return {
        "episodes": len(ends),
        "episodes_missing": sum(sum(training_facts(r).get("missing", {}).values()) for r in runs),
        "share_at_limit": _share([e == "time_limit" for _, e, _ in ends]),
        "share_at_limit_last_20pct": _share([e == "time_limit" for e in last]),
        "ends": dict(Counter(e for _, e, _ in ends)),
    }


def _share(flags: list[bool]) -> float | None:
    return float(np.mean(flags)) if flags else None  # (none seen: no share, not NaN)


def frozen_check(runs: list[Path]) -> dict[str, Any]:
    """The orchestrator run's sub-agents frozen, checked on its own training episodes: every
    turn of the trained policy is the orchestrator's (agent 0), every sub-agent's turn is the
    frozen policy's, and each step's trained tokens are exactly the orchestrator's tokens."""
    turns: Counter[str] = Counter()
    steps_match = 0
    steps = 0
    for run in runs:
        kept = training_facts(run)
        facts = kept["steps"]
        for row in facts.values():
            turns.update(row["turns"])
        for m in read_metrics(run):
            if str(m.step) in kept.get("missing", {}):
                continue  # (its episodes are in another checkout: not checked, not counted)
            steps += 1
            row = facts.get(str(m.step), {})
            steps_match += row.get("trained_tokens", 0) == m.trained_tokens
    frozen = set(turns) <= {"trained by orchestrator", "frozen by sub-agent"}
    return {
        "turns": dict(turns),
        "steps_whose_trained_tokens_are_the_orchestrators": f"{steps_match}/{steps}",
        "sub_agents_frozen": frozen and steps_match == steps and steps > 0,
    }


def seed_of(run: Path) -> int:
    return int(run.name.rsplit("-s", 1)[1])


def cpu_seconds() -> float:
    own, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def starting_point(out: Path, quick: bool) -> Path:
    """The prior every run starts from. In a checkout: the committed one, named from the
    checkout's root (this process works there, so a run's config names it alike in every
    checkout; a run's digest covers its bytes, not its path). Elsewhere (an installed copy):
    one made in ``OUT/prior`` by the same recipe, a small one with ``--quick``."""
    import os

    if (CHECKOUT / PRIOR).is_file() and (CHECKOUT / "bench" / "signs_of_life.py").exists():
        os.chdir(CHECKOUT)
        return PRIOR
    from experiments.prior import SFT, make_prior

    cfg = msgspec.structs.replace(SFT, epochs=1) if quick else SFT
    return make_prior(out.absolute() / "prior", 20 if quick else 200, cfg)[0]


def complete_runs(
    out: Path, specs: dict[str, dict[str, Any]], seeds: list[int]
) -> dict[str, list[Path]]:
    """The runs of ``specs`` at ``seeds`` already complete in ``out`` with exactly their config
    (``--complete-only``): each variant with the seeds that finished, one with none left out."""
    runs = {}
    for name, fields in specs.items():
        done = []
        for s in seeds:
            run, cfg = out / "runs" / f"{name}-s{s}", read_config({**fields, "seed": s})
            if run_digest(run) == train_digest(cfg) and is_complete(run, cfg):
                done.append(run)  # finished with exactly this config
        if done:
            runs[name] = done
    return runs
