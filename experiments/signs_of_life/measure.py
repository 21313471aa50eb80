"""The held-out protocol, the same for every kind of policy: each training seed's own fresh
instances (:func:`episode`, :func:`evaluate`), the solo against the collective in simulated time
(:func:`latency_curves`), and every measurement the findings need, seed by seed, each part kept
under its digest (``measured/PART-nN.npz``, :func:`measure_key`, ``MEASURE_VERSION``) and re-used
while it matches (:func:`measure_all`)."""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

import numpy as np

from collective import (
    Episode,
    EpisodeConfig,
    latency_preset,
    run_episodes,
)
from collective.records.signs import signs
from collective.rl.train import TrainConfig, load_config
from experiments.resumable import (
    digest,
    file_digest,
    run_digest,
    store,
    stored_digest,
)
from experiments.setting import EVAL_T
from experiments.signs_of_life.design import HORIZON, KINDS, LOOSE, SCRIPTS, kinds_of
from experiments.signs_of_life.runs import checkpoint_of, cpu_seconds, pool, seed_of, snapshot_steps
from policy.scripted import ScriptedPolicy, workshop_scripts
from policy.tiny import TinyModel, TinyPolicy
from policy.uniform import RandomPolicy

#: Held-out instances: training seed s is measured on its own fresh ones, world and sampling
#: seeds BASE + SPAN * s + i (latency curves: LATENCY_BASE + ...), and every baseline (random,
#: the scripts) on the same seed's, so each per-seed figure carries its instances' sampling noise,
#: a t-interval over seeds covers seed and instance variation alike
#: (tests/studies/test_intervals.py), and every contrast pairs rows drawn alike.
BASE, LATENCY_BASE, SPAN = 90_000, 50_000, 1_000


def heldout_base(run: Path, base: int = BASE) -> int:
    return base + SPAN * seed_of(run)


# -- the held-out protocol, the same for every policy ------------------------------------------


def episode(
    cfg: TrainConfig, team: int, instance: int, limit: float, task: int = 0, base: int = 90_000
) -> EpisodeConfig:
    """Held-out instance ``instance`` for a team of ``team`` under the run's organisation (a CEO
    hiring up to team - 1; a flat, orchestrated or islands team of ``team`` otherwise)."""
    agents, budget = (1, team - 1) if cfg.org == "ceo" else (team, 0)
    return EpisodeConfig(
        world=cfg.worlds[0].world,
        params=dict(cfg.worlds[0].params),
        org=cfg.org,
        agents=agents,
        world_agents=(task or team) if cfg.org in ("ceo", "flat") else 0,
        budget=budget,
        world_seed=base + instance,
        sample_seed=base + instance,  # (each seed's instances sample apart too)
        time_limit=limit,
        max_output_tokens=cfg.max_output_tokens,
        latency=latency_preset(cfg.latency),
        tokenizer="bytes",
    )


def policies(run: Path, kind: str) -> Any:
    """A kind's policy for ``run``: ``untrained`` is the run's starting weights (the prior, or
    fresh ones), its step-0 baseline."""
    cfg = load_config(run / "config.toml")
    start = TinyModel.load(cfg.init) if cfg.init else TinyModel.fresh(cfg.tiny)
    untrained = TinyPolicy(start)
    if kind == "random":
        return RandomPolicy()
    if kind == "untrained":
        return {"trained": untrained, "frozen": untrained}
    ckpt = checkpoint_of(run, kind)
    if ckpt is None:
        raise ValueError(f"no policy kind {kind!r}")
    trained = TinyPolicy(TinyModel.load(ckpt))
    return {"trained": trained, "frozen": untrained}  # the orchestrator's sub-agents: frozen


def play(cfgs: list[EpisodeConfig], run: Path, kind: str, concurrency: int = 20) -> list[Episode]:
    """Episodes of ``cfgs`` (in their order) under one kind of policy. A scripted control keeps
    state per agent id, so each of its episodes gets a fresh script (and runs alone)."""
    scripts = workshop_scripts()
    if kind in scripts:
        return [
            run_episodes([c], ScriptedPolicy(scripts[kind](), name=kind), concurrency=1)[0]
            for c in cfgs
        ]
    return run_episodes(cfgs, policies(run, kind), concurrency=concurrency)


