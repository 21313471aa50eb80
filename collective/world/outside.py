"""Worlds whose tools reach outside the process (a server), and how a replay stands in for it.

Such a world (``World.outside = True``, e.g. an Open Reward Standard environment) cannot be
re-executed from its own code: its state lives elsewhere, and the service may be gone, slow, or
answer differently the second time. So the record is what a replay trusts:

- what the world found when it opened (its prompt and tools) is recorded as a world event at
  t = 0 (``World.at(0.0, self.opened, description)``); a world built for a replay finds that
  description here (:func:`recorded_opening`) instead of asking the service;
- each tool call's recorded result is handed back to the world (``World.replayed``) instead of
  calling the tool, so a replay is exact with the service switched off, and a fork needs the
  service only for the calls past the record.

The engine sets what a world built now may read (:func:`from_record`); this floor only holds it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar


class _Opening:
    """A record's world events at t = 0 (their ``call`` texts), and how many of each kind the
    worlds built so far have taken."""

    def __init__(self, calls: Sequence[str]) -> None:
        self.calls = tuple(calls)
        self.taken: dict[str, int] = {}


#: What a replay's worlds read while they are built (None: not a replay, a world asks its
#: service).
_OPENING: ContextVar[_Opening | None] = ContextVar("recorded_opening", default=None)


@contextmanager
def from_record(opening: Sequence[str] | None) -> Iterator[None]:
    """While this holds, worlds built read their opening from ``opening`` (the ``call`` texts of
    a record's world events at t = 0) rather than from the service they reach."""
    token = _OPENING.set(None if opening is None else _Opening(opening))
    try:
        yield
    finally:
        _OPENING.reset(token)


def replaying() -> bool:
    """Whether the world being built is a replay's (its opening comes from the record)."""
    return _OPENING.get() is not None


def recorded_opening(event: str) -> str | None:
    """The string argument of the recorded world event ``event(...)`` at t = 0 that the world
    being built recorded, or None (not a replay, or the record holds no such event). An
    episode's worlds are built in the order of their groups, and record their events at t = 0
    in that order; so the k-th world built takes the k-th such event."""
    opening = _OPENING.get()
    if opening is None:
        return None
    values = []
    for call in opening.calls:
        if call.startswith(event + "(") and call.endswith(")"):
            try:
                value = ast.literal_eval(call[len(event) + 1 : -1])
            except (ValueError, SyntaxError):
                continue
            if isinstance(value, str):
                values.append(value)
    k = opening.taken.get(event, 0)
    opening.taken[event] = k + 1
    return values[k] if k < len(values) else None
