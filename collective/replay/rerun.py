"""Replay, fork and diff: an episode is a deterministic function of its config and its record.

``replay`` re-executes an episode with the recorded policy outputs (and recorded real
durations). ``audit`` compares everything the re-execution derives with what the file says:
the event stream event for event, every turn (its prompt, result, timing, text, token ids and
logprobs), the score, the stats, the curve and the world's metrics; and it checks what no
re-execution derives, the recorded answers themselves: one finite logprob <= 0 per token, and
token ids that spell the text under the recorded tokenizer. Given a policy, it recomputes the
answers too (logprobs included) instead of taking them from the record. ``fork`` replays up to
a simulated time, then continues live with another policy.

Everything here streams: an episode may be an :class:`~collective.records.Episode` in memory or
an :class:`~collective.records.EpisodeStream` read from its file part by part, and a replay
compares what it derives with the record as it goes (a :class:`Checker` is its recorder), so
auditing a long episode holds its live state and a few chunks, not two whole records.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import msgspec
import trio

from collective.base.actions import longest_action
from collective.engine.actor import default_program
from collective.engine.conductor import Conductor
from collective.engine.recording import Recorder
from collective.engine.registry import check_runnable, resolve_world
from collective.engine.replayed import Replay
from collective.records import (
    Chunk,
    Closing,
    Episode,
    EpisodeStream,
    Opening,
    Part,
    Turn,
    TurnEnd,
    episode_parts,
)
from collective.replay.recorded import RecordedPolicy
from collective.world.outside import from_record
from policy import tokenizer as byte_tokenizer
from policy.base import Policy, PolicyError, PolicyUnavailable
from policy.watched import Watched


class Divergence(msgspec.Struct):
    index: int
    expected: Any  # the original's event at index (None: the original ended here)
    got: Any  # the new event at index (None: the new stream ended here)

    def describe(self) -> str:
        return (
            f"first divergence at event {self.index}:\n  expected: {_show(self.expected)}\n"
            f"  got:      {_show(self.got)}"
        )


def _show(e: Any) -> str:
    return "(end of stream)" if e is None else repr(e)


def first_divergence(expected: Sequence[Any], got: Sequence[Any]) -> Divergence | None:
    for i, (a, b) in enumerate(zip(expected, got, strict=False)):
        if a != b:
            return Divergence(i, a, b)
    if len(expected) != len(got):
        i = min(len(expected), len(got))
        return Divergence(
            i, expected[i] if i < len(expected) else None, got[i] if i < len(got) else None
        )
    return None


Record = Episode | EpisodeStream  # an episode in memory, or read from its file as it goes


def _rerun(
    ep: Record, backend: Policy, fed: Replay, recorder: Recorder | None = None, **changes: Any
) -> Episode:
    cfg = msgspec.structs.replace(ep.config, **changes)
    conductor = Conductor(backend, program=default_program)
    sink = None if recorder is None else lambda _: recorder
    return trio.run(lambda: conductor.play([cfg], replay=fed, recorder=sink))[0]


def replay(
    ep: Record,
    *,
    policy: Policy | None = None,
    world: str | None = None,
    recorder: Recorder | None = None,
    progress: Callable[[float], None] | None = None,
) -> Episode:
    """Re-execute ``ep`` from its recorded outputs (or, given ``policy``, with answers that
    policy computes anew for the same requests and seeds). A ``real`` clock episode replays on
    the virtual clock at its recorded times. ``world`` replaces the world reference the record
    names (the same world found elsewhere, or named by the user rather than by the file).
    With ``recorder``, the replay's record streams there (see ``Conductor.play``); ``progress``
    is told the simulated time the replay has reached, batch by batch."""
    changes: dict[str, Any] = {}
    if ep.config.clock == "real":
        changes = {"clock": "virtual", "recorded_answers_until": math.inf}
    if world is not None:
        changes["world"] = world
    answers: Policy = RecordedPolicy(
        ep.turns, live=policy, until=math.inf if policy is None else 0.0
    )
    if progress is not None:
        answers = Watched(answers, progress)
    # Bounded by what the record holds, not by the limits it declares: a replay one event past
    # the record has diverged already, and a file that declares time_limit=1e308 and
    # max_events=2**63-1 must not make it run without end.
    fed = Replay(ep, most_events=len(ep.events) + 1, world=world)
    return _rerun(ep, answers, fed, recorder, **changes)


def verify(ep: Episode) -> Divergence | None:
    """Replay ``ep`` and return where its event stream diverges (None: identical)."""
    return first_divergence(ep.events, replay(ep).events)


def fork(
    ep: Record,
    until: float,
    policy: Policy,
    *,
    sample_seed: int | None = None,
    world: str | None = None,
    progress: Callable[[float], None] | None = None,
) -> Episode:
    """Replay ``ep`` exactly up to simulated time ``until``, then continue live with ``policy``
    (``progress``: as ``replay`` tells it).

    Every request asked before ``until`` gets its recorded answer; every later one goes to
    ``policy`` (with the agents' streams reseeded by ``sample_seed`` when given).
    """
    if not 0 <= until <= ep.config.time_limit or math.isnan(until):
        raise ValueError(f"fork time {until} is outside the episode (0..{ep.config.time_limit})")
    changes: dict[str, Any] = {
        "policy": f"fork of [{ep.config.policy}] at t={until:g} with {policy.name}"
    }
    if sample_seed is not None:
        changes["sample_seed"] = sample_seed
    if world is not None:
        changes["world"] = world
    if ep.config.tokenizer != tokenizer_of(policy):  # the answers after `until` are another's
        changes["tokenizer"] = ""
    if ep.config.clock == "real":  # the prefix's answers keep their measured times
        changes["clock"] = "virtual"
        changes["recorded_answers_until"] = until
    elif ep.config.recorded_answers_until:
        changes["recorded_answers_until"] = min(until, ep.config.recorded_answers_until)
    recorded: Policy = RecordedPolicy(ep.turns, live=policy, until=until)
    if progress is not None:
        recorded = Watched(recorded, progress)
    return _rerun(ep, recorded, Replay(ep, until, world=world), **changes)


def check_replayable(ep: Record, world: str | None = None, *, fork: bool = False) -> None:
    """``check_runnable`` for a replay of ``ep`` (with ``world`` in place of its own, if
    given): a world that reaches outside the process (``World.outside``, a server) is built
    from the record, so a replay needs no server; a fork continues live past its time, so it
    does, and a missing one is said in one line."""
    cfg = msgspec.structs.replace(ep.config, world=world or ep.config.world)
    try:
        outside = resolve_world(cfg.world).outside
    except ValueError:
        outside = False  # (check_runnable says why in a moment)
    if not outside:
        check_runnable(cfg)
    elif fork:
        try:
            check_runnable(cfg)
        except ValueError as e:
            raise ValueError(
                f"{e}; a fork goes on past the record, where it needs the world's server"
            ) from e
    else:
        with from_record(Replay(ep, world=cfg.world).opening):
            check_runnable(cfg)


def prefix(events: Sequence[Any], until: float) -> list[Any]:
    """The events strictly before simulated time ``until``: what a fork must share."""
    return [e for e in events if e.t < until]


# -- the whole record: audit and diff ---------------------------------------------------------


def _r(value: Any) -> str:
    """``repr`` with -0.0 shown as 0.0: they compare equal, so a line of differences that
    printed both (a policy's logprob of a forced token is either) would show a difference
    that is not one."""
    if type(value) is float and value == 0.0:
        return "0.0"
    if type(value) in (list, tuple) and any(type(x) is float and x == 0.0 for x in value):
        inner = ", ".join(_r(x) for x in value)
        return f"[{inner}]" if type(value) is list else f"({inner}{',' * (len(value) == 1)})"
    return repr(value)


def _changes(a: Any, b: Any, fields: Iterable[str]) -> str:
    """``field A vs B`` for each field that differs."""
    pairs = ((f, getattr(a, f), getattr(b, f)) for f in fields)
    return "; ".join(f"{f} {_r(x)} vs {_r(y)}"[:300] for f, x, y in pairs if x != y)


def _turn_change(i: int, a: Turn, b: Turn) -> str:
    return f"turn {i} (agent {a.agent}, turn {a.turn}): {_changes(a, b, Turn.__struct_fields__)}"


def _end_change(i: int, a: TurnEnd, b: TurnEnd) -> str:
    """Outcomes are compared in the order they landed, so the i-th on each side may be
    another turn's: then the line says so and shows each whole, rather than reading one
    turn's outcome against another's as if they were the same turn's."""
    if a.index == b.index:
        return f"turn {a.index} outcome: {_changes(a, b, TurnEnd.__struct_fields__)}"
    fields = [f for f in TurnEnd.__struct_fields__ if f != "index"]

    def whole(e: TurnEnd) -> str:
        return f"turn {e.index}'s (" + ", ".join(f"{f} {_r(getattr(e, f))}" for f in fields) + ")"

    return f"outcome {i} to land: {whole(a)[:280]} vs {whole(b)[:280]}"


_KINDS = ("events", "turns", "ends", "spaces", "curve")


class Checker:
    """Compares a record as it streams in (a replay's, or a second file's parts) with an
    original's parts, read alongside: what is held is only what one side is ahead of the other.
    Each kind of record is compared in order: events, turns as answered, their outcomes (in the
    order finished, index), action spaces, the curve; then the closing. ``lines()`` says where
    they differ, one line per part (the first difference in each); ``divergence`` is the first
    differing event."""

    def __init__(self, original: Iterable[Part], *, config: bool = True) -> None:
        self.source: Iterator[Part] = iter(original)
        first = next(self.source)
        assert isinstance(first, Opening)
        self.want_config = first.config
        self.check_config = config
        self.queue: dict[str, deque[Any]] = {k: deque() for k in _KINDS}
        self.count = dict.fromkeys(_KINDS, 0)  # the new record's, per kind
        self.taken = dict.fromkeys(_KINDS, 0)  # the original's compared with them
        self.first: dict[str, str] = {}
        self.divergence: Divergence | None = None
        self.closing: Closing | None = None
        self.config_lines: list[str] = []

    def _pull(self) -> bool:
        """Read the original's next part; False once it is all read."""
        part = next(self.source, None)
        if part is None:
            return False
        if isinstance(part, Closing):
            self.closing = part
        elif isinstance(part, Chunk):
            for k in _KINDS:
                self.queue[k].extend(getattr(part, k))
        return True

    def _want(self, kind: str) -> Any:
        queue = self.queue[kind]
        while not queue:
            if not self._pull():
                return None
        return queue.popleft()

    def _note(self, kind: str, i: int, want: Any, got: Any) -> None:
        if kind == "events":
            if self.divergence is None:
                self.divergence = Divergence(i, want, got)
        elif kind not in self.first and want is not None and got is not None:
            if kind == "turns":
                line = _turn_change(i, want, got)
            elif kind == "ends":
                line = _end_change(i, want, got)
            else:
                line = f"{kind}[{i}]: {_r(want)} vs {_r(got)}"
            self.first[kind] = line[:600]

    def write(self, part: Part) -> None:
        if isinstance(part, Opening):
            if self.check_config:
                for f in type(part.config).__struct_fields__:
                    x, y = getattr(self.want_config, f), getattr(part.config, f)
                    if x != y:
                        self.config_lines.append(f"config {f}: {x!r} vs {y!r}")
        elif isinstance(part, Chunk):
            for kind in _KINDS:
                for got in getattr(part, kind):
                    i = self.count[kind]
                    self.count[kind] += 1
                    want = self._want(kind)
                    self.taken[kind] += want is not None
                    if want != got:
                        self._note(kind, i, want, got)
        else:
            self._finish(part)

    def _finish(self, got: Closing) -> None:
        while self.closing is None and self._pull():
            pass
        for kind in _KINDS:
            queue = self.queue[kind]
            total, n = self.taken[kind] + len(queue), self.count[kind]
            if queue:  # the original has more
                self._note(kind, n, queue[0], None)
                queue.clear()
            if total != n and kind != "events" and kind not in self.first:
                what = "" if kind == "turns" else " entries"
                self.first[kind] = f"{kind}: {total} vs {n}{what}"
        want = self.closing
        assert want is not None
        lines = self.config_lines
        d = self.divergence
        if d is not None:
            t = (d.expected if d.expected is not None else d.got).t
            lines.append(
                f"first divergence at event {d.index} (t={t!r}): "
                f"{_show(d.expected)} vs {_show(d.got)}"
            )
        lines += [self.first[k] for k in ("turns", "ends") if k in self.first]
        for f in ("score", "duration", "end"):
            if getattr(want, f) != getattr(got, f):
                lines.append(f"{f}: {_r(getattr(want, f))} vs {_r(getattr(got, f))}")
        if got.end == "replay_bound" != want.end:
            lines[-1] += (
                f" (the replay went past the record's {self.taken['events']:,} events and was "
                "stopped one event later)"
            )
        for f in type(want.stats).__struct_fields__:
            if getattr(want.stats, f) != getattr(got.stats, f):
                lines.append(f"stats {f}: {getattr(want.stats, f)!r} vs {getattr(got.stats, f)!r}")
        if want.turns != got.turns and "turns" not in self.first:
            lines.append(f"turns: {want.turns} vs {got.turns}")
        lines += [self.first[k] for k in ("curve", "spaces") if k in self.first]
        if want.world_metrics != got.world_metrics:
            lines.append(f"world_metrics: {want.world_metrics!r} vs {got.world_metrics!r}")
        self.done = lines

    def lines(self) -> list[str]:
        return self.done


def _parts(ep: Record) -> Iterator[Part]:
    return ep.parts(whole=True) if isinstance(ep, EpisodeStream) else episode_parts(ep)


def compare(a: Record, b: Record, *, config: bool = True) -> Checker:
    """Read two records side by side (see :class:`Checker`)."""
    checker = Checker(_parts(a), config=config)
    for part in _parts(b):
        checker.write(part)
    return checker


def differences(a: Record, b: Record, *, config: bool = True) -> list[str]:
    """Where two episodes differ, one line per part (the first difference in each): config
    fields, events, turns, score, duration, end, stats, curve, action spaces, world metrics.
    Empty when they are the same episode. Times are printed exactly (``repr``)."""
    return compare(a, b, config=config).lines()


def tokenizer_of(policy: Policy) -> str:
    """The tokenizer a policy's token ids are in, for ``EpisodeConfig.tokenizer``: the policy's
    own ``tokenizer_name`` ("bytes" for the byte-level random, scripted and tiny policies), else
    "" (not recorded: replay then cannot check that ids spell the text). Declared by the policy,
    not found by ``isinstance``: asking whether a random policy is a ``TinyPolicy`` imported
    torch, seconds of a fork or run that needs no torch at all (bench/results/engine/README.md)."""
    declared = getattr(policy, "tokenizer_name", None)
    return declared if isinstance(declared, str) else ""


def answer_problems(ep: Record) -> list[str]:
    """What is wrong with the recorded answers themselves, which no replay re-derives: each
    turn has one finite logprob <= 0 per token and (under the byte tokenizer) ids that spell
    its text. An answer cut at its bound (see ``collective.engine.conductor.bounded``) is checked
    for
    its length only. The first problem of each kind."""
    found: dict[str, str] = {}
    spell = ep.config.tokenizer == "bytes"
    if ep.config.tokenizer not in ("", "bytes"):
        found["tokenizer"] = f"tokenizer {ep.config.tokenizer!r}: this version checks only bytes"
    limit = ep.config.max_output_tokens
    spaces: list[Any] = []
    for i, t in _answers(ep, spaces):
        where = f"turn {i} (agent {t.agent}, turn {t.turn})"
        if len(t.logprobs) != len(t.token_ids):
            found.setdefault(
                "count", f"{where}: {len(t.token_ids)} token ids, {len(t.logprobs)} logprobs"
            )
        bad = next((x for x in t.logprobs if not (math.isfinite(x) and x <= 0.0)), None)
        if bad is not None:
            found.setdefault("logprob", f"{where}: logprob {bad!r} (must be finite and <= 0)")
        if not 0 <= t.space < len(spaces):
            found.setdefault("space", f"{where}: action space {t.space} of {len(spaces)}")
            continue
        chars = longest_action(spaces[t.space])
        cut = len(t.token_ids) > limit or len(t.text) > chars
        if len(t.token_ids) > limit + 1 or len(t.text) > chars + 1:
            found.setdefault("bound", f"{where}: an answer longer than its bound was kept")
        if spell and not cut:
            ids = t.token_ids
            if any(not 0 <= x < byte_tokenizer.VOCAB_SIZE for x in ids):
                found.setdefault("ids", f"{where}: token id outside the byte tokenizer")
            elif byte_tokenizer.decode(ids) != t.text:
                found.setdefault(
                    "spell",
                    f"{where}: token ids spell {byte_tokenizer.decode(ids)!r}, "
                    f"the agent acted on {t.text!r}",
                )
    return list(found.values())


def _answers(ep: Record, spaces: list[Any]) -> Iterator[tuple[int, Turn]]:
    """Each turn as answered with its index, ``spaces`` grown to every action space before it."""
    i = 0
    for part in _parts(ep):
        if isinstance(part, Chunk):
            spaces += part.spaces
            for t in part.turns:
                yield i, t
                i += 1


def audit(
    ep: Record,
    *,
    policy: Policy | None = None,
    world: str | None = None,
    progress: Callable[[float], None] | None = None,
) -> tuple[Record, list[str]]:
    """Replay ``ep`` (with ``policy``: recomputing its answers) and return the replay and every
    way the record disagrees with it or with itself; an empty list: the whole record holds.
    (A replay the record's own answers stop returns ``ep`` itself with the reason.) An
    episode read from its file is compared as the replay goes: what is returned then holds all
    but the replay's events, turns and curve."""
    problems = answer_problems(ep)
    streamed = isinstance(ep, EpisodeStream)
    checker = Checker(_parts(ep), config=False) if streamed else None
    try:
        again = replay(ep, policy=policy, world=world, recorder=checker, progress=progress)
    except PolicyUnavailable:  # nothing answered: the policy named is the problem, not the record
        raise
    except PolicyError as e:  # e.g. a forged turn with fewer logprobs than tokens
        return ep, [*problems, f"the replay stopped: {e}"]
    if checker is not None:
        return again, problems + checker.lines()
    return again, problems + differences(ep, again, config=False)
