"""The conductor: the one place simulated time moves.

Its loop, for every episode it runs at once:

1. wait for quiescence: every actor of every episode is parked;
2. start every parked request, episode by episode, in agent-id order (a tool call is scheduled
   to land after its duration; a think joins the pending batch);
3. if something is still due at an episode's current instant (a rejected action's error, a
   wait woken at once), apply it and go back to 1: the instant is not settled yet;
4. send all pending thinks of all episodes to the policy as ONE batch (one per policy of the
   organisation), and schedule each answer at the simulated time its latency model charges;
5. move each episode's clock to its next due instant and apply everything due then, in heap
   order ``(time, priority, agent, seq)``; only here (and in 3) are actors resumed.

trio decides the order actors run in between two quiescences, and that order cannot matter:
actors only read frozen state and park. That is the whole determinism argument.
"""

from __future__ import annotations

import gc
import itertools
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Protocol, runtime_checkable

import msgspec
import trio

from collective.base.log import get_logger
from collective.engine.actor import Actor, Program, default_program
from collective.engine.episode import LiveEpisode
from collective.engine.quiescence import Quiescence
from collective.engine.recording import Recorder
from collective.engine.replayed import Replay
from collective.records import Episode, EpisodeConfig
from policy.base import Policy, PolicyError, PolicyRequest, PolicyResponse

log = get_logger("collective.engine.conductor")


class BatchStats(msgspec.Struct, kw_only=True):
    """Running totals of policy batches; constant memory, whatever the run length."""

    batches: int = 0
    requests: int = 0
    largest: int = 0
    policy_seconds: float = 0.0  # real seconds spent inside policy calls

    @property
    def mean(self) -> float:
        return self.requests / self.batches if self.batches else 0.0


@runtime_checkable
class EpisodeSource(Protocol):
    """Where a conductor's episodes come from, when they may start."""

    def take(self) -> EpisodeConfig | None:
        """The next config, if one may start now; never blocks."""
        ...

    async def wait(self) -> bool:
        """Block until ``take`` may return a config; False when none ever will again."""
        ...


class _IterSource:
    """A plain iterable of configs: every one may start at once."""

    def __init__(self, configs: Iterable[EpisodeConfig]) -> None:
        self._it: Iterator[EpisodeConfig] = iter(configs)
        self._next: EpisodeConfig | None = next(self._it, None)

    def take(self) -> EpisodeConfig | None:
        cfg, self._next = self._next, (next(self._it, None) if self._next is not None else None)
        return cfg

    async def wait(self) -> bool:
        return self._next is not None


