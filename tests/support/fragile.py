"""Worlds for tests: tools that misbehave on purpose, one that awaits mid-commit, one with a bug
in a method of choice, one that rings world events, and worlds `collective check` must fault."""

from __future__ import annotations

import random
from typing import Annotated

import trio

from collective import Range, Text, ToolError, World, tool


class Fragile(World):
    """A world whose tools misbehave on purpose: one raises a bug, one refuses politely."""

    def __init__(self, n_agents: int = 1, seed: int = 0) -> None:
        super().__init__(n_agents, seed)
        self.progress = 0

    @tool(duration=3.0)
    def step(self, agent: int, n: Annotated[int, Range(1, 2)]) -> str:
        self.progress = min(10, self.progress + n)
        return f"progress {self.progress}"

    @tool(duration=1.0)
    def crash(self, agent: int) -> str:
        raise RuntimeError("the world has a bug")

    @tool(duration=1.0)
    def refuse(self, agent: int, why: Annotated[str, Text(10)]) -> str:
        raise ToolError(f"refused: {why}")

    def observe(self, agent: int) -> str:
        return f"progress {self.progress}"

    def score(self) -> float:
        return self.progress / 10


class Bumps(World):
    """A counter every agent can bump; ``abump`` awaits in the middle of its effect, as a tool
    that runs a real subprocess does (the repo world's ``test``)."""

    def __init__(self, n_agents: int = 1, seed: int = 0) -> None:
        super().__init__(n_agents, seed)
        self.count = 0

    @tool(duration=1.0)
    def bump(self, agent: int) -> str:
        self.count += 1
        return "ok"

    @tool(duration=1.0)
    async def abump(self, agent: int) -> str:
        await trio.sleep(0)  # the conductor yields here, mid-instant
        self.count += 1
        return "ok"

    def observe(self, agent: int) -> str:
        return f"count {self.count}"

    def score(self) -> float:
        return min(1.0, self.count / 100)


class Faulty(World):
    """One bug, chosen by ``bug``, in the method it names: it misbehaves once ``count`` reaches
    2 (``metrics`` and ``close`` at the end; ``event`` at t = 5). Each bug's line is marked
    ``# bug: NAME`` so a test can check that the error names it."""

    def __init__(self, n_agents: int = 1, seed: int = 0, bug: str = "tool") -> None:
        super().__init__(n_agents, seed)
        self.bug = bug
        self.count = 0
        if bug == "event":
            self.at(5.0, self.boom, 7)

    @tool(duration=lambda w, agent, n: w.seconds(n))  # bug: duration (the function that said -10)
    def add(self, agent: int, n: Annotated[int, Range(1, 2)]) -> str:
        self.count += n
        if self.bug == "tool" and self.count >= 2:
            raise KeyError("no such thing")  # bug: tool
        if self.bug == "schedule" and self.count >= 2:
            self.at(self.now + 1, self.boom, self)  # bug: schedule
        return f"count {self.count}"

    def seconds(self, n: int) -> float:
        if self.bug == "duration" and self.count >= 2:
            return -5.0 * n
        return 2.0

    def boom(self, n: object) -> None:
        raise RuntimeError(f"boom {n}")  # bug: event

    def observe(self, agent: int) -> str:
        if self.bug == "observe" and self.count >= 2:
            raise IndexError("nothing to see")  # bug: observe
        if self.bug == "observe-int" and self.count >= 2:
            return 42  # type: ignore[return-value]
        if self.bug == "observe-at" and self.count >= 2:
            self.after(1.0, self.boom, 1)  # bug: observe-at
        return f"count {self.count}"

    def score(self) -> float:
        if self.bug == "score" and self.count >= 2:
            return 1.5
        return min(1.0, self.count / 100)

    def done(self) -> bool:
        if self.bug == "done" and self.count >= 2:
            raise ZeroDivisionError("done? who knows")  # bug: done
        return False

    def heard(self, sender: int, to: int | None, text: str) -> None:
        if self.bug == "heard":
            raise UnicodeError("cannot hear that")  # bug: heard

    def join(self, agent: int) -> None:
        if self.bug == "join":
            raise LookupError("no desk for the new hire")  # bug: join

    def leave(self, agent: int) -> None:
        if self.bug == "leave":
            raise LookupError("nobody to see them out")  # bug: leave

    def metrics(self) -> dict[str, float]:
        if self.bug == "metrics":
            raise AttributeError("no counters")  # bug: metrics
        return {"count": self.count}

    def close(self) -> None:
        if self.bug == "close":
            raise OSError("cannot remove what it made")  # bug: close


