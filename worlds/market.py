"""market: trading on hidden drifts, where researching different instruments in parallel pays.

Every instrument's price follows a hidden drift (up or down, a fixed amount per ``tick``) plus
noise that hides it from a glance. ``research`` an instrument to learn its drift (it takes a
while); ``buy`` and ``sell`` open or close a one-unit position at the current price. Only so
many positions (``depth``) may be open on one instrument at once, so a collective that piles
onto one discovery earns little: it must research different instruments in parallel and tell
each other what it found.

The score is realised profit so far over a target that scales with the collective
(``target`` per agent), clipped to [0, 1]; a position counts when it is closed. It can fall (a
losing trade), so the world is not monotone. Prices are a function of time alone, computed on
demand, so observing costs O(``view``) and nothing runs between calls.
"""

from __future__ import annotations

from typing import Annotated

from collective.base.seeding import Stream, derive
from collective.world import Range, ToolError, World, tool


class Market(World):
    lexicon = ("up", "down", "buy", "sell", "drift", "full", "research", "profit")

    def __init__(
        self,
        n_agents: int = 1,
        seed: int = 0,
        size: int = 2,
        view: int = 3,
        depth: int = 2,
        positions: int = 2,
        tick: float = 10.0,
        noise: float = 2.0,
        target: float = 15.0,
        research_seconds: float = 30.0,
        trade_seconds: float = 2.0,
    ) -> None:
        """``size`` instruments per agent, ``view`` of them on each agent's screen; at most
        ``depth`` open positions per instrument and ``positions`` per agent; prices move every
        ``tick`` seconds by the drift plus uniform noise of standard deviation ``noise``; the
        score is 1 at a realised profit of ``target`` per agent."""
        super().__init__(n_agents, seed)
        checks = [
            (size >= 1, f"size must be >= 1, got {size}"),
            (1 <= view <= 9, f"view must be in 1..9, got {view}"),
            (depth >= 1, f"depth must be >= 1, got {depth}"),
            (positions >= 1, f"positions must be >= 1, got {positions}"),
            (tick > 0, f"tick must be > 0, got {tick}"),
            (noise >= 0, f"noise must be >= 0, got {noise}"),
            (target > 0, f"target must be > 0, got {target}"),
            (research_seconds > 0, f"research_seconds must be > 0, got {research_seconds}"),
            (trade_seconds > 0, f"trade_seconds must be > 0, got {trade_seconds}"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(f"Market: {msg}")
        self.instruments = size * n_agents
        self.view, self.depth, self.max_positions = view, depth, positions
        self.tick, self.noise, self.target = tick, noise, target * n_agents
        self.research_seconds, self.trade_seconds = research_seconds, trade_seconds
        rng = self.rng
        self.base = [round(rng.uniform(50, 150), 1) for _ in range(self.instruments)]
        self.drift = [rng.choice((-1.0, -0.5, 0.5, 1.0)) for _ in range(self.instruments)]
        self.noise_seed = rng.getrandbits(63)
        self.open_on = [0] * self.instruments  # open positions per instrument
        self.held: dict[int, dict[int, tuple[int, float]]] = {}  # agent -> i -> (side, entry)
        self.learned: dict[int, list[int]] = {}  # agent -> instruments researched, newest last
        self.profit = 0.0
        self.trades = 0

    def price(self, i: int, t: float | None = None) -> float:
        """Instrument ``i`` at simulated time ``t`` (default: now): a pure function of time."""
        k = int((self.now if t is None else t) // self.tick)
        u = Stream(derive(self.noise_seed, i, k)).random()
        # Uniform noise scaled to the standard deviation asked for.
        return round(self.base[i] + self.drift[i] * k + self.noise * 3.4641 * (u - 0.5), 2)

    def observe(self, agent: int) -> str:
        screen = [(agent * self.view + j) % self.instruments for j in range(self.view)]
        parts = [f"profit {self.profit:+.1f}."]
        parts.append(" ".join(f"i{i} {self.price(i):.1f}" for i in dict.fromkeys(screen)) + ".")
        known = self.learned.get(agent, [])[-self.view :]
        if known:
            parts.append("drifts: " + " ".join(f"i{i} {self._says(i)}" for i in known) + ".")
        held = self.held.get(agent)
        if held:
            parts.append(
                "holding: "
                + " ".join(
                    f"i{i} {'long' if s > 0 else 'short'}@{e:.1f}" for i, (s, e) in held.items()
                )
                + "."
            )
        return " ".join(parts)

    @tool(duration="research_seconds")
    def research(self, agent: int, instrument: Annotated[int, Range(0, "last")]) -> str:
        """learn an instrument's drift"""
        known = self.learned.setdefault(agent, [])
        if instrument in known:
            known.remove(instrument)
        known.append(instrument)
        return f"i{instrument} drifts {self._says(instrument)}"

    @tool(duration="trade_seconds")
    def buy(self, agent: int, instrument: Annotated[int, Range(0, "last")]) -> str:
        """buy one unit: open a long position, or close a short one"""
        return self._trade(agent, instrument, +1)

    @tool(duration="trade_seconds")
    def sell(self, agent: int, instrument: Annotated[int, Range(0, "last")]) -> str:
        """sell one unit: open a short position, or close a long one"""
        return self._trade(agent, instrument, -1)

    def score(self) -> float:
        return min(1.0, max(0.0, self.profit / self.target))

    def leave(self, agent: int) -> None:
        """A fired agent's positions are closed at the current price."""
        for i, (side, _) in list(self.held.get(agent, {}).items()):
            self._trade(agent, i, -side)

    # -- bookkeeping ---------------------------------------------------------------------------

    @property
    def last(self) -> int:
        return self.instruments - 1

    def _says(self, i: int) -> str:
        d = self.drift[i]
        return f"{'up' if d > 0 else 'down'} {abs(d):g}"

    def _trade(self, agent: int, i: int, side: int) -> str:
        held = self.held.setdefault(agent, {})
        price = self.price(i)
        if i in held:
            open_side, entry = held[i]
            if open_side == side:
                raise ToolError(f"you already hold i{i} {'long' if side > 0 else 'short'}")
            del held[i]
            self.open_on[i] -= 1
            gain = round(open_side * (price - entry), 2)
            self.profit = round(self.profit + gain, 2)
            self.trades += 1
            return f"closed i{i} at {price:.1f}: {gain:+.1f}"
        if len(held) >= self.max_positions:
            raise ToolError(f"you hold {len(held)} positions, the most allowed: close one first")
        if self.open_on[i] >= self.depth:
            raise ToolError(f"i{i} is crowded ({self.depth} positions open): trade another")
        held[i] = (side, price)
        self.open_on[i] += 1
        return f"opened i{i} {'long' if side > 0 else 'short'} at {price:.1f}"
