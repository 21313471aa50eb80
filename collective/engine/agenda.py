"""The agenda: an episode's due events, in the one order they are applied.

As SimPy keeps ``(time, priority, id)``, an entry here is ``(t, priority, agent, seq, entry)``:
the simulated time it is due, a named priority for entries that fall on the same instant, the
agent it belongs to (so two agents' entries at one instant and priority land in agent-id
order, whatever order trio ran them in), a running number (so two entries of one agent keep
the order they were scheduled in) and the typed entry itself. ``seq`` is unique, so the
comparison never reaches the entry.

The priorities say what an instant sees: answers first, then the world's own events (so an
action landing at ``t`` sees what happened at ``t``), then actions' effects, then plain
resumptions, then timers (so a message landing at ``t`` wakes a waiter before its timeout).
Only their order matters: they are never recorded.
"""

from __future__ import annotations

import heapq
import math
from enum import IntEnum
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from collective.base.actions import Action
    from collective.engine.actor import Actor
    from collective.world import Scalar, World
    from policy.base import PolicyRequest, PolicyResponse


class Priority(IntEnum):
    """What lands first when entries fall on the same instant."""

    ANSWER = 0
    WORLD = 1
    LAND = 2
    RESUME = 3
    TIMER = 4


class Answer:
    """A policy's answer to an actor's think, landing when the latency model says."""

    __slots__ = ("actor", "req", "resp")
    priority: ClassVar[Priority] = Priority.ANSWER

    def __init__(self, actor: Actor, req: PolicyRequest, resp: PolicyResponse) -> None:
        self.actor, self.req, self.resp = actor, req, resp


class WorldEvent:
    """A world's own event (``World.at``): ``fn(*args)`` at its time."""

    __slots__ = ("args", "fn", "world")
    priority: ClassVar[Priority] = Priority.WORLD

    def __init__(self, world: World, fn: Any, args: tuple[Scalar, ...]) -> None:
        self.world, self.fn, self.args = world, fn, args


class Land:
    """An action's effect, applied when its duration has passed."""

    __slots__ = ("act", "action", "actor")
    priority: ClassVar[Priority] = Priority.LAND

    def __init__(self, actor: Actor, act: int, action: Action) -> None:
        self.actor, self.act, self.action = actor, act, action


class Resume:
    """An actor let go with a value: a rejected action's error, or a tool's result once its
    measured real time has passed (hybrid clock)."""

    __slots__ = ("actor", "value")
    priority: ClassVar[Priority] = Priority.RESUME

    def __init__(self, actor: Actor, value: str) -> None:
        self.actor, self.value = actor, value


class Timer:
    """A wait's end: its timeout, or news that came while the agent was thinking. Stale once
    the agent's ``wait_token`` moved on (it was woken by something else first)."""

    __slots__ = ("act", "actor", "reason", "token")
    priority: ClassVar[Priority] = Priority.TIMER

    def __init__(self, actor: Actor, act: int, token: int, reason: str) -> None:
        self.actor, self.act, self.token, self.reason = actor, act, token, reason


Entry = Answer | WorldEvent | Land | Resume | Timer


class Agenda:
    """A heap of due entries. Pushing is O(log n); an idle agent (a wait with no timeout) has
    no entry at all, so it costs no CPU."""

    __slots__ = ("heap", "seq")

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, int, int, Entry]] = []
        self.seq = 0

    def __len__(self) -> int:
        return len(self.heap)

    def push(self, t: float, agent: int, entry: Entry) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, entry.priority, agent, self.seq, entry))

    def next_due(self) -> float:
        """When the earliest entry is due (infinity when none is)."""
        return self.heap[0][0] if self.heap else math.inf

    def pop(self) -> Entry:
        return heapq.heappop(self.heap)[4]

    def in_order(self) -> list[tuple[float, Entry]]:
        """Every entry still due, in the order it would be applied (the end reads the answers
        still in flight)."""
        return [(h[0], h[4]) for h in sorted(self.heap, key=lambda h: h[:4])]
