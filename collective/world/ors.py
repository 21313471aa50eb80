"""An Open Reward Standard (ORS) environment as a world: its tools, its prompt, its rewards.

An ORS environment (``openreward.environments.Environment``) is a class with tasks in splits, a
prompt per task, and ``@tool`` methods taking a pydantic model and returning a ``ToolOutput``
(blocks of text, a ``reward``, a ``finished`` flag). It is reached in-process (the class itself,
on an asyncio loop of its own in a thread: the SDK is asyncio, the engine trio) or over HTTP
(``ors:http://HOST:PORT/NAME``, a server the SDK's ``Server`` runs). Both are one *session* of
one task, shared by every agent of the episode's world: the engine commits tool calls one at a
time in its canonical order, so the environment's own locks see them in a deterministic order.

The tools' JSON schemas become the action space's typed arguments (:func:`map_tool`): a bounded
integer is a range, an enum or a boolean a choice, a string free text (at most one, placed
last); anything else is refused in one line naming the tool and the field.

**The score is the sum of the rewards so far, capped at 1.** The return of an ORS rollout is
its rewards summed (undiscounted, as RLCR's gamma = 1), so the sum is the return earned by any
instant, which is what an anytime score must be; each reward must be in [0, 1] (else the
environment has a bug), so the score never falls (``monotone``), and the cap keeps it a score.
An environment that rewards only when a tool returns ``finished`` scores 0 until then. The
episode ends once a tool returns ``finished`` (later calls would be refused by the SDK anyway).

A served environment is outside the process (``World.outside``): its prompt and tools are
recorded as a world event at t = 0, each call's result carries its reward and ``finished`` in
the recorded text, so a replay rebuilds the state from the record without the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from collective.base.actions import ArgSpec, ToolSpec
from collective.base.primitives import PRIMITIVES
from collective.world.outside import recorded_opening, replaying
from collective.world.world import ToolError, World

#: The world event that records what a session found when it opened.
OPENED = "ors_opened"
#: The longest free-text argument an agent may write when the schema sets no ``maxLength``.
TEXT_CHARS = 200
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_CHOICE = re.compile(r"^[A-Za-z0-9_.:#/+-]+$")


class OrsError(Exception):
    """The environment or its server misbehaved (down, silent, raised, an impossible answer)."""


@dataclass(frozen=True)
class Outcome:
    """One tool call's answer: ``ok`` False is the SDK's refusal (bad input, episode over)."""

    ok: bool
    text: str
    reward: float | None = None
    finished: bool = False


class Session(Protocol):
    """One ORS session of one task, reached in-process or over HTTP; every method blocks."""

    def open(self, split: str, task: int, seed: int) -> dict[str, Any]: ...

    def call(self, name: str, payload: dict[str, Any]) -> Outcome: ...

    def close(self) -> None: ...


# -- the tools' schemas as typed arguments ---------------------------------------------------------


def map_tool(name: str, doc: str, schema: Mapping[str, Any] | None) -> dict[str, Any]:
    """A tool as the world keeps it (JSON-able): ``{"name", "doc", "args": [[field, kind,
    lo, hi, choices, max_chars, json_type]]}``, free text last; a ValueError naming the tool
    and the field for what an action cannot carry."""
    if not _NAME.match(name):
        raise ValueError(f"tool {name!r}: a tool name must be lowercase letters, digits and _")
    if name in PRIMITIVES:
        raise ValueError(f"tool {name!r}: named like the engine's primitive {name!r}")
    args: list[list[Any]] = []
    text: list[Any] | None = None
    schema = schema or {}
    defs = schema.get("$defs", {})
    for field, prop in (schema.get("properties") or {}).items():
        arg = _map_field(name, field, _deref(prop, defs))
        if arg[1] == "text":
            if text is not None:
                raise ValueError(
                    f"tool {name!r}, field {field!r}: a second free-text field ({text[0]!r} is "
                    "one); an action carries at most one"
                )
            text = arg
        else:
            args.append(arg)
    if text is not None:
        args.append(text)
    return {"name": name, "doc": " ".join(doc.split())[:200], "args": args}


def _deref(prop: Mapping[str, Any], defs: Mapping[str, Any]) -> Mapping[str, Any]:
    """A property with its ``$ref`` followed and an ``Optional``'s null dropped."""
    ref = prop.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        prop = {
            **defs.get(ref.removeprefix("#/$defs/"), {}),
            **{k: v for k, v in prop.items() if k != "$ref"},
        }
    options = prop.get("anyOf")
    if isinstance(options, list):
        real = [o for o in options if o.get("type") != "null"]
        if len(real) == 1:
            prop = {**_deref(real[0], defs), **{k: v for k, v in prop.items() if k != "anyOf"}}
    return prop


