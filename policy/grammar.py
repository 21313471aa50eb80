"""Action spaces compiled to token automata, so a byte-level model can only emit valid actions.

An :class:`~collective.base.actions.ActionSpace` fixes the one-line action format: a tool name, then
its arguments separated by single spaces (an int in ``lo..hi`` as canonical decimal, a choice
word, or a double-quoted text of at most ``max_chars`` printable ASCII characters other than
``"``, always last), then EOS. That language is finite, so it is a DFA over the byte vocabulary of
:mod:`policy.tokenizer`; every path through it is an action ``parse_action`` accepts.

The DFA is stored as dense tables so a whole batch advances with one gather per step:

- ``next_state[state, token]``: where a token leads (0, the start, where it is not allowed;
  DONE, from DONE);
- ``cost[state, token]``: the fewest tokens an action needs if ``token`` is taken now, counting
  the token itself and the final EOS (``BLOCKED`` where the token is not allowed; ``FREE`` in
  the DONE state, where a finished row of a batch idles until the batch ends).

``cost`` makes the length budget part of the same mask: with ``r`` tokens left, a token is
allowed iff ``cost <= r``, so sampling never runs out of tokens mid-action, and the learner,
given the same ``r``, recomputes exactly the mask that was sampled with.

States are built by exploring symbolic keys, so equal futures share one state: the text states
of ``msg``, ``post`` and ``put`` are one chain when their text arguments are equal, and an int
range of 0..99999 takes a few dozen states (one per digit position and tightness against each
bound), not 100,000 strings.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence
from functools import lru_cache
from typing import Any

import numpy as np
import torch

from collective.base.actions import ActionSpace, ArgSpec
from policy.tokenizer import EOS, VOCAB_SIZE

BLOCKED = np.iinfo(np.int32).max // 2  # a cost no budget reaches
FREE = np.iinfo(np.int32).min // 2  # a cost every budget allows (DONE's row)
START, DONE = 0, 1  # the first two states of every compiled automaton

_SPACE, _QUOTE, _MINUS = ord(" "), ord('"'), ord("-")
_DIGITS = tuple(range(ord("0"), ord("9") + 1))
#: What a text argument may contain: printable ASCII except the closing quote.
TEXT_BYTES = tuple(b for b in range(32, 127) if b != _QUOTE)


def _cmp(a: str, b: str) -> int:
    return (a > b) - (a < b)


class _Decimal:
    """Canonical decimals (no sign, no leading zero) of the integers in ``lo..hi``, lo >= 0.

    A prefix ``p`` of ``k`` digits has the same set of valid completions as any other prefix
    with the same ``(k, cmp(p, lo[:k]), cmp(p, hi[:k]))``: a completed number of the same length
    as a bound compares to it by that comparison and then by the suffix, and a longer (shorter)
    number is always above (below) it. So those triples are the states.
    """

    def __init__(self, lo: int, hi: int) -> None:
        self.lo, self.hi = lo, hi
        self.los, self.his = str(lo), str(hi)

    def key(self, p: str) -> Hashable:
        if p == "0":
            return ("zero",)
        k = len(p)
        c_lo = _cmp(p, self.los[:k]) if k <= len(self.los) else 1
        return (k, c_lo, _cmp(p, self.his[:k]))

    def viable(self, p: str) -> bool:
        """Some completion of ``p`` (maybe ``p`` itself) is in range."""
        if p == "0":
            return self.lo == 0
        return any(
            int(p + "0" * (n - len(p))) <= self.hi and int(p + "9" * (n - len(p))) >= self.lo
            for n in range(len(p), len(self.his) + 1)
        )

    def accepts(self, p: str) -> bool:
        return p != "" and self.lo <= int(p) <= self.hi

    def extend(self, p: str) -> list[tuple[int, str]]:
        if p == "0":
            return []
        digits = _DIGITS[1:] if p == "" else _DIGITS  # no leading zero...
        out = [(d, q) for d in digits if self.viable(q := p + chr(d))]
        return [(_DIGITS[0], "0"), *out] if p == "" and self.lo == 0 else out  # ...but "0"


class _Arg:
    """The automaton of one argument; a state is a representative string typed so far."""

    def __init__(self, spec: ArgSpec) -> None:
        self.spec = spec
        if spec.kind == "int":
            lo, hi = spec.lo, spec.hi
            self.pos = _Decimal(max(lo, 0), hi) if hi >= 0 else None
            self.neg = _Decimal(max(1, -hi), -lo) if lo < 0 else None
        elif spec.kind == "choice":
            words = spec.choices
            self.words = frozenset(words)
            self.prefixes = frozenset(w[:i] for w in words for i in range(len(w)))

    def key(self, s: str) -> Hashable:
        kind = self.spec.kind
        if kind == "int":
            if s.startswith("-"):
                assert self.neg is not None
                return ("-", self.neg.key(s[1:]))
            return ("+", self.pos.key(s)) if self.pos is not None and s else ("",)
        if kind == "choice":
            return s
        if not s:
            return -1
        return len(s) - 1 if not (len(s) >= 2 and s.endswith('"')) else -2  # -2: closed

    def accepts(self, s: str) -> bool:
        kind = self.spec.kind
        if kind == "int":
            if s.startswith("-"):
                return self.neg is not None and self.neg.accepts(s[1:])
            return self.pos is not None and self.pos.accepts(s)
        if kind == "choice":
            return s in self.words
        return len(s) >= 2 and s.endswith('"')

    def extend(self, s: str) -> list[tuple[int, str]]:
        kind = self.spec.kind
        if kind == "int":
            if s.startswith("-"):
                assert self.neg is not None
                return [(b, "-" + q) for b, q in self.neg.extend(s[1:])]
            out = self.pos.extend(s) if self.pos is not None else []
            if s == "" and self.neg is not None:
                out.append((_MINUS, "-"))
            return out
        if kind == "choice":
            nxt = {w[len(s)] for w in self.spec.choices if len(w) > len(s) and w.startswith(s)}
            return [(ord(c), s + c) for c in sorted(nxt)]
        if s == "":
            return [(_QUOTE, '"')]
        if self.accepts(s):
            return []
        n = len(s) - 1  # characters of content so far
        out = [(_QUOTE, s + '"')]
        if n < self.spec.max_chars:
            out += [(b, s + "a") for b in TEXT_BYTES]  # any content byte: same future
        return out


#: A state of the automaton while it is built (see ``Grammar.__init__``).
_Node = tuple[Any, ...]


class Grammar:
    """The compiled automaton of one action space (see the module docstring for the tables)."""

    def __init__(self, space: ActionSpace) -> None:
        self.space = space
        tails: dict[tuple[ArgSpec, ...], int] = {}  # interned argument tails: cheap keys
        tail_list: list[tuple[ArgSpec, ...]] = []
        arg_of: list[_Arg] = []
        for t in space.tools:
            for i in range(len(t.args)):
                tail = t.args[i:]
                if tail not in tails:
                    tails[tail] = len(tail_list)
                    tail_list.append(tail)
                    arg_of.append(_Arg(tail[0]))
        names = {t.name: t for t in space.tools}
        name_prefixes = {n[:i] for n in names for i in range(len(n) + 1)}

        # A node is ("tool", prefix) | ("arg", tail id, representative string) | ("done",); its
        # key drops what cannot change the future, so equal futures merge.
        def key(node: _Node) -> Hashable:
            if node[0] == "arg":
                return ("arg", node[1], arg_of[node[1]].key(node[2]))
            return node

        def edges(node: _Node) -> list[tuple[int, _Node]]:
            if node[0] == "done":
                return []
            if node[0] == "tool":
                p = node[1]
                out: list[tuple[int, _Node]] = [
                    (ord(c), ("tool", p + c))
                    for c in sorted({n[len(p)] for n in names if len(n) > len(p)})
                    if p + c in name_prefixes
                ]
                if p in names:
                    args = names[p].args
                    out.append((_SPACE, ("arg", tails[args], "")) if args else (EOS, ("done",)))
                return out
            tid, s = node[1], node[2]
            arg = arg_of[tid]
            out = [(b, ("arg", tid, q)) for b, q in arg.extend(s)]
            if arg.accepts(s):
                tail = tail_list[tid]
                last = len(tail) == 1
                out.append((EOS, ("done",)) if last else (_SPACE, ("arg", tails[tail[1:]], "")))
            return out

        ids: dict[Hashable, int] = {key(("tool", "")): START, ("done",): DONE}
        nodes: list[_Node] = [("tool", ""), ("done",)]
        trans: list[list[tuple[int, int]]] = [[], []]
        queue = deque([0])
        while queue:
            s = queue.popleft()
            for b, nxt in edges(nodes[s]):
                k = key(nxt)
                j = ids.get(k)
                if j is None:
                    j = ids[k] = len(nodes)
                    nodes.append(nxt)
                    trans.append([])
                    queue.append(j)
                trans[s].append((b, j))
        n = len(nodes)
        # Fewest tokens from each state to the end (DONE = 0); the language is finite and every
        # state was reached by a viable prefix, so every state can finish.
        dist = np.full(n, BLOCKED, dtype=np.int64)
        dist[DONE] = 0
        order = _topological(trans)
        for s in reversed(order):
            for _, j in trans[s]:
                dist[s] = min(dist[s], dist[j] + 1)
        if (dist >= BLOCKED).any():
            bad = [nodes[i] for i in np.flatnonzero(dist >= BLOCKED) if i != DONE][:3]
            raise AssertionError(f"grammar has states that cannot finish: {bad}")
        self.next_state = np.zeros((n, VOCAB_SIZE), dtype=np.int64)
        self.next_state[DONE] = DONE
        self.cost = np.full((n, VOCAB_SIZE), BLOCKED, dtype=np.int32)
        for s, out in enumerate(trans):
            for b, j in out:
                self.next_state[s, b] = j
                self.cost[s, b] = dist[j] + 1
        self.cost[DONE] = FREE  # a finished row of a batch may take anything and stays DONE
        self.shortest = int(dist[START])  # tokens (EOS included) of the shortest action
        self.longest = _longest(trans, order)

    @property
    def n_states(self) -> int:
        return self.cost.shape[0]

    @property
    def allowed(self) -> np.ndarray:
        """``allowed[state, token]``: the mask without a length budget (all of DONE's row)."""
        return self.cost < BLOCKED

    def accepts(self, token_ids: Sequence[int]) -> bool:
        """Whether the tokens (EOS included) are one complete action of the space."""
        s = START
        for t in token_ids:
            if s == DONE or not 0 <= t < VOCAB_SIZE or self.cost[s, t] >= BLOCKED:
                return False
            s = int(self.next_state[s, t])
        return s == DONE


def _topological(trans: list[list[tuple[int, int]]]) -> list[int]:
    """States in an order where every edge goes forward (the automaton is acyclic)."""
    indeg = [0] * len(trans)
    for out in trans:
        for _, j in out:
            indeg[j] += 1
    order, ready = [], [s for s, d in enumerate(indeg) if d == 0]
    while ready:
        s = ready.pop()
        order.append(s)
        for _, j in trans[s]:
            indeg[j] -= 1
            if indeg[j] == 0:
                ready.append(j)
    if len(order) != len(trans):
        raise AssertionError("grammar automaton has a cycle")
    return order


def _longest(trans: list[list[tuple[int, int]]], order: list[int]) -> int:
    far = [0] * len(trans)
    for s in reversed(order):
        far[s] = max((far[j] + 1 for _, j in trans[s]), default=0)
    return far[START]


@lru_cache(maxsize=4096)
def compile_space(space: ActionSpace) -> Grammar:
    """The automaton of ``space``, compiled once per distinct space (spaces are hashable).

    Each island of an ``islands:K`` episode has its own space (its channel's name is in it), so
    the cache holds thousands: at 256, 512 islands of 8 recompiled every grammar in every batch
    (the city study's 4,096-agent islands cell: bench/results/city/README.md)."""
    return Grammar(space)


class BatchTables:
    """The tables of every distinct space of a batch, concatenated with state offsets.

    ``start[i]`` is request i's start state in the concatenated tables; ``final`` marks each
    automaton's DONE state (every token leads from DONE back to it, so a finished row stays).
    """

    def __init__(self, grammars: Sequence[Grammar], which: Sequence[int]) -> None:
        offsets = np.cumsum([0, *(g.n_states for g in grammars)])[:-1]
        self.next_state = torch.from_numpy(
            np.concatenate([g.next_state + o for g, o in zip(grammars, offsets, strict=True)])
        )
        self.cost = torch.from_numpy(np.concatenate([g.cost for g in grammars]))
        self.final = torch.zeros(self.cost.shape[0], dtype=torch.bool)
        self.final[torch.as_tensor(offsets + DONE)] = True
        self.start = torch.as_tensor(offsets[list(which)] + START, dtype=torch.int64)
        self.grammars = list(grammars)
        self.which = list(which)


def batch_tables(spaces: Sequence[ActionSpace]) -> BatchTables:
    """Tables for a batch whose request i is constrained by ``spaces[i]``.

    Spaces are deduplicated by identity first (the episode hands every agent of a group the same
    object), so a batch of thousands hashes each distinct space once.
    """
    by_id: dict[int, int] = {}
    grammars: list[Grammar] = []
    slot: dict[int, int] = {}  # id(grammar) -> index in grammars
    which: list[int] = []
    for sp in spaces:
        i = by_id.get(id(sp))
        if i is None:
            g = compile_space(sp)
            i = slot.get(id(g))
            if i is None:
                i = slot[id(g)] = len(grammars)
                grammars.append(g)
            by_id[id(sp)] = i
        which.append(i)
    return BatchTables(grammars, which)
