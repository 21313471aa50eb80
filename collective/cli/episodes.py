"""The commands that read a recorded episode: ``replay`` (and its fork, ``--until``), ``show``,
``trace`` and ``diff``. Each opens episode files and writes at most one new file (a fork, a
trace, a picture); none trains or reads a config. ``collective.cli`` imports this module so that
its ``@command``s are registered, and declares their flags with the others in ``build_parser``."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import msgspec

from collective.base.outputs import check_file, printable
from collective.base.progress import Clock, on_terminal
from collective.cli.shared import close_policy, command, episode_summary, input_paths, say
from collective.records import (
    Asked,
    Delivered,
    Ended,
    EpisodeStream,
    open_episode,
    save_episode,
    world_error,
)
from collective.views.text import describe

# -- replay and fork ---------------------------------------------------------------------------


def _world_to_import(ep: EpisodeStream, a: argparse.Namespace) -> str | None:
    """The world reference a replay may import: the user's ``--world``; else the episode's own
    if it is built in or the user passed ``--trust-world`` (None: the recorded one). Opening
    someone's episode must not run code that only the file names."""
    from collective.engine.registry import is_builtin

    if a.world:
        return a.world
    ref = ep.config.world
    if is_builtin(ref) or a.trust_world:
        return None
    raise ValueError(
        f"{a.episode} runs world {ref!r}, which is not built in: replaying imports it, running "
        f"code the file names; to run it, name it: --world {ref} (or pass --trust-world)"
    )


@command
def cmd_replay(a: argparse.Namespace) -> int:
    from collective.replay import audit, check_replayable, first_divergence, fork, prefix
    from policy.factory import make_policy

    ep = open_episode(a.episode)
    world = _world_to_import(ep, a)
    check_replayable(ep, world, fork=a.until is not None)
    t0 = time.perf_counter()
    if a.until is None:
        for option, given in (("--out", a.out is not None), ("--seed", a.seed is not None)):
            if given:
                say(f"collective replay: error: {option} needs --until (a fork)", file=sys.stderr)
                return 2
        policy = make_policy(a.policy) if a.policy else None
        clock = Clock(ep.duration, "replay") if on_terminal() else None
        try:
            _, problems = audit(
                ep, policy=policy, world=world, progress=clock.at if clock else None
            )
        finally:
            if clock is not None:
                clock.close()
            if policy is not None:
                close_policy(policy)
        if problems:
            say(f"replay of {a.episode} DIVERGED")
            for line in problems:
                say(f"  {printable(line)}")
            return 1
        say(
            json.dumps(
                {
                    "replay": "identical",
                    "events": len(ep.events),
                    "turns": ep.stats.turns,  # as `run` counts them: answers that landed
                    "answers": "recomputed" if policy else "recorded",
                    "token_ids": "spell the text" if ep.config.tokenizer == "bytes" else "counted",
                    "wall_time": round(time.perf_counter() - t0, 3),
                }
            )
        )
        return 0
    if not 0 <= a.until <= ep.config.time_limit:  # before a policy (a server?) is started
        raise ValueError(f"--until {a.until}: outside the episode (0..{ep.config.time_limit:g})")
    out = check_file(a.out, "--out", input_paths(a, "out")) if a.out is not None else None
    policy = make_policy(a.policy or "random")
    clock = Clock(ep.config.time_limit, "fork") if on_terminal() else None
    try:
        forked = fork(
            ep,
            a.until,
            policy,
            sample_seed=a.seed,
            world=world,
            progress=clock.at if clock else None,
        )
    finally:
        if clock is not None:
            clock.close()
        close_policy(policy)
    d = first_divergence(prefix(ep.events, a.until), prefix(forked.events, a.until))
    if d is not None:
        say(f"fork of {a.episode} does not share its prefix up to t={a.until}\n{d.describe()}")
        return 1
    if out is not None:
        save_episode(forked, out, "--out")
    summary = episode_summary(forked, time.perf_counter() - t0, a.out)
    summary.update(
        forked_at=a.until,
        prefix_events=len(prefix(ep.events, a.until)),
        original_score=round(ep.score, 6),
    )
    say(json.dumps(summary))
    return 0


# -- show and diff -----------------------------------------------------------------------------


