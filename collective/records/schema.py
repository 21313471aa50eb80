"""Typed records: everything that crosses a boundary is a ``msgspec.Struct``.

An :class:`Episode` holds the config that reproduces it, the full event stream (for replay and
debugging), per-agent turns (what the learner needs), the anytime score curve and counters.
Nothing non-deterministic (wall time, host names) is stored, so the same run gives the same bytes.
How an episode becomes bytes on disk, and back, is :mod:`collective.records.fileformat`.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import msgspec

from collective.base.actions import ActionSpace
from collective.base.latency import DEFAULT_PRESET, PRESETS, LatencyModel

FORMAT = 2

ClockMode = Literal["virtual", "hybrid", "real"]
Overflow = Literal["drop_newest", "drop_oldest"]


# -- events: the replayable history of an episode, in commit order ---------------------------


# gc=False on events and turns: they hold no references back to anything, so they can never be
# part of a cycle, and a long episode keeps millions of them; untracked, Python's cyclic
# collector never walks them. Each event repeats ``frozen=True``: msgspec inherits it from
# ``Event``, a type checker (a dataclass transform) does not.
class Event(
    msgspec.Struct, tag=True, array_like=True, frozen=True, gc=False, forbid_unknown_fields=True
):
    t: float  # simulated seconds since the episode began
    agent: int  # who it concerns (-1 for the episode itself)


class Spawned(Event, tag="spawn", frozen=True):
    role: str
    by: int  # -1 for the agents the organisation starts with


class Asked(Event, tag="ask", frozen=True):
    turn: int
    prompt: str  # a digest of the prompt: replay notices a changed observation at once
    read: tuple[int, ...]  # ids of the messages the prompt consumed from the mailbox


class Thought(Event, tag="think", frozen=True):
    turn: int
    asked: float
    text: str
    version: int
    prompt_tokens: int
    output_tokens: int


class Began(Event, tag="begin", frozen=True):
    act: int  # the agent's action counter
    text: str
    until: float  # when the effect lands


class Rejected(Event, tag="reject", frozen=True):
    act: int
    text: str
    error: str


class Committed(Event, tag="commit", frozen=True):
    act: int
    tool: str
    ok: bool
    result: str
    real: float  # measured real seconds of the tool (hybrid mode), charged and replayed


class Sent(Event, tag="send", frozen=True):
    msg: int
    to: int
    text: str


class Delivered(Event, tag="deliver", frozen=True):
    msg: int
    to: int


class Dropped(Event, tag="drop", frozen=True):
    msg: int
    to: int
    reason: str  # "mailbox_full", "evicted", "no_such_agent", "not_allowed", "unread_at_end"


class Posted(Event, tag="post", frozen=True):
    msg: int
    channel: str
    text: str


class Hired(Event, tag="hire", frozen=True):
    new: int
    role: str


class Fired(Event, tag="fire", frozen=True):
    target: int


class Woke(Event, tag="wake", frozen=True):
    reason: str


class Happened(Event, tag="happen", frozen=True):
    """A world event (``World.at``) happened; ``agent`` is -1. Only worlds that schedule events
    write these, so every other episode's bytes are as they were."""

    group: int  # which of the episode's worlds (islands: one per group)
    call: str  # what was called, as ``name(args)``


class Failed(Event, tag="fail", frozen=True):
    """A world method raised (or returned what it may not): the episode ends ``world_error``
    right after. ``agent`` is the agent whose call it was, or -1."""

    world: str  # the world's class
    method: str  # e.g. "water (tool)", "ignite (world event)", "observe", "score"
    error: str  # "ZeroDivisionError: division by zero"
    where: str  # "garden.py:30": the file's name and the line that raised


def failure_text(world: str, method: str, agent: int, error: str, where: str) -> str:
    """A world's bug in words: ``Garden.water (tool, agent 2) raised ZeroDivisionError: ...
    at garden.py:30``."""
    if agent >= 0:
        method = (
            f"{method[:-1]}, agent {agent})"
            if method.endswith(")")
            else f"{method} (agent {agent})"
        )
    return f"{world}.{method} raised {error} at {where}"


class Ended(Event, tag="end", frozen=True):
    reason: str  # "done", "time_limit", "idle", "event_limit", "world_error"; "replay_bound":
    # a replay ran one event past its record (it has diverged) and was stopped there
    score: float


AnyEvent = (
    Spawned
    | Asked
    | Thought
    | Began
    | Rejected
    | Committed
    | Sent
    | Delivered
    | Dropped
    | Posted
    | Hired
    | Fired
    | Woke
    | Ended
    | Happened
    | Failed
)


# -- turns: what the learner needs ------------------------------------------------------------


class Turn(msgspec.Struct, kw_only=True, gc=False, forbid_unknown_fields=True):
    """One think-then-act cycle of one agent."""

    agent: int
    turn: int
    role: str
    policy: str  # which policy of the organisation answered ("trained", "frozen")
    asked: float
    answered: float
    prompt: str  # empty when the episode was run with keep_prompts = false
    text: str
    token_ids: list[int]
    logprobs: list[float]
    prompt_tokens: int
    version: int
    space: int = 0  # index into Episode.spaces: the constraint the output was sampled under
    tool: str = ""
    kind: str = ""  # "world", "comm", "wait", "invalid"; "" if the episode ended first
    ok: bool = False
    result: str = ""
    finished: float = -1.0  # when the action's result came back


# -- configuration and the whole record -------------------------------------------------------


MAX_DEPTH = 32  # how deep a world's parameters may nest (a list in a dict in a list ...)