class Conductor:
    """Runs episodes, many at once, batching every policy call at quiescence.

    ``policies`` maps the organisation's policy names (``trained``, ``frozen``) to backends;
    a single backend serves both.
    """

    def __init__(
        self,
        policies: Policy | dict[str, Policy],
        *,
        program: Program = default_program,
        on_batch: Callable[[int], None] | None = None,
    ) -> None:
        if isinstance(policies, dict):
            self.policies = dict(policies)
        else:
            self.policies = {"trained": policies, "frozen": policies}
        self.program = program
        self.on_batch = on_batch
        self.quiet = Quiescence()
        self.batch_stats = BatchStats()
        self.warned_bound = False

    # -- the loop ---------------------------------------------------------------------------------

    # Ctrl-C (KeyboardInterrupt) reaches the engine only where the conductor awaits, never
    # between two lines of its bookkeeping: see ``LiveEpisode.host``.
    @trio.lowlevel.enable_ki_protection
    async def play(
        self,
        configs: Iterable[EpisodeConfig] | EpisodeSource,
        *,
        concurrency: int = 1,
        emit: Callable[[Episode], Awaitable[None] | None] | None = None,
        replay: Replay | None = None,
        recorder: Callable[[EpisodeConfig], Recorder] | None = None,
    ) -> list[Episode]:
        """Run every config, ``concurrency`` episodes at a time, and return their records in the
        order of the configs (or ``emit`` each as it finishes, in the order they end: callers
        pair results with configs by position). Episodes are independent; batching is shared.
        ``configs`` may be an :class:`EpisodeSource` that decides when the next episode may start
        (training gates episodes on the policy versions they are pinned to). With ``recorder``,
        each episode's record streams to the recorder it gives as the episode runs (memory holds
        the live state and a chunk), and the episode returned holds all but its events, turns
        and curve."""
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        source = configs if isinstance(configs, EpisodeSource) else _IterSource(configs)
        try:
            with roomy_gc():
                return await self._play(source, concurrency, emit, replay, recorder)
        except BaseExceptionGroup as group:
            raise lone_error(group) from None

    async def _play(
        self,
        source: EpisodeSource,
        concurrency: int,
        emit: Callable[[Episode], Awaitable[None] | None] | None,
        replay: Replay | None,
        recorder: Callable[[EpisodeConfig], Recorder] | None,
    ) -> list[Episode]:
        done: list[tuple[int, Episode]] = []  # (admission index, record): returned in that order
        live: list[LiveEpisode] = []
        index: dict[LiveEpisode, int] = {}  # the live ones'
        admissions = itertools.count()
        real_clock = False  # whether a live episode runs on the real clock
        async with trio.open_nursery() as nursery:

            async def admit() -> None:
                nonlocal real_clock
                while len(live) < concurrency:
                    cfg = source.take()
                    if cfg is None:
                        return
                    sink = recorder(cfg) if recorder is not None else None
                    ep = LiveEpisode(cfg, self.quiet, self.program, replay, sink)
                    await nursery.start(ep.host)
                    index[ep] = next(admissions)
                    live.append(ep)
                    real_clock = real_clock or cfg.clock == "real"

            async def retire() -> None:
                """Record (or emit) the episodes that ended. Only once past
                ``checkpoint_if_cancelled``: a run stopped from outside may have applied one
                more instant after the stop (see LiveEpisode.withdraw), and what ended in it is
                nobody's, so nothing is recorded or emitted."""
                nonlocal real_clock
                for ep in [ep for ep in live if ep.ended]:
                    live.remove(ep)
                    admitted = index.pop(ep)
                    record = ep.record()
                    log.debug(
                        "episode ended",
                        world=ep.cfg.world,
                        reason=ep.end_reason,
                        score=ep.final_score,
                        t=ep.now,
                        events=ep.event_count,
                    )
                    if emit is None:
                        done.append((admitted, record))
                    else:
                        result = emit(record)
                        if result is not None:
                            await result
                real_clock = any(ep.cfg.clock == "real" for ep in live)

            # This loop runs once or twice per simulated instant: the calls that make a
            # coroutine (admit, retire, quiet.wait) are made only when they have work to do.
            thinks: list[tuple[LiveEpisode, Actor, PolicyRequest]] = []
            while True:
                if len(live) < concurrency:
                    await admit()
                if not live:
                    if not await source.wait():
                        break
                    continue
                if self.quiet.runnable:
                    await self.quiet.wait()
                for ep in live:
                    ep.start_requests(thinks)
                # Settle every episode's current instant before asking the policy: actors
                # resumed there may think too, and everyone thinking at an instant is one batch.
                settling = [ep for ep in live if ep.next_due() == ep.now]
                if settling:
                    for ep in settling:
                        await ep.advance()
                    await trio.lowlevel.checkpoint_if_cancelled()  # (see retire)
                    if any(ep.ended for ep in live):
                        await retire()
                    continue
                if thinks and any(ep.ended for ep in live):
                    thinks = [item for item in thinks if not item[0].ended]
                if thinks:
                    await self._think(thinks)
                    thinks = []
                if real_clock:
                    await self._sleep_until_due(live)
                for ep in live:
                    await ep.advance()
                await trio.lowlevel.checkpoint_if_cancelled()  # (see retire)
                if any(ep.ended for ep in live):
                    await retire()
        return [record for _, record in sorted(done, key=lambda pair: pair[0])]

    async def _think(self, thinks: list[tuple[LiveEpisode, Actor, PolicyRequest]]) -> None:
        by_policy: dict[str, list[tuple[LiveEpisode, Actor, PolicyRequest]]] = {}
        for item in thinks:
            by_policy.setdefault(item[1].policy_key, []).append(item)
        for key, items in by_policy.items():
            policy = self.policies.get(key)
            if policy is None:
                raise PolicyError(f"no policy named {key!r} was given to the conductor")
            requests = [req for _, _, req in items]
            t0 = time.perf_counter()
            responses = await policy.generate(requests)
            self.batch_stats.policy_seconds += time.perf_counter() - t0
            if len(responses) != len(requests):
                raise PolicyError(
                    f"policy {policy.name!r} answered {len(responses)} of {len(requests)} requests"
                )
            self.batch_stats.batches += 1
            self.batch_stats.requests += len(requests)
            self.batch_stats.largest = max(self.batch_stats.largest, len(requests))
            if self.on_batch is not None:
                self.on_batch(len(requests))
            for (ep, actor, req), resp in zip(items, responses, strict=True):
                if len(resp.logprobs) != len(resp.token_ids):
                    raise PolicyError(
                        f"policy {policy.name!r}: agent {req.agent} turn {req.turn}: "
                        f"{len(resp.token_ids)} tokens but {len(resp.logprobs)} logprobs"
                    )
                kept = bounded(req, resp, actor.longest)
                if kept is not resp and not self.warned_bound:
                    self.warned_bound = True  # the rest are in the record, as rejected actions
                    log.warning(
                        "an answer over its bound: rejected, kept only to the bound",
                        policy=policy.name,
                        agent=req.agent,
                        turn=req.turn,
                        tokens=len(resp.token_ids),
                        max_tokens=req.max_tokens,
                        chars=len(resp.text),
                    )
                ep.answer(actor, req, kept)

    async def _sleep_until_due(self, live: list[LiveEpisode]) -> None:
        """Real clock mode: nothing is due before the wall clock reaches it."""
        due = min(
            (ep.t0_wall + ep.next_due() for ep in live if ep.cfg.clock == "real"), default=math.inf
        )
        limit = min(ep.t0_wall + ep.cfg.time_limit for ep in live if ep.cfg.clock == "real")
        target = min(due, limit)
        if target > trio.current_time():
            await trio.sleep_until(target)


