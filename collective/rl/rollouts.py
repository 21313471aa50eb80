"""Rollouts: where the finished episodes a training step learns from come from.

This is the seam between rollouts and the learner. The training loop asks a ``Rollouts`` for
the step's groups (``await rollouts.groups(step)``: B groups of G finished episodes, in group
and member order, each already saved in the run directory) and tells it when new weights exist
(``await rollouts.publish(version, weights)``). How and where the episodes ran is the
source's business: ``LocalRollouts`` runs them all in this process with one conductor;
``collective.rl.cluster.RayRollouts`` spreads them over Ray actors. Either way an episode is a
function of its config (``team_config``: seeds from the run's seed, group and member) and the
policy version it is pinned to, so where it ran cannot change it, and the loop consumes whole
steps in a fixed order, so when it finished cannot change the run.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import msgspec
import trio

from collective.base.latency import latency_preset
from collective.base.seeding import derive
from collective.engine.conductor import Conductor
from collective.records import Episode, EpisodeConfig, world_error
from collective.rl.backend import Backend, Weights
from collective.rl.commons import CommonsStore
from collective.rl.config import (
    TrainConfig,
    WorldEntry,
    draws_per_step,
    mix,
    time_limit_at,
    world_of,
)
from collective.rl.forks import trained_turn
from collective.rl.rundir import RunDir
from policy.base import Policy, TrainableModel
from policy.watched import Watched


def team_config(cfg: TrainConfig, group: int, member: int, version: int) -> EpisodeConfig:
    """Episode ``member`` of ``group``: the group shares its world (``world_of``: the one world,
    or a draw from the mix), its task instance (world seed) and team size; each member has its
    own sampling stream."""
    world = world_of(cfg, group)
    return episode_config(
        cfg,
        world,
        team_size(cfg, group),
        world_seed=derive(cfg.seed, group) >> 33,
        sample_seed=derive(cfg.seed, group, member) >> 1,
        time_limit=time_limit_at(cfg, group // draws_per_step(cfg), world),
        version=version,
    )


def episode_config(
    cfg: TrainConfig,
    world: WorldEntry,
    team: int,
    *,
    world_seed: int,
    sample_seed: int,
    time_limit: float,
    version: int,
) -> EpisodeConfig:
    """An episode of the run's kind on ``world`` with ``team`` agents (for ``org = "ceo"``: the
    CEO plus ``team - 1`` hires, on a task sized for the team)."""
    agents, budget = (1, team - 1) if cfg.org == "ceo" else (team, 0)
    return EpisodeConfig(
        world=world.world,
        params=dict(world.params),
        agents=agents,
        world_agents=team if cfg.org == "ceo" else 0,  # a CEO's task is sized for its team
        budget=budget,
        org=cfg.org,
        world_seed=world_seed,
        sample_seed=sample_seed,
        time_limit=time_limit,
        latency=latency_preset(cfg.latency),
        max_output_tokens=cfg.max_output_tokens,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        policy=f"{cfg.model.kind} (training)",
        policy_version=version,
        tokenizer="bytes" if cfg.model.kind == "tiny" else "",
    )


def team_size(cfg: TrainConfig, group: int) -> int:
    """Group ``group``'s team size: its world's sizes, cycled over the groups."""
    sizes = world_of(cfg, group).team_sizes
    return sizes[group % len(sizes)]


def first_configs(cfg: TrainConfig) -> list[EpisodeConfig]:
    """One episode config for each (world, team size) a run plays, what a run checks before it
    starts (``check_runnable``): every world of the mix at each of its sizes."""
    return [
        episode_config(
            cfg,
            w,
            team,
            world_seed=derive(cfg.seed, 0) >> 33,
            sample_seed=derive(cfg.seed, 0, 0) >> 1,
            time_limit=time_limit_at(cfg, 0, w),
            version=0,
        )
        for w in mix(cfg)
        for team in dict.fromkeys(w.team_sizes)
    ]


def unexpected_episode(
    cfg: TrainConfig,
    group: int,
    member: int,
    ep: Episode,
    pinned: bool,
    commons: CommonsStore | None = None,
) -> str:
    """How ``ep`` differs from episode ``member`` of ``group`` as this run plays it ("" if it
    does not): its config (world, parameters, seeds, team, time limit; with a commons, the
    commons of its version), its policy version (one the schedule can pin the group to) and
    the version its trained turns were answered by. A sealed file that is another group's, or
    another run's, passes its digest; it does not pass this."""
    step = group // draws_per_step(cfg)
    v = ep.config.policy_version
    if not pinned:
        allowed = range(-1, 0)
    elif cfg.sync == "pinned":
        allowed = range(max(0, step - cfg.lag), max(0, step - cfg.lag) + 1)
    else:  # (the newest version when it was issued: from the pinned one up to the step's own)
        allowed = range(max(0, step - cfg.lag), step + 1)
    if v not in allowed:
        return f"policy version {v}, where the run plays it with version(s) {list(allowed)}"
    want = team_config(cfg, group, member, v)
    if commons is not None:
        want = commons.apply(want, v)
    for field in want.__struct_fields__:
        if field == "policy":  # (the serving policy's own name: not the run's to say)
            continue
        got, expect = getattr(ep.config, field), getattr(want, field)
        if got != expect and _encoded(got) != _encoded(expect):  # (a tuple read back: a list)
            return f"its {field} is {str(got)[:80]}, not {str(expect)[:80]}"
    if pinned and (versions := {t.version for t in ep.turns if trained_turn(t)} - {v}):
        return f"turns answered by version(s) {sorted(versions)}, not {v}"
    return ""


