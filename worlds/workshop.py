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

Knobs that let each finding be *learned* (all off by default, so an episode of the world as
first built is byte for byte what it was; ``FINDINGS`` below sets them, and
``bench/findings_controls.py`` runs the scripted controls of ``policy/scripted.py`` through it):

- ``desks="shared"``: every agent sees the same ready modules in the same order, its own module
  in slot 1, then those nobody is at work on. With ``"spread"`` desks "always work slot 1" is
  clash-free, so hiring everyone forces "a big team does ~2x" by headcount alone; shared desks
  make who takes what a problem the team must settle.
- ``clash="refuse"``: units on one module that overlap in time are all lost (and a unit on a
  built module); the desk marks a module another agent is at work on ``busy``. Under
  ``"penalty"`` a clashed unit still lands, so clashes cannot lower "useful work" (landed
  units); with refusals an uncoordinated big team really pays.
- ``interrupts``: a message (a post: for everyone else) heard while a unit of work is in flight
  loses that unit. Without it an untrained big team's chatter is free and headcount alone puts
  it above the average rollout; with it, it can start below, and talk pays only when it carries
  something (a key, to one who waits for it).
- ``keys_per_message``: a message teaches at most this many keys (0: every key it names; a
  24-token answer holds about five). One message passing all knowledge would keep needed
  talk from growing with the team.
- ``terse``: the observation in about half the bytes a slot (five slots in the bytes of three),
  and ``want k<j>@<a>`` names who asked for a key. The default ``wanted: k<j>`` says a key is
  wanted but not by whom, so passing it by direct message is guesswork; a bigger desk in the
  default layout would push the inbox out of a small context (table below).