def _map_field(tool: str, field: str, prop: Mapping[str, Any]) -> list[Any]:
    where = f"tool {tool!r}, field {field!r}"
    kind = prop.get("type")
    values = prop.get("enum", [prop["const"]] if "const" in prop else None)
    if values is not None:
        if not values or not all(
            isinstance(v, str | int) and not isinstance(v, bool) for v in values
        ):
            raise ValueError(f"{where}: an enum of strings or integers is needed, got {values}")
        words = [str(v) for v in values]
        bad = next((w for w in words if not _CHOICE.match(w)), None)
        if bad is not None:
            raise ValueError(
                f"{where}: the choice {bad!r} is not one word of letters, digits and _.:#/+-"
            )
        json_type = "integer" if all(isinstance(v, int) for v in values) else "string"
        return [field, "choice", 0, 0, words, 0, json_type]
    if kind == "boolean":
        return [field, "choice", 0, 0, ["true", "false"], 0, "boolean"]
    if kind == "integer":
        lo = prop.get("minimum", _past(prop.get("exclusiveMinimum"), 1))
        hi = prop.get("maximum", _past(prop.get("exclusiveMaximum"), -1))
        if lo is None or hi is None:
            raise ValueError(
                f"{where}: an integer needs both bounds (Field(ge=..., le=...)), so "
                "that a policy can be told what it may pass"
            )
        if hi - lo > 100_000:
            raise ValueError(f"{where}: the range {lo}..{hi} is wider than 100000 values")
        return [field, "int", int(lo), int(hi), [], 0, "integer"]
    if kind == "string":
        chars = int(prop.get("maxLength", TEXT_CHARS))
        return [field, "text", 0, 0, [], max(1, min(chars, TEXT_CHARS)), "string"]
    raise ValueError(
        f"{where}: a {kind or 'untyped'} field cannot be an action's argument "
        "(integers with bounds, enums, booleans and strings can)"
    )


def _past(bound: Any, step: int) -> int | None:
    return None if bound is None else int(bound) + step


def specs_of(tools: list[dict[str, Any]], lexicon: tuple[str, ...]) -> tuple[ToolSpec, ...]:
    out = []
    for t in tools:
        args = tuple(
            ArgSpec(
                f,
                k,
                lo=lo,
                hi=hi,
                choices=tuple(ch),
                max_chars=mc,
                words=lexicon if k == "text" else (),
            )
            for f, k, lo, hi, ch, mc, _ in t["args"]
        )
        out.append(ToolSpec(t["name"], args, "world", t["doc"]))
    return tuple(out)


# -- results as recorded text ----------------------------------------------------------------------


def result_text(out: Outcome) -> str:
    """What the agent reads and the record keeps: ``[reward 0.5, finished] text``. The reward
    and the flag come first, where a replay reads them back (the text cannot forge them)."""
    marks = ([f"reward {out.reward!r}"] if out.reward is not None else []) + (
        ["finished"] if out.finished else []
    )
    return f"[{', '.join(marks) or 'no reward'}] {out.text}"


