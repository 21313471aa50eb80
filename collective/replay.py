"""Replay, fork and diff: an episode is a deterministic function of its config and its record.

``replay`` re-executes an episode with the recorded policy outputs (and recorded real
durations). ``audit`` compares everything the re-execution derives with what the file says:
the event stream event for event, every turn (its prompt, result, timing, text, token ids and
logprobs), the score, the stats, the curve and the world's metrics; and it checks what no
re-execution derives, the recorded answers themselves: one finite logprob <= 0 per token, and
token ids that spell the text under the recorded tokenizer. Given a policy, it recomputes the
answers too (logprobs included) instead of taking them from the record. ``fork`` replays up to
a simulated time, then continues live with another policy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import msgspec
import trio

from collective.actions import longest_action
from collective.actor import default_program
from collective.conductor import Conductor
from collective.episode import Replay
from collective.records import Episode, Turn
from policy import tokenizer as byte_tokenizer
from policy.base import Policy, PolicyError
from policy.recorded import RecordedPolicy


class Divergence(msgspec.Struct):
    index: int
    expected: Any  # the original's event at index (None: the original ended here)
    got: Any  # the new event at index (None: the new stream ended here)

    def describe(self) -> str:
        return (
            f"first divergence at event {self.index}:\n  expected: {_show(self.expected)}\n"
            f"  got:      {_show(self.got)}"
        )


def _show(e: Any) -> str:
    return "(end of stream)" if e is None else repr(e)


def first_divergence(expected: Sequence[Any], got: Sequence[Any]) -> Divergence | None:
    for i, (a, b) in enumerate(zip(expected, got, strict=False)):
        if a != b:
            return Divergence(i, a, b)
    if len(expected) != len(got):
        i = min(len(expected), len(got))
        return Divergence(
            i, expected[i] if i < len(expected) else None, got[i] if i < len(got) else None
        )
    return None


def _rerun(ep: Episode, backend: Policy, fed: Replay, **changes: Any) -> Episode:
    cfg = msgspec.structs.replace(ep.config, **changes)
    conductor = Conductor(backend, program=default_program)
    return trio.run(lambda: conductor.play([cfg], replay=fed))[0]


def replay(ep: Episode, *, policy: Policy | None = None, world: str | None = None) -> Episode:
    """Re-execute ``ep`` from its recorded outputs (or, given ``policy``, with answers that
    policy computes anew for the same requests and seeds). A ``real`` clock episode replays on
    the virtual clock at its recorded times. ``world`` replaces the world reference the record
    names (the same world found elsewhere, or named by the user rather than by the file)."""
    changes: dict[str, Any] = {}
    if ep.config.clock == "real":
        changes = {"clock": "virtual", "recorded_answers_until": math.inf}
    if world is not None:
        changes["world"] = world
    answers = RecordedPolicy(ep.turns, live=policy, until=math.inf if policy is None else 0.0)
    return _rerun(ep, answers, Replay(ep), **changes)


def verify(ep: Episode) -> Divergence | None:
    """Replay ``ep`` and return where its event stream diverges (None: identical)."""
    return first_divergence(ep.events, replay(ep).events)


def fork(
    ep: Episode,
    until: float,
    policy: Policy,
    *,
    sample_seed: int | None = None,
    world: str | None = None,
) -> Episode:
    """Replay ``ep`` exactly up to simulated time ``until``, then continue live with ``policy``.

    Every request asked before ``until`` gets its recorded answer; every later one goes to
    ``policy`` (with the agents' streams reseeded by ``sample_seed`` when given).
    """
    if not 0 <= until <= ep.config.time_limit or math.isnan(until):
        raise ValueError(f"fork time {until} is outside the episode (0..{ep.config.time_limit})")
    changes: dict[str, Any] = {
        "policy": f"fork of [{ep.config.policy}] at t={until:g} with {policy.name}"
    }
    if sample_seed is not None:
        changes["sample_seed"] = sample_seed
    if world is not None:
        changes["world"] = world
    if ep.config.tokenizer != tokenizer_of(policy):  # the answers after `until` are another's
        changes["tokenizer"] = ""
    if ep.config.clock == "real":  # the prefix's answers keep their measured times
        changes["clock"] = "virtual"
        changes["recorded_answers_until"] = until
    elif ep.config.recorded_answers_until:
        changes["recorded_answers_until"] = min(until, ep.config.recorded_answers_until)
    recorded = RecordedPolicy(ep.turns, live=policy, until=until)
    return _rerun(ep, recorded, Replay(ep, until), **changes)


def prefix(events: Sequence[Any], until: float) -> list[Any]:
    """The events strictly before simulated time ``until``: what a fork must share."""
    return [e for e in events if e.t < until]


# -- the whole record: audit and diff ---------------------------------------------------------


def _first_change(name: str, a: Sequence[Any], b: Sequence[Any]) -> str | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"{name}[{i}]: {x!r} vs {y!r}"
    if len(a) != len(b):
        return f"{name}: {len(a)} vs {len(b)} entries"
    return None


def _turn_change(i: int, a: Turn, b: Turn) -> str:
    fields = [f for f in Turn.__struct_fields__ if getattr(a, f) != getattr(b, f)]
    shown = "; ".join(f"{f} {getattr(a, f)!r} vs {getattr(b, f)!r}"[:300] for f in fields)
    return f"turn {i} (agent {a.agent}, turn {a.turn}): {shown}"


def differences(a: Episode, b: Episode, *, config: bool = True) -> list[str]:
    """Where two episodes differ, one line per part (the first difference in each): config
    fields, events, turns, score, duration, end, stats, curve, action spaces, world metrics.
    Empty when they are the same episode. Times are printed exactly (``repr``)."""
    out: list[str] = []
    if config:
        for f in type(a.config).__struct_fields__:
            x, y = getattr(a.config, f), getattr(b.config, f)
            if x != y:
                out.append(f"config {f}: {x!r} vs {y!r}")
    d = first_divergence(a.events, b.events)
    if d is not None:
        t = (d.expected if d.expected is not None else d.got).t
        out.append(
            f"first divergence at event {d.index} (t={t!r}): {_show(d.expected)} vs {_show(d.got)}"
        )
    for i, (x, y) in enumerate(zip(a.turns, b.turns, strict=False)):
        if x != y:
            out.append(_turn_change(i, x, y))
            break
    else:
        if len(a.turns) != len(b.turns):
            out.append(f"turns: {len(a.turns)} vs {len(b.turns)}")
    for f in ("score", "duration", "end"):
        if getattr(a, f) != getattr(b, f):
            out.append(f"{f}: {getattr(a, f)!r} vs {getattr(b, f)!r}")
    for f in type(a.stats).__struct_fields__:
        if getattr(a.stats, f) != getattr(b.stats, f):
            out.append(f"stats {f}: {getattr(a.stats, f)!r} vs {getattr(b.stats, f)!r}")
    for name, x, y in (("curve", a.curve, b.curve), ("spaces", a.spaces, b.spaces)):
        change = _first_change(name, x, y)
        if change:
            out.append(change[:600])
    if a.world_metrics != b.world_metrics:
        out.append(f"world_metrics: {a.world_metrics!r} vs {b.world_metrics!r}")
    return out


def tokenizer_of(policy: Policy) -> str:
    """The tokenizer a policy's token ids are in, for ``EpisodeConfig.tokenizer``: "bytes" for
    the byte-level policies (random, scripted, tiny), a policy's own ``tokenizer_name`` if it
    declares one, else "" (not recorded: replay then cannot check that ids spell the text)."""
    declared = getattr(policy, "tokenizer_name", None)
    if isinstance(declared, str):
        return declared
    from policy.scripted import ScriptedPolicy
    from policy.tiny import TinyPolicy
    from policy.uniform import RandomPolicy

    return "bytes" if isinstance(policy, RandomPolicy | ScriptedPolicy | TinyPolicy) else ""


def answer_problems(ep: Episode) -> list[str]:
    """What is wrong with the recorded answers themselves, which no replay re-derives: each
    turn has one finite logprob <= 0 per token and (under the byte tokenizer) ids that spell
    its text. An answer cut at its bound (see ``collective.conductor.bounded``) is checked for
    its length only. The first problem of each kind."""
    found: dict[str, str] = {}
    spell = ep.config.tokenizer == "bytes"
    if ep.config.tokenizer not in ("", "bytes"):
        found["tokenizer"] = f"tokenizer {ep.config.tokenizer!r}: this version checks only bytes"
    limit = ep.config.max_output_tokens
    for i, t in enumerate(ep.turns):
        where = f"turn {i} (agent {t.agent}, turn {t.turn})"
        if len(t.logprobs) != len(t.token_ids):
            found.setdefault(
                "count", f"{where}: {len(t.token_ids)} token ids, {len(t.logprobs)} logprobs"
            )
        bad = next((x for x in t.logprobs if not (math.isfinite(x) and x <= 0.0)), None)
        if bad is not None:
            found.setdefault("logprob", f"{where}: logprob {bad!r} (must be finite and <= 0)")
        if not 0 <= t.space < len(ep.spaces):
            found.setdefault("space", f"{where}: action space {t.space} of {len(ep.spaces)}")
            continue
        chars = longest_action(ep.spaces[t.space])
        cut = len(t.token_ids) > limit or len(t.text) > chars
        if len(t.token_ids) > limit + 1 or len(t.text) > chars + 1:
            found.setdefault("bound", f"{where}: an answer longer than its bound was kept")
        if spell and not cut:
            ids = t.token_ids
            if any(not 0 <= x < byte_tokenizer.VOCAB_SIZE for x in ids):
                found.setdefault("ids", f"{where}: token id outside the byte tokenizer")
            elif byte_tokenizer.decode(ids) != t.text:
                found.setdefault(
                    "spell",
                    f"{where}: token ids spell {byte_tokenizer.decode(ids)!r}, "
                    f"the agent acted on {t.text!r}",
                )
    return list(found.values())


def audit(
    ep: Episode, *, policy: Policy | None = None, world: str | None = None
) -> tuple[Episode, list[str]]:
    """Replay ``ep`` (with ``policy``: recomputing its answers) and return the replay and every
    way the record disagrees with it or with itself; an empty list: the whole record holds.
    (A replay the record's own answers stop returns ``ep`` itself with the reason.)"""
    problems = answer_problems(ep)
    try:
        again = replay(ep, policy=policy, world=world)
    except PolicyError as e:  # e.g. a forged turn with fewer logprobs than tokens
        return ep, [*problems, f"the replay stopped: {e}"]
    return again, problems + differences(ep, again, config=False)
