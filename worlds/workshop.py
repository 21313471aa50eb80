"""workshop: a software project in miniature, where parallel work pays and knowledge must travel.

Modules form a dependency graph in layers; each needs a few units of ``work``. A module is
*ready* once all its dependencies are built, and its test passes once it is built (so once it
and its dependencies are); the score is the fraction of tests passing. Every agent sees only a
small desk: up to ``view`` ready modules, numbered from slot 1, chosen so that different agents
see different modules where there are enough. An agent keeps the module it last worked on in
slot 1 while it is still ready, so "keep working slot 1" finishes what was begun.

Two agents working one module at once waste work: a unit landing less than ``work_seconds``
after another agent's unit on the same module overlapped it, and counts only
``1 - duplicate_penalty``; a unit landing on a module already built is wasted. Both are
counted in ``duplicates``.

Some modules (a fraction ``knowledge``) need a key ``k<j>`` that only one agent knows at the
start. An agent that knows a key hands it over by saying it: a ``msg`` whose text contains the
key teaches the recipient, a ``post`` teaches the whole group. Working a module whose key you
lack is refused, and the key's holders then see that it is wanted. Every handover is a logged
message, so ``collective show`` tells how knowledge spread.

Everything an agent reads or does costs O(``view``): the ready set, the counts and who knows
what are kept up to date as work lands, so ten thousand agents stay cheap.

Knobs that decide what an experiment can find (each defaults to the world as first built; the
signs-of-life study, ``bench/signs_of_life.py``, sets them so that no finding is built in):

- ``modules``: 0 sizes the project by the world's agent count, so a bigger team (or a bigger
  hiring budget) gets a bigger task, and its share of work grows with its headcount alone;
  that forces "team 5-8 does ~2x the average useful work". A fixed ``modules`` makes the task
  the environment's, the same instance whatever the team.
- ``holders``: ``"slots"`` gives key j to a random agent *slot*; a solo agent put on a task
  sized for 8 then lacks every key held by a slot that does not exist in its run, which forces
  "a solo agent never catches up". ``"first"`` gives every key to agent 0 (the solo agent, the
  CEO, the first of a flat team), so a lone agent can build everything, and a team must pass
  keys on, by messages that cost tokens and time, to use its extra hands.
- ``onboard_seconds``: a hired agent's first unit of work lands only this long after it was
  hired (0: at once). With free hires, hiring everyone at once is free parallelism, which
  forces "the collective wins from the first minute"; a cost lets a solo lead early.
- ``posts_teach``: whether a key said in a ``post`` teaches the whole group at once (True) or
  teaches nobody (False: keys travel by direct message only). One post reaching everyone makes
  knowledge free to spread at any scale, which forces "key passing does not slow a big team".
"""

from __future__ import annotations

import itertools
import re
from typing import Annotated

from collective.world import Range, ToolError, World, tool

_KEY = re.compile(r"\bk(\d+)\b")