def _depth(value: Any) -> int:
    """How deeply ``value`` nests lists and dicts (0: a plain value), counted without
    recursion, and only as far as one past ``MAX_DEPTH``."""
    deepest, level = 0, [value]
    while level and deepest <= MAX_DEPTH:
        inner: list[Any] = []
        for v in level:
            if isinstance(v, dict):
                inner += v.values()
            elif isinstance(v, list | tuple):
                inner += v
        if any(isinstance(v, dict | list | tuple) for v in level):
            deepest += 1
        level = inner
    return deepest


class EpisodeConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Everything needed to run an episode again, except the policy's weights."""

    world: str = "tally"  # built-in name, "path/file.py:Class" or "package.module:Class"
    params: dict[str, Any] = {}  # keyword arguments of the world's constructor
    agents: int = 3
    world_agents: int = 0  # size the task for this many agents (0: `agents`); e.g. a CEO's team
    world_seed: int = 0  # the task instance: a group shares it
    sample_seed: int = 0  # the agents' sampling streams: differs within a group
    time_limit: float = 600.0  # T_max, simulated seconds
    org: str = "flat"
    budget: int = 0  # how many agents the organisation may hire (alive at once)
    clock: ClockMode = "virtual"
    latency: LatencyModel = PRESETS[DEFAULT_PRESET]
    mailbox: int = 16  # mailbox capacity per agent
    overflow: Overflow = "drop_newest"
    channel_history: int = 64  # posts a channel keeps
    archive_size: int = 256  # entries the archive keeps
    comm_duration: float = 1.0  # simulated seconds a communication primitive takes
    max_wait: int = 600  # longest wait an agent may ask for, seconds
    max_output_tokens: int = 64
    temperature: float = 1.0
    # Nucleus sampling: only the most likely tokens whose mass reaches top_p (SGLang's rule).
    # UNSET stands for 1.0 (none) and is left out of the record, so an episode sampled without
    # it is the same bytes as before the field existed (``nucleus`` reads it as a number).
    top_p: float | msgspec.UnsetType = msgspec.UNSET
    max_events: int = 5_000_000  # a guard against a world whose tools take no time
    keep_prompts: bool = True
    policy: str = ""  # the policy that ran it, as a description
    policy_version: int = -1  # pin the trained policy's requests to it (-1: the latest)
    # Answers to requests asked before this time land at their recorded times, as measured on
    # the wall clock: a replayed real-clock episode, or the prefix of a fork of one.
    recorded_answers_until: float = 0.0
    # What the turns' token ids mean: "bytes" (the byte-level tokenizer of the tiny, random and
    # scripted policies), so replay checks that each turn's ids spell its text; "" when the
    # policy did not say (then only the ids' count and logprobs are checked).
    tokenizer: str = ""

    def __post_init__(self) -> None:
        checks = [
            (self.agents >= 1, "agents must be >= 1"),
            (0 <= self.world_seed < 2**64, "world_seed must be in 0..2**64-1"),
            (0 <= self.sample_seed < 2**64, "sample_seed must be in 0..2**64-1"),
            (math.isfinite(self.time_limit), "time_limit must be finite"),
            (math.isfinite(self.comm_duration), "comm_duration must be finite"),
            (math.isfinite(self.temperature), "temperature must be finite"),
            (1 <= self.max_events < 2**63, "max_events must be in 1..2**63-1"),
            (self.policy_version >= -1, "policy_version must be >= -1"),
            (self.world_agents >= 0, "world_agents must be >= 0"),
            (self.recorded_answers_until >= 0, "recorded_answers_until must be >= 0"),
            (self.time_limit > 0, "time_limit must be > 0"),
            (self.budget >= 0, "budget must be >= 0"),
            (self.mailbox >= 1, "mailbox must be >= 1"),
            (self.channel_history >= 1, "channel_history must be >= 1"),
            (self.archive_size >= 1, "archive_size must be >= 1"),
            (self.comm_duration > 0, "comm_duration must be > 0"),
            (self.max_wait >= 1, "max_wait must be >= 1"),
            (self.max_output_tokens >= 1, "max_output_tokens must be >= 1"),
            (self.temperature > 0, "temperature must be > 0"),
            (0 < self.nucleus <= 1, "top_p must be in (0, 1]"),
            (_depth(self.params) <= MAX_DEPTH, f"params nest deeper than {MAX_DEPTH} levels"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(f"episode config: {msg}")
        if self.top_p == 1.0:  # one spelling of "no nucleus": the same bytes either way
            self.top_p = msgspec.UNSET

    @property
    def nucleus(self) -> float:
        """``top_p`` as a number (1.0: every token the grammar allows may be sampled)."""
        return 1.0 if self.top_p is msgspec.UNSET else self.top_p


class Stats(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    events: int = 0
    turns: int = 0
    output_tokens: int = 0
    prompt_tokens: int = 0
    world_tokens: int = 0  # output tokens of turns that acted on the world (useful work)
    comm_tokens: int = 0  # output tokens of turns that communicated
    actions: int = 0
    rejected: int = 0
    tool_errors: int = 0
    sent: int = 0
    delivered: int = 0
    dropped: int = 0
    evicted: int = 0  # delivered, then pushed out of a full mailbox before being read
    read: int = 0
    unread: int = 0  # delivered and still in a mailbox at the end
    posts: int = 0
    missed_posts: int = 0  # posts a subscriber never saw because the channel history rolled over
    hires: int = 0
    fires: int = 0
    peak_agents: int = 0


class Episode(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    format: int = FORMAT
    config: EpisodeConfig
    score: float
    duration: float  # simulated seconds until the end
    end: str
    stats: Stats
    curve: list[tuple[float, float]]  # (t, score) at every instant the score changed
    events: list[AnyEvent]
    turns: list[Turn]
    spaces: list[ActionSpace] = []  # the distinct action spaces turns were sampled under
    world_metrics: dict[str, float] = {}  # World.metrics() at the end, summed over groups
