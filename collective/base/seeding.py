"""Seeded random streams that do not depend on who else is running.

Every agent samples from its own stream derived from ``(episode seed, agent id, turn)``.
Python's ``hash()`` changes with ``PYTHONHASHSEED`` and ``random.Random`` is costly to seed a
million times, so streams here are counter-based: SplitMix64 over a folded key. The same key
gives the same numbers in any process, in any order, whatever else shares the batch.
"""

from __future__ import annotations

import math

_MASK = (1 << 64) - 1


def splitmix64(x: int) -> int:
    """One SplitMix64 step: a bijective 64-bit mixer with good avalanche."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def derive(*parts: int) -> int:
    """Fold integers into one 64-bit seed; order matters, so (1, 2) != (2, 1)."""
    h = 0x243F6A8885A308D3
    for p in parts:
        # splitmix64(h ^ p), written out: this runs at every turn of every agent.
        x = ((h ^ (p & _MASK)) + 0x9E3779B97F4A7C15) & _MASK
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
        h = x ^ (x >> 31)
    return h


def derive_more(h: int, p: int) -> int:
    """``derive(*parts, p)`` given ``h = derive(*parts)``: one fold more. An agent keeps
    ``derive(seed, id)`` and folds in each turn, a third of the work of ``derive`` anew (a fold
    is a dozen operations on Python ints; the three were some 5% of the engine's cost a turn)."""
    x = ((h ^ (p & _MASK)) + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


class Stream:
    """A tiny counter-based random stream: draw ``k`` is ``splitmix64(seed + k)``."""

    __slots__ = ("_counter", "_seed")

    def __init__(self, seed: int) -> None:
        self._seed = seed & _MASK
        self._counter = 0

    def bits(self) -> int:
        self._counter += 1
        # splitmix64(seed + counter * golden), written out (policies draw it per decision);
        # splitmix64's own first step adds one more golden, hence counter + 1.
        x = (self._seed + (self._counter + 1) * 0x9E3779B97F4A7C15) & _MASK
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
        return x ^ (x >> 31)

    def random(self) -> float:
        """A float in [0, 1) with 53 random bits."""
        return (self.bits() >> 11) * (1.0 / (1 << 53))

    def below(self, n: int) -> int:
        """An integer in [0, n), uniform up to a bias of n / 2**64 (negligible here)."""
        if n <= 0:
            raise ValueError(f"below() needs n > 0, got {n}")
        return self.bits() % n

    def log_uniform_choice(self, n: int) -> tuple[int, float]:
        """Pick uniformly among n and return (index, log-probability of that pick)."""
        return self.below(n), -math.log(n)
