"""library: locks whose keys are worth remembering, in a commons that outlives the episode.

Each episode has ``locks`` locks, drawn by the world seed from a pool of ``pool`` kinds. A kind's
key (1..``keys``) is the same in every episode (drawn from ``pool_seed``, not the world seed), so
what one episode finds out about a kind is worth something to every later one. Tools:

- ``try_key(lock, key)`` (8 s): opens the lock if the key is right;
- ``recall(lock)`` (2 s): opens it with the key the library holds for its kind, if it holds one;
- ``publish(lock)`` (4 s): puts an open lock's key in the library (the world's commons,
  ``World.contribute``) for the episodes that start later. It does nothing for this episode.

The score is the share of the episode's locks open: anytime and monotone. The observation is one
line, ``locks 0:shut+lib 1:open+pub 2:shut``: ``+lib`` the library held the lock's kind when the
episode began, ``+pub`` this episode published it.

Why this world: publishing costs an episode time and pays only later episodes, so a
per-episode return gives it no credit: under ``commons = "on"`` it is left to chance or trained
away, and measured credit (``commons = "credit"``, ``collective/rl/commons.py``) can pay it.
Which knob would force which finding:

- ``keys = 1``: every lock opens at the first try; the library is worth nothing (no finding);
- a training run's ``commons_size >= pool``: once each kind is published, the library is full
  for good and publishing stops mattering; a small library keeps it mattering (old entries go);
- ``pool <= locks``: every episode meets every kind, so one lucky episode fills the library.
"""

from __future__ import annotations

import random
import re
from typing import Annotated

from collective.world import Commons, Range, ToolError, World, tool

_ENTRY = re.compile(r"kind (\d+) key (\d+)")


class Library(World):
    monotone = True
    commons = "library"  # the constructor parameter that receives the commons
    lexicon = ("lock", "key", "open", "library", "publish", "recall")

    def __init__(
        self,
        n_agents: int = 1,
        seed: int = 0,
        locks: int = 3,
        pool: int = 12,
        keys: int = 6,
        pool_seed: int = 0,
        library: Commons | None = None,
    ) -> None:
        super().__init__(n_agents, seed)
        for name, value, lo in (("locks", locks, 1), ("pool", pool, 1), ("keys", keys, 1)):
            if value < lo:
                raise ValueError(f"Library: {name} must be >= {lo}, got {value}")
        if locks > pool:
            raise ValueError(f"Library: locks ({locks}) cannot exceed the pool ({pool})")
        keyring = random.Random(pool_seed)
        self.key_of = [keyring.randint(1, keys) for _ in range(pool)]  # each kind's key
        self.keys = keys
        self.kinds = self.rng.sample(range(pool), locks)  # this episode's locks, by kind
        self.last_lock = locks - 1
        self.open = [False] * locks
        self.tried: list[set[int]] = [set() for _ in range(locks)]
        self.known: dict[int, int] = {}  # kind -> key, from the library's entries
        for entry in (library or Commons()).entries:
            m = _ENTRY.fullmatch(entry)
            if m and int(m[1]) < pool:
                self.known[int(m[1])] = int(m[2])
        self.published: set[int] = set()
        self.recalled = 0

    def _lock(self, lock: int) -> int:
        if self.open[lock]:
            raise ToolError(f"lock {lock} is already open")
        return self.kinds[lock]

    @tool(duration=8.0)
    def try_key(
        self,
        agent: int,
        lock: Annotated[int, Range(0, "last_lock")],
        key: Annotated[int, Range(1, "keys")],
    ) -> str:
        """try a key in a lock"""
        kind = self._lock(lock)
        self.tried[lock].add(key)
        if key != self.key_of[kind]:
            return f"key {key} does not open lock {lock}"
        self.open[lock] = True
        return f"lock {lock} is open"

    @tool(duration=2.0)
    def recall(self, agent: int, lock: Annotated[int, Range(0, "last_lock")]) -> str:
        """open a lock with the library's key for its kind"""
        kind = self._lock(lock)
        if kind not in self.known:
            raise ToolError(f"the library has no key for lock {lock} (kind {kind})")
        self.open[lock] = True
        self.recalled += 1
        return f"lock {lock} is open (library)"

    @tool(duration=4.0)
    def publish(self, agent: int, lock: Annotated[int, Range(0, "last_lock")]) -> str:
        """put an open lock's key in the library, for later episodes"""
        kind = self.kinds[lock]
        if not self.open[lock]:
            raise ToolError(f"lock {lock} is not open: its key is not known")
        if kind in self.known or kind in self.published:
            raise ToolError(f"the library already has kind {kind}")
        self.published.add(kind)
        self.contribute(agent, f"kind {kind} key {self.key_of[kind]}")
        return f"published kind {kind}"

    def observe(self, agent: int) -> str:
        def mark(kind: int) -> str:
            return "+lib" if kind in self.known else "+pub" if kind in self.published else ""

        locks = " ".join(
            f"{i}:{'open' if o else 'shut'}{mark(k)}"
            for i, (k, o) in enumerate(zip(self.kinds, self.open, strict=True))
        )
        return f"locks {locks}"

    def score(self) -> float:
        return sum(self.open) / len(self.open)

    def metrics(self) -> dict[str, float]:
        return {"commons_used": float(self.recalled), "commons_added": float(len(self.published))}
