"""What an episode did, in the units the signs of life are stated in: work that landed, and talk.

``Stats.world_tokens`` and ``Stats.comm_tokens`` (collective/engine/episode.py) count a turn's
tokens
when its action *begins*: a world tool the world then refused (a ``ToolError``) counts as work,
and a hire, a read or an archive search count as communication. Those are attempts, and the
episode file keeps them as they are. The signs of life are read here instead, from the record
of how each turn ended (``Turn.kind`` and ``Turn.ok``, written when its action lands):

- useful work: the world tool calls that landed (``kind == "world"`` and ``ok``), counted as
  units and as their output tokens. A refused call, an invalid answer, an action cut off by the
  end of the episode or by a firing is not work done.
- communication: the output tokens of messages and posts that landed (``msg``, ``post``), the
  only primitives that carry words to another agent; hiring, firing, reading and the archive are
  not talk. Reported per episode and per agent-second: the sum over agents of the simulated
  seconds each was alive (from its spawn or hire to its firing or the episode's end), so a team
  that merely has more members, or lives longer, does not look chattier.
"""

from __future__ import annotations

import msgspec

from collective.records import Episode, Fired, Spawned

TALK = ("msg", "post")  # the primitives that carry words to others


class Signs(msgspec.Struct, kw_only=True, frozen=True):
    """One episode's signs of life (see the module docstring for what counts)."""

    landed_units: int  # world tool calls that landed
    landed_tokens: int  # their output tokens
    refused_units: int  # world tool calls the world refused (ToolError)
    refused_tokens: int
    talk_tokens: int  # output tokens of messages and posts that landed
    talk_units: int
    agents: int  # agents that took part (those it started with and every hire)
    agent_seconds: float  # sum over agents of the simulated seconds each was alive

    @property
    def landed_per_agent(self) -> float:
        return self.landed_tokens / self.agents if self.agents else 0.0

    @property
    def talk_per_agent_second(self) -> float:
        return self.talk_tokens / self.agent_seconds if self.agent_seconds > 0 else 0.0


def signs(ep: Episode) -> Signs:
    """The signs of life of one finished episode, from its turns' endings and its events."""
    born: dict[int, float] = {}  # agent -> when it was spawned or hired
    gone: dict[int, float] = {}  # agent -> when it was fired
    for e in ep.events:
        if isinstance(e, Spawned):
            born[e.agent] = e.t
        elif isinstance(e, Fired):
            gone.setdefault(e.target, e.t)
    end = ep.duration
    landed_units = landed_tokens = refused_units = refused_tokens = talk_units = talk_tokens = 0
    for t in ep.turns:
        n = len(t.token_ids)
        if t.kind == "world":
            if t.ok:
                landed_units += 1
                landed_tokens += n
            else:
                refused_units += 1
                refused_tokens += n
        elif t.tool in TALK and t.ok:
            talk_units += 1
            talk_tokens += n
    return Signs(
        landed_units=landed_units,
        landed_tokens=landed_tokens,
        refused_units=refused_units,
        refused_tokens=refused_tokens,
        talk_tokens=talk_tokens,
        talk_units=talk_units,
        agents=len(born),
        agent_seconds=float(sum(max(0.0, gone.get(a, end) - t0) for a, t0 in born.items())),
    )


def score_at(ep: Episode, t: float) -> float:
    """The anytime score at simulated time t (a step function of the episode's curve)."""
    value = 0.0
    for when, s in ep.curve:
        if when > t:
            break
        value = s
    return value