def parse_result(text: str) -> Outcome:
    head, sep, rest = text.partition("] ")
    if not text.startswith("[") or not sep:
        raise ValueError(f"a recorded result without its reward mark: {text[:60]!r}")
    reward, finished = None, False
    for mark in head[1:].split(", "):
        if mark.startswith("reward "):
            reward = float(mark.removeprefix("reward "))
        elif mark == "finished":
            finished = True
        elif mark != "no reward":
            raise ValueError(f"a recorded result with an unknown mark {mark!r}")
    return Outcome(True, rest, reward, finished)


def check_reward(reward: Any) -> float | None:
    if reward is None:
        return None
    if isinstance(reward, bool) or not isinstance(reward, int | float):
        raise OrsError(f"the reward {reward!r} is not a number")
    if not (math.isfinite(reward) and 0.0 <= reward <= 1.0):
        raise OrsError(f"the reward {reward!r} is outside [0, 1]")
    return float(reward)


def blocks_text(blocks: Any) -> str:
    parts = []
    for b in blocks or ():
        get = b.get if isinstance(b, Mapping) else lambda k, b=b: getattr(b, k, None)
        parts.append(get("text") if get("type") == "text" else f"[{get('type')}]")
    return "\n".join(p for p in parts if p)


# -- the world -----------------------------------------------------------------------------------


class OrsWorld(World):
    """A world made of one ORS session; ``source`` (set by :func:`ors_world`) opens it."""

    monotone = True  # rewards are checked to be in [0, 1]: their sum never falls
    outside = True
    #: Opens a session (an in-process class or a server's address), given the call deadline.
    source: ClassVar[Any] = None
    lexicon = ("yes", "no", "done", "answer", "help")

    def __init__(
        self,
        n_agents: int = 1,
        seed: int = 0,
        split: str = "train",
        task: int = -1,
        duration: float = 1.0,
        deadline: float = 30.0,
    ) -> None:
        super().__init__(n_agents, seed)
        name = type(self).__name__
        if not (math.isfinite(duration) and duration >= 0):
            raise ValueError(f"{name}: duration must be seconds >= 0, got {duration}")
        if not (math.isfinite(deadline) and deadline > 0):
            raise ValueError(f"{name}: deadline must be seconds > 0, got {deadline}")
        self.split, self.duration, self.deadline = split, float(duration), float(deadline)
        self.session: Session | None = None
        # The calls replayed from a record, for a fork to send a new session past it.
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.rewards = 0.0
        self.finished = False
        self.counts = {"calls": 0, "rewards": 0, "rewards_before_finished": 0}
        self.seen: set[int] = set()
        recorded = recorded_opening(OPENED)
        if recorded is not None:
            opened = json.loads(recorded)
        elif replaying():
            raise ValueError(f"{name}: the record holds no {OPENED} event to replay from")
        else:
            self.session = self.source.session(self.deadline)
            try:
                opened = self.session.open(split, task, seed)
            except BaseException:
                self.close()
                raise
        self.task = int(opened["task"])
        self.prompt = str(opened["prompt"])
        self.tools = list(opened["tools"])
        self.kinds = {t["name"]: [(a[0], a[6]) for a in t["args"]] for t in self.tools}
        self.at(0.0, self.ors_opened, json.dumps(opened, sort_keys=True))

    def ors_opened(self, description: str) -> None:
        """The world event recording what the session found when it opened."""

    def tool_specs(self) -> tuple[ToolSpec, ...]:
        return specs_of(self.tools, self.lexicon)

    def tool_duration(self, name: str, agent: int, args: tuple[int | str, ...]) -> float:
        return self.duration

    def tool_is_async(self, name: str) -> bool:
        return True

    def call_tool(self, name: str, agent: int, args: tuple[int | str, ...]) -> Any:
        return self._call(name, self._payload(name, args))

    async def _call(self, name: str, payload: dict[str, Any]) -> str:
        import trio

        if self.session is None:  # a fork past its record: open the session, catch it up
            self.session = await trio.to_thread.run_sync(self._reopen)
            self.calls.clear()  # (the live session holds what they did now)
        out = await trio.to_thread.run_sync(self.session.call, name, payload)
        return self._take(out)

    def _reopen(self) -> Session:
        session = self.source.session(self.deadline)
        try:
            session.open(self.split, self.task, self.seed)
            for name, payload in self.calls:
                session.call(name, payload)
        except BaseException:
            session.close()
            raise
        return session

    def _payload(self, name: str, args: tuple[int | str, ...]) -> dict[str, Any]:
        payload: dict[str, Any] = {}
        for (field, json_type), v in zip(self.kinds[name], args, strict=True):
            if json_type == "boolean":
                payload[field] = v == "true"
            elif json_type == "integer":
                payload[field] = int(v)
            else:
                payload[field] = str(v)
        return payload

    def _take(self, out: Outcome) -> str:
        """Apply one answer to the state; the text the agent reads (a refusal raised)."""
        self.counts["calls"] += 1
        if not out.ok:
            raise ToolError(out.text)
        reward = check_reward(out.reward)
        if reward is not None:
            self.rewards += reward
            self.counts["rewards"] += 1
            if not out.finished:
                self.counts["rewards_before_finished"] += 1
        self.finished = self.finished or out.finished
        return result_text(Outcome(True, out.text, reward, out.finished))

    def replayed(
        self, name: str, agent: int, args: tuple[int | str, ...], ok: bool, result: str
    ) -> None:
        self.calls.append((name, self._payload(name, args)))
        if ok:
            self._take(parse_result(result))
        else:
            self.counts["calls"] += 1

    def observe(self, agent: int) -> str:
        state = "finished" if self.finished else f"rewards so far {min(1.0, self.rewards):g}"
        if agent in self.seen:
            return f"task {self.task}: {state}"
        self.seen.add(agent)
        return f"{self.prompt}\n(task {self.task}: {state})"

    def score(self) -> float:
        return min(1.0, self.rewards)

    def done(self) -> bool:
        return self.finished or self.score() >= 1.0

    def metrics(self) -> dict[str, float]:
        return {k: float(v) for k, v in self.counts.items()}

    @classmethod
    def check_note(cls, metrics: list[dict[str, float]]) -> str:
        """What ``collective check`` says of the rewards its random team earned."""
        if any(m.get("rewards_before_finished", 0) for m in metrics):
            return ""
        return (
            "rewards arrive only with `finished` (none before it in these episodes): the "
            "score is 0 until a tool finishes the task"
        )

    def close(self) -> None:
        session, self.session = self.session, None
        if session is not None:
            session.close()