class Workshop(World):
    monotone = True
    lexicon = ("ready", "built", "key", "need", "slot", "mine", "take", "done", "help")

    def __init__(
        self,
        n_agents: int = 1,
        seed: int = 0,
        size: int = 4,
        modules: int = 0,
        parallel: float = 0.5,
        depth: int = 3,
        units: int = 3,
        duplicate_penalty: float = 0.5,
        knowledge: float = 0.25,
        keys: int = 4,
        view: int = 3,
        work_seconds: float = 10.0,
        holders: str = "slots",
        onboard_seconds: float = 0.0,
        posts_teach: bool = True,
    ) -> None:
        """``size`` modules per agent (the project grows with the team), or exactly ``modules``
        when given (to put teams of different sizes on one project); ``parallel`` of them
        in the first layer (ready from the start), the rest spread over ``depth - 1`` more
        layers, each module depending on one or two of the layer before; each needs 1 to
        ``units`` units of work; ``knowledge`` of them need one of ``keys`` keys (at most one
        key per agent, so a solo agent knows them all). ``holders``, ``onboard_seconds`` and
        ``posts_teach``: see the module's docstring."""
        super().__init__(n_agents, seed)
        checks = [
            (size >= 1, f"size must be >= 1, got {size}"),
            (modules >= 0, f"modules must be >= 0 (0: size per agent), got {modules}"),
            (0.0 <= parallel <= 1.0, f"parallel must be in [0, 1], got {parallel}"),
            (depth >= 1, f"depth must be >= 1, got {depth}"),
            (units >= 1, f"units must be >= 1, got {units}"),
            (
                0.0 <= duplicate_penalty <= 1.0,
                f"duplicate_penalty must be in [0, 1], got {duplicate_penalty}",
            ),
            (0.0 <= knowledge <= 1.0, f"knowledge must be in [0, 1], got {knowledge}"),
            (keys >= 1, f"keys must be >= 1, got {keys}"),
            (1 <= view <= 9, f"view must be in 1..9, got {view}"),
            (work_seconds > 0, f"work_seconds must be > 0, got {work_seconds}"),
            (holders in ("slots", "first"), f"holders must be slots or first, got {holders!r}"),
            (onboard_seconds >= 0, f"onboard_seconds must be >= 0, got {onboard_seconds}"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(f"Workshop: {msg}")
        self.view, self.work_seconds, self.penalty = view, work_seconds, duplicate_penalty
        self.onboard, self.posts_teach = onboard_seconds, posts_teach
        self.starts: dict[int, float] = {}  # hired agent -> when its first unit may land
        rng = self.rng
        n = self.modules = modules or size * n_agents
        first = max(1, round(parallel * n)) if depth > 1 else n
        rest = n - first
        layers = [list(range(first))]
        for d in range(depth - 1):  # the remaining modules, split evenly over the deeper layers
            lo = first + rest * d // (depth - 1)
            hi = first + rest * (d + 1) // (depth - 1)
            if hi > lo:
                layers.append(list(range(lo, hi)))
        self.need = [rng.randint(1, units) for _ in range(n)]
        self.dependents: list[list[int]] = [[] for _ in range(n)]
        self.missing = [0] * n  # dependencies not yet built
        for below, layer in itertools.pairwise(layers):
            for m in layer:
                for dep in sorted(set(rng.choices(below, k=rng.randint(1, 2)))):
                    self.dependents[dep].append(m)
                    self.missing[m] += 1
        if holders == "first":  # every key with agent 0; no draw depends on the team's size
            self.n_keys = keys
            self.holder = [0] * keys
        else:
            self.n_keys = min(keys, n_agents)
            self.holder = rng.sample(range(n_agents), self.n_keys)  # key j's only holder at start
        self.key_of = [
            rng.randrange(self.n_keys) if rng.random() < knowledge else -1 for _ in range(n)
        ]
        self.lexicon = (*type(self).lexicon, *(f"k{j}" for j in range(self.n_keys)))
        self.known: dict[int, set[int]] = {}
        for j, a in enumerate(self.holder):
            self.known.setdefault(a, set()).add(j)
        self.public: set[int] = set()  # keys posted on a channel: everyone knows them
        self.wanted: set[int] = set()  # keys someone was refused work for
        self.progress = [0.0] * n
        self.built = bytearray(n)
        self.n_built = 0
        self.last_at = [-1e18] * n  # when the last unit landed on each module, and whose
        self.last_by = [-1] * n
        self.ready: list[int] = [m for m in range(n) if self.missing[m] == 0]
        self.pos = {m: i for i, m in enumerate(self.ready)}  # module -> index in self.ready
        self.desk: dict[int, tuple[int, ...]] = {}  # what each agent was last shown, by slot
        self.current: dict[int, int] = {}  # the module each agent last worked on
        self.duplicates = 0
        self.refused = 0

    # -- what agents see and do --------------------------------------------------------------

    def knows(self, agent: int, key: int) -> bool:
        return key in self.public or key in self.known.get(agent, ())

    def observe(self, agent: int) -> str:
        """The agent's desk (remembered: ``work`` refers to the slots shown here) and its keys."""
        desk = self._desk(agent)
        self.desk[agent] = desk
        mine = sorted(self.known.get(agent, ()))
        parts = [f"built {self.n_built}/{self.modules}."]
        if mine:
            parts.append("you know " + " ".join(f"k{j}" for j in mine) + ".")
        share = [j for j in mine if j in self.wanted and j not in self.public]
        if share:
            parts.append("wanted: " + " ".join(f"k{j}" for j in share) + ".")
        slots = []
        for i, m in enumerate(desk, 1):
            key = self.key_of[m]
            lack = f", needs k{key}" if key >= 0 and not self.knows(agent, key) else ""
            slots.append(f"{i}=m{m} ({self._left(m):g} left{lack})")
        parts.append("slots: " + (", ".join(slots) if slots else "none ready"))
        return " ".join(parts)

    def _work_seconds(self, agent: int, slot: int) -> float:
        """A unit of work takes ``work_seconds``; a new hire's first one also waits out the rest
        of its onboarding."""
        return self.work_seconds + max(0.0, self.starts.get(agent, 0.0) - self.now)

    def join(self, agent: int) -> None:
        if self.onboard:
            self.starts[agent] = self.now + self.onboard

    @tool(duration=_work_seconds)
    def work(self, agent: int, slot: Annotated[int, Range(1, "view")]) -> str:
        """do one unit of work on the module in a slot"""
        desk = self.desk.get(agent)
        if desk is None:  # acted without observing (a custom program): show it the desk now
            desk = self.desk[agent] = self._desk(agent)
        if slot > len(desk):
            raise ToolError(f"slot {slot} is empty: your desk has {len(desk)} ready module(s)")
        m = desk[slot - 1]
        key = self.key_of[m]
        if key >= 0 and not self.knows(agent, key):
            self.refused += 1
            self.wanted.add(key)
            raise ToolError(f"m{m} needs key k{key}, which you do not know: ask for it")
        self.current[agent] = m
        if self.built[m]:
            self.duplicates += 1
            return f"m{m} was already built: work wasted"
        gain = 1.0
        other = self.last_by[m]
        clash = other not in (-1, agent) and self.now - self.last_at[m] < self.work_seconds
        self.last_at[m], self.last_by[m] = self.now, agent
        if clash:
            self.duplicates += 1
            gain -= self.penalty
        self.progress[m] += gain
        if self._left(m) <= 0:
            self._build(m)
            return f"m{m} built ({self.n_built}/{self.modules})" + (
                " after a clash" if clash else ""
            )
        said = f"clashed with agent {self.agent_id(other)} on m{m}; " if clash else f"m{m}: "
        return said + f"{self._left(m):g} left"

    def metrics(self) -> dict[str, float]:
        return {"duplicates": self.duplicates}

    def heard(self, sender: int, to: int | None, text: str) -> None:
        """A key said by someone who knows it is learned: by the recipient, or by all (a post)."""
        for match in _KEY.finditer(text):
            key = int(match.group(1))
            if key < self.n_keys and self.knows(sender, key):
                if to is None and not self.posts_teach:
                    continue
                if to is None:
                    self.public.add(key)
                else:
                    self.known.setdefault(to, set()).add(key)

    def score(self) -> float:
        return self.n_built / self.modules

    # -- bookkeeping ---------------------------------------------------------------------------

    def _left(self, m: int) -> float:
        return max(0.0, round(self.need[m] - self.progress[m], 6))

    def _desk(self, agent: int) -> tuple[int, ...]:
        """Up to ``view`` ready modules: the one it works on first, then ready modules strided so
        that, while at least as many are ready as there are agents, no two agents share slot 1
        (and with ``view`` times as many, no two share any slot)."""
        ready, n = self.ready, len(self.ready)
        if not n:
            return ()
        cur = self.current.get(agent, -1)
        desk = [cur] if cur in self.pos else []
        stride = self.n_agents if self.n_agents * (self.view - 1) < n else 1
        for i in range(2 * self.view):
            m = ready[(agent + i * stride) % n]
            if m not in desk:
                desk.append(m)
                if len(desk) == min(self.view, n):
                    break
        return tuple(desk)

    def _build(self, m: int) -> None:
        self.built[m] = 1
        self.n_built += 1
        i = self.pos.pop(m)  # swap-remove from the ready list: O(1)
        last = self.ready.pop()
        if last != m:
            self.ready[i] = last
            self.pos[last] = i
        for d in self.dependents[m]:
            self.missing[d] -= 1
            if self.missing[d] == 0:
                self.pos[d] = len(self.ready)
                self.ready.append(d)
