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
import math
import random
import re
import traceback
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

import msgspec

from collective.base.actions import ArgSpec, ToolSpec
from collective.base.primitives import PRIMITIVES
from collective.records import failure_text

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
#: What a world event's arguments may be: they are written into the record (``Happened``).
Scalar = int | float | str | bool | None


class Host(Protocol):
    """What a world asks of the episode running it (``LiveEpisode``): its own events, its
    posts."""

    def schedule_world_event(
        self, world: World, t: float, fn: Callable[..., object], args: tuple[Scalar, ...]
    ) -> None: ...

    def world_post(self, world: World, text: str) -> None: ...


#: Where the engine's own code lives (all of collective/): a traceback's frames there are not the
#: world's.
_ENGINE = str(Path(__file__).resolve().parent.parent) + "/"
#: Names a tool may not take: the World's own attributes, which a tool would hide.
_RESERVED = frozenset({"n_agents", "seed", "rng", "now"})
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")  # in the repr of an object, as in error messages
POST_CHARS = 200  # the longest text a world may post: its agents read it in their prompts
COMMONS_ENTRY_CHARS = 200  # the longest entry a world may add to its commons
#: The world event a contribution to the commons is recorded as (``World.contribute``).
COMMONS_EVENT = "commons_put"


class Commons(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A world's commons as an episode began: goods that outlive an episode (a library of
    solved problems, an archive), kept across a training run by ``collective.rl.commons``.
    A world that declares one (``World.commons``) receives it as that constructor parameter;
    being a parameter, it is in the episode's record, so replay and fork start from the same
    commons, and ``version`` names which one it was."""

    version: int = -1  # -1: no commons (the world plays without one)
    entries: tuple[str, ...] = ()  # oldest first


@dataclass(frozen=True)
class _ToolDecl:
    name: str
    params: tuple[tuple[str, Range | OneOf | Text], ...]
    duration: Duration
    doc: str
    is_async: bool


def tool(duration: Duration = 1.0, *, doc: str | None = None) -> Callable[[Callable], Callable]:
    """Mark a world method as a tool an agent may call.

    ``duration`` is the simulated seconds the call takes: a number >= 0, the name of a world
    attribute holding one, or ``f(world, agent, **args)``. The effect lands when that time has
    passed. The first parameter after ``self`` is the calling agent's id; every other parameter
    must be annotated ``Annotated[int, Range(...)]``, ``Annotated[str, OneOf(...)]`` or
    ``Annotated[str, Text(...)]``. A tool may be ``async`` (real work, e.g. a subprocess); in
    ``hybrid`` clock mode its measured real duration is added to the simulated one and logged.
    """

    def mark(fn: Callable) -> Callable:
        fn.__collective_tool__ = (duration, doc)  # type: ignore[attr-defined]
        return fn

    return mark


def _resolve(world: World, value: Any, where: str) -> Any:
    if callable(value):
        return value(world)
    if isinstance(value, str):
        try:
            return getattr(world, value)
        except AttributeError:
            raise AttributeError(
                f"{where} names attribute {value!r}, which the world does not have"
            ) from None
    return value


class World:
    """Base class of every world. Subclasses call ``super().__init__(n_agents, seed)``."""

    #: Set True when the score can never decrease; the test suite holds the world to it.
    monotone: ClassVar[bool] = False
    #: Words an agent may find useful in messages (the random policy draws from them): the
    #: class's, or an instance's own where they depend on its parameters (``worlds.workshop``).
    lexicon: tuple[str, ...] = ()
    #: The constructor parameter that receives this world's commons (a :class:`Commons`), for a
    #: world that declares one; "" = none. What its tools add with ``contribute`` is what later
    #: episodes of a training run find there (``commons = "on"`` in the training config).
    commons: ClassVar[str] = ""
    #: True for a world whose tools reach outside the process (a server): a replay then hands
    #: each call's recorded result to :meth:`replayed` instead of calling the tool, so it is
    #: exact without the server (``collective/world/outside.py``).
    outside: ClassVar[bool] = False

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
        # (Name-mangled: a subclass's own attributes cannot collide with these.)
        self.__episode: Host | None = None  # the episode running this world, if any
        self.__early: list[tuple[float, Callable[..., object], tuple[Scalar, ...]]] = []

    # -- what a subclass writes ---------------------------------------------------------------

    @classmethod
    def footprint(cls, n_agents: int, **params: Any) -> int:
        """Bytes this world's own state will take for ``n_agents`` with ``params`` (the
        constructor's, converted), said before it is built so that a size that cannot fit is
        refused in one line before any work (``collective/engine/limits.py``). 0: it cannot say (it
        is
        then built under a memory cap, and refused if it asks for too much)."""
        return 0

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

    def replayed(
        self, name: str, agent: int, args: tuple[int | str, ...], ok: bool, result: str
    ) -> None:
        """An ``outside`` world's tool call, replayed: bring the state to what the recorded
        ``result`` says (the engine lands the result as recorded)."""
        raise NotImplementedError(f"{type(self).__name__} sets outside = True: define replayed()")

    # -- what a subclass may call: events of its own ------------------------------------------

    def at(self, t: float, fn: Callable[..., object], *args: Scalar) -> None:
        """Call ``fn(*args)`` at simulated time ``t``: a world event (a fire that starts, a
        delivery that arrives, a deadline). It is committed like everything else, in canonical
        order: at its instant, after the policy's answers and before the agents' actions that
        land then (so an action landing at ``t`` sees what happened at ``t``), world events of
        one instant in the order they were scheduled. ``fn`` may change the state (and so the
        score), ``post``, and schedule more events; it is recorded (a ``Happened`` event) as
        its name and arguments, so ``args`` are numbers, strings, bools or None. Call it from
        the constructor, a tool, another world event, ``heard``, ``join`` or ``leave``; an
        event at or after the time limit never happens."""
        t = float(t)
        if not math.isfinite(t) or t < self.now:
            raise ValueError(
                f"{type(self).__name__}.at({t}): a world event needs a finite time >= now "
                f"({self.now})"
            )
        if not callable(fn) or inspect.iscoroutinefunction(fn):
            raise TypeError(
                f"{type(self).__name__}.at: {fn!r} is not a plain function (world events "
                "cannot be async)"
            )
        bad = next((a for a in args if not isinstance(a, int | float | str | None)), None)
        if bad is not None:
            raise TypeError(
                f"{type(self).__name__}.at: an argument is a {type(bad).__name__}; world event "
                "arguments are recorded, so they are numbers, strings, bools or None"
            )
        if self.__episode is None:
            self.__early.append((t, fn, args))  # the constructor: the episode takes them
        else:
            self.__episode.schedule_world_event(self, t, fn, args)

    def after(self, delay: float, fn: Callable[..., object], *args: Scalar) -> None:
        """Call ``fn(*args)`` ``delay`` simulated seconds from now (see :meth:`at`)."""
        self.at(self.now + float(delay), fn, *args)

    def post(self, text: str) -> None:
        """Post ``text`` on the channel this world's agents share (``all``; a group's own under
        ``islands``), as the world: subscribers read it as ``[world] text`` in their next
        prompt, and it wakes those waiting for news. Call it from a tool, a world event,
        ``heard``, ``join`` or ``leave`` (not from the constructor: no episode runs yet)."""
        if not isinstance(text, str):
            raise TypeError(f"{type(self).__name__}.post: text must be a str, got {text!r}")
        if len(text) > POST_CHARS:
            raise ValueError(
                f"{type(self).__name__}.post: {len(text)} characters; at most {POST_CHARS} "
                "(every subscriber reads it)"
            )
        if self.__episode is None:
            raise RuntimeError(
                f"{type(self).__name__}.post: no episode is running this world (post from a "
                "tool or a world event, not from the constructor)"
            )
        self.__episode.world_post(self, text)

    def contribute(self, agent: int, entry: str) -> None:
        """Add ``entry`` to the commons on behalf of this world's agent ``agent`` (call it from
        a tool). It changes nothing in this episode: it is recorded as a world event at this
        instant (``commons_put(agent id, entry)``), and a training run with a commons adds it
        for the episodes that start later, crediting the turn that made it when asked to."""
        if not type(self).commons:
            raise TypeError(
                f"{type(self).__name__}.contribute: the world declares no commons (set the "
                "class attribute `commons` to the constructor parameter that receives it)"
            )
        if not isinstance(entry, str) or not 0 < len(entry) <= COMMONS_ENTRY_CHARS:
            raise ValueError(
                f"{type(self).__name__}.contribute: an entry is a str of 1 to "
                f"{COMMONS_ENTRY_CHARS} characters, got {entry!r:.80}"
            )
        self.at(self.now, self.commons_put, self.agent_id(agent), entry)

    def commons_put(self, agent: int, entry: str) -> None:
        """The world event a contribution is recorded as; it does nothing in the episode."""

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
        for name in decls:
            hider = inspect.getattr_static(cls, name, None)
            if not callable(hider):
                raise TypeError(
                    f"{cls.__name__}.{name}: a class attribute ({type(hider).__name__}) hides "
                    f"the tool {name!r}; rename one of them"
                )
        cls._tool_decls = decls

    def _attach(
        self, episode: Host
    ) -> list[tuple[float, Callable[..., object], tuple[Scalar, ...]]]:
        """An episode takes this world: from now on ``at`` and ``post`` go to it. Returns the
        events the constructor scheduled, for the episode to put on its heap."""
        self.__episode = episode
        early, self.__early = self.__early, []
        return early

    def _detach(self) -> None:
        self.__episode = None

    def _seat(self, agent: int, agent_id: int) -> None:
        """The engine gave this world's agent ``agent`` the id ``agent_id`` (see ``agent_id``)."""
        if agent == len(self._ids):
            self._ids.append(agent_id)

    def tool_specs(self) -> tuple[ToolSpec, ...]:
        """This instance's tools with every domain resolved (bounds may depend on its size)."""
        specs = []
        for d in self._tool_decls.values():
            args = []
            for pname, dom in d.params:
                where = f"{type(self).__name__}.{d.name}: the domain of {pname!r}"
                if isinstance(dom, Range):
                    a = ArgSpec(
                        pname,
                        "int",
                        lo=int(_resolve(self, dom.lo, where)),
                        hi=int(_resolve(self, dom.hi, where)),
                    )
                elif isinstance(dom, OneOf):
                    a = ArgSpec(pname, "choice", choices=tuple(_resolve(self, dom.choices, where)))
                else:
                    a = ArgSpec(
                        pname,
                        "text",
                        max_chars=dom.max_chars,
                        words=tuple(_resolve(self, dom.words, where)) or self.lexicon,
                    )
                args.append(a)
            specs.append(ToolSpec(d.name, tuple(args), "world", d.doc))
        return tuple(specs)

    def tool_duration(self, name: str, agent: int, args: tuple[int | str, ...]) -> float:
        d = self._tool_decls[name]
        if callable(d.duration):
            kwargs = {p: v for (p, _), v in zip(d.params, args, strict=True)}
            seconds = d.duration(self, agent, **kwargs)
        elif isinstance(d.duration, str):
            seconds = getattr(self, d.duration)
        else:
            seconds = d.duration
        if isinstance(seconds, str | bytes | bool) or not math.isfinite(seconds := float(seconds)):
            raise ValueError(f"the duration of {name} is {seconds!r}, not a number of seconds")
        if seconds < 0:
            raise ValueError(f"the duration of {name} must be >= 0, got {seconds}")
        return seconds

    def tool_is_async(self, name: str) -> bool:
        return self._tool_decls[name].is_async

    def call_tool(self, name: str, agent: int, args: tuple[int | str, ...]) -> Any:
        """Call the tool method (a coroutine for async tools); the conductor handles errors."""
        return getattr(self, name)(agent, *args)