def evaluate(runs: list[Path], kind: str, n: int, limit: float) -> dict[str, np.ndarray]:
    """Per (seed, team, instance): score, useful work (the output tokens of world tool calls
    that landed, collective/records/signs.py; ``attempted``: those begun, refused ones included),
    communication (message and post tokens per agent-second alive; ``talk``: per episode), and
    whether the time limit ended the episode or the task was done (the rest ended idle: every
    agent waiting for a message nobody would send); ``useful_per_agent``: landed work tokens per
    agent that took part; ``taught``: keys agents learned from messages (the talk that carried
    knowledge). A row per training seed, on that seed's instances (``heldout_base``), for every
    kind: random and the scripts too."""
    cfg = load_config(runs[0] / "config.toml")
    if n > SPAN:
        raise ValueError(f"signs_of_life: at most {SPAN} held-out instances a team size, not {n}")
    got: dict[str, list[np.ndarray]] = {}
    for run in runs:
        b = heldout_base(run)
        cfgs = [
            episode(cfg, t, i, limit, base=b) for t in cfg.worlds[0].team_sizes for i in range(n)
        ]
        eps = play(cfgs, run, kind)
        shape = (len(cfg.worlds[0].team_sizes), n)
        sg = [signs(e) for e in eps]
        for key, vals in (
            ("score", [e.score for e in eps]),
            ("useful", [x.landed_tokens for x in sg]),
            ("attempted", [e.stats.world_tokens for e in eps]),
            ("useful_per_agent", [x.landed_per_agent for x in sg]),
            ("comm", [x.talk_per_agent_second for x in sg]),
            ("talk", [x.talk_tokens for x in sg]),
            ("taught", [e.world_metrics.get("taught", 0) for e in eps]),
            ("at_limit", [e.end == "time_limit" for e in eps]),
            ("done", [e.end == "done" for e in eps]),
        ):
            got.setdefault(key, []).append(np.array(vals, dtype=float).reshape(shape))
    return {k: np.array(v) for k, v in got.items()}


def measurements(runs: dict[str, list[Path]]) -> list[str]:
    """Every held-out measurement the findings need, longest first: ``NAME|KIND|LIMIT`` (an
    evaluation) or ``latency|KIND`` (the main run's latency curves). The scripted controls run
    through the main run's protocol (its organisation, instances and limits)."""
    jobs = [f"latency|{k}" for k in (*KINDS, *SCRIPTS)]
    if "no_pressure" in runs:
        jobs += [f"no_pressure|{k}|{LOOSE:g}" for k in KINDS]
    for name in runs:
        kinds = kinds_of(name)
        jobs += [f"{name}|{k}|{EVAL_T:g}" for k in kinds]
    # the held-out training curve: the main run's kept checkpoints, at the same limit
    jobs += [f"main|step{s}|{EVAL_T:g}" for s in snapshot_steps(runs["main"])]
    return jobs


def parts(job: str, runs: dict[str, list[Path]]) -> list[str]:
    """A measurement's parts, one per training run (``JOB#SEED``), random and scripts too (each
    on that seed's instances)."""
    name = job.split("|")[0]
    rs = runs["main" if name == "latency" else name]
    return [f"{job}#{seed_of(r)}" for r in rs]


def measure(runs: dict[str, list[Path]], part: str, n: int) -> dict[str, Any]:
    """One part: the measurement on one seed's run alone (the rows of a measurement are
    computed seed by seed, so its parts stacked are the whole)."""
    job, seed = part.rsplit("#", 1)
    name, kind, *limit = job.split("|")
    rs = runs["main" if name == "latency" else name]
    run = [r for r in rs if seed_of(r) == int(seed)]
    if name == "latency":
        return latency_curves(run, kind, n, team=8)
    return evaluate(run, kind, n, float(limit[0]))


def stack(pieces: list[dict[str, Any]]) -> dict[str, Any]:
    """A measurement from its parts: per-seed arrays stacked; the grid and limit are shared."""
    shared = ("grid", "t_max")
    return {
        k: pieces[0][k] if k in shared else np.concatenate([p[k] for p in pieces])
        for k in pieces[0]
    }


def measure_all(
    out: Path, runs: dict[str, list[Path]], n: int, jobs: int
) -> dict[str, dict[str, Any]]:
    """Every measurement, seed by seed, in this process (``jobs`` 1) or ``jobs`` child
    processes at a time (:func:`pool`), each part written to ``OUT/measured/<part>.npz``
    with its digest beside it (:func:`measure_key`). A part whose stored digest matches is
    re-used, any other measured again: each is a function of one run's weights and the
    instances alone, so where or when it ran changes nothing."""
    todo = [part for job in measurements(runs) for part in parts(job, runs)]
    keys = {part: measure_key(out, part, n) for part in todo}
    missing = [p for p in todo if stored_digest(measured_file(out, p, n)) != keys[p][0]]
    t0 = time.perf_counter()

    def done(k: int, what: str) -> None:
        print(
            f"[measure {k}/{len(missing)}] {what} ({(time.perf_counter() - t0) / 60:.1f} min, "
            f"{cpu_seconds() / 60:.1f} CPU min so far)",
            flush=True,
        )

    if len(missing) < len(todo):
        print(f"[measure] {len(todo) - len(missing)} of {len(todo)} re-used (digests match)")

    def one(part: str) -> None:
        store(measured_file(out, part, n), *keys[part], measure(runs, part, n), _save_npz)

    if jobs <= 1:
        for k, part in enumerate(missing, 1):
            one(part)
            done(k, part)
    else:
        pool([(part, functools.partial(one, part)) for part in missing], jobs, done)
    got = {part: _load_npz(measured_file(out, part, n)) for part in todo}
    return {job: stack([got[p] for p in parts(job, runs)]) for job in measurements(runs)}


