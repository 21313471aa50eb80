"""How fast the engine runs agents, how much memory an agent costs, and how it compares.

Three parts, each printing its figures and saving JSON and PNG plots:

* the sweep (issue 2): the random policy in the ``Crowd`` world (``bench/city.py``) with 10 to
  100,000 agents, each size in a fresh process so its memory can be measured honestly. Per
  size: agent-turns and events per second of wall time; engine overhead per agent-turn (wall
  time minus the time spent inside the policy, per turn); peak memory per agent (growth of the
  process's peak resident set over its size before the episode, divided by the agents); memory
  per idle agent (resident set growth once all but one agent wait for a message that never
  comes); and the mean policy batch against the number of agents that began thinking at that
  simulated instant.
* the comparison (issue 7): the same scenario stepped by this engine, by a round-based asyncio
  loop and by SimPy (``bench/baselines.py``), in this one process, at 1,000 and 10,000 agents,
  dense (every agent runs the random policy) and sparse (most agents wait for a message);
  agent-turns per second and their ratios; each run twice, with digests of its event order,
  and once more under a policy whose answers arrive with real, random delays, as a model
  server's do. Beside them in every case, the floor (``play_floor``): a bare trio program that
  wakes and parks the same agents at the same instants as the engine did (its schedule read
  from the engine's own episode), spawning them, quiescence by counter and the end as the
  engine does them, and nothing else: what any engine with every agent a trio task must pay, so
  each row reads engine / floor / SimPy. Medians over interleaved repetitions, wall and CPU
  time. And what trio and SimPy cost bare per step (wake-and-park, an agent's start-wait-end).
* ``--million``: 1,000,000 resident agents in one process with sparse activity: memory per
  agent, events and agent-turns per second.
* ``--records`` (issue 14): what an episode's record costs, the engine at a git ref (``main``
  by default: the format before) beside the working tree's, in one run: ``collective run
  --out``, ``replay`` and ``trace`` of the same episode (random policy, workshop), each in a
  fresh process, for its file's size, bytes per turn, wall time and peak resident memory.

    python bench/engine.py            # sweep + comparison, ~10 minutes
    python bench/engine.py --quick    # a small version, ~7 seconds
    python bench/engine.py --million  # several minutes, ~6 GB
    python bench/engine.py --records  # ~20 minutes, ~7 GB

Timings are wall-clock, as the issue asks, on a machine other jobs may share: each JSON also
records CPU seconds and the load average around the run.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import json
import math
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import trio
from tqdm import tqdm

from bench.baselines import Town, no_wake, run_rounds, run_simpy
from bench.city import CROWD, SparsePolicy
from collective import (
    Conductor,
    Episode,
    EpisodeConfig,
)
from collective.engine.conductor import roomy_gc
from collective.records import Asked, encode_episode
from collective.replay import verify
from experiments.gitref import engine_at, python_env
from policy.base import PolicyRequest, PolicyResponse

ROOT = Path(__file__).resolve().parent.parent

RESULTS = ROOT / "bench" / "results"
TURNS_PER_AGENT_SECOND = 0.36  # measured rate of the dense scenario, to size time limits
# Twenty cells an agent, each to fill 255 times: no timed run can finish the task early, so
# every run lasts its whole time limit (the one-cell default would end small runs in minutes).
ENDLESS = {"cells_per_agent": 20, "target": 255}


# -- measuring -----------------------------------------------------------------------------------


def rss() -> int:
    """Resident set size of this process, in bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss() -> int:
    """The largest resident set this process has had (VmHWM), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def available_memory() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


class GcClock:
    """Seconds spent in Python's cyclic garbage collector, reported apart for transparency."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start

    def __enter__(self) -> GcClock:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


class Probe:
    """Wraps a policy: records each batch's size and the simulated instant it was asked at, and
    calls ``at_batch`` (with that instant) before answering."""

    def __init__(self, inner: Any, at_batch: Callable[[float], None] | None = None) -> None:
        self.inner = inner
        self.name = inner.name
        self.version = inner.version
        self.batches: list[tuple[float, int]] = []
        self.at_batch = at_batch

    async def generate(self, requests: Sequence[PolicyRequest]) -> list[PolicyResponse]:
        asked = requests[0].asked
        self.batches.append((asked, len(requests)))
        if self.at_batch is not None:
            self.at_batch(asked)
        return await self.inner.generate(requests)

    async def aclose(self) -> None:
        await self.inner.aclose()


def batching(ep: Episode, batches: list[tuple[float, int]]) -> dict[str, float]:
    """Batch sizes against the agents that began thinking at each instant, from the log.

    The log is the independent witness: every think is an ``Asked`` event at the instant it
    began. A batch "equals the agents thinking at that instant" when each instant's requests
    all went out in one batch, so sizes and counts match instant by instant. Reported beside
    them: how many agents were mid-thought (asked earlier, not yet answered) at each batch.
    """
    thinking = Counter(e.t for e in ep.events if isinstance(e, Asked))
    per_instant: dict[float, list[int]] = {}
    for t, size in batches:
        per_instant.setdefault(t, []).append(size)
    single = sum(1 for t, sizes in per_instant.items() if sizes == [thinking[t]])
    # Agents mid-thought when a batch goes out: asked at or before it, answered after it. Most
    # were asked at earlier instants, so they went out in earlier batches.
    asked = sorted(turn.asked for turn in ep.turns)
    answered = sorted(turn.answered for turn in ep.turns)
    in_flight = [bisect_right(asked, t) - bisect_right(answered, t) for t, _ in batches]
    return {
        "batches": len(batches),
        "batch_mean": sum(s for _, s in batches) / max(1, len(batches)),
        "batch_largest": max((s for _, s in batches), default=0),
        "thinking_instants": len(thinking),
        "thinking_mean": sum(thinking.values()) / max(1, len(thinking)),
        "instants_in_one_batch": single / max(1, len(thinking)),
        "in_flight_mean": sum(in_flight) / max(1, len(in_flight)),
    }


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def environment() -> dict[str, Any]:
    import msgspec
    import simpy

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        commit = ""
    return {
        "python": platform.python_version(),
        "trio": trio.__version__,
        "simpy": simpy.__version__,
        "msgspec": msgspec.__version__,
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "commit": commit,
        "load_before": load(),
    }


