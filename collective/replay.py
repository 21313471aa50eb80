"""Replay, fork and diff: an episode is a deterministic function of its config and its record.

``replay`` re-executes an episode with the recorded policy outputs (and recorded real
durations) and compares the new event stream with the old, event for event. ``fork`` does the
same up to a simulated time, then continues live with another policy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import msgspec
import trio

from collective.actor import default_program
from collective.conductor import Conductor
from collective.episode import Replay
from collective.records import Episode
from policy.base import Policy
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


def replay(ep: Episode) -> Episode:
    """Re-execute ``ep`` from its recorded outputs. A ``real`` clock episode replays on the
    virtual clock at its recorded times."""
    changes: dict[str, Any] = {}
    if ep.config.clock == "real":
        changes = {"clock": "virtual", "recorded_answers_until": math.inf}
    return _rerun(ep, RecordedPolicy(ep.turns), Replay(ep), **changes)


def verify(ep: Episode) -> Divergence | None:
    """Replay ``ep`` and return where its event stream diverges (None: identical)."""
    return first_divergence(ep.events, replay(ep).events)


def fork(ep: Episode, until: float, policy: Policy, *, sample_seed: int | None = None) -> Episode:
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