# -- sessions ------------------------------------------------------------------------------------


def pick(task: int, seed: int, n_tasks: int) -> int:
    """The task an episode works: ``task``, or where it is -1 the world seed's (seed mod the
    split's size), so that a training run's world seeds walk the split."""
    return seed % n_tasks if task < 0 and n_tasks else task


def _opening(
    split: str, task: int, n_tasks: int, prompt: Any, tools: Any, terminal: Any, where: str
) -> dict[str, Any]:
    if not 0 <= task < n_tasks:
        raise OrsError(
            f"{where}: task {task} is out of range: split {split!r} has {n_tasks} "
            f"task{'s' * (n_tasks != 1)}" + (f" (0..{n_tasks - 1})" if n_tasks else "")
        )
    mapped = [map_tool(t["name"], t.get("description") or "", t.get("input_schema")) for t in tools]
    if terminal:
        arg = terminal.get("arg")
        schema = {"properties": {arg: {"type": "string"}}} if arg else None
        mapped.append(map_tool(terminal["name"], terminal.get("description") or "", schema))
    return {"split": split, "task": task, "prompt": blocks_text(prompt), "tools": mapped}


class LocalSource:
    """An environment class run in this process, on an asyncio loop of its own."""

    def __init__(self, cls: Any) -> None:
        self.cls = cls

    def session(self, deadline: float) -> LocalSession:
        return LocalSession(self.cls, deadline)