# -- the sweep: one size per process -----------------------------------------------------------


def dense_config(agents: int, turns: int) -> EpisodeConfig:
    """Every agent runs the random policy, for about ``turns`` agent-turns in all."""
    limit = min(100_000.0, max(5.0, turns / (agents * TURNS_PER_AGENT_SECOND)))
    return EpisodeConfig(
        world=CROWD, params=ENDLESS, agents=agents, org="city", time_limit=limit, max_wait=30
    )


def run_point(agents: int, turns: int, idle: bool, show: bool) -> dict[str, Any]:
    """One sweep point, in this (fresh) process."""
    if idle:
        # Agents 0 to 7 keep the clock moving; everyone else answers its first turn with
        # "wait 0" and waits, with no timeout, for a message (which only 0 to 7 send).
        cfg = EpisodeConfig(world=CROWD, agents=agents, org="city", time_limit=60.0, max_wait=30)
        inner = SparsePolicy(activity=0.0, pinned=min(8, agents))
    else:
        cfg = dense_config(agents, turns)
        inner = SparsePolicy(1.0)
    settled: list[int] = []

    def at_batch(t: float) -> None:
        if idle and t >= 2.0 and not settled:  # every idle agent has parked by now
            settled.append(rss())
        if bar is not None:
            bar.update(int(min(t, cfg.time_limit)) - bar.n)

    probe = Probe(inner, at_batch)
    conductor = Conductor(probe)
    bar = (
        tqdm(total=cfg.time_limit, desc=f"{agents} agents", unit="sim s", leave=False)
        if show
        else None
    )
    gc.collect()
    base = rss()
    with GcClock() as gc_clock:
        wall0, cpu0 = time.perf_counter(), time.process_time()
        ep = trio.run(lambda: conductor.play([cfg]))[0]
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    if bar is not None:
        bar.close()
    peak = peak_rss()
    policy = conductor.batch_stats.policy_seconds
    turns_done = ep.stats.turns
    out: dict[str, Any] = {
        "agents": agents,
        "idle": idle,
        "sim_seconds": ep.duration,
        "end": ep.end,
        "turns": turns_done,
        "events": len(ep.events),
        "wall_s": wall,
        "cpu_s": cpu,
        "gc_s": gc_clock.seconds,
        "policy_s": policy,
        "turns_per_s": turns_done / wall,
        "events_per_s": len(ep.events) / wall,
        "overhead_us_per_turn": (wall - policy) / turns_done * 1e6,
        "peak_rss_growth_per_agent": (peak - base) / agents,
        "peak_rss_growth_per_turn": (peak - base) / turns_done,
        **batching(ep, probe.batches),
    }
    if idle:
        out["idle_rss_per_agent"] = (settled[0] - base) / agents if settled else math.nan
    return out


def sweep(sizes: list[int], turns: int, repeats: int, show: bool) -> list[dict[str, Any]]:
    """Every size dense (``repeats`` times: the fastest counts, the machine may be shared) and
    idle (once), each run in a fresh process."""
    rows = []
    jobs = [
        (n, idle) for n in sizes for idle in (False, True) for _ in range(1 if idle else repeats)
    ]
    done_runs: dict[tuple[int, bool], list[dict[str, Any]]] = {}
    for n, idle in tqdm(jobs, desc="sweep", unit="run", disable=not show):
        target = max(turns, 5 * n)  # at least five turns an agent: more than its first
        cmd = [sys.executable, str(Path(__file__)), "--point", str(n), "--turns", str(target)]
        if idle:
            cmd.append("--idle")
        if not show:
            cmd.append("--quiet")
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"sweep point {n} agents (idle={idle}) failed:\n{done.stderr}")
        done_runs.setdefault((n, idle), []).append(json.loads(done.stdout.strip().splitlines()[-1]))
    for results in done_runs.values():
        best = min(results, key=lambda r: r["wall_s"])
        best["walls_s"] = [round(r["wall_s"], 3) for r in results]
        rows.append(best)
    return rows


# -- the comparison: this engine, asyncio rounds, SimPy, one process ---------------------------


def comparison_config(agents: int, activity: float, turns: int) -> EpisodeConfig:
    limit = min(300.0, max(10.0, turns / (agents * activity * TURNS_PER_AGENT_SECOND)))
    return EpisodeConfig(
        world=CROWD, params=ENDLESS, agents=agents, org="city", time_limit=limit, max_wait=30
    )


def digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=8).hexdigest()


# A system plays a case and returns its agent-turns and how to digest its event order: the
# comparison stops its clock before the digest, which witnesses determinism and is no part of
# any system's work (the engine's digest encodes its whole record, the others' a short log).
Played = tuple[int, Callable[[], str]]


def play_engine(cfg: EpisodeConfig, policy: Any) -> tuple[int, Callable[[], str], Episode]:
    conductor = Conductor(policy)
    ep = trio.run(lambda: conductor.play([cfg]))[0]
    return ep.stats.turns, lambda: digest(encode_episode(ep)), ep


def play_baseline(step: Callable[..., Town], cfg: EpisodeConfig, policy: Any) -> Played:
    """A baseline's run: its turns counted as the engine counts them, those whose answer
    landed before the time limit (a policy call still in flight at the end is work done, but
    no turn)."""
    town = step(cfg, policy)
    return town.landed, town.digest


SYSTEMS: dict[str, tuple[str, Callable[[EpisodeConfig, SparsePolicy], Played]]] = {
    "engine": ("this engine", lambda cfg, pol: play_engine(cfg, pol)[:2]),
    "asyncio_rounds": ("asyncio rounds, 1 s", lambda cfg, pol: play_baseline(run_rounds, cfg, pol)),
    # The same loop at a finer step, closer to the policy latencies it simulates (~0.4 s):
    # only in the dense case, where it costs least.
    "asyncio_rounds_fine": (
        "asyncio rounds, 0.25 s",
        lambda cfg, pol: play_baseline(partial(run_rounds, dt=0.25), cfg, pol),
    ),
    "simpy": ("SimPy", lambda cfg, pol: play_baseline(run_simpy, cfg, pol)),
    "floor": ("floor: bare trio, the engine's schedule", lambda cfg, pol: play_floor(cfg, pol)),
    "work": ("work: the engine's turns, no scheduler", lambda cfg, pol: play_work(cfg, pol)),
}
#: The engine's schedule of each case, for the floor: (agents, limit, activity) -> (turns,
#: waves). Read from an untimed engine run before the timed ones (``compare``).
SCHEDULES: dict[tuple[int, float, float], tuple[int, list[list[int]]]] = {}
#: The engine's turns of each case, for ``play_work``: (agents, limit, activity) -> (asked,
#: agent, landed) of every policy call, in the order the engine answered them (the answers
#: still in flight at the end last, not landed). Read with ``SCHEDULES``.
TURN_ORDERS: dict[tuple[int, float, float], list[tuple[float, int, bool]]] = {}


