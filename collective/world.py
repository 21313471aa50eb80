"""The ``World`` base class: a researcher's world is a plain Python class.

A world holds the shared state of one task instance. It exposes tools (methods marked with
:func:`tool`) whose arguments carry machine-readable domains, an ``observe(agent)`` text, and an
anytime ``score()`` in [0, 1] that can be read at any instant, so an episode cut by its time
limit is still scored. The conductor is the only caller of tools, always in canonical order, so
a world needs no locks and no care for concurrency.

Example::

    class Tally(World):
        def __init__(self, n_agents=1, seed=0, target=20):
            super().__init__(n_agents, seed)
            self.target, self.count = target, 0

        @tool(duration=5.0)
        def add(self, agent: int, amount: Annotated[int, Range(1, 3)]) -> str:
            self.count = min(self.target, self.count + amount)
            return f"count is {self.count}"

        def observe(self, agent: int) -> str:
            return f"count {self.count} of {self.target}"

        def score(self) -> float:
            return self.count / self.target
"""

from __future__ import annotations

import inspect
import random
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from collective.actions import ArgSpec, ToolSpec

Bound = int | str | Callable[[Any], int]


@dataclass(frozen=True)
class Range:
    """An integer argument in ``lo..hi`` (inclusive). A bound may be an int, the name of a world
    attribute, or a function of the world, so domains can scale with the world's size."""

    lo: Bound
    hi: Bound


@dataclass(frozen=True)
class OneOf:
    """A word from a fixed list (or the name of a world attribute holding one, or a function)."""

    choices: Sequence[str] | str | Callable[[Any], Sequence[str]]


@dataclass(frozen=True)
class Text:
    """Free text up to ``max_chars``; ``words`` (same forms as OneOf) suggests a vocabulary."""

    max_chars: int = 80
    words: Sequence[str] | str | Callable[[Any], Sequence[str]] = ()


class ToolError(Exception):
    """Raised by a tool to refuse a call; the message becomes the agent's error result."""


Duration = float | str | Callable[..., float]


@dataclass(frozen=True)
class _ToolDecl:
    name: str
    params: tuple[tuple[str, Range | OneOf | Text], ...]
    duration: Duration
    doc: str
    is_async: bool


def tool(duration: Duration = 1.0, *, doc: str | None = None) -> Callable[[Callable], Callable]:
    """Mark a world method as a tool an agent may call.

    ``duration`` is the simulated seconds the call takes: a number, the name of a world
    attribute, or ``f(world, agent, **args)``. The effect lands when that time has passed. The
    first parameter after ``self`` is the calling agent's id; every other parameter must be
    annotated ``Annotated[int, Range(...)]``, ``Annotated[str, OneOf(...)]`` or
    ``Annotated[str, Text(...)]``. A tool may be ``async`` (real work, e.g. a subprocess); in
    ``hybrid`` clock mode its measured real duration is added to the simulated one and logged.
    """

    def mark(fn: Callable) -> Callable:
        fn.__collective_tool__ = (duration, doc)  # type: ignore[attr-defined]
        return fn

    return mark


def _resolve(world: World, value: Any) -> Any:
    if callable(value):
        return value(world)
    if isinstance(value, str):
        try:
            return getattr(world, value)
        except AttributeError:
            raise AttributeError(
                f"{type(world).__name__}: a tool domain names attribute {value!r}, "
                "which the world does not have"
            ) from None
    return value