def _declare(cls: type, name: str, fn: Callable, duration: Duration, doc: str | None) -> _ToolDecl:
    where = f"{cls.__name__}.{name}"
    if name in PRIMITIVES:
        raise TypeError(
            f"{where}: a tool may not be named like the engine's primitive {name!r} (the "
            f"primitives: {', '.join(PRIMITIVES)})"
        )
    if name in _RESERVED or hasattr(World, name):
        raise TypeError(f"{where}: a tool may not be named like World.{name}, which it would hide")
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
        if hint is not None and typing.get_origin(hint) is typing.Annotated:
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
    _check_duration(where, duration, [p for p, _ in out])
    text = doc if doc is not None else (inspect.getdoc(fn) or "").split("\n")[0]
    return _ToolDecl(name, tuple(out), duration, text, inspect.iscoroutinefunction(fn))


def _check_duration(where: str, duration: Any, params: list[str]) -> None:
    """A duration is a number >= 0, an attribute's name, or a function the engine can call as
    ``f(world, agent, **args)``: anything else is refused when the class is defined."""
    if isinstance(duration, int | float) and not isinstance(duration, bool):
        if not (math.isfinite(duration) and duration >= 0):
            raise TypeError(f"{where}: duration must be a finite number >= 0, got {duration}")
    elif isinstance(duration, str):
        if not duration.isidentifier():
            raise TypeError(f"{where}: duration {duration!r} is not an attribute name")
    elif callable(duration):
        try:
            sig = inspect.signature(duration)
        except (TypeError, ValueError):  # a builtin without a signature: checked when called
            return
        try:
            sig.bind(None, 0, **dict.fromkeys(params))
        except TypeError as e:
            raise TypeError(
                f"{where}: the duration function cannot be called as f(world, agent"
                f"{''.join(', ' + p + '=...' for p in params)}): {e}"
            ) from None
    else:
        raise TypeError(
            f"{where}: duration must be seconds (a number >= 0), the name of an attribute holding "
            f"them, or f(world, agent, **args); got {duration!r}"
        )