def learn_case(cfg: EpisodeConfig, activity: float, ep: Episode) -> None:
    """Keep what the floor and the work of a case replay from the engine's episode ``ep``."""
    key = (cfg.agents, cfg.time_limit, activity)
    SCHEDULES[key] = (ep.stats.turns, wake_schedule(ep))
    TURN_ORDERS[key] = [(t.asked, t.agent, t.answered < cfg.time_limit) for t in ep.turns]


def wake_schedule(ep: Episode) -> list[list[int]]:
    """The engine's scheduling pattern in ``ep``: the agents it woke, wave by wave, in time
    order. A turn wakes its agent's task once, when the action's result comes back
    (``finished``: the answer itself is started while the actor stays parked,
    ``Actor.think_and_act``); an agent woken twice at one instant is in two waves there, as
    the engine runs it twice."""
    wakes = sorted((t.finished, t.agent) for t in ep.turns if t.finished >= 0)
    waves: list[list[int]] = []
    i = 0
    while i < len(wakes):
        j = i
        while j < len(wakes) and wakes[j][0] == wakes[i][0]:
            j += 1
        seen: Counter[int] = Counter()
        at: list[list[int]] = []
        for _, agent in wakes[i:j]:
            if seen[agent] == len(at):
                at.append([])
            at[seen[agent]].append(agent)
            seen[agent] += 1
        waves += at
        i = j
    return waves


def play_floor(cfg: EpisodeConfig, policy: SparsePolicy) -> Played:
    """The floor of a case: its agents as trio tasks, spawned in a nursery, each parked with
    ``wait_task_rescheduled`` and woken with ``reschedule`` wave by wave as the engine woke
    them (``SCHEDULES``), a wave's end found by counter (the last task to park wakes the
    conductor), and every task ended at the close by an exception rescheduled into it, as
    ``LiveEpisode._end`` ends parked actors. No world, policy, prompt, heap or record."""
    import outcome

    turns, waves = SCHEDULES[(cfg.agents, cfg.time_limit, policy.activity)]

    class Over(Exception):
        pass

    def abort(_: object) -> trio.lowlevel.Abort:
        return trio.lowlevel.Abort.SUCCEEDED

    async def floor() -> None:
        tasks: list[Any] = [None] * cfg.agents
        runnable = 0
        conductor: Any = None

        async def actor(i: int) -> None:
            nonlocal runnable, conductor
            tasks[i] = trio.lowlevel.current_task()
            with contextlib.suppress(Over):
                while True:
                    runnable -= 1
                    if runnable == 0 and conductor is not None:
                        task, conductor = conductor, None
                        trio.lowlevel.reschedule(task)
                    await trio.lowlevel.wait_task_rescheduled(abort)

        async def quiescent() -> None:
            nonlocal conductor
            while runnable:
                conductor = trio.lowlevel.current_task()
                await trio.lowlevel.wait_task_rescheduled(abort)

        async with trio.open_nursery() as nursery:
            for i in range(cfg.agents):
                runnable += 1
                nursery.start_soon(actor, i)
            for wave in waves:
                await quiescent()
                for i in wave:
                    runnable += 1
                    trio.lowlevel.reschedule(tasks[i], outcome.Value(None))
            await quiescent()
            for task in tasks:
                trio.lowlevel.reschedule(task, outcome.Error(Over()))

    trio.run(floor)
    return turns, lambda: digest(json.dumps(waves).encode())


def play_work(cfg: EpisodeConfig, policy: SparsePolicy) -> Played:
    """The work of a case that no scheduler can save: the engine's own turns (``TURN_ORDERS``),
    in the order it answered them, each through the baselines' ``Town`` as SimPy's processes do
    it (prompt and request with its seed, the policy's answer, the turn's record, parsing, the
    action's duration and effect; only the first three for an answer still in flight at the
    end, as the engine), with no clock, heap, task, batch or event record. An engine
    whose every agent is a trio task pays at least the floor plus this, so SimPy / (floor +
    work) is the most engine / SimPy any such engine could reach on the case, with no
    bookkeeping of its own (``ceiling`` in each row)."""
    order = TURN_ORDERS[(cfg.agents, cfg.time_limit, policy.activity)]
    town = Town(cfg, policy)
    residents = town.residents
    for now, agent, landed in order:
        r = residents[agent]
        req = town.request(r, now)
        resp = policy.answer(req)
        town.answered(r, req, resp, now)
        if not landed:  # asked and answered, but the episode ended first: no action
            continue
        town.landed += 1
        action = town.parse(r, resp.text, now)
        if action is not None and action.tool != "wait":
            town.duration(r, action)
            r.last = town.apply(r, action, now, no_wake)
    return town.landed, town.digest