def bounded(req: PolicyRequest, resp: PolicyResponse, chars: int) -> PolicyResponse:
    """An answer cut to one token past ``max_tokens`` and one character past ``chars``, the
    longest action of ``req.space`` (``longest_action``: the asking actor keeps it).

    No policy's answer may grow the record without bound (a broken or hostile server could send
    megabytes). An answer past either bound is an invalid action (the episode rejects it), and
    what is kept of it is still past the bound, so a replay fed the kept answer rejects it
    again: cutting is idempotent."""
    if len(resp.token_ids) <= req.max_tokens and len(resp.text) <= chars:
        return resp
    keep = req.max_tokens + 1
    return PolicyResponse(
        text=resp.text[: chars + 1],
        token_ids=list(resp.token_ids[:keep]),
        logprobs=list(resp.logprobs[:keep]),
        prompt_tokens=resp.prompt_tokens,
        version=resp.version,
    )


@contextmanager
def roomy_gc() -> Iterator[None]:
    """Run episodes with Python's cyclic garbage collector called less often.

    Every agent is some fifteen objects the collector tracks (its trio task, its coroutine
    frames), and every full collection walks all of them: with the default thresholds, 100,000
    idle agents cost seconds of CPU per simulated minute, against the rule that idle agents
    cost memory, not CPU. Every parked agent also holds a few young objects (the frames of its
    current wait), so even a young collection walks about four objects per agent. The engine's
    own objects form no reference cycles (reference counting frees them), so collecting young
    objects every 1,000,000 allocations instead of every 700, and old ones rarely, costs only
    this: cyclic garbage made by a world or a policy lives longer before it is freed (the time
    it saves at 100,000 agents: ``bench/results/engine/README.md``, "Figures the code cites").
    Only when the collector runs changes, never what an episode does; the previous thresholds
    come back when play ends.
    """
    global _plays
    old = gc.get_threshold()
    if _plays == 0 and old[0] != 0:  # 0: the caller disabled collection; leave it so
        gc.set_threshold(max(old[0], 1_000_000), max(old[1], 50), max(old[2], 100))
    _plays += 1
    try:
        yield
    finally:
        _plays -= 1
        if _plays == 0:
            gc.set_threshold(*old)


_plays = 0  # plays running in this process (nested or concurrent): the outermost restores


def lone_error(group: BaseExceptionGroup) -> BaseException:
    """trio wraps every error in an ExceptionGroup; a lone error is clearer unwrapped (the
    command line prints it in one line), and keeps its own traceback. Several errors stay
    grouped."""
    err: BaseException = group
    while isinstance(err, BaseExceptionGroup) and len(err.exceptions) == 1:
        err = err.exceptions[0]
    return err


def run_episode(
    cfg: EpisodeConfig,
    policy: Policy | dict[str, Policy],
    *,
    program: Program = default_program,
    recorder: Recorder | None = None,
) -> Episode:
    """Run one episode to its end, synchronously (a convenience over ``Conductor.play``); with
    ``recorder``, its record streams there (see ``play``)."""
    conductor = Conductor(policy, program=program)
    sink = None if recorder is None else lambda _: recorder
    return trio.run(lambda: conductor.play([cfg], recorder=sink))[0]


def run_episodes(
    cfgs: Iterable[EpisodeConfig],
    policy: Policy | dict[str, Policy],
    *,
    concurrency: int = 1,
    program: Program = default_program,
) -> list[Episode]:
    conductor = Conductor(policy, program=program)
    return trio.run(lambda: conductor.play(cfgs, concurrency=concurrency))