# -- checks at build time -----------------------------------------------------------------------


def check_built(world: World) -> None:
    """What can only be checked once a world is built, before its episode's first event: a
    ValueError naming the problem. (The class was checked when it was defined.)"""
    cls = type(world)
    name = cls.__name__
    if "_ids" not in vars(world):
        raise ValueError(f"{name}.__init__ does not call super().__init__(n_agents, seed)")
    for method, sig in (("observe", "observe(agent) -> str"), ("score", "score() -> float")):
        if getattr(cls, method) is getattr(World, method):
            raise ValueError(f"{name} defines no {sig}")
    own = vars(world)
    for tool_name, d in cls._tool_decls.items():
        if tool_name in own:
            raise ValueError(
                f"{name}: the attribute self.{tool_name} ({type(own[tool_name]).__name__}) "
                f"hides the tool {tool_name!r}; rename one of them"
            )
        if isinstance(d.duration, str):
            value = getattr(world, d.duration, None)
            if value is None and not hasattr(world, d.duration):
                raise ValueError(
                    f"{name}.{tool_name}: duration names attribute {d.duration!r}, which the "
                    "world does not have"
                )
            ok = (
                isinstance(value, int | float)
                and not isinstance(value, bool)
                and math.isfinite(value)
                and value >= 0
            )
            if not ok:
                raise ValueError(
                    f"{name}.{tool_name}: duration names {d.duration!r}, which is {value!r}, "
                    "not a number of seconds >= 0"
                )
    try:
        from collective.base.actions import ActionSpace

        ActionSpace(world.tool_specs())  # every domain resolved, and not empty
    except (AttributeError, TypeError, ValueError) as e:
        raise ValueError(str(e) if name in str(e) else f"{name}: {e}") from None