class LocalSession:
    def __init__(self, cls: Any, deadline: float) -> None:
        self.cls, self.deadline = cls, deadline
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, daemon=True, name=f"ors {cls.__name__}"
        )
        self.thread.start()
        self.env: Any = None

    def _run(self, coro: Any) -> Any:
        try:
            return asyncio.run_coroutine_threadsafe(coro, self.loop).result(self.deadline)
        except TimeoutError:
            raise OrsError(
                f"{self.cls.__name__} did not answer within the deadline ({self.deadline:g} s)"
            ) from None

    def open(self, split: str, task: int, seed: int) -> dict[str, Any]:
        from openreward.environments.utils import run_user_callable

        cls, where = self.cls, self.cls.__name__

        async def opening() -> dict[str, Any]:
            splits = [getattr(s, "name", s) for s in cls.list_splits()]
            if split not in splits:
                raise OrsError(f"{where}: no split {split!r}; it has {', '.join(splits)}")
            n = await cls.num_tasks(split)
            t = pick(task, seed, n)
            if not 0 <= t < n:
                return _opening(split, t, n, [], [], None, where)
            self.env = await run_user_callable(cls, task_spec=await cls.get_task(split, t))
            await run_user_callable(self.env.setup)
            prompt = await run_user_callable(self.env.get_prompt)
            listed = cls.list_tools()
            tools = [t.model_dump() for t in listed.tools]
            terminal = listed.terminal_tool.model_dump() if listed.terminal_tool else None
            return _opening(split, t, n, [b.model_dump() for b in prompt], tools, terminal, where)

        return self._run(opening())

    def call(self, name: str, payload: dict[str, Any]) -> Outcome:
        from openreward.environments.session import call_session_tool

        async def calling() -> Any:
            return await call_session_tool(self.env, None, name, payload)

        try:
            res = self._run(calling()).root
        except OrsError:
            raise
        except Exception as e:
            raise OrsError(f"{self.cls.__name__}.{name} raised {type(e).__name__}: {e}") from e
        if not res.ok:
            return Outcome(False, res.error)
        o = res.output
        return Outcome(True, blocks_text(o.blocks), o.reward, o.finished)

    def close(self) -> None:
        from openreward.environments.utils import run_user_callable

        if self.env is not None:
            env, self.env = self.env, None
            with contextlib.suppress(Exception):  # tearing down what is over: nothing to lose
                self._run(run_user_callable(env.teardown))
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(self.deadline)
        if not self.loop.is_running() and not self.loop.is_closed():
            self.loop.close()


class HttpSource:
    """An environment served over HTTP: ``http://HOST:PORT/NAME``."""

    def __init__(self, url: str) -> None:
        base, _, name = url.rstrip("/").rpartition("/")
        if (
            not base.startswith(("http://", "https://"))
            or "/" in base.split("://", 1)[1]
            or not name
        ):
            raise ValueError(f"ors:{url}: give ors:http://HOST:PORT/NAME")
        self.url, self.base, self.name = url, base, name

    def session(self, deadline: float) -> HttpSession:
        try:
            import httpx  # noqa: F401  (the ors extra)
        except ImportError:
            raise OrsError(
                f"ors:{self.url}: reaching a served environment needs the ors extra: "
                "pip install 'collective[ors]'"
            ) from None
        return HttpSession(self, deadline)


