"""Goods that outlive an episode: a world's commons kept across a training run, and credit for
what was put there, measured rather than assumed.

A world may declare a commons (``World.commons``: a library of solved problems, an archive)
and add to it from its tools (``World.contribute``, recorded in the episode as a
``commons_put`` world event). With ``commons = "on"`` or ``"credit"`` a training run keeps it:

- **Versions.** The commons an episode pinned to policy version v starts from is version v: the
  entries contributed by the episodes of steps 0..v-1, merged after each step in (group,
  member, event) order, a repeated entry once, at most ``commons.size`` kept (the oldest go).
  It reaches the world as its commons parameter (a ``collective.world.Commons``: version and
  entries), so it is in the episode's record: replay and fork start from the same commons, and
  a run stays a function of its config.
- **Credit** (``commons = "credit"``). A per-episode return gives the turn that contributed
  nothing: the good pays episodes that start later. So at each step, ``commons_credit_entries``
  entries the step's episodes started with are sampled, and for each, ``commons_credit_reruns``
  of those episodes are re-run from their start (the same config, seeds and weights) without
  that entry. Their score with it minus without it, discounted by ``commons_discount`` per step
  between the contribution and this use, is the entry's credited value; the turn that made it
  (read back from its episode file) joins this step's samples with that value as its advantage.
  The re-runs are counted (``commons_rollouts``) against the step's own rollouts.

  Such a sample is late by construction: its turn was sampled ``lag + 1`` or more versions ago,
  so the staleness bound that drops old episodes does not apply to it; the importance ratio
  against its behaviour logprobs (exact, as for every sample) and the clip bound what it can do.
  An entry drawn again at a later step is measured again and paid again: its value to each
  step's episodes, discounted by how long ago it was made.

``metrics.jsonl`` reports the commons' size, what the step added, how much its episodes used
it (the world's ``commons_used`` metric) and the credited value.
"""

from __future__ import annotations

import ast
import random
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import numpy as np
import trio

from collective.base.seeding import derive
from collective.engine.conductor import Conductor
from collective.records import Episode, EpisodeConfig
from collective.records.schema import Happened
from collective.rl.config import CommonsCredit, CommonsOn, TrainConfig
from collective.rl.forks import trained_turn
from collective.rl.learner import Sample
from collective.world.world import COMMONS_EVENT, Commons

#: The stream tag of a step's credit draws.
CREDIT_DRAW = 0x636F6D6D6F6E73


class Entry(msgspec.Struct, frozen=True, kw_only=True):
    """One good in the commons: its text, who made it (step, group, member, and the index of
    the turn in that episode's record; -1 when no turn matches) and the versions it is in."""

    text: str
    step: int
    group: int
    member: int
    turn: int
    added: int  # the first version that holds it
    dropped: int = -1  # the first version that no longer does (-1: still held)


def contributions(ep: Episode) -> list[tuple[int, str, int]]:
    """What an episode added to its world's commons, in record order: (agent id, entry, index
    of the turn whose action made it, or -1)."""
    out = []
    head = COMMONS_EVENT + "("
    for ev in ep.events:
        if isinstance(ev, Happened) and ev.call.startswith(head):
            agent, text = ast.literal_eval(ev.call[len(COMMONS_EVENT) :])
            turn = next(
                (
                    j
                    for j, t in enumerate(ep.turns)
                    if t.agent == agent and t.finished == ev.t and t.ok and t.token_ids
                ),
                -1,
            )
            out.append((int(agent), str(text), turn))
    return out


class CommonsStore:
    """The commons of a training run: every entry with the versions it is in, kept while a
    version that holds it may still be asked for (the newest ``lag + 1``)."""

    def __init__(self, cfg: TrainConfig, param: str, entries: Sequence[Entry] = ()) -> None:
        self.cfg = cfg
        assert isinstance(cfg.commons, CommonsOn | CommonsCredit), "a store needs a commons"
        self.size = cfg.commons.size
        self.param = param  # the world's constructor parameter that receives the commons
        self.entries = list(entries)

    def view(self, version: int) -> list[Entry]:
        return [e for e in self.entries if e.added <= version and not 0 <= e.dropped <= version]

    def commons(self, version: int, without: str | None = None) -> Commons:
        return Commons(
            version=version,
            entries=tuple(e.text for e in self.view(version) if e.text != without),
        )

    def apply(self, ep: EpisodeConfig, version: int, without: str | None = None) -> EpisodeConfig:
        """``ep`` starting from commons version ``version`` (less ``without``)."""
        held = msgspec.to_builtins(self.commons(version, without))
        return msgspec.structs.replace(ep, params={**ep.params, self.param: held})

    def merge(self, step: int, groups: list[list[Episode]]) -> int:
        """Step ``step``'s contributions, making version ``step + 1``; returns how many were
        new."""
        version = step + 1
        held = self.view(step)
        texts = {e.text for e in held}
        first = step * self.cfg.groups_per_step
        added = 0
        for g, episodes in enumerate(groups):
            for i, ep in enumerate(episodes):
                for _, text, turn in contributions(ep):
                    if text in texts:
                        continue
                    texts.add(text)
                    self.entries.append(
                        Entry(
                            text=text,
                            step=step,
                            group=first + g,
                            member=i,
                            turn=turn,
                            added=version,
                        )
                    )
                    added += 1
        live = [e for e in self.entries if e.dropped < 0]
        for e in live[: max(0, len(live) - self.size)]:  # the oldest go
            self.entries[self.entries.index(e)] = msgspec.structs.replace(e, dropped=version)
        keep_from = version - self.cfg.lag  # the oldest version still asked for
        self.entries = [e for e in self.entries if not 0 <= e.dropped <= keep_from]
        return added