class Chimes(World):
    """Chimes at the times given (world events), each posting on the channel and raising the
    score by one step; ``done`` once every chime has rung. ``ring`` is a tool agents may call
    to schedule one more chime ``delay`` seconds later."""

    monotone = True

    def __init__(
        self, n_agents: int = 1, seed: int = 0, times: tuple[float, ...] = (10.0, 20.0, 20.0)
    ) -> None:
        super().__init__(n_agents, seed)
        self.rung: list[tuple[float, int]] = []
        self.total = len(times)
        for i, t in enumerate(times):
            self.at(t, self.chime, i)

    def chime(self, i: int) -> str:
        self.rung.append((self.now, i))
        self.post(f"chime {i}")
        return f"chime {i}"

    @tool(duration=1.0)
    def ring(self, agent: int, delay: Annotated[int, Range(0, 5)]) -> str:
        """schedule one more chime"""
        self.total += 1
        self.after(delay, self.chime, 100 + agent)
        return f"a chime in {delay} s"

    @tool(duration=5.0)
    def look(self, agent: int) -> str:
        """see how many chimes have rung"""
        return f"{len(self.rung)} rung"

    def observe(self, agent: int) -> str:
        return f"{len(self.rung)} of {self.total} rung"

    def score(self) -> float:
        return len(self.rung) / max(1, self.total)

    def done(self) -> bool:
        return self.total > 0 and len(self.rung) == self.total


class Stuck(World):
    """Nothing an agent does changes the score: nothing to learn."""

    @tool(duration=1.0)
    def push(self, agent: int) -> str:
        return "nothing moves"

    def observe(self, agent: int) -> str:
        return "a wall"

    def score(self) -> float:
        return 0.0


class Unseeded(World):
    """Draws from the global random stream, not ``self.rng``: not reproducible."""

    def __init__(self, n_agents: int = 1, seed: int = 0) -> None:
        super().__init__(n_agents, seed)
        self.count = 0

    @tool(duration=1.0)
    def roll(self, agent: int) -> str:
        self.count += random.randint(1, 3)
        return f"count {self.count}"

    def observe(self, agent: int) -> str:
        return f"count {self.count}"

    def score(self) -> float:
        return min(1.0, self.count / 50)


class Liar(World):
    """Declares ``monotone`` but its score falls."""

    monotone = True

    def __init__(self, n_agents: int = 1, seed: int = 0) -> None:
        super().__init__(n_agents, seed)
        self.count = 0

    @tool(duration=1.0)
    def up(self, agent: int) -> str:
        self.count = min(10, self.count + 1)
        return "up"

    @tool(duration=1.0)
    def down(self, agent: int) -> str:
        self.count = max(0, self.count - 1)
        return "down"

    def observe(self, agent: int) -> str:
        return f"count {self.count}"

    def score(self) -> float:
        return self.count / 10


class Halts(Bumps):
    """``halt`` stops the run around the conductor in the middle of an instant, as a training
    run that stops its rollouts does while a tool is out: it cancels the nursery the
    conductor's task runs in, then awaits; ``shielded``, to the end (as a worker thread's
    result is delivered after a cancellation), otherwise the cancellation lands in the tool.
    ``bump`` is an ordinary tool."""

    def __init__(self, n_agents: int = 1, seed: int = 0, shielded: bool = False) -> None:
        super().__init__(n_agents, seed)
        self.shielded = shielded

    @tool(duration=1.0)
    async def halt(self, agent: int) -> str:
        runner = trio.lowlevel.current_task().parent_nursery
        assert runner is not None
        runner.cancel_scope.cancel()
        with trio.CancelScope(shield=self.shielded):
            await trio.sleep(0)
        return "halted"


class Refuses(World):
    """``spend`` changes its state, schedules an event and posts, then raises ``ToolError``;
    ``metrics`` counts both. What the guide says of a refusal: nothing is undone."""

    def __init__(self, n_agents: int = 1, seed: int = 0) -> None:
        super().__init__(n_agents, seed)
        self.count = 0
        self.rang = 0

    @tool(duration=2.0)
    def spend(self, agent: int) -> str:
        self.count += 1
        self.after(1.0, self.ring)
        self.post(f"spent {self.count}")
        raise ToolError("refused after all")

    def ring(self) -> None:
        self.rang += 1

    def observe(self, agent: int) -> str:
        return f"count {self.count}"

    def score(self) -> float:
        return min(1.0, self.count / 10)

    def metrics(self) -> dict[str, float]:
        return {"count": self.count, "rang": self.rang}


class Vast(Bumps):
    """Says it takes a petabyte an agent, and fails if built: the memory guard must refuse it
    from what it says, before building it."""

    @classmethod
    def footprint(cls, n_agents: int, **params: object) -> int:
        return n_agents * 2**50

    def __init__(self, n_agents: int = 1, seed: int = 0) -> None:
        raise AssertionError("Vast was built although it said it cannot fit")


class Unmeasured(Bumps):
    """A footprint with a bug."""

    @classmethod
    def footprint(cls, n_agents: int, **params: object) -> int:
        return n_agents // 0


class Named(World):
    """A lexicon set per instance, growing with the team: ``p0`` .. ``p{4n-1}``."""

    def __init__(self, n_agents: int = 1, seed: int = 0) -> None:
        super().__init__(n_agents, seed)
        self.lexicon = tuple(f"p{i}" for i in range(4 * n_agents))
        self.count = 0

    @tool(duration=1.0)
    def tick(self, agent: int) -> str:
        self.count += 1
        return "tick"

    def observe(self, agent: int) -> str:
        return f"count {self.count}"

    def score(self) -> float:
        return min(1.0, self.count / 1000)