def convert_params(cls: type[World], params: dict[str, Any], ref: str) -> dict[str, Any]:
    """The constructor's keyword arguments, checked against its signature and converted to its
    annotations: ``--param size=3`` arrives as an int, ``--param rate=1`` is 1.0 for a
    ``rate: float``, ``"true"`` is True for a bool, and ``--param size=abc`` for an int is
    refused here, naming the parameter, rather than failing somewhere inside the world. An
    unannotated parameter gets the value as given (a number, a string, a list...)."""
    sig = inspect.signature(cls.__init__)
    takes = [
        p.name
        for p in sig.parameters.values()
        if p.name not in ("self", "n_agents", "seed")
        and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    open_ended = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    for key in params:
        if key in ("n_agents", "seed"):
            raise ValueError(
                f"world {ref!r}: {key} is set by the engine (--agents, --seed), not a parameter"
            )
        if key not in takes and not open_ended:
            raise ValueError(
                f"world {ref!r} has no parameter {key!r}; it takes: {', '.join(takes) or 'none'}"
            )
    try:
        hints = typing.get_type_hints(cls.__init__)
    except Exception:  # annotations the module cannot resolve: take the values as given
        hints = {}
    out = {}
    for key, value in params.items():
        hint = hints.get(key)
        if hint is None or hint is Any:
            out[key] = value
            continue
        if hint is str and isinstance(value, int) and not isinstance(value, bool):
            value = str(value)  # `--param name=123` for a name
        try:
            out[key] = msgspec.convert(value, hint, strict=False)
        except msgspec.ValidationError as e:
            raise ValueError(
                f"world {ref!r}: parameter {key}={value!r}: {e} (the constructor says "
                f"{key}: {getattr(hint, '__name__', hint)})"
            ) from None
        except TypeError:  # an annotation msgspec cannot check: the value as given
            out[key] = value
    for key, value in out.items():
        problem = _unrecordable(value)
        if problem:
            raise ValueError(f"world {ref!r}: parameter {key}={value!r:.80}: {problem}")
    return out


def _unrecordable(value: Any) -> str:
    """Why a parameter's value cannot be one (""): an infinite or NaN number (a limit it would
    switch off, a score it would poison) or an integer past 64 bits (the record cannot hold
    it), anywhere inside it."""
    todo = [value]
    while todo:  # (a loop, not recursion: a value may nest deeper than the stack)
        v = todo.pop()
        if isinstance(v, msgspec.Struct):  # (a Commons, or any struct a world annotates)
            todo += [getattr(v, f) for f in v.__struct_fields__]
            continue
        if isinstance(v, float) and not math.isfinite(v):
            return "numbers must be finite"
        if isinstance(v, int) and not -(2**63) <= v < 2**64:
            return "integers must be within -2**63..2**64-1"
        if isinstance(v, dict):
            todo += [*v.keys(), *v.values()]
        elif isinstance(v, list | tuple | set | frozenset):
            todo += v
    return ""


def checked_score(world: World) -> float:
    """``world.score()``, which must be a number in [0, 1] (a string or a bool is not one)."""
    s = world.score()
    try:
        f = float(s) if not isinstance(s, str | bytes | bool) else math.nan
    except (TypeError, ValueError):
        f = math.nan
    if not 0.0 <= f <= 1.0:
        raise ValueError(f"score() returned {s!r:.60}, not a number in [0, 1]")
    return f


def checked_observation(world: World, agent: int) -> str:
    """``world.observe(agent)``, which must be a str."""
    text = world.observe(agent)
    if type(text) is not str:
        raise TypeError(f"observe() returned {type(text).__name__} {text!r:.60}, not a str")
    return text


# -- a world's bug -----------------------------------------------------------------------------


class WorldBug(Exception):
    """A world method raised (anything but a tool's ``ToolError``) or returned what it may not:
    a bug in the world, not the agents' doing. The engine ends the episode with it
    (``end = "world_error"``, a ``Failed`` event) rather than let every later call fail too.
    ``method`` says which method and what kind ("water (tool)", "ignite (world event)",
    "observe"); ``where`` is the file and line that raised, in the world's own file where
    the traceback passes through it."""

    def __init__(
        self,
        world: World | type[World],
        method: str,
        error: BaseException,
        *,
        agent: int = -1,
        fn: Callable[..., Any] | None = None,
    ) -> None:
        cls = world if isinstance(world, type) else type(world)
        self.world = cls.__name__
        self.method = method
        text = _ADDRESS.sub("", str(error))  # an object's address differs from run to run
        self.error = f"{type(error).__name__}: {text}" if text else type(error).__name__
        self.where = _where(cls, error, fn)
        self.agent = agent
        self.cause = error
        super().__init__(self.line())

    def line(self) -> str:
        return failure_text(self.world, self.method, self.agent, self.error, self.where)


def _where(cls: type, error: BaseException, fn: Callable[..., Any] | None) -> str:
    """Where a world's error comes from, as ``file.py:line`` (the file's name only: a record
    holds nothing that differs between machines). The deepest frame in the world's own file;
    else the deepest outside the engine (a base class's or a helper's file); else the
    definition of ``fn`` (an error the engine found in what a method returned)."""
    try:
        home = inspect.getsourcefile(cls)
    except TypeError:
        home = None
    frames = traceback.extract_tb(error.__traceback__) if error.__traceback__ else []
    pick = next((f for f in reversed(frames) if f.filename == home), None)
    if pick is None:
        pick = next((f for f in reversed(frames) if not f.filename.startswith(_ENGINE)), None)
    if pick is not None:
        return f"{Path(pick.filename).name}:{pick.lineno}"
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    if code is not None:
        return f"{Path(code.co_filename).name}:{code.co_firstlineno}"
    return "an unknown place"