# bump when what a measurement computes changes (2: episodes in config order; 3: landed work,
# message and post tokens per agent-second; 4: re-used by digest; 5: keys taught, scripted
# controls, a 16x horizon on a 2 s grid)
MEASURE_VERSION = 7


def measured_file(out: Path, part: str, n: int) -> Path:
    """Where a measurement's part is kept (its digest beside it, ``.digest.json``)."""
    return out / "measured" / f"{part.replace('|', '-').replace('#', '-seed')}-n{n}.npz"


def measure_key(out: Path, part: str, n: int) -> tuple[str, dict[str, Any]]:
    """The digest of a measurement's part and the settings it covers: the measured run's
    config digest, the trained checkpoint's bytes (for the trained policy), the part, its
    instances, the protocol's constants and MEASURE_VERSION. A retrained, resumed or
    reconfigured run, or a changed protocol, never re-uses an old measurement."""
    job, seed = part.rsplit("#", 1)
    variant, kind = job.split("|")[:2]
    run = out / "runs" / f"{'main' if variant == 'latency' else variant}-s{seed}"
    ckpt = checkpoint_of(run, kind)
    settings = {
        "part": part,
        "instances": n,
        "run": run.name,
        "run_digest": run_digest(run),
        "checkpoint": file_digest(ckpt) if ckpt is not None and ckpt.is_file() else None,
        "protocol": {"eval_t": EVAL_T, "horizon": HORIZON, "loose": LOOSE, "team": 8},
        "measure_version": MEASURE_VERSION,
    }
    return digest("measure", settings), settings


def _save_npz(path: Path, result: dict[str, Any]) -> None:
    np.savez(path, **result)


def _load_npz(path: Path) -> dict[str, Any]:
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


# -- 3. performance against latency --------------------------------------------------------------


def curve_at(curve: list[tuple[float, float]], times: np.ndarray) -> np.ndarray:
    """The anytime score at each time (a step function: the last value at or before t)."""
    ts = np.array([t for t, _ in curve])
    vs = np.array([v for _, v in curve])
    idx = np.searchsorted(ts, times, side="right") - 1
    return vs[np.clip(idx, 0, None)]


def first_time(grid: np.ndarray, values: np.ndarray, level: float) -> float | None:
    hit = np.nonzero(values >= level - 1e-9)[0]
    return float(grid[hit[0]]) if len(hit) else None


def latency_curves(runs: list[Path], kind: str, n: int, team: int) -> dict[str, Any]:
    """Score against simulated time for a collective of ``team`` (limit EVAL_T) and a solo agent
    on the same instances of the same fixed task, allowed to run until it has spent the
    collective's output tokens (or the horizon). Curves per (seed, instance)."""
    cfg = load_config(runs[0] / "config.toml")
    horizon = EVAL_T * HORIZON
    grid = np.linspace(0, horizon, 1441)  # 2 s apart
    teams, solos = [], []
    for run in runs:
        b = heldout_base(run, LATENCY_BASE)
        col = play([episode(cfg, team, i, EVAL_T, base=b) for i in range(n)], run, kind, n)
        solo = play(
            [episode(cfg, 1, i, horizon, task=team, base=b) for i in range(n)], run, kind, n
        )
        tc, sc = [], []
        for c, s in zip(col, solo, strict=True):
            stop = _spent_at(s, c.stats.output_tokens, horizon)
            sv = curve_at(s.curve, grid)
            sv[grid > stop] = curve_at(s.curve, np.array([stop]))[0]
            cv = curve_at(c.curve, grid)
            cv[grid > EVAL_T] = c.score
            tc.append(cv)
            sc.append(sv)
        teams.append(tc)
        solos.append(sc)
    return {"grid": grid, "team": np.array(teams), "solo": np.array(solos), "t_max": EVAL_T}


def _spent_at(solo: Episode, budget: int, horizon: float) -> float:
    spent = 0
    for t in sorted(solo.turns, key=lambda t: t.answered):
        spent += len(t.token_ids)
        if spent >= budget:
            return min(t.answered, horizon)
    return horizon