- ``holders="first"`` with ``posts_teach=False``: agent 0 holds every key and keys travel by
  direct message only. ``holders="slots"`` denies a solo keys by construction ("a solo never
  catches up"); with posts teaching, one post teaches everyone at any scale.
- a fixed ``modules``: one task whatever the team (``modules=0`` grows it: "2x" by headcount).

With any of the first five on, ``metrics`` also reports ``taught``: the keys agents learned from
messages, the communication that carried knowledge.

"Tokens cost time" is the latency model's, not the world's: ``FINDINGS`` is meant with the
``tiny-paced`` preset (collective/base/latency.py: 50 ms an output token), under which a solo agent
spending a team's tokens needs measurably longer. "No organisation contains the solo": compare
a flat team with a solo (every agent from the start), not a CEO who starts alone.

With ``FINDINGS`` use a context of 256 (``TinyConfig.context``, recorded in every checkpoint,
so older checkpoints load with their own 128): at 128 the model saw a whole inbox line in about
one prompt in twenty, at 256 in all of them (the prompt's bytes by part, measured with
``bench/findings_controls.py --bytes``: ``bench/results/findings_controls/README.md``).
"""

from __future__ import annotations

import inspect
import itertools
import re
from typing import Annotated, Any

from collective.world import Range, ToolError, World, tool

_KEY = re.compile(r"\bk(\d+)\b")

#: The workshop in which each finding of the signs-of-life study can be learned and none is
#: forced (the module docstring's tables; a context of 192 bytes for the tiny model).
FINDINGS: dict[str, object] = {
    "modules": 64,
    "holders": "first",
    "onboard_seconds": 20.0,
    "knowledge": 0.5,
    "keys": 4,
    "view": 5,
    "desks": "shared",
    "clash": "refuse",
    "interrupts": True,
    "posts_teach": False,
    "keys_per_message": 0,
    "terse": True,
}


# Resident bytes per module (its layer, dependencies, units, key, counters and indexes): a
# peak-RSS slope, rounded up (bench/footprint.py; bench/results/footprint/README.md).
MODULE_BYTES = 256


def _check(
    *,
    size: int,
    modules: int,
    parallel: float,
    depth: int,
    units: int,
    duplicate_penalty: float,
    knowledge: float,
    keys: int,
    view: int,
    work_seconds: float,
    holders: str,
    onboard_seconds: float,
    desks: str,
    clash: str,
    keys_per_message: int,
    interrupts: bool,
) -> None:
    """Raise ValueError (``Workshop: ...``, one line) on the first parameter out of its domain."""
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
        (desks in ("spread", "shared"), f"desks must be spread or shared, got {desks!r}"),
        (clash in ("penalty", "refuse"), f"clash must be penalty or refuse, got {clash!r}"),
        (keys_per_message >= 0, f"keys_per_message must be >= 0, got {keys_per_message}"),
        (interrupts in (True, False), f"interrupts must be true or false, got {interrupts!r}"),
    ]
    for ok, msg in checks:
        if not ok:
            raise ValueError(f"Workshop: {msg}")


class Workshop(World):
    monotone = True
    lexicon: tuple[str, ...] = (
        "ready",
        "built",
        "key",
        "need",
        "slot",
        "mine",
        "take",
        "done",
        "help",
    )

    @classmethod
    def footprint(cls, n_agents: int, **params: Any) -> int:
        # (a subclass may take **params instead of restating size: then Workshop's default)
        own = inspect.signature(cls.__init__).parameters.get("size")
        default = (own or inspect.signature(Workshop.__init__).parameters["size"]).default
        size = params.get("size", default)
        return max(0, (params.get("modules") or size * n_agents) * MODULE_BYTES)

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
        desks: str = "spread",
        clash: str = "penalty",
        keys_per_message: int = 0,
        terse: bool = False,
        interrupts: bool = False,
    ) -> None:
        """``size`` modules per agent (the project grows with the team), or exactly ``modules``
        when given (to put teams of different sizes on one project); ``parallel`` of them
        in the first layer (ready from the start), the rest spread over ``depth - 1`` more
        layers, each module depending on one or two of the layer before; each needs 1 to
        ``units`` units of work; ``knowledge`` of them need one of ``keys`` keys (at most one
        key per agent, so a solo agent knows them all). ``holders``, ``onboard_seconds``,
        ``posts_teach``, ``desks``, ``clash``, ``keys_per_message`` and ``terse``: see the
        module's docstring."""
        super().__init__(n_agents, seed)
        _check(
            size=size,
            modules=modules,
            parallel=parallel,
            depth=depth,
            units=units,
            duplicate_penalty=duplicate_penalty,
            knowledge=knowledge,
            keys=keys,
            view=view,
            work_seconds=work_seconds,
            holders=holders,
            onboard_seconds=onboard_seconds,
            desks=desks,
            clash=clash,
            keys_per_message=keys_per_message,
            interrupts=interrupts,
        )
        self.view, self.work_seconds, self.penalty = view, work_seconds, duplicate_penalty
        self.onboard, self.posts_teach = onboard_seconds, posts_teach
        self.shared, self.refuse = desks == "shared", clash == "refuse"
        self.per_message, self.terse, self.interrupts = keys_per_message, terse, interrupts
        self.findings = self.shared or self.refuse or interrupts or terse or keys_per_message > 0
        self.taught = 0  # keys learned from a message or a post (``metrics``)
        self.working: dict[int, int] = {}  # agent -> the module of its unit in flight
        self.interrupted: dict[int, int] = {}  # agent -> who interrupted its unit in flight
        self.wanted_by: dict[int, list[int]] = {}  # key -> agents refused for lacking it, still
        self.flight: dict[int, list[tuple[int, float, float]]] = {}  # module -> (agent, begun, due)
        self.starts: dict[int, float] = {}  # hired agent -> when its first unit may land
        n = self.modules = modules or size * n_agents
        # The seeded draws, in this order: the project, then who holds which key.
        self._draw_project(n, parallel, depth, units)
        self._draw_keys(n_agents, n, keys, knowledge, holders)
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

    def _draw_project(self, n: int, parallel: float, depth: int, units: int) -> None:
        """The ``n`` modules: ``parallel`` of them in the first layer, the rest split evenly
        over ``depth - 1`` more; each needs 1 to ``units`` units and depends on one or two of
        the layer before (``need``, ``dependents``, ``missing``)."""
        rng = self.rng
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

    def _draw_keys(self, n_agents: int, n: int, keys: int, knowledge: float, holders: str) -> None:
        """Who holds which key at the start (``holder``, ``known``) and which modules need one
        (``key_of``; -1: none); the keys' names join the lexicon."""
        rng = self.rng
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

    # -- what agents see and do --------------------------------------------------------------

    def knows(self, agent: int, key: int) -> bool:
        return key in self.public or key in self.known.get(agent, ())

    def observe(self, agent: int) -> str:
        """The agent's desk (remembered: ``work`` refers to the slots shown here) and its keys."""
        desk = self._desk(agent)
        self.desk[agent] = desk
        mine = sorted(self.known.get(agent, ()))
        if self.terse:
            return self._terse(agent, desk, mine)
        parts = [f"built {self.n_built}/{self.modules}."]
        if mine:
            parts.append("you know " + " ".join(f"k{j}" for j in mine) + ".")
        share = [j for j in mine if j in self.wanted and j not in self.public]
        if share:
            parts.append("wanted: " + " ".join(f"k{j}" for j in share) + ".")
        slots = []
        marks = self.shared or self.refuse
        for i, m in enumerate(desk, 1):
            key = self.key_of[m]
            lack = f", needs k{key}" if key >= 0 and not self.knows(agent, key) else ""
            busy = ", busy" if marks and self._busy(agent, m) else ""
            slots.append(f"{i}=m{m} ({self._left(m):g} left{lack}{busy})")
        parts.append("slots: " + (", ".join(slots) if slots else "none ready"))
        return " ".join(parts)

    def _terse(self, agent: int, desk: tuple[int, ...], mine: list[int]) -> str:
        """The same facts in fewer bytes, so that a small context holds them and the inbox
        (``terse``; the byte table in the module docstring): ``built 3/64; know k0 k1; want
        k1@2; 1=m4 2, 2=m7 3 k1?, 3=m9 1 busy``. ``want k1@2``: agent 2 was refused work for
        lacking k1, which this agent knows (the last four such requests still open)."""
        parts = [f"built {self.n_built}/{self.modules}"]
        if mine:
            parts.append("know " + " ".join(f"k{j}" for j in mine))
        asks = [
            f"k{j}@{self.agent_id(a)}"
            for j in mine
            if j not in self.public
            for a in self.wanted_by.get(j, ())
        ]
        if asks:
            parts.append("want " + " ".join(asks[-4:]))
        slots = []
        for i, m in enumerate(desk, 1):
            key = self.key_of[m]
            lack = f" k{key}?" if key >= 0 and not self.knows(agent, key) else ""
            busy = " busy" if self._busy(agent, m) else ""
            slots.append(f"{i}=m{m} {self._left(m):g}{lack}{busy}")
        parts.append(", ".join(slots) if slots else "none ready")
        return "; ".join(parts)

    def _busy(self, agent: int, m: int) -> bool:
        """Whether another agent is at work on ``m``: a unit of its is in flight there
        (``clash = "refuse"`` registers them) or landed less than ``work_seconds`` ago (one who
        keeps at it begins its next unit a turn later)."""
        other = self.last_by[m]
        if other not in (-1, agent) and self.now - self.last_at[m] < self.work_seconds:
            return True
        return any(a != agent and b <= self.now < e for a, b, e in self.flight.get(m, ()))

    def _work_seconds(self, agent: int, slot: int) -> float:
        """A unit of work takes ``work_seconds``; a new hire's first one also waits out the rest
        of its onboarding. With ``clash = "refuse"`` the unit is also registered, as it begins,
        on its module (the engine asks for an action's duration once, as the action begins, in
        canonical order), so that units that overlap in time can be told apart."""
        seconds = self.work_seconds + max(0.0, self.starts.get(agent, 0.0) - self.now)
        if self.interrupts:
            self.working[agent] = slot
            self.interrupted.pop(agent, None)
        if self.refuse:
            desk = self.desk.get(agent, ())
            if slot <= len(desk):
                m = desk[slot - 1]
                key = self.key_of[m]
                if not self.built[m] and (key < 0 or self.knows(agent, key)):
                    horizon = self.now - self.work_seconds - self.onboard
                    units = [u for u in self.flight.get(m, ()) if u[2] >= horizon]
                    units.append((agent, self.now, self.now + seconds))
                    self.flight[m] = units
        return seconds

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
        if self.interrupts:
            self.working.pop(agent, None)
            by = self.interrupted.pop(agent, -1)
            if by >= 0:
                self.duplicates += 1
                raise ToolError(
                    f"a message from agent {self.agent_id(by)} interrupted your unit on m{m}; "
                    "it is lost"
                )
        key = self.key_of[m]
        if key >= 0 and not self.knows(agent, key):
            self.refused += 1
            self.wanted.add(key)
            asks = self.wanted_by.setdefault(key, [])
            if agent in asks:
                asks.remove(agent)
            asks.append(agent)
            raise ToolError(f"m{m} needs key k{key}, which you do not know: ask for it")
        if self.refuse:
            self._refuse_clash(agent, m)
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

    def _refuse_clash(self, agent: int, m: int) -> None:
        """``clash = "refuse"``: a unit on a module already built is lost, and so is every unit
        that overlapped in time another agent's unit on the same module (both are lost: two
        people editing one file at once); the time they took is spent. A clash is work that
        did not land."""
        if self.built[m]:
            self.duplicates += 1
            raise ToolError(f"m{m} was already built: your unit is lost")
        units = self.flight.get(m, [])
        mine = next((u for u in reversed(units) if u[0] == agent and u[2] == self.now), None)
        begun = mine[1] if mine else self.now
        other = next((a for a, b, e in units if a != agent and b < self.now and e > begun), -1)
        if other >= 0:
            self.duplicates += 1
            raise ToolError(f"m{m} clashed with agent {self.agent_id(other)}'s unit; both are lost")

    def metrics(self) -> dict[str, float]:
        """Work lost to duplication or clashes; with a findings knob on (the world as first
        built reports only that), also ``taught``: keys agents learned from messages or posts,
        the communication that carried knowledge."""
        if self.findings:
            return {"duplicates": self.duplicates, "taught": self.taught}
        return {"duplicates": self.duplicates}

    def heard(self, sender: int, to: int | None, text: str) -> None:
        """A key said by someone who knows it is learned: by the recipient, or by all (a post).
        With ``keys_per_message`` k > 0, one message teaches at most k keys the recipient did
        not know, the first it names. With ``interrupts``, a message (or a post, for everyone
        else) heard while a unit of work is in flight loses that unit."""
        if self.interrupts:
            for a in self.working if to is None else (to,) if to in self.working else ():
                if a != sender:
                    self.interrupted.setdefault(a, sender)
        taught = 0
        for match in _KEY.finditer(text):
            key = int(match.group(1))
            if key < self.n_keys and self.knows(sender, key):
                if to is None and not self.posts_teach:
                    continue
                if self.per_message and taught >= self.per_message:
                    break
                if to is None:
                    new = key not in self.public
                    taught += new
                    self.taught += new
                    self.public.add(key)
                    self.wanted_by.pop(key, None)
                else:
                    new = not self.knows(to, key)
                    taught += new
                    self.taught += new
                    self.known.setdefault(to, set()).add(key)
                    asks = self.wanted_by.get(key)
                    if asks and to in asks:
                        asks.remove(to)

    def score(self) -> float:
        return self.n_built / self.modules

    # -- bookkeeping ---------------------------------------------------------------------------

    def _left(self, m: int) -> float:
        return max(0.0, round(self.need[m] - self.progress[m], 6))

    def _desk(self, agent: int) -> tuple[int, ...]:
        """Up to ``view`` ready modules: the one it works on first, then ready modules strided so
        that, while at least as many are ready as there are agents, no two agents share slot 1
        (and with ``view`` times as many, no two share any slot). With ``desks = "shared"``
        every agent sees the same ready modules in the same order (of the first ``4 * view``
        ready ones, those nobody else is at work on first), after its own in slot 1: agents
        that start at once are shown the same slot 1, so who takes which must be settled."""
        ready, n = self.ready, len(self.ready)
        if not n:
            return ()
        cur = self.current.get(agent, -1)
        desk = [cur] if cur in self.pos else []
        if self.shared:
            free: list[int] = []
            busy: list[int] = []
            for m in ready[: 4 * self.view]:
                if m != cur:
                    (busy if self._busy(agent, m) else free).append(m)
            return tuple((desk + free + busy)[: self.view])
        return self._strided(ready, agent, self.n_agents, desk)

    def _strided(
        self, ready: list[int], place: int, members: int, desk: list[int]
    ) -> tuple[int, ...]:
        """``desk`` filled up to ``view`` from ``ready``, starting at the agent's ``place``
        among ``members`` agents sharing these modules and striding by ``members`` while enough
        are ready, so that neighbours are shown different modules."""
        n = len(ready)
        stride = members if members * (self.view - 1) < n else 1
        for i in range(2 * self.view):
            m = ready[(place + i * stride) % n]
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