def _encoded(value: Any) -> bytes:
    return msgspec.msgpack.encode(value)


class Schedule:
    """Issues the episodes of groups in order, each only once the policy version it is pinned to
    exists: group g belongs to step g // D (D = ``draws_per_step``) and may use weights ``lag``
    versions older. A step's first ``groups_per_step`` groups are issued as soon as they may be;
    its reserve groups (dynamic sampling) only once ``request`` asks for them, and before
    anything else then (the learner is waiting on them)."""

    def __init__(
        self,
        cfg: TrainConfig,
        first_group: int,
        have: set[tuple[int, int]],
        pin: bool = True,
        commons: CommonsStore | None = None,
    ) -> None:
        self.cfg = cfg
        self.draws = draws_per_step(cfg)
        self.commons = commons  # the run's commons, whose version v an episode of v starts from
        self.pin = pin  # False: the server holds one version; episodes take whatever it has
        self.group, self.member = first_group, 0
        self.have = have  # (group, member) already on disk: not run again
        self.latest = first_group // self.draws  # newest version the learner published
        self.issued: dict[int, tuple[int, int]] = {}  # sample_seed -> (group, member)
        self.reserve: list[tuple[int, int]] = []  # requested reserve episodes, in order
        # Steps whose groups are settled (no reserve can be asked for any more): without
        # dynamic sampling, every step from the start.
        self.settled = -1 if cfg.resample else cfg.steps
        self._changed = trio.Event()

    def publish(self, version: int) -> None:
        self.latest = version
        self._wake()

    def request(self, groups: list[int]) -> None:
        """Play these reserve groups (each of the step the learner is waiting on)."""
        self.reserve += [(g, i) for g in groups for i in range(self.cfg.group_size)]
        self._wake()

    def settle(self, step: int) -> None:
        """``step`` has all the groups it will train on: no reserve of it will be asked for."""
        self.settled = max(self.settled, step)
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _skip_done(self) -> None:
        while (self.group, self.member) in self.have:
            self._advance()
        while self.reserve and self.reserve[0] in self.have:
            self.reserve.pop(0)

    def _advance(self) -> None:
        self.member += 1
        if self.member == self.cfg.group_size:
            self.group, self.member = self.group + 1, 0
            if self.group % self.draws == self.cfg.groups_per_step:  # a step's reserves: skip
                self.group += self.cfg.resample

    def _exhausted(self) -> bool:
        return (
            self.group >= self.cfg.steps * self.draws
            and not self.reserve
            and self.settled >= self.cfg.steps - 1
        )

    def _version(self, needs: int) -> int:
        if not self.pin:
            return -1
        return needs if self.cfg.sync == "pinned" else self.latest

    def take(self) -> EpisodeConfig | None:
        self._skip_done()
        if self.reserve:  # (its step's first groups ran: its version exists)
            g, i = self.reserve.pop(0)
            return self._issue(g, i, self._version(self._needs_of(g)))
        if self.group >= self.cfg.steps * self.draws or self.latest < self._needs_of(self.group):
            return None
        g, i = self.group, self.member
        self._advance()
        return self._issue(g, i, self._version(self._needs_of(g)))

    def _needs_of(self, group: int) -> int:
        return max(0, group // self.draws - self.cfg.lag)

    def _issue(self, group: int, member: int, version: int) -> EpisodeConfig:
        ep = team_config(self.cfg, group, member, version)
        if self.commons is not None:
            ep = self.commons.apply(ep, version)
        self.issued[ep.sample_seed] = (group, member)
        return ep

    async def wait(self) -> bool:
        self._skip_done()
        while (
            not self._exhausted()
            and not self.reserve
            and (
                self.group >= self.cfg.steps * self.draws
                or self.latest < self._needs_of(self.group)
            )
        ):
            await self._changed.wait()
        return not self._exhausted()


@dataclass(frozen=True, kw_only=True, slots=True)
class RolloutArgs:
    """What every kind of rollouts is built from (``LocalRollouts``, ``RayRollouts``)."""

    cfg: TrainConfig
    run: RunDir
    first_step: int  # the first step to gather (a resumed run's next)
    backend: Backend
    model: TrainableModel  # the learner's
    # The weights of every version rollouts may still use (pinned backends), as the learner
    # keeps them: at the start, the one(s) a run begins or resumes with.
    serving_weights: dict[int, Weights]
    commons: CommonsStore | None = None  # commons = "on"/"credit": the run's commons


class Rollouts:
    """Finished episodes, gathered into a step's groups. Subclasses run the episodes and hand
    each one, as it finishes, to ``finished``; it is saved in the run directory before anyone
    uses it (an episode written is an episode kept), then buffered until its step is asked for.
    """

    def __init__(self, args: RolloutArgs) -> None:
        self.cfg = cfg = args.cfg
        self.run = run = args.run
        self.first_step = first_step = args.first_step
        self.backend, self.model = args.backend, args.model
        self.serving_weights = args.serving_weights
        self.first_group = first_step * draws_per_step(cfg)
        # A resumed run's episodes that finished after its checkpoint: used, not run again,
        # once each is checked to be the episode the run plays under its name.
        pinned = self.backend.pinned

        def unexpected(group: int, member: int, ep: Episode) -> str:
            return unexpected_episode(cfg, group, member, ep, pinned, args.commons)

        self.buffer: dict[tuple[int, int], Episode] = run.finished_episodes(
            self.first_group, unexpected
        )
        self.on_disk = set(self.buffer)
        self._send, self._recv = trio.open_memory_channel[tuple[int, int, Episode]](
            cfg.channel_capacity
        )
        # Told the simulated time each policy batch was asked at (in this process: local
        # rollouts), for a progress bar; None: nobody is watching.
        self.on_time: Callable[[float], None] | None = None

    @property
    def batch_mean(self) -> float:
        """Mean policy batch size so far (a wall-clock figure: it depends on timing)."""
        return 0.0

    def start(self) -> None:
        """Start what runs the episodes (nothing, locally); raises ValueError for a placement
        that cannot work, before the run directory is written."""

    def close(self) -> None:
        """Stop it all (idempotent)."""

    def running(self) -> Any:
        """An async context in which episodes run; leaving it stops them."""
        raise NotImplementedError

    async def publish(self, version: int, weights: Weights) -> None:
        """The learner has made ``version``; ``weights`` are its weights (pinned backends)."""
        raise NotImplementedError

    async def finished(self, group: int, member: int, ep: Episode) -> None:
        if ep.end == "world_error":  # kept for the author, never learned from: the run stops
            failed = self.run.save_failed(group, member, ep)
            raise ValueError(
                f"{world_error(ep)}; the episode is kept in {failed}; once the world is fixed, "
                f"`collective train --resume {self.run.path}`"
            )
        self.run.save_episode(group, member, ep)  # kept before anyone uses it
        await self._send.send((group, member, ep))

    async def groups(
        self, step: int, signal: Callable[[list[Episode]], bool] | None = None
    ) -> Drawn:
        """The step's B groups of G episodes, in order, once every one has finished. With
        ``signal`` (dynamic sampling, ``resample > 0``), each group without signal is replaced,
        in order, by the step's next reserve group that has it, while the reserves last; reserves
        are played in rounds of as many as there are groups to replace, so the choice is a
        function of the episodes' returns alone."""
        cfg = self.cfg
        B, D = cfg.groups_per_step, draws_per_step(cfg)
        first = step * D
        slots = list(range(first, first + B))
        await self._gather(slots)
        flat: list[int] = []
        reserves = list(range(first + B, first + D))
        while signal is not None and reserves:
            empty = [k for k, g in enumerate(slots) if not signal(self._group(g))]
            if not empty:
                break
            drawn, reserves = reserves[: len(empty)], reserves[len(empty) :]
            self._request(drawn)
            await self._gather(drawn)
            useful = [g for g in drawn if signal(self._group(g))]
            flat += [g for g in drawn if g not in useful]
            for k, g in zip(empty, useful, strict=False):
                flat.append(slots[k])
                slots[k] = g
        self._settle(step)
        G = cfg.group_size
        out = Drawn(
            ids=slots,
            groups=[[self.buffer.pop((g, i)) for i in range(G)] for g in slots],
            flat=sorted(flat),
        )
        for g in flat:
            for i in range(G):
                del self.buffer[(g, i)]
        return out

    def _group(self, g: int) -> list[Episode]:
        return [self.buffer[(g, i)] for i in range(self.cfg.group_size)]

    async def _gather(self, groups: list[int]) -> None:
        wanted = [(g, i) for g in groups for i in range(self.cfg.group_size)]
        while any(k not in self.buffer for k in wanted):
            g, i, ep = await self._recv.receive()
            self.buffer[(g, i)] = ep

    def _request(self, groups: list[int]) -> None:
        """Play these reserve groups (dynamic sampling; local rollouts only: config.py)."""
        raise NotImplementedError

    def _settle(self, step: int) -> None:
        """``step``'s groups are chosen: no reserve of it will be asked for."""


@dataclass(frozen=True, slots=True)
class Drawn:
    """A step's groups as the learner takes them: their group indices (``ids``, which name
    their episode files), the episodes, and the groups dropped for want of signal (dynamic
    sampling: played and kept on disk, never trained on)."""

    ids: list[int]
    groups: list[list[Episode]]
    flat: list[int]


class LocalRollouts(Rollouts):
    """Every rollout in this process: one conductor runs ``concurrency`` episodes at a time
    (everyone thinking at an instant is one policy batch), served by the backend's policy (a
    frozen copy of each live version's weights, or an SGLang fleet)."""

    def __init__(self, args: RolloutArgs, frozen: Policy | None = None) -> None:
        super().__init__(args)
        self.frozen = frozen  # the orchestrator's sub-agents' policy, if any
        self.schedule = Schedule(
            self.cfg, self.first_group, self.on_disk, pin=self.backend.pinned, commons=args.commons
        )
        self.schedule.latest = self.first_step
        self.conductor: Conductor | None = None

    @property
    def batch_mean(self) -> float:
        return self.conductor.batch_stats.mean if self.conductor is not None else 0.0

    @asynccontextmanager
    async def running(self) -> AsyncIterator[LocalRollouts]:
        serving = await self.backend.serve(self.model, self.serving_weights)
        if self.on_time is not None:
            serving = Watched(serving, self.on_time)
        policies = serving if self.frozen is None else {"trained": serving, "frozen": self.frozen}
        self.conductor = conductor = Conductor(policies)

        async def emit(ep: Episode) -> None:
            # Once the run is cancelled (Ctrl-C), an episode whose actors were cancelled can
            # still look finished ("idle") to the conductor: it must not be kept as if it had run.
            await trio.lowlevel.checkpoint_if_cancelled()
            g, i = self.schedule.issued.pop(ep.config.sample_seed)
            await self.finished(g, i, ep)

        stopped: list[Exception] = []

        async def play() -> None:
            try:
                await conductor.play(self.schedule, concurrency=self.cfg.concurrency, emit=emit)
            except Exception as e:
                # Cancel the training loop rather than fail beside it, so that the error is the
                # run's only one.
                stopped.append(e)
                nursery.cancel_scope.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(play)
            yield self
            nursery.cancel_scope.cancel()
        if stopped:
            raise stopped[0]

    async def publish(self, version: int, weights: Weights) -> None:
        await self.backend.publish(self.model, version, weights)
        self.schedule.publish(version)

    def _request(self, groups: list[int]) -> None:
        self.schedule.request(groups)

    def _settle(self, step: int) -> None:
        self.schedule.settle(step)