def step_commons(
    cfg: TrainConfig,
    step: int,
    groups: list[list[Episode]],
    store: CommonsStore,
    policy_of: Callable[[int], Any],
    maker: Callable[[int, int], Episode | None],
) -> tuple[list[Sample], dict[str, Any]]:
    """A step's commons work: its credit (``commons = "credit"``: re-runs without sampled
    entries, the makers' turns as samples) and its merge. ``policy_of(v)``: the policy of
    version v; ``maker(group, member)``: that episode's record, if kept. Run it in a thread
    (the re-runs are a trio run of their own). Returns the credit samples and the metrics."""
    flat = [ep for episodes in groups for ep in episodes]
    version = _version_of(flat[0].config, store.param)
    held = store.view(version)
    samples: list[Sample] = []
    credits: list[float] = []
    reruns = 0
    if isinstance(cfg.commons, CommonsCredit):
        rng = random.Random(derive(cfg.seed, CREDIT_DRAW, step))
        eligible = [e for e in held if e.turn >= 0]  # (a maker turn to pay)
        chosen = rng.sample(eligible, min(cfg.commons.entries, len(eligible)))
        for entry in chosen:
            which = rng.sample(range(len(flat)), min(cfg.commons.reruns, len(flat)))
            delta = _rerun_delta([flat[k] for k in which], store, entry.text, policy_of)
            reruns += len(which)
            value = cfg.commons.discount ** (step - entry.step) * delta
            credits.append(value)
            ep = maker(entry.group, entry.member)
            if ep is None:
                raise RuntimeError(
                    f"commons credit: the episode that made {entry.text!r} (group "
                    f"{entry.group}, member {entry.member}) is not in the run directory"
                )
            t = ep.turns[entry.turn]
            if not trained_turn(t):
                continue  # a frozen policy's turn (or one answered without a model): not learned
            samples.append(
                Sample(
                    t.prompt,
                    t.token_ids,
                    ep.spaces[t.space],
                    t.logprobs,
                    value,
                    1.0,
                    t.version,
                    t.role,
                )
            )
    added = store.merge(step, groups)
    used = [ep.world_metrics.get("commons_used", 0.0) for ep in flat]
    return samples, {
        "commons_size": len(held),
        "commons_added": added,
        "commons_used": float(np.mean(used)),
        "commons_credit": float(np.mean(credits)) if credits else None,
        "commons_credited_turns": len(samples),
        "commons_rollouts": reruns,
    }


def _version_of(cfg: EpisodeConfig, param: str) -> int:
    return int(cfg.params.get(param, {}).get("version", 0))


def _rerun_delta(
    episodes: list[Episode], store: CommonsStore, text: str, policy_of: Callable[[int], Any]
) -> float:
    """Mean score of ``episodes`` minus that of their re-runs without the entry ``text``."""
    configs = [
        store.apply(ep.config, _version_of(ep.config, store.param), without=text) for ep in episodes
    ]
    by_version: dict[int, list[int]] = {}
    for k, ep in enumerate(episodes):
        by_version.setdefault(ep.config.policy_version, []).append(k)
    scores = [0.0] * len(episodes)
    for v, idx in by_version.items():
        policy = policy_of(v)

        async def play(idx: list[int] = idx, policy: Any = policy) -> list[Episode]:
            conductor = Conductor({"trained": policy, "frozen": policy})
            return await conductor.play([configs[k] for k in idx], concurrency=len(idx))

        for k, ep in zip(idx, trio.run(play), strict=True):
            scores[k] = ep.score
    return float(np.mean([e.score for e in episodes]) - np.mean(scores))
