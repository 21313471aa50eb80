"""What a replay feeds back instead of measuring (:class:`Replay`): the real durations of tools,
the answer times of a ``real`` clock episode, and an outside world's recorded results and
failures; the live episode (:mod:`collective.engine.episode`) reads them where it would measure
or call out, so a replay reaches the same bytes without the clock or the service.
"""

from __future__ import annotations

import math

from collective.engine.registry import resolve_world
from collective.records import Began, Committed, Episode, EpisodeStream, Failed, Happened
from collective.world import World, WorldBug


def _outside(world: str) -> bool:
    """Whether the world ``world`` names reaches outside the process (``World.outside``); a
    reference that names nothing here is not (its replay fails later, saying why)."""
    try:
        return resolve_world(world).outside
    except ValueError:
        return False


def recorded_bug(world: World, failed: Failed) -> WorldBug:
    """The world error a record holds, raised again where it happened."""
    bug = WorldBug(world, failed.method, RuntimeError(failed.error), agent=failed.agent)
    bug.world, bug.error, bug.where = failed.world, failed.error, failed.where
    return bug


class Replay:
    """What a replay feeds back instead of measuring, for everything begun before ``until``:
    the real durations of tools (``hybrid``), and the answer times of policy calls in a ``real``
    clock episode, whose latencies no model can recompute. Virtual latencies are recomputed, so
    a tampered time is caught rather than trusted."""

    def __init__(
        self,
        episode: Episode | EpisodeStream,
        until: float = math.inf,
        most_events: int | None = None,
        world: str | None = None,
    ) -> None:
        """``world``: the reference the replay runs in place of the record's (only a world the
        user named is ever imported)."""
        self.until = until
        # A replay of a whole record ends at one event past it (``event_limit``): it has
        # diverged by then, whatever limits the record declares.
        self.most_events = most_events
        self.real: dict[tuple[int, int], float] = {}
        self.answered: dict[tuple[int, int], float] = {}
        # An outside world's (``World.outside``): each call's recorded (ok, result), and the
        # world events at t = 0, where it recorded what it found when it opened.
        self.results: dict[tuple[int, int], tuple[bool, str]] = {}
        self.opening: list[str] | None = None
        self.failures: dict[tuple[int, int], Failed] = {}  # calls where the world failed
        cfg = episode.config
        outside = _outside(world or cfg.world)
        # Only a hybrid clock measures tools (any other records 0.0, which a replay recomputes):
        # so a long virtual episode's replay holds no table of every action.
        if cfg.clock == "hybrid" or outside:
            self.opening = []
            begun: dict[tuple[int, int], float] = {}
            for e in episode.events:
                if isinstance(e, Began):
                    begun[(e.agent, e.act)] = e.t
                elif isinstance(e, Committed) and begun.pop((e.agent, e.act), math.inf) < until:
                    self.real[(e.agent, e.act)] = e.real
                    if outside:
                        self.results[(e.agent, e.act)] = (e.ok, e.result)
                elif outside and isinstance(e, Happened) and e.t == 0.0:
                    self.opening.append(e.call)
                elif outside and isinstance(e, Failed) and e.agent >= 0:
                    # The call that failed: its agent's last action begun and never committed.
                    acts = [k for k, t in begun.items() if k[0] == e.agent and t < until]
                    if acts:
                        self.failures[max(acts)] = e
            if not outside:
                self.opening = None
        measured = math.inf if cfg.clock == "real" else cfg.recorded_answers_until
        # From the turns, not the Thought events: an answer still in flight at the end, or
        # meant for an agent fired meanwhile, has a turn (and its landing time) but no Thought.
        if min(until, measured) > 0:
            for tr in episode.turns:
                if tr.asked < min(until, measured):
                    self.answered[(tr.agent, tr.turn)] = tr.answered