@command
def cmd_show(a: argparse.Namespace) -> int:
    ep = open_episode(a.episode)
    if a.png is not None:
        from collective.views.swimlane import MAX_LANES, draw_timeline

        check_file(a.png, "--png", [a.episode])
        clock = Clock(ep.duration, "show --png: reading") if on_terminal() else None
        try:
            drawn = draw_timeline(ep, a.png, progress=clock.at if clock else None)
        finally:
            if clock is not None:
                clock.close()
        say(drawn)
        if ep.config.agents + ep.stats.hires > MAX_LANES:  # every agent that ever lived
            say(
                f"show: only the first {MAX_LANES} agents have lanes; "
                "`collective trace` shows every agent",
                file=sys.stderr,
            )
        return 0
    c = ep.config
    header = (
        f"# {c.world} {c.params or ''} agents={c.agents} org={c.org} world_seed={c.world_seed} "
        f"sample_seed={c.sample_seed} T_max={c.time_limit:g}s clock={c.clock} "
        f"latency={c.latency.name} policy={c.policy}"
    )
    say(printable(header))
    if a.observations:
        _show_observations(ep, a)
        return 0
    shown = 0
    for e in ep.events:
        if a.agent is not None and e.agent != a.agent and not isinstance(e, Ended):
            continue
        if isinstance(e, Asked | Delivered) and not a.all:
            continue
        say(f"{e.t:10.3f}  {describe(e)}")
        shown += 1
        if a.limit and shown >= a.limit:
            say(f"... ({len(ep.events)} events in all)")
            break
    say(
        f"# score {ep.score:.4f} after {ep.duration:.1f}s simulated ({ep.end}); "
        f"{ep.stats.turns} turns, {ep.stats.output_tokens} tokens, {ep.stats.sent} messages"
    )
    if ep.world_metrics:  # the world's own metrics() at the end
        say("# world metrics: " + ", ".join(f"{k} {v:g}" for k, v in ep.world_metrics.items()))
    if ep.end == "world_error":
        say(f"# {printable(world_error(ep))}")
    return 0


def _show_observations(ep: EpisodeStream, a: argparse.Namespace) -> None:
    """Every turn's prompt: what the agent saw (the world's observation, then its inbox, the
    channels' news and its last result), then what it decided and what came of it."""
    turns = ep.turns_of(a.agent)
    if turns and not any(t.prompt for t in turns):
        raise ValueError(
            f"{a.episode} was run with keep_prompts = false: it holds no observations to show"
        )
    turns.sort(key=lambda t: (t.asked, t.agent, t.turn))
    for shown, t in enumerate(turns):
        if a.limit and shown >= a.limit:
            say(f"... ({len(turns)} turns in all)")
            break
        say(f"{t.asked:10.3f}  agent {t.agent} turn {t.turn} ({printable(t.role)}) sees:")
        for line in t.prompt.split("\n"):
            say(f"{'':12}| {line}")
        if t.kind:
            outcome = f"{'->' if t.ok else 'FAILED ->'} {printable(t.result)}"
        else:
            outcome = "(the episode ended first)"
        say(f"{t.answered:10.3f}  decides: {t.text!r}  {outcome}")


@command
def cmd_trace(a: argparse.Namespace) -> int:
    from collective.views.trace import WARN_AGENTS, WARN_BYTES, agents_in, parse_agents, write_trace

    ep = open_episode(a.episode)
    keep = parse_agents(a.agents) if a.agents is not None else None
    default = Path(a.episode).with_suffix(".trace.json")
    out = check_file(a.out if a.out is not None else default, "--out", [a.episode])
    tracks = agents_in(ep, keep)
    if tracks > WARN_AGENTS:
        say(
            f"trace: warning: {tracks} agent tracks; viewers slow down past about "
            f"{WARN_AGENTS:,}: keep fewer with --agents 0-99",
            file=sys.stderr,
        )
    w = write_trace(ep, out, keep, real=a.real, progress=len(ep.events) > 200_000)
    if w.bytes > WARN_BYTES:
        say(
            f"trace: warning: {w.bytes / 2**20:.0f} MB written; chrome://tracing cannot open JSON "
            f"over about 512 MB and the Perfetto UI loads large JSON slowly: keep fewer agents "
            f"with --agents",
            file=sys.stderr,
        )
    say(json.dumps(msgspec.structs.asdict(w)))
    return 0


@command
def cmd_diff(a: argparse.Namespace) -> int:
    from collective.replay import compare

    x, y = open_episode(a.a), open_episode(a.b)
    checker = compare(x, y)
    lines = checker.lines()
    if not lines:
        say(f"identical episodes ({len(x.events)} events, {x.stats.turns} turns)")
        return 0
    for line in lines:
        if line.startswith("config "):
            say(printable(line))
    d = checker.divergence
    if d is not None:
        times = sorted({repr(e.t) for e in (d.expected, d.got) if e is not None})
        say(f"first divergence at event {d.index} (t={' vs '.join(times)}):")
        say(f"  {a.a}: " + ("(ended)" if d.expected is None else describe(d.expected, True)))
        say(f"  {a.b}: " + ("(ended)" if d.got is None else describe(d.got, True)))
    else:
        say(f"identical event streams ({len(x.events)} events)")
    for line in lines:
        if not line.startswith(("config ", "first divergence at event ")):
            say(printable(line))
    return 1
