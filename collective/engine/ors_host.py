"""A world served as an Open Reward Standard environment (``collective serve-ors``).

Harnesses that speak ORS drive the project's worlds through it: the world becomes an
``openreward.environments.Environment`` whose tasks are world seeds, whose prompt is agent 0's
first observation, and whose tools are the world's, their domains as pydantic fields (a range
as ``ge``/``le``, a choice as a ``Literal``, text with its ``max_length``). A session is one
episode: one world, built for ``agents`` agents; each call names the agent that makes it
(``agent``, default 0), so every client sharing a session is one agent of it.

Time here is the calls': each advances the world's simulated clock by the tool's duration (the
harness, not the engine, decides who acts when), and the world's own events that fall due
before that run first, in the order they were scheduled. A call's ``reward`` is what it added
to the world's score, so the rewards of a session sum to its score; ``finished`` is the
world's ``done()``. A ``ToolError`` is the agent's refused call (``error: ...``, no reward);
any other exception is the world's bug, which the SDK reports as the tool having raised.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from typing import Annotated, Any, Literal

import trio

from collective.base.actions import ToolSpec
from collective.engine.registry import make_world
from collective.world import Scalar, ToolError, World, checked_observation, checked_score


class _Host:
    """What a served world asks of its episode (``World.at``, ``World.post``)."""

    def __init__(self) -> None:
        self.due: list[tuple[float, int, Callable[..., object], tuple[Scalar, ...]]] = []
        self.order = itertools.count()
        self.posts: list[str] = []

    def schedule_world_event(
        self, world: World, t: float, fn: Callable[..., object], args: tuple[Scalar, ...]
    ) -> None:
        heapq.heappush(self.due, (t, next(self.order), fn, args))

    def world_post(self, world: World, text: str) -> None:
        self.posts.append(f"[world] {text}")


async def _await(value: Any) -> Any:
    return await value


def environment(world: str, params: dict[str, Any], agents: int = 1, tasks: int = 16) -> type:
    """An ORS ``Environment`` class serving ``world``: ``tasks`` world seeds in split
    ``train`` (0..tasks-1) and as many in ``test`` (after them). A session holds one world
    and hands each call to ``_call``; each of the world's tools is a method of the class
    (``_tool``)."""
    from openreward.environments import Environment, TextBlock, ToolOutput

    specs = _tool_specs(world, params, agents)  # every problem in one line, before serving

    class Served(Environment):
        def __init__(self, task_spec: Any = {}, secrets: Any = {}) -> None:  # noqa: B006
            super().__init__(task_spec, secrets)
            self.world = make_world(world, agents, int(task_spec["seed"]), params)
            self.host = _Host()
            for t, fn, args in self.world._attach(self.host):
                self.host.schedule_world_event(self.world, t, fn, args)
            self.lock = asyncio.Lock()

        @classmethod
        def list_splits(cls) -> list[str]:
            return ["train", "test"]

        @classmethod
        def list_tasks(cls, split: str) -> list[dict[str, Any]]:
            first = 0 if split == "train" else tasks
            return [{"seed": s} for s in range(first, first + tasks)]

        def get_prompt(self) -> list[Any]:
            return [TextBlock(text=checked_observation(self.world, 0))]

        def teardown(self) -> None:
            self.world.close()

        async def act(self, name: str, args: Any) -> Any:
            async with self.lock:  # one call at a time, as the engine commits them
                text, reward, finished = await _call(self.world, self.host, name, args.model_dump())
                return ToolOutput(blocks=[TextBlock(text=text)], reward=reward, finished=finished)

    for spec in specs:
        setattr(Served, spec.name, _tool(spec, agents))
    # Named as clients will address it (``http://HOST:PORT/NAME``, lowercased by the SDK).
    name = "".join(c for c in world.rpartition(":")[2].rpartition("/")[2] if c.isalnum())
    Served.__name__ = Served.__qualname__ = name or "world"
    return Served


def _tool_specs(world: str, params: dict[str, Any], agents: int) -> tuple[ToolSpec, ...]:
    """The tools of ``world`` built for ``agents`` (built once to read them: a world that
    cannot be built is one line before serving); none may have an argument named ``agent``,
    which every served tool gains."""
    probe = make_world(world, agents, 0, params)
    try:
        specs = probe.tool_specs()
    finally:
        probe.close()
    for spec in specs:
        if any(a.name == "agent" for a in spec.args):
            raise ValueError(
                f"world {world!r}: tool {spec.name!r} has an argument named 'agent', which "
                "serve-ors adds to every tool (the agent that calls)"
            )
    return specs


def _tool(spec: ToolSpec, agents: int) -> Callable[..., Any]:
    """The world's tool ``spec`` as an SDK tool method: its arguments a pydantic model whose
    fields carry the domains (a range as ``ge``/``le``, a choice as a ``Literal``, text with
    its ``max_length``), plus ``agent``, the calling agent."""
    from openreward.environments import ToolOutput, tool
    from pydantic import Field, create_model

    fields: dict[str, Any] = {"agent": (int, Field(0, ge=0, le=agents - 1))}
    for a in spec.args:
        if a.kind == "int":
            fields[a.name] = (Annotated[int, Field(ge=a.lo, le=a.hi)], ...)
        elif a.kind == "choice":
            fields[a.name] = (Literal[tuple(a.choices)], ...)
        else:
            fields[a.name] = (Annotated[str, Field(max_length=a.max_chars)], ...)
    model = create_model(f"{spec.name.title().replace('_', '')}Args", **fields)

    async def call(self: Any, args: Any) -> ToolOutput:
        return await self.act(spec.name, args)

    call.__name__ = call.__qualname__ = spec.name
    call.__doc__ = spec.doc or spec.name
    call.__annotations__ = {"args": model, "return": ToolOutput}
    return tool(call)


async def _call(w: World, host: _Host, name: str, given: dict[str, Any]) -> tuple[str, float, bool]:
    """One call of tool ``name`` by ``given["agent"]`` with the rest of ``given`` as its
    arguments: the text it answers (the result, the world's posts, the agent's observation),
    its reward (what it added to the score) and whether the world is done. The world's clock
    advances by the tool's duration and its events due by then run first."""
    agent = int(given.pop("agent"))
    spec = next(s for s in w.tool_specs() if s.name == name)
    values = tuple(given[a.name] for a in spec.args)
    outside = next(
        (
            f"{a.name} must be in {a.lo}..{a.hi}, got {v}"
            for a, v in zip(spec.args, values, strict=True)
            if a.kind == "int" and not a.lo <= int(v) <= a.hi
        ),
        None,
    )
    if outside is not None:  # this session's world is smaller than the declared one
        return f"error: {name}: {outside}", 0.0, bool(w.done())
    before = checked_score(w)
    w.now += w.tool_duration(name, agent, values)
    while host.due and host.due[0][0] <= w.now:
        _, _, fn, fargs = heapq.heappop(host.due)
        fn(*fargs)
    try:
        value = w.call_tool(name, agent, values)
        if w.tool_is_async(name):  # a trio coroutine: its own trio run, in a thread
            value = await asyncio.to_thread(trio.run, _await, value)
        text = str(value)
    except ToolError as e:
        text = f"error: {e}"
    after = checked_score(w)
    posts, host.posts = host.posts, []
    seen = checked_observation(w, agent)
    return "\n".join([text, *posts, seen]), max(0.0, after - before), bool(w.done())


def serve(
    world: str, params: dict[str, Any], *, host: str, port: int, agents: int = 1, tasks: int = 16
) -> None:
    """Serve ``world`` on ``host:port`` until interrupted."""
    import uvicorn
    from openreward.environments import Server

    server = Server([environment(world, params, agents, tasks)])
    uvicorn.run(server.app, host=host, port=port, log_level="warning")