def compare(
    sizes: list[int], activities: list[float], turns: int, repeats: int, show: bool
) -> list[dict[str, Any]]:
    """Each system ``repeats`` times per case, interleaved so that a busy moment on a shared
    machine hurts all alike; the fastest run of each counts, and all its digests are kept."""
    cases = [(n, a) for n in sizes for a in activities]
    jobs = [
        (n, a, name)
        for n, a in cases
        for _ in range(repeats)
        for name in SYSTEMS
        if name != "asyncio_rounds_fine" or a == 1.0
    ]
    for n, activity in cases:  # the floor's and work's turns, from an untimed engine run of each
        cfg = comparison_config(n, activity, turns)
        learn_case(cfg, activity, play_engine(cfg, SparsePolicy(activity))[2])
    runs: dict[tuple[int, float, str], list[tuple[int, str, float, float]]] = {}
    for n, activity, name in tqdm(jobs, desc="compare", unit="run", disable=not show):
        cfg = comparison_config(n, activity, turns)
        gc.collect()
        with roomy_gc():  # the same collector settings the engine plays under, for all
            wall0, cpu0 = time.perf_counter(), time.process_time()
            turns_done, digest_order = SYSTEMS[name][1](cfg, SparsePolicy(activity))
            wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        order = digest_order()
        runs.setdefault((n, activity, name), []).append((turns_done, order, wall, cpu))
    out = []
    for n, activity in cases:
        row: dict[str, Any] = {
            "agents": n,
            "activity": activity,
            "sim_seconds": comparison_config(n, activity, turns).time_limit,
        }
        for name in SYSTEMS:
            done = runs.get((n, activity, name))
            if not done:
                continue
            ranked = sorted(done, key=lambda r: r[2])
            median = ranked[len(ranked) // 2]  # (of an even count: the slower middle one)
            cpu = sorted(r[3] for r in done)[len(done) // 2]
            row[name] = {
                "turns": median[0],
                "wall_s": median[2],
                "cpu_s": cpu,
                "turns_per_s": median[0] / median[2],
                "turns_per_cpu_s": median[0] / cpu,
                "cpu_us_per_turn": cpu / median[0] * 1e6,
                "walls_s": [round(r[2], 3) for r in done],
                "digests": [r[1] for r in done],
                "same_order_every_run": len({r[1] for r in done}) == 1,
            }
        e, e_cpu = row["engine"]["turns_per_s"], row["engine"]["turns_per_cpu_s"]
        for name in SYSTEMS:
            if name != "engine" and name in row:
                row[f"engine_over_{name}"] = e / row[name]["turns_per_s"]
                row[f"engine_over_{name}_cpu"] = e_cpu / row[name]["turns_per_cpu_s"]
        # The most engine / SimPy an engine of trio tasks with no bookkeeping could reach.
        row["ceiling_cpu"] = row["simpy"]["cpu_us_per_turn"] / (
            row["floor"]["cpu_us_per_turn"] + row["work"]["cpu_us_per_turn"]
        )
        # Where the engine is below SimPy but within 10% of what any all-trio engine must pay.
        row["at_the_floor"] = (
            row["engine_over_simpy_cpu"] < 1.0 and row["engine_over_floor_cpu"] >= 0.9
        )
        out.append(row)
    return out


class Jittery:
    """A policy whose answers take real, random time, as a model server's do (an unseeded
    stream: nothing the simulation controls). Async for trio and asyncio alike; SimPy, whose
    processes cannot await, gets the same delay as a blocking sleep."""

    def __init__(self, inner: SparsePolicy, most: float, sleep: Callable[[float], Any]) -> None:
        self.inner, self.most, self.sleep = inner, most, sleep
        self.name, self.version = inner.name, inner.version
        self.jitter = random.Random()

    async def generate(self, requests: Sequence[PolicyRequest]) -> list[PolicyResponse]:
        await self.sleep(self.jitter.uniform(0, self.most))
        return await self.inner.generate(requests)

    def answer(self, r: PolicyRequest) -> PolicyResponse:
        time.sleep(self.jitter.uniform(0, self.most))
        return self.inner.answer(r)

    async def aclose(self) -> None:
        return None


def determinism(agents: int, limit: float, most: float) -> dict[str, Any]:
    """Each system twice under a jittery policy: does the event order repeat? Only the engine can
    also replay its episode from the record and check it event for event."""
    import asyncio

    cfg = EpisodeConfig(world=CROWD, agents=agents, org="city", time_limit=limit, max_wait=30)
    out: dict[str, Any] = {"agents": agents, "sim_seconds": limit, "jitter_s": most}
    runs: dict[str, list[tuple[str, float]]] = {"engine": [], "asyncio_rounds": [], "simpy": []}
    for _ in range(2):  # (each clock stops before the digest, as in compare)
        t0 = time.perf_counter()
        _, order, ep = play_engine(cfg, Jittery(SparsePolicy(1.0), most, trio.sleep))
        wall = time.perf_counter() - t0
        runs["engine"].append((order(), wall))
        t0 = time.perf_counter()
        town = run_rounds(cfg, Jittery(SparsePolicy(1.0), most, asyncio.sleep))  # type: ignore[arg-type]
        wall = time.perf_counter() - t0
        runs["asyncio_rounds"].append((town.digest(), wall))
        t0 = time.perf_counter()
        town = run_simpy(cfg, Jittery(SparsePolicy(1.0), most, trio.sleep))  # type: ignore[arg-type]
        wall = time.perf_counter() - t0
        runs["simpy"].append((town.digest(), wall))
    for name, pair in runs.items():
        out[name] = {
            "digests": [d for d, _ in pair],
            "same_order_twice": pair[0][0] == pair[1][0],
            "wall_s": [round(w, 3) for _, w in pair],
        }
    out["engine"]["replay_identical"] = verify(ep) is None
    return out


# Agents stepped per instant by the floors below: two (where trio's per-instant round trip
# weighs most) and 70, the mean batch of the 1,000-agent sweep point (``batch_mean``).
FLOOR_AGENTS = (2, 70)
LIFECYCLE_AGENTS = 10_000


def trio_floor(rounds: int = 50_000) -> dict[str, float]:
    """What trio alone costs, nothing else: a conductor task wakes ``n`` parked tasks, they
    park again, the last one wakes the conductor (the engine's pattern, with
    ``wait_task_rescheduled`` and ``reschedule``), and no work in between. Per instant with
    two agents, and per agent-step with each of ``FLOOR_AGENTS`` stepped per instant."""
    import outcome

    async def main(n: int, rounds: int) -> float:
        parked: list[Any] = []
        state = {"runnable": 0, "conductor": None}

        def abort(_: object) -> trio.lowlevel.Abort:
            return trio.lowlevel.Abort.SUCCEEDED

        async def actor() -> None:
            while True:
                parked.append(trio.lowlevel.current_task())
                state["runnable"] -= 1
                if state["runnable"] == 0 and state["conductor"] is not None:
                    task, state["conductor"] = state["conductor"], None
                    trio.lowlevel.reschedule(task)
                await trio.lowlevel.wait_task_rescheduled(abort)

        async with trio.open_nursery() as nursery:
            for _ in range(n):
                state["runnable"] += 1
                nursery.start_soon(actor)
            t0 = time.perf_counter()
            for _ in range(rounds):
                while state["runnable"]:
                    state["conductor"] = trio.lowlevel.current_task()
                    await trio.lowlevel.wait_task_rescheduled(abort)
                waking = parked[:]
                parked.clear()
                for task in waking:
                    state["runnable"] += 1
                    trio.lowlevel.reschedule(task, outcome.Value(None))
            seconds = time.perf_counter() - t0
            nursery.cancel_scope.cancel()
        return seconds

    out = _floor_figures(lambda n, steps: trio.run(main, n, steps), rounds)
    out["agent_lifecycle_us"] = _lifecycle(_trio_lifecycle)
    return out


def _trio_lifecycle(n: int) -> float:
    """``n`` tasks spawned in a nursery, each parked once, then ended as ``LiveEpisode._end``
    ends parked actors (rescheduled with an error, the nursery cancelled): the least an agent
    that is a trio task costs, whatever it does."""
    import outcome

    class Over(Exception):
        pass

    async def main() -> float:
        parked: list[Any] = []

        def abort(_: object) -> trio.lowlevel.Abort:
            return trio.lowlevel.Abort.SUCCEEDED

        async def actor() -> None:
            parked.append(trio.lowlevel.current_task())
            with contextlib.suppress(Over):
                await trio.lowlevel.wait_task_rescheduled(abort)

        t0 = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(n):
                nursery.start_soon(actor)
            while len(parked) < n:
                await trio.lowlevel.checkpoint()
            for task in parked:
                trio.lowlevel.reschedule(task, outcome.Error(Over()))
            nursery.cancel_scope.cancel()
        return time.perf_counter() - t0

    return trio.run(main)


def simpy_floor(rounds: int = 50_000) -> dict[str, float]:
    """SimPy's counterpart of ``trio_floor``: processes that each yield a timeout of one
    simulated second, so every instant steps all of them, and no work in between."""
    import simpy

    def proc(env: simpy.Environment) -> Any:
        while True:
            yield env.timeout(1)

    def seconds_for(n: int, steps: int) -> float:
        env = simpy.Environment()
        for _ in range(n):
            env.process(proc(env))
        t0 = time.perf_counter()
        env.run(until=steps)
        return time.perf_counter() - t0

    out = _floor_figures(seconds_for, rounds)
    out["agent_lifecycle_us"] = _lifecycle(_simpy_lifecycle)
    return out


def _simpy_lifecycle(n: int) -> float:
    """SimPy's counterpart of ``_trio_lifecycle``: ``n`` processes started, each waiting once on
    an event, then all their events triggered and the processes run to their end."""
    import simpy

    def proc(event: simpy.Event) -> Any:
        yield event

    t0 = time.perf_counter()
    env = simpy.Environment()
    events = [env.event() for _ in range(n)]
    for event in events:
        env.process(proc(event))
    env.run(until=1)
    for event in events:
        event.succeed()
    env.run(until=2)
    return time.perf_counter() - t0


def _lifecycle(seconds_for: Callable[[int], float]) -> float:
    """µs per agent of a lifecycle measure, ``LIFECYCLE_AGENTS`` at once, best of five."""
    best = math.inf
    for _ in range(5):
        gc.collect()
        with roomy_gc():
            best = min(best, seconds_for(LIFECYCLE_AGENTS))
    return best / LIFECYCLE_AGENTS * 1e6


def _floor_figures(seconds_for: Callable[[int, int], float], rounds: int) -> dict[str, float]:
    """A floor's figures from ``seconds_for(n, steps)``, the time ``steps`` instants of ``n``
    agents each take: per instant with two agents, per agent-step with each of
    ``FLOOR_AGENTS``. About ``2 * rounds`` agent-steps each."""
    out = {}
    for n in FLOOR_AGENTS:
        steps = max(rounds * 2 // n, 200)
        with roomy_gc():
            seconds = seconds_for(n, steps)
        if n == 2:
            out["instant_with_two_agents_us"] = seconds / steps * 1e6
        out[f"agent_step_us_{n}_per_instant"] = seconds / steps / n * 1e6
    return out


def floors_text(trio_bare: dict[str, float], simpy_bare: dict[str, float]) -> str:
    many = f"agent_step_us_{FLOOR_AGENTS[-1]}_per_instant"
    return (
        f"bare scheduling, one instant stepping two agents: trio "
        f"{trio_bare['instant_with_two_agents_us']:.1f} µs, SimPy "
        f"{simpy_bare['instant_with_two_agents_us']:.1f} µs; per agent-step with "
        f"{FLOOR_AGENTS[-1]} an instant: trio {trio_bare[many]:.2f} µs, "
        f"SimPy {simpy_bare[many]:.2f} µs; an agent's whole life (start, one wait, end; "
        f"{LIFECYCLE_AGENTS:,} at once): trio {trio_bare['agent_lifecycle_us']:.1f} µs, "
        f"SimPy {simpy_bare['agent_lifecycle_us']:.1f} µs"
    )


# -- the million ---------------------------------------------------------------------------------


def million(agents: int, activity: float, limit: float, show: bool) -> dict[str, Any]:
    """``agents`` resident in one process, a fraction ``activity`` of them active."""
    need = agents * 9_000  # measured ~4.5 KB per idle agent, with room for the first batch
    if available_memory() < need:
        raise SystemExit(
            f"--million: {agents} agents need about {need / 2**30:.1f} GiB, "
            f"only {available_memory() / 2**30:.1f} GiB is available"
        )
    cfg = EpisodeConfig(world=CROWD, agents=agents, org="city", time_limit=limit, max_wait=30)
    samples: list[tuple[float, float, int]] = []  # (wall seconds, simulated seconds, rss)

    def at_batch(t: float) -> None:
        samples.append((time.perf_counter() - wall0, t, rss()))
        if bar is not None:
            bar.update(int(min(t, limit)) - bar.n)

    probe = Probe(SparsePolicy(activity, pinned=1), at_batch)
    conductor = Conductor(probe)
    bar = tqdm(total=int(limit), desc=f"{agents:,} agents", unit="sim s") if show else None
    gc.collect()
    base = rss()
    with GcClock() as gc_clock:
        wall0, cpu0 = time.perf_counter(), time.process_time()
        ep = trio.run(lambda: conductor.play([cfg]))[0]
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    if bar is not None:
        bar.close()
    peak = peak_rss()
    # The steady state: from the first batch after every idle agent has parked (their answers
    # land within two simulated seconds) to the last batch.
    settle = next((s for s in samples if s[1] >= 10.0), samples[-1])
    last = samples[-1]
    steady_wall = last[0] - settle[0]
    steady_events = sum(1 for e in ep.events if settle[1] <= e.t < last[1])
    return {
        "agents": agents,
        "activity": activity,
        "active_agents": sum(1 for a in range(agents) if probe.inner.active(a)),
        "sim_seconds": ep.duration,
        "end": ep.end,
        "turns": ep.stats.turns,
        "events": len(ep.events),
        "wall_s": wall,
        "cpu_s": cpu,
        "gc_s": gc_clock.seconds,
        "policy_s": conductor.batch_stats.policy_seconds,
        "first_batch_wall_s": samples[0][0] if samples else math.nan,
        "after_last_batch_wall_s": wall - last[0],  # the end: cancelling every agent's task
        "resident_rss_per_agent": (settle[2] - base) / agents,
        "peak_rss_per_agent": (peak - base) / agents,
        "steady_sim_seconds": last[1] - settle[1],
        "steady_wall_s": steady_wall,
        "steady_events": steady_events,
        "steady_events_per_s": steady_events / steady_wall if steady_wall > 0 else math.nan,
        "events_per_s": len(ep.events) / wall,
        "turns_per_s": ep.stats.turns / wall,
        "samples": [
            [round(w, 3), round(t, 3), r] for w, t, r in samples[:: max(1, len(samples) // 400)]
        ],
    }


# -- plots -------------------------------------------------------------------------------------


def measured(args: list[str], code: Path) -> dict[str, Any]:
    """Run ``python -m collective.cli ARGS`` on the engine in ``code``, in a fresh process:
    its wall time, peak resident set (the child's own, from wait4) and JSON answer. Its output
    goes to files, not pipes: a pipe nobody reads while we wait would stop it."""
    with tempfile.TemporaryFile("w+") as stdout, tempfile.TemporaryFile("w+") as stderr:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "collective.cli", *args],
            cwd=code,
            env=python_env(code),
            stdout=stdout,
            stderr=stderr,
            text=True,
        )
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        stdout.seek(0)
        stderr.seek(0)
        out, err = stdout.read(), stderr.read()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(args)} failed ({proc.returncode}):\n{err[-2000:]}")
    lines = [line for line in out.splitlines() if line.startswith("{")]
    return {
        "wall_s": round(wall, 2),
        "peak_rss_bytes": usage.ru_maxrss * 1024,
        "exit": proc.returncode,
        "answer": json.loads(lines[-1]) if lines else out[-300:],
    }


def records(sizes: list[tuple[int, float]], ref: str, show: bool) -> list[dict[str, Any]]:
    """Each size's episode written, replayed and traced by the engine at ``ref`` and by this
    one, the same episode (same seed, same random policy) on both."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        engines = {"before": engine_at(ref, Path(tmp) / "before", ROOT), "after": ROOT}
        steps = [(n, limit, which) for n, limit in sizes for which in engines]
        for n, limit, which in tqdm(steps, desc="records", disable=not show):
            code = engines[which]
            ep = Path(tmp) / f"{which}-{n}.msgpack"
            run = ["run", "workshop", "--agents", str(n), "--time-limit", str(limit)]
            row: dict[str, Any] = {"format": which, "agents": n, "time_limit": limit}
            row["write"] = measured([*run, "--out", str(ep)], code)
            row["file_bytes"] = ep.stat().st_size
            summary = row["write"]["answer"]
            row["events"], row["turns"], row["end"] = (
                summary["events"],
                summary["turns"],
                summary["end"],
            )
            row["bytes_per_turn"] = round(row["file_bytes"] / summary["turns"], 1)
            row["replay"] = measured(["replay", str(ep)], code)
            row["trace"] = measured(["trace", str(ep), "--out", str(ep) + ".json"], code)
            Path(str(ep) + ".json").unlink()
            ep.unlink()
            rows.append(row)
            if show:
                tqdm.write(
                    f"{which:>6} {n:>7,} agents: {row['file_bytes'] / 1e6:8.1f} MB, "
                    f"{row['bytes_per_turn']:7.1f} B/turn; peak write "
                    f"{row['write']['peak_rss_bytes'] / 2**30:.2f} GiB, replay "
                    f"{row['replay']['peak_rss_bytes'] / 2**30:.2f} GiB, trace "
                    f"{row['trace']['peak_rss_bytes'] / 2**30:.2f} GiB"
                )
    return rows


def plot_records(rows: list[dict[str, Any]], path: Path) -> None:
    plt = _plt()
    sizes = sorted({r["agents"] for r in rows})
    panels = [
        ("bytes per turn", lambda r: r["bytes_per_turn"], "bytes"),
        ("peak memory, run --out", lambda r: r["write"]["peak_rss_bytes"] / 2**30, "GiB"),
        ("peak memory, replay", lambda r: r["replay"]["peak_rss_bytes"] / 2**30, "GiB"),
        ("peak memory, trace", lambda r: r["trace"]["peak_rss_bytes"] / 2**30, "GiB"),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.6))
    width = 0.38
    for ax, (title, value, unit) in zip(axes, panels, strict=True):
        for k, which in enumerate(("before", "after")):
            ys = [
                value(r) for n in sizes for r in rows if r["agents"] == n and r["format"] == which
            ]
            xs = [i + (k - 0.5) * width for i in range(len(ys))]
            bars = ax.bar(xs, ys, width, label=which)
            ax.bar_label(bars, fmt="%.3g", fontsize=7)
        ax.set_xticks(range(len(sizes)), [f"{n:,} agents" for n in sizes])
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(unit)
    axes[0].legend()
    fig.suptitle("An episode's record on workshop: the format before and after (issue 14)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_sweep(rows: list[dict[str, Any]], path: Path) -> None:
    plt = _plt()
    dense = [r for r in rows if not r["idle"]]
    idle = [r for r in rows if r["idle"]]
    n = [r["agents"] for r in dense]
    fig, ax = plt.subplots(2, 2, figsize=(11, 8))
    a = ax[0][0]
    a.plot(n, [r["turns_per_s"] for r in dense], "o-", label="agent-turns / s")
    a.plot(n, [r["events_per_s"] for r in dense], "s-", label="events / s")
    a.set(xscale="log", yscale="log", xlabel="agents", title="throughput (wall clock)")
    a.legend()
    a = ax[0][1]
    a.plot(n, [r["overhead_us_per_turn"] for r in dense], "o-", label="engine overhead")
    a.axhline(50, color="r", ls="--", label="target: 50 µs at 10,000 agents")
    a.set(xscale="log", xlabel="agents", ylabel="µs per agent-turn", title="engine overhead")
    a.set_ylim(bottom=0)
    a.legend()
    a = ax[1][0]
    a.plot(
        [r["agents"] for r in idle],
        [r["idle_rss_per_agent"] / 1024 for r in idle],
        "s-",
        label="per idle agent (resident)",
    )
    a.plot(
        n,
        [r["peak_rss_growth_per_turn"] / 1024 for r in dense],
        "o-",
        label="per agent-turn of a dense run (peak / turns: its record)",
    )
    a.axhline(5, color="r", ls="--", label="target: 5 KB per idle agent")
    a.set(xscale="log", xlabel="agents", ylabel="KB", title="memory (growth of the resident set)")
    a.set_ylim(bottom=0)
    a.legend(fontsize=8)
    a = ax[1][1]
    a.plot(n, [r["batch_mean"] for r in dense], "o-", label="mean policy batch")
    a.plot(n, [r["thinking_mean"] for r in dense], "x--", label="mean agents starting to think")
    a.plot(n, [r["in_flight_mean"] for r in dense], "^:", label="mean agents mid-thought")
    a.set(xscale="log", yscale="log", xlabel="agents", title="batching (dense run)")
    a.legend()
    fig.suptitle("collective engine: random policy in the Crowd world, city organisation")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_comparison(rows: list[dict[str, Any]], path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(12, 5))
    width = 0.8 / len(SYSTEMS)
    for i, (key, (label, _)) in enumerate(SYSTEMS.items()):
        xs = [j + (i - (len(SYSTEMS) - 1) / 2) * width for j, r in enumerate(rows) if key in r]
        ys = [r[key]["turns_per_cpu_s"] for r in rows if key in r]
        color = {"floor": "black", "work": "grey"}.get(key)
        ax.bar(xs, ys, width, label=label, color=color)
    top = max(r[k]["turns_per_cpu_s"] for r in rows for k in SYSTEMS if k in r)
    for j, r in enumerate(rows):
        note = [f"×{r['engine_over_asyncio_rounds_cpu']:.2f} asyncio"]
        if "engine_over_asyncio_rounds_fine_cpu" in r:
            note.append(f"×{r['engine_over_asyncio_rounds_fine_cpu']:.2f} asyncio 0.25 s")
        note.append(f"×{r['engine_over_simpy_cpu']:.2f} SimPy")
        note.append(f"×{r['engine_over_floor_cpu']:.2f} floor")
        note.append(f"ceiling ×{r['ceiling_cpu']:.2f} SimPy")
        ax.text(j, top * 1.6, "\n".join(note), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(
        range(len(rows)), [f"{r['agents']:,} agents\nactivity {r['activity']:g}" for r in rows]
    )
    ax.set(yscale="log", ylabel="agent-turns / CPU second (median run)")
    ax.set_ylim(top=top * 8)
    ax.set_title(
        "same world, policy and primitives: this engine vs asyncio rounds vs SimPy\n"
        "beside the floor (a bare trio program waking the engine's agents at its instants) and "
        "the work of its turns with no scheduler;\n"
        "the engine's ratio to each above, and the ceiling: SimPy / (floor + work)"
    )
    ax.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_million(result: dict[str, Any], path: Path) -> None:
    plt = _plt()
    s = result["samples"]
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    ax[0].plot([w for w, _, _ in s], [r / result["agents"] / 1024 for _, _, r in s])
    ax[0].set(
        xlabel="wall seconds (from the first policy batch)",
        ylabel="KB per agent",
        title="the process's resident set / agents",
    )
    ax[1].plot([w for w, _, _ in s], [t for _, t, _ in s])
    ax[1].set(
        xlabel="wall seconds (from the first policy batch)",
        ylabel="simulated seconds",
        title="simulated clock",
    )
    fig.suptitle(
        f"{result['agents']:,} resident agents, {result['active_agents']:,} active: "
        f"{result['resident_rss_per_agent'] / 1024:.2f} KB each, "
        f"{result['steady_events_per_s']:,.0f} events/s in steady state"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- the command line ----------------------------------------------------------------------------


def write(result: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")


def report_sweep(rows: list[dict[str, Any]]) -> None:
    print(
        "agents   turns/s  events/s  overhead µs/turn  peak KB/agent  idle KB/agent  "
        "batch  thinking  one-batch"
    )
    idle = {r["agents"]: r for r in rows if r["idle"]}
    for r in rows:
        if r["idle"]:
            continue
        i = idle.get(r["agents"], {})
        print(
            f"{r['agents']:>7,} {r['turns_per_s']:>9,.0f} {r['events_per_s']:>9,.0f} "
            f"{r['overhead_us_per_turn']:>17.1f} {r['peak_rss_growth_per_agent'] / 1024:>14.2f} "
            f"{i.get('idle_rss_per_agent', math.nan) / 1024:>14.2f} {r['batch_mean']:>6.2f} "
            f"{r['thinking_mean']:>9.2f} {r['instants_in_one_batch']:>9.1%}"
        )


def report_comparison(rows: list[dict[str, Any]]) -> None:
    print(
        "agents  activity  CPU µs a turn: engine  floor   work   SimPy  asyncio | engine / SimPy "
        "(CPU, wall)  ceiling  engine / floor (CPU)  same order every run (e/a/s)"
    )
    for r in rows:
        same = "/".join(
            "yes" if r[k]["same_order_every_run"] else "NO"
            for k in ("engine", "asyncio_rounds", "simpy")
        )
        note = "  (within 10% of the floor, below SimPy)" if r["at_the_floor"] else ""
        print(
            f"{r['agents']:>6,} {r['activity']:>9g} {r['engine']['cpu_us_per_turn']:>21.1f} "
            f"{r['floor']['cpu_us_per_turn']:>6.1f} {r['work']['cpu_us_per_turn']:>6.1f} "
            f"{r['simpy']['cpu_us_per_turn']:>7.1f} "
            f"{r['asyncio_rounds']['cpu_us_per_turn']:>8.1f} | "
            f"{r['engine_over_simpy_cpu']:>9.2f} {r['engine_over_simpy']:>5.2f} "
            f"{r['ceiling_cpu']:>8.2f} {r['engine_over_floor_cpu']:>21.2f}  {same}{note}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a short version (~7 s)")
    p.add_argument("--million", action="store_true", help="1,000,000 resident agents")
    p.add_argument("--out", type=Path, default=None, help="where the engine figures go")
    p.add_argument("--city-out", type=Path, default=None, help="where the issue-7 figures go")
    p.add_argument("--agents", default=None, help="sweep sizes, e.g. 10,100,1000")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--replot", action="store_true", help="redraw the PNGs from the JSON files")
    p.add_argument("--records", action="store_true", help="the record's size and memory")
    p.add_argument(
        "--compare-only",
        metavar="TURNS,REPEATS",
        help="only the comparison (1,000 and 10,000 agents, activity 1, 0.1, 0.01) and the "
        "bare trio and SimPy floors, e.g. 30000,2; writes comparison.json under --out",
    )
    p.add_argument("--ref", default="main", help="--records: the engine before (a git ref)")
    # one sweep point, run by the sweep in a fresh process
    p.add_argument("--point", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--turns", type=int, default=100_000, help=argparse.SUPPRESS)
    p.add_argument("--idle", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    show = not a.quiet
    if a.point is not None:
        print(json.dumps(run_point(a.point, a.turns, a.idle, show)))
        return 0
    engine_dir = a.out or (RESULTS / "engine" / ("quick" if a.quick else ""))
    city_dir = a.city_out or (engine_dir / "city" if a.quick else RESULTS / "city")
    if a.replot:
        for d in (engine_dir, city_dir):
            if (d / "engine.json").exists():
                plot_sweep(json.loads((d / "engine.json").read_text())["sweep"], d / "engine.png")
            if (d / "comparison.json").exists():
                rows = json.loads((d / "comparison.json").read_text())["comparison"]
                plot_comparison(rows, d / "comparison.png")
            if (d / "million.json").exists():
                plot_million(json.loads((d / "million.json").read_text()), d / "million.png")
            if (d / "records.json").exists():
                plot_records(
                    json.loads((d / "records.json").read_text())["records"], d / "records.png"
                )
        return 0
    env = environment()

    if a.records:
        sizes = [(100, 120.0)] if a.quick else [(1_000, 600.0), (100_000, 600.0)]
        rows = records(sizes, a.ref, show)
        write(
            {"environment": {**env, "load_after": load()}, "ref": a.ref, "records": rows},
            engine_dir / "records.json",
        )
        plot_records(rows, engine_dir / "records.png")
        return 0

    if a.million:
        result = million(1_000_000, activity=0.001, limit=600.0, show=show)
        result["environment"] = {**env, "load_after": load()}
        for d in (engine_dir, city_dir):
            write(result, d / "million.json")
            plot_million(result, d / "million.png")
        print(
            f"{result['agents']:,} agents ({result['active_agents']:,} active): "
            f"{result['resident_rss_per_agent']:,.0f} B resident per agent, "
            f"{result['peak_rss_per_agent']:,.0f} B peak per agent; "
            f"{result['steady_events_per_s']:,.0f} events/s in steady state, "
            f"{result['events_per_s']:,.0f} events/s over the whole run "
            f"({result['wall_s']:.0f} s wall, first batch of every agent after "
            f"{result['first_batch_wall_s']:.0f} s)"
        )
        return 0

    if a.compare_only:
        cmp_turns, repeats = (int(x) for x in a.compare_only.split(","))
        out_dir = a.out or RESULTS / "engine" / "compare_only"
        comparison = compare([1_000, 10_000], [1.0, 0.1, 0.01], cmp_turns, repeats, show)
        floors = {"trio_floor": trio_floor(), "simpy_floor": simpy_floor()}
        report_comparison(comparison)
        print(floors_text(floors["trio_floor"], floors["simpy_floor"]))
        write(
            {"environment": {**env, "load_after": load()}, "comparison": comparison, **floors},
            out_dir / "comparison.json",
        )
        plot_comparison(comparison, out_dir / "comparison.png")
        return 0

    if a.quick:
        sizes, turns, sweep_repeats = [10, 100, 1000], 4_000, 1
        cmp_sizes, activities, cmp_turns, repeats = [300], [1.0, 0.1], 3_000, 2
        jitter = (30, 20.0, 0.001)
    else:
        sizes, turns, sweep_repeats = [10, 100, 1_000, 10_000, 100_000], 100_000, 2
        cmp_sizes, activities, cmp_turns, repeats = [1_000, 10_000], [1.0, 0.1, 0.01], 60_000, 3
        jitter = (100, 30.0, 0.002)
    if a.agents:
        sizes = [int(x) for x in a.agents.split(",")]

    rows = sweep(sizes, turns, sweep_repeats, show)
    report_sweep(rows)
    write({"environment": {**env, "load_after": load()}, "sweep": rows}, engine_dir / "engine.json")
    plot_sweep(rows, engine_dir / "engine.png")

    comparison = compare(cmp_sizes, activities, cmp_turns, repeats, show)
    det = determinism(*jitter)
    floor = trio_floor()
    simpy_bare = simpy_floor()
    report_comparison(comparison)
    print(floors_text(floor, simpy_bare))
    print(
        "jittery policy, same order twice: "
        + ", ".join(
            f"{k} {'yes' if det[k]['same_order_twice'] else 'NO'}"
            for k in ("engine", "asyncio_rounds", "simpy")
        )
        + f"; engine replay identical: {det['engine']['replay_identical']}"
    )
    result = {
        "environment": {**env, "load_after": load()},
        "comparison": comparison,
        "determinism": det,
        "trio_floor": floor,
        "simpy_floor": simpy_bare,
    }
    for d in (engine_dir, city_dir):
        write(result, d / "comparison.json")
        plot_comparison(comparison, d / "comparison.png")
    print(f"wrote {engine_dir} and {city_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