class World:
    """Base class of every world. Subclasses call ``super().__init__(n_agents, seed)``."""

    #: Set True when the score can never decrease; the test suite holds the world to it.
    monotone: ClassVar[bool] = False
    #: Words an agent may find useful in messages (the random policy draws from them).
    lexicon: ClassVar[tuple[str, ...]] = ()

    _tool_decls: ClassVar[dict[str, _ToolDecl]]

    def __init__(self, n_agents: int = 1, seed: int = 0) -> None:
        if n_agents < 1:
            raise ValueError(f"{type(self).__name__} needs at least one agent, got {n_agents}")
        self.n_agents = n_agents
        self.seed = seed
        #: The world's own seeded stream; use it (never the global ``random``) for determinism.
        self.rng = random.Random(seed)
        #: Simulated seconds since the episode began. The engine sets it to the current instant
        #: before anything reads or calls the world then, so observations, tools and scores may
        #: depend on time (prices that move, work that overlaps).
        self.now = 0.0
        self._ids: list[int] = []  # engine-wide agent ids, by this world's agent number

    # -- what a subclass writes ---------------------------------------------------------------

    def observe(self, agent: int) -> str:
        raise NotImplementedError(f"{type(self).__name__} must define observe(agent) -> str")

    def score(self) -> float:
        raise NotImplementedError(f"{type(self).__name__} must define score() -> float in [0, 1]")

    def done(self) -> bool:
        """The episode ends early when this is true; by default when the score reaches 1."""
        return self.score() >= 1.0

    def heard(self, sender: int, to: int | None, text: str) -> None:
        """Called when ``sender`` sends this world's agent ``to`` a message (at delivery), or
        posts ``text`` on a channel (``to`` is None). Messages change nothing by default; a world
        where knowledge travels by word of mouth overrides this to learn who now knows what."""

    def agent_id(self, agent: int) -> int:
        """The engine-wide id of this world's agent ``agent``: the number others ``msg``. They
        differ only when several worlds share an episode (islands); say this one in
        observations that tell an agent whom to talk to."""
        return self._ids[agent] if agent < len(self._ids) else agent

    def join(self, agent: int) -> None:
        """Called when an agent is hired mid-episode (ids beyond ``n_agents``)."""

    def leave(self, agent: int) -> None:
        """Called when an agent is fired."""

    def metrics(self) -> dict[str, float]:
        """World-specific counters worth reporting (e.g. duplicated work), read at the end."""
        return {}

    def close(self) -> None:
        """Release real resources (temporary directories, processes) when the episode ends."""

    # -- what the engine uses ------------------------------------------------------------------

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        decls: dict[str, _ToolDecl] = {}
        for base in reversed(cls.__mro__[1:]):
            decls.update(getattr(base, "_tool_decls", {}))
        for name, fn in vars(cls).items():
            marker = getattr(fn, "__collective_tool__", None)
            if marker is None:
                continue
            duration, doc = marker
            decls[name] = _declare(cls, name, fn, duration, doc)
        cls._tool_decls = decls

    def tool_specs(self) -> tuple[ToolSpec, ...]:
        """This instance's tools with every domain resolved (bounds may depend on its size)."""
        specs = []
        for d in self._tool_decls.values():
            args = []
            for pname, dom in d.params:
                if isinstance(dom, Range):
                    a = ArgSpec(
                        pname, "int", lo=int(_resolve(self, dom.lo)), hi=int(_resolve(self, dom.hi))
                    )
                elif isinstance(dom, OneOf):
                    a = ArgSpec(pname, "choice", choices=tuple(_resolve(self, dom.choices)))
                else:
                    a = ArgSpec(
                        pname,
                        "text",
                        max_chars=dom.max_chars,
                        words=tuple(_resolve(self, dom.words)) or self.lexicon,
                    )
                args.append(a)
            specs.append(ToolSpec(d.name, tuple(args), "world", d.doc))
        return tuple(specs)

    def tool_duration(self, name: str, agent: int, args: tuple[int | str, ...]) -> float:
        d = self._tool_decls[name]
        if callable(d.duration):
            kwargs = {p: v for (p, _), v in zip(d.params, args, strict=True)}
            seconds = d.duration(self, agent, **kwargs)
        else:
            seconds = _resolve(self, d.duration)
        seconds = float(seconds)
        if not seconds >= 0:
            raise ValueError(f"{type(self).__name__}.{name}: duration must be >= 0, got {seconds}")
        return seconds

    def tool_is_async(self, name: str) -> bool:
        return self._tool_decls[name].is_async

    def call_tool(self, name: str, agent: int, args: tuple[int | str, ...]) -> Any:
        """Call the tool method (a coroutine for async tools); the conductor handles errors."""
        return getattr(self, name)(agent, *args)


def _declare(cls: type, name: str, fn: Callable, duration: Duration, doc: str | None) -> _ToolDecl:
    where = f"{cls.__name__}.{name}"
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())
    if len(params) < 2:
        raise TypeError(f"{where}: a tool takes (self, agent, ...) ")
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as e:  # a forward reference the module cannot resolve
        raise TypeError(f"{where}: cannot read the argument annotations ({e})") from e
    out = []
    for p in params[2:]:
        hint = hints.get(p.name)
        dom = None
        if typing.get_origin(hint) is typing.Annotated:
            dom = next((m for m in hint.__metadata__ if isinstance(m, Range | OneOf | Text)), None)
        if dom is None:
            raise TypeError(
                f"{where}: argument {p.name!r} needs a domain, e.g. "
                "Annotated[int, Range(0, 9)], Annotated[str, OneOf(...)] "
                "or Annotated[str, Text(80)]"
            )
        out.append((p.name, dom))
    kinds = [type(d) for _, d in out]
    if Text in kinds and kinds.index(Text) != len(kinds) - 1:
        raise TypeError(f"{where}: a Text argument must be the last one")
    text = doc if doc is not None else (inspect.getdoc(fn) or "").split("\n")[0]
    return _ToolDecl(name, tuple(out), duration, text, inspect.iscoroutinefunction(fn))