class HttpSession:
    def __init__(self, source: HttpSource, deadline: float) -> None:
        import httpx

        self.source, self.deadline = source, deadline
        self.sid = str(uuid.uuid4())  # never recorded: it names the session to the server only
        self.client = httpx.Client(
            base_url=source.base, timeout=deadline, headers={"X-Session-ID": self.sid}
        )
        self.created = False

    def _ask(self, method: str, path: str, **kw: Any) -> Any:
        import httpx

        try:
            r = self.client.request(method, path, **kw)
        except httpx.TimeoutException:
            raise OrsError(
                f"{self.source.url}: no answer within the deadline "
                f"({self.deadline:g} s) to {method} {path}"
            ) from None
        except httpx.HTTPError as e:
            raise OrsError(
                f"{self.source.url}: no server answers ({type(e).__name__}: "
                f"{' '.join(str(e).split()) or 'connection failed'})"
            ) from None
        if r.status_code >= 400:
            raise OrsError(
                f"{self.source.url}: {method} {path} answered {r.status_code}: "
                f"{' '.join(r.text.split())[:200]}"
            )
        return r.json()

    def open(self, split: str, task: int, seed: int) -> dict[str, Any]:
        name, where = self.source.name, self.source.url
        splits = [
            s["name"] if isinstance(s, dict) else s for s in self._ask("GET", f"/{name}/splits")
        ]
        if split not in splits:
            raise OrsError(f"{where}: no split {split!r}; it has {', '.join(splits)}")
        n = self._num_tasks(split)
        task = pick(task, seed, n)
        if not 0 <= task < n:
            return _opening(split, task, n, [], [], None, where)
        self._ask("POST", "/create", json={"env_name": name, "split": split, "index": task})
        self.created = True
        prompt = self._ask("GET", f"/{name}/prompt")
        listed = self._ask("GET", f"/{name}/tools")
        return _opening(split, task, n, prompt, listed["tools"], listed.get("terminal_tool"), where)

    def _num_tasks(self, split: str) -> int:
        got = self._ask("POST", f"/{self.source.name}/num_tasks", json={"split": split})
        return int(got["num_tasks"] if isinstance(got, dict) else got)

    def call(self, name: str, payload: dict[str, Any]) -> Outcome:
        import httpx

        where = f"{self.source.url}: {name}"
        event, data, parts = "", [], []
        try:
            with self.client.stream(
                "POST", f"/{self.source.name}/call", json={"name": name, "input": payload}
            ) as r:
                if r.status_code >= 400:
                    r.read()
                    raise OrsError(
                        f"{where} answered {r.status_code}: {' '.join(r.text.split())[:200]}"
                    )
                for line in r.iter_lines():
                    if line.startswith("event:"):
                        event = line[6:].strip()
                    elif line.startswith("data:"):
                        data.append(line[5:].removeprefix(" "))
                    elif not line:
                        if event == "error":
                            raise OrsError(f"{where} raised: {' '.join(data)}"[:300])
                        if event in ("chunk", "end"):
                            parts.append("\n".join(data))
                        if event == "end":
                            break
                        event, data = "", []
        except httpx.TimeoutException:
            raise OrsError(
                f"{where}: no answer within the deadline ({self.deadline:g} s)"
            ) from None
        except httpx.HTTPError as e:
            raise OrsError(f"{where}: the server went away ({type(e).__name__})") from None
        if not parts:
            raise OrsError(f"{where}: the stream ended without a result")
        res = json.loads("".join(parts))
        if not res.get("ok"):
            return Outcome(False, str(res.get("error", "refused")))
        o = res["output"]
        return Outcome(True, blocks_text(o.get("blocks")), o.get("reward"), bool(o.get("finished")))

    def close(self) -> None:
        try:
            if self.created:
                self.created = False
                self.client.post("/delete", timeout=min(self.deadline, 5.0))
        except Exception:  # the session is over either way; the server reaps what is left
            pass
        self.client.close()


def quiet_sdk() -> None:
    """Keep the SDK's logging off stdout, where collective prints its results: it logs every
    tool call at info level, and what goes wrong is said here, in one line. Read when the SDK
    is first imported; a level the user set is kept."""
    import os

    os.environ.setdefault("OPENREWARD_LOG_LEVEL", "CRITICAL")


def ors_world(source: LocalSource | HttpSource, name: str) -> type[OrsWorld]:
    """A world class for ``source``, named after the environment (as errors name it)."""
    cls_name = re.sub(r"\W", "_", name) or "Ors"
    return type(
        cls_name, (OrsWorld,), {"source": source, "__module__": __name__, "__qualname__": cls_name}
    )


def is_environment(obj: Any) -> bool:
    """Whether ``obj`` is an ``openreward`` Environment class (without importing the SDK)."""
    import sys

    mod = sys.modules.get("openreward.environments")
    env = getattr(mod, "Environment", None)
    return env is not None and isinstance(obj, type) and issubclass(obj, env)
