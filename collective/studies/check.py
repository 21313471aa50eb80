"""``collective check``: what a world's author runs before training on it.

Everything checkable before an episode is checked when the world is defined and built (see
``collective.world``); this runs the rest on real episodes of a team (a random one, or the
policy a run will train: ``--policy``, or a training config's own starting policy): that no
world method raises, that the same seed gives the same bytes and a replay the same events, that
the score stays in [0, 1] (and never falls, if the world says so), that no episode hits the
event cap. Then it answers the question a training run cannot answer cheaply: does the world
give a policy something to learn? RLCR learns from the spread of returns within a group
(rollouts of one world seed): if a random team never scores at the training time limit, or
always scores the same, or already finishes, every advantage is zero and nothing is learned. So
it prints the team's score at a few time limits, with its spread within a world seed, and the
share of its actions the world refused, and says which case the world is in. A random team that
scores says little of a policy that does not: the untrained tiny model once scored 0 in 48 of 48
rollouts, 88% of its actions refused, on a world a random team found something to learn in.
"Something to learn" needs a quarter of the rollouts to score (``SCORED_ENOUGH``): below that
most groups are all zeros, every advantage in them is 0, and a run of a few hundred groups may
see too few that differ to move at all.

A world that raises (a world error) fails the way ``collective run`` fails on it, exit 2; one
that runs but breaks a promise (the same seed, another episode; a ``monotone`` score that falls;
the event cap) is a failed check, exit 1, as a replay that diverges is.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from collective.base.latency import latency_preset
from collective.engine.conductor import run_episode, run_episodes
from collective.engine.limits import (
    AGENT_BYTES,
    EPISODE_AGENT_BYTES,
    check_fits,
    human,
    world_footprint,
)
from collective.engine.registry import check_runnable, make_world, resolve_world
from collective.records import (
    Committed,
    Episode,
    EpisodeConfig,
    Rejected,
    Thought,
    encode_episode,
    world_error,
)
from collective.replay import differences, first_divergence, tokenizer_of, verify
from collective.world import World, convert_params
from policy.base import Policy
from policy.uniform import RandomPolicy

SATURATED = 0.95  # a random team's mean score at or above this: nothing left to learn
# The share of a random team's rollouts that must score for "something to learn": with groups of
# 4 rollouts, at 25% about two groups in three have a spread (1 - 0.75^4 - 0.25^4); at 8% (a
# world that check once called learnable at a mean of 0.003) about one in four does.
SCORED_ENOUGH = 0.25
OBSERVATION_BYTES = 200  # the guide's advice: observations longer than this cost every prompt


@dataclass
class Report:
    """What ``check`` found: lines marked ok or FAIL, the learnability table and a verdict."""

    world: str
    who: str = "random team"  # whose episodes: "random team", "tiny:PATH team", ...
    findings: list[tuple[bool, str]] = field(default_factory=list)
    table: list[tuple[float, float, float, float]] = field(default_factory=list)
    verdict: str = ""
    notes: list[str] = field(default_factory=list)
    world_error: str = ""  # the first world error's line, if an episode ended in one

    @property
    def team(self) -> str:
        """``who`` with its article: "a random team", "the team of tiny:PATH"."""
        return f"a {self.who}" if self.who == "random team" else f"the {self.who}"

    @property
    def ok(self) -> bool:
        return all(ok for ok, _ in self.findings)

    def lines(self) -> list[str]:
        out = []
        for ok, what in self.findings:  # a finding's later lines indented under it
            first, *more = what.split("\n")
            out.append(f"{'ok  ' if ok else 'FAIL'}  {first}")
            out += [f"      {line.strip()}" for line in more]
        out += [f"note  {n}" for n in self.notes]
        if self.table:
            out.append(
                f"{self.team[0].upper()}{self.team[1:]}'s score at each time limit (mean; spread "
                "within a world seed;"
            )
            out.append("  share of rollouts that scored):")
            for limit, mean, spread, scored in self.table:
                out.append(f"  {limit:8g} s   {mean:.3f}   ±{spread:.3f}   {scored:4.0%}")
        if self.verdict:
            out.append(f"verdict: {self.verdict}")
            out.append(
                f"  (something to learn: at least {SCORED_ENOUGH:.0%} of rollouts score, a spread "
                f"within a world seed, and a mean under {SATURATED})"
            )
        return out


def score_before(ep: Episode, limit: float) -> float:
    """The score an episode cut at ``limit`` would end with: the last change strictly before it
    (an episode cut at ``limit`` applies nothing at ``limit``), read from the score curve."""
    if limit >= ep.config.time_limit:
        return ep.score
    value = ep.curve[0][1]
    for t, s in ep.curve:
        if t >= limit:
            break
        value = s
    return value


def check_world(
    world: str,
    params: dict[str, Any],
    *,
    agents: int = 4,
    seeds: int = 3,
    rollouts: int = 4,
    time_limit: float = 600.0,
    latency: str = "tiny",
    limits: Sequence[float] = (),
    policy: Policy | None = None,
    who: str = "random team",
    like: EpisodeConfig | None = None,
) -> Report:
    """Check ``world`` on ``seeds`` world seeds x ``rollouts`` rollouts each of a team playing
    ``policy`` (random: ``None``), called ``who`` in the report. ``like``: the episode a
    training run plays (its org, budget, answer bound, temperature, policy name), whose world,
    team, time limit and latency these arguments replace.

    A world that cannot be defined or built raises ValueError (one line) before any episode,
    as ``collective run`` would; everything found by running is in the report. The checks run
    in the order the module's docstring gives, each one a function below; a world error ends
    the report there, and episodes the same seed does not repeat get no verdict."""
    if agents < 1 or seeds < 1 or rollouts < 2:
        raise ValueError("check needs --agents >= 1, --seeds >= 1 and --rollouts >= 2")
    if not 0 < time_limit < math.inf:
        raise ValueError(f"check --time-limit {time_limit}: must be finite and > 0")
    outside = [x for x in limits if not 0 < x <= time_limit]
    if outside:
        raise ValueError(
            f"check --limits {outside[0]}: read times must be in (0, T = {time_limit:g}]"
        )
    cls = resolve_world(world)
    _check_room(cls, world, params, agents, seeds, rollouts)
    report = Report(world, who)
    player = policy if policy is not None else RandomPolicy()
    base = msgspec.structs.replace(
        like or EpisodeConfig(policy=player.name, tokenizer=tokenizer_of(player)),
        world=world,
        params=params,
        agents=agents,
        time_limit=time_limit,
        latency=latency_preset(latency),
    )
    _check_built(report, base)

    configs = [
        _with(base, world_seed=s, sample_seed=1000 * s + r)
        for s in range(seeds)
        for r in range(rollouts)
    ]
    # (They finish in any order: put them back in the configs' order.)
    finished = run_episodes(configs, player, concurrency=len(configs))
    by_seeds = {(ep.config.world_seed, ep.config.sample_seed): ep for ep in finished}
    episodes = [by_seeds[(c.world_seed, c.sample_seed)] for c in configs]
    if not _check_ends(report, episodes, base.max_events):
        return report
    deterministic = _check_repeats(report, episodes[0], configs[0], player)
    _check_score(report, cls.monotone, episodes)
    report.notes.append(_actions(episodes))

    # A world may say what its episodes' metrics mean for learning (an ORS environment whose
    # rewards come only with `finished`).
    note = getattr(cls, "check_note", None)
    if callable(note) and (said := note([dict(ep.world_metrics) for ep in episodes])):
        report.notes.append(said)

    if not deterministic:
        # A verdict read from episodes that the same seed does not repeat would judge noise.
        report.notes.append(
            "no verdict on whether there is something to learn until the world is deterministic"
        )
        return report
    chosen = sorted(set(limits)) if limits else [time_limit / 4, time_limit / 2, time_limit]
    report.table = _learnability(episodes, chosen, seeds, rollouts)
    report.verdict = _verdict(report.table, who)
    return report


def _check_room(
    cls: type[World], world: str, params: dict[str, Any], agents: int, seeds: int, rollouts: int
) -> None:
    """Raise ValueError (one line) unless ``seeds`` x ``rollouts`` episodes of ``agents`` fit
    in memory. Every episode runs at once and is kept for the report, so the total is checked
    before any is built (2^70 seeds would otherwise build configs forever, never reaching a
    limit)."""
    at_once = seeds * rollouts
    each = world_footprint(cls, agents, convert_params(cls, params, world), world)
    check_fits(
        f"check: {at_once:,} episodes at once ({seeds:,} seeds x {rollouts:,} rollouts of "
        f"{agents:,} agents)",
        {
            "their agents": at_once * agents * AGENT_BYTES,
            "their worlds": at_once * each,
            f"the episodes kept, at {human(EPISODE_AGENT_BYTES)} an agent": at_once
            * agents
            * EPISODE_AGENT_BYTES,
        },
        world=each,
    )


def _check_built(report: Report, base: EpisodeConfig) -> None:
    """The world defined and built for one agent and for the team (raising ValueError, one
    line, as ``collective run`` would), its tools, and its longest observation: every agent
    reads it every turn, so a long one is noted."""
    agents = base.agents
    for n in sorted({1, agents}):
        check_runnable(_with(base, agents=n))
    built = make_world(base.world, agents, 0, base.params)
    try:
        longest = max(len(built.observe(a).encode()) for a in range(agents))
        tools = [s.name for s in built.tool_specs()]
    finally:
        built.close()
    report.findings.append(
        (
            True,
            f"defined and built for {' and '.join(map(str, sorted({1, agents})))} agents: "
            f"{len(tools)} tool{'s' * (len(tools) != 1)} ({', '.join(tools)}); observations "
            f"up to {longest} bytes",
        )
    )
    if longest > OBSERVATION_BYTES:
        report.notes.append(
            f"an observation of {longest} bytes: every agent reads it every turn, and a small "
            f"model sees only its prompt's last bytes (the guide suggests under "
            f"{OBSERVATION_BYTES})"
        )


def _check_ends(report: Report, episodes: Sequence[Episode], max_events: int) -> bool:
    """How the episodes ended: a world error (then False: nothing else is checked), the event
    cap, or their time limit (or the world's own end)."""
    broken = [ep for ep in episodes if ep.end == "world_error"]
    capped = [ep for ep in episodes if ep.end == "event_limit"]
    ends = ", ".join(f"{k} {v}" for k, v in sorted(Counter(ep.end for ep in episodes).items()))
    if broken:
        report.world_error = world_error(broken[0])
        report.findings.append(
            (
                False,
                f"{len(broken)} of {len(episodes)} episodes ended world_error; the first: "
                f"{report.world_error}",
            )
        )
        # What the other checks would say of episodes cut short by a bug says nothing of the
        # world once it is fixed (and "score in [0, 1]" beside a score of 1.5 is false).
        report.notes.append(
            "not checked until the world error is fixed: determinism, the score's range, "
            "whether there is something to learn"
        )
        return False
    if capped:
        report.findings.append(
            (
                False,
                f"{len(capped)} of {len(episodes)} episodes stopped at the event cap "
                f"({max_events:,} events): do some tools take no time?",
            )
        )
    else:
        report.findings.append(
            (True, f"{len(episodes)} episodes of {report.team} ran to their end ({ends})")
        )
    return True


def _check_repeats(report: Report, first: Episode, config: EpisodeConfig, player: Policy) -> bool:
    """Whether ``first`` (played from ``config``) is the same bytes when its seed is run again,
    and the same events when it is replayed."""
    again = run_episode(config, player)
    if encode_episode(again) != encode_episode(first):
        report.findings.append(
            (False, f"the same seed gave different episodes: {_parted(first, again)}")
        )
        return False
    d = verify(first)
    report.findings.append(
        (
            True,
            f"deterministic: the same seed gave the same bytes; replay identical "
            f"({len(first.events):,} events)",
        )
        if d is None
        # (a replay is the same seed run again: an unseeded world may agree once by chance)
        else (False, f"the same seed gave different episodes on replay: {d.describe()}")
    )
    return d is None


def _check_score(report: Report, monotone: bool, episodes: Sequence[Episode]) -> None:
    """The score stays in [0, 1] at every change (one outside it is a world error, which
    ``_check_ends`` reports) and, for a
    world that says ``monotone = True``, never falls."""
    falls = [(ep, t) for ep in episodes if (t := _first_fall(ep)) is not None]
    if monotone and falls:
        ep, t = falls[0]
        report.findings.append(
            (
                False,
                f"monotone = True, but the score fell at t={t:g} (world seed "
                f"{ep.config.world_seed}, sample seed {ep.config.sample_seed})",
            )
        )
    else:
        how = "never falls (monotone = True)" if monotone else "may fall (monotone = False)"
        report.findings.append((True, f"score in [0, 1] at every change; {how}"))


def _learnability(
    episodes: Sequence[Episode], limits: Sequence[float], seeds: int, rollouts: int
) -> list[tuple[float, float, float, float]]:
    """At each of ``limits``: the team's mean score, its spread within a world seed (what RLCR
    learns from) and the share of rollouts that scored. ``episodes``: ``rollouts`` of each
    world seed in turn."""
    table = []
    for limit in limits:
        scores = [score_before(ep, limit) for ep in episodes]
        groups = [scores[s * rollouts : (s + 1) * rollouts] for s in range(seeds)]
        spread = statistics.fmean(statistics.pstdev(g) for g in groups)
        scored = sum(x > 0 for x in scores) / len(scores)
        table.append((limit, statistics.fmean(scores), spread, scored))
    return table


def _actions(episodes: Sequence[Episode]) -> str:
    """How many of the team's answers did something: the share the world (or the engine)
    refused, and the share that were no action at all. A team mostly refused has little to
    learn from, whatever its score."""
    answered = refused = rejected = 0
    for ep in episodes:
        for e in ep.events:
            answered += isinstance(e, Thought)
            refused += isinstance(e, Committed) and not e.ok
            rejected += isinstance(e, Rejected)
    if not answered:
        return "actions: no answer in any episode"
    return (
        f"actions: {answered:,} answers; {refused / answered:.0%} refused by the world or the "
        f"engine, {rejected / answered:.0%} not an action"
    )


def _parted(first: Episode, again: Episode) -> str:
    """Where two runs of one seed first part, and what differed: the first event (as ``replay``
    names it), else the first other part of the record that differs."""
    d = first_divergence(first.events, again.events)
    if d is not None:
        e, g = d.expected, d.got
        what = ""
        if e is not None and g is not None and type(e) is type(g):
            fields = [f for f in type(e).__struct_fields__ if getattr(e, f) != getattr(g, f)]
            what = "\n  differs in: " + "; ".join(
                f"{f} {getattr(e, f)!r} vs {getattr(g, f)!r}"[:200] for f in fields
            )
            if "prompt" in fields:  # (a hash of the prompt is all an event keeps)
                what += f" (what agent {e.agent} saw: observe() or its inbox differed)"
        t = (e if e is not None else g).t
        first_, second = ("(ended)" if x is None else repr(x) for x in (e, g))
        return (
            f"the two runs part at event {d.index} (t={t!r})\n  first:  {first_}\n"
            f"  second: {second}"
            f"{what}\n  something the world reads is not seeded: draw from self.rng, "
            "never from time, the global random module, id() or a set's order"
        )
    lines = differences(first, again, config=False)
    return f"the same events, but {lines[0] if lines else 'other bytes'}"


def _first_fall(ep: Episode) -> float | None:
    """When the score first fell, if it ever did."""
    for (_, before), (t, after) in zip(ep.curve, ep.curve[1:], strict=False):
        if after < before:
            return t
    return None


def _verdict(table: list[tuple[float, float, float, float]], who: str = "random team") -> str:
    first, last = table[0], table[-1]
    limit, mean, spread, scored = last
    one, many = ("random rollout", "random rollouts")
    if who != "random team":
        one, many = f"rollout of the {who}", f"rollouts of the {who}"
    team = f"a {who}" if who == "random team" else f"the {who}"
    if scored == 0:
        return (
            f"nothing to learn at {limit:g} s: no {one} scored, so every advantage is "
            "0. Let partial progress score, give more time, or make the first steps easier."
        )
    if first[1] >= SATURATED:
        return (
            f"saturated: {team} already scores {first[1]:.3f} by {first[0]:g} s; "
            "shorten the time limit or grow the task."
        )
    if mean >= SATURATED:
        under = next((row[0] for row in table if row[1] < SATURATED), first[0])
        return (
            f"little to learn at {limit:g} s: {team} nearly finishes ({mean:.3f}); "
            f"train at {under:g} s or less, where it does not."
        )
    if spread == 0:
        return (
            f"nothing to learn at {limit:g} s: every rollout of a world seed scores the same "
            f"({mean:.3f}), so every advantage is 0. The score must depend on what agents do."
        )
    if scored < SCORED_ENOUGH:
        return (
            f"too little to learn at {limit:g} s: only {scored:.0%} of {many} scored "
            f"(mean {mean:.3f}), so most groups score all 0 and their advantages are 0. Let "
            "partial progress score, give more time, or make the first steps easier."
        )
    return (
        f"something to learn at {limit:g} s: {team} scores {mean:.3f} with a spread of "
        f"{spread:.3f} within a world seed; a policy that does better earns more."
    )


def _with(cfg: EpisodeConfig, **changes: Any) -> EpisodeConfig:
    return msgspec.structs.replace(cfg, **changes)
