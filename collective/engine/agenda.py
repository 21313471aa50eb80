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

import bisect
import heapq
import math
from enum import IntEnum
from typing import TYPE_CHECKING, Any, ClassVar

import msgspec

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


# The entries are msgspec Structs for their constructor, which runs in C: two are made at every
# turn (an Answer, a Land), and a class's __init__ cost twice as much. Never encoded; tracked
# by the collector (the default), as an entry refers to an actor, which refers to its episode.


class Answer(msgspec.Struct):
    """A policy's answer to an actor's think, landing when the latency model says."""

    actor: Actor
    req: PolicyRequest
    resp: PolicyResponse
    priority: ClassVar[Priority] = Priority.ANSWER


class WorldEvent(msgspec.Struct):
    """A world's own event (``World.at``): ``fn(*args)`` at its time."""

    world: World
    fn: Any
    args: tuple[Scalar, ...]
    priority: ClassVar[Priority] = Priority.WORLD


class Land(msgspec.Struct):
    """An action's effect, applied when its duration has passed."""

    actor: Actor
    act: int
    action: Action
    priority: ClassVar[Priority] = Priority.LAND


class Resume(msgspec.Struct):
    """An actor let go with a value: a rejected action's error, or a tool's result once its
    measured real time has passed (hybrid clock)."""

    actor: Actor
    value: str
    priority: ClassVar[Priority] = Priority.RESUME


class Timer(msgspec.Struct):
    """A wait's end: its timeout, or news that came while the agent was thinking. Stale once
    the agent's ``wait_token`` moved on (it was woken by something else first)."""

    actor: Actor
    act: int
    token: int
    reason: str
    priority: ClassVar[Priority] = Priority.TIMER


Entry = Answer | WorldEvent | Land | Resume | Timer


Key = tuple[int, int, int, Entry]  # (priority, agent, seq, entry): an entry's place in its instant


class Agenda:
    """Due entries by instant: a heap of the distinct times, and each time's entries in a list,
    sorted once when that time falls due.

    Many entries share an instant (answers land on the latency model's ticks, whole waves of
    actions at once), so a heap of every entry would compare its way through each of them on
    every push and pop; here a push is an append (a heap push only for a new time) and an
    instant is one sort. The order is the heap's, ``(t, priority, agent, seq)``, whatever the
    entries' arrival: an entry pushed for the instant being applied (``World.at(now)`` from a
    tool) is placed among the entries still to come, as a heap would have popped it. An idle
    agent (a wait with no timeout) has no entry at all, so it costs no CPU."""

    __slots__ = ("_at", "_due", "_later", "_next", "_times", "seq")

    def __init__(self) -> None:
        self._times: list[float] = []  # a heap of the times in _later
        self._later: dict[float, list[Key]] = {}  # a later time -> its entries, unsorted
        self._at = math.inf  # the earliest instant begun: its entries are in _due, not _later
        self._due: list[Key] = []  # its entries, sorted; those from _next on are still due
        self._next = 0
        self.seq = 0

    def push(self, t: float, agent: int, entry: Entry) -> None:
        self.seq += 1
        key = (entry.priority, agent, self.seq, entry)
        if t == self._at:  # the instant being applied (or just applied): among those to come
            bisect.insort(self._due, key, lo=self._next)
            return
        bucket = self._later.get(t)
        if bucket is None:
            self._later[t] = [key]
            heapq.heappush(self._times, t)
        else:
            bucket.append(key)

    def next_due(self) -> float:
        """When the earliest entry is due (infinity when none is)."""
        if self._next < len(self._due):
            return self._at
        return self._times[0] if self._times else math.inf

    def pop_at(self, t: float) -> Entry | None:
        """The earliest entry if it is due at ``t`` (an instant ``next_due`` gave), else None:
        one call per entry where ``next_due`` then ``pop`` were two. The first of an instant
        sorts the instant's entries."""
        due, i = self._due, self._next
        if i == len(due):
            # Nothing left of the instant begun (an entry pushed for it went into _due): the
            # next is the earliest later time's, if that is t.
            times = self._times
            if not times or times[0] != t:
                return None
            self._at = heapq.heappop(times)
            self._due = due = self._later.pop(t)
            due.sort()
            i = 0
        elif self._at != t:
            return None
        self._next = i + 1
        return due[i][3]

    def in_order(self) -> list[tuple[float, Entry]]:
        """Every entry still due, in the order it would be applied (the end reads the answers
        still in flight)."""
        out = [(self._at, key[3]) for key in self._due[self._next :]]
        for t in sorted(self._later):
            out += [(t, key[3]) for key in sorted(self._later[t])]
        return out
