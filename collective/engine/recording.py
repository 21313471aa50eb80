"""An episode's record as it grows, and where it goes.

Every event in commit order, every turn as answered (its outcome filled in when its action
lands), the score curve and the action spaces the turns used. With a recorder (an episode file
being written, or a replay's check against the original) the record goes out in chunks between
instants (:meth:`Recording.flush`), so a long episode holds only what came since the last chunk;
``collective.records.fileformat`` says what a chunk holds and in which order. The live episode
(:mod:`collective.engine.episode`) decides what happens; this keeps what it decided.
"""

from __future__ import annotations

from typing import Any, Protocol

from collective.base.actions import ActionSpace
from collective.engine.actor import Actor
from collective.records import (
    Chunk,
    Closing,
    Episode,
    EpisodeConfig,
    Opening,
    Part,
    Stats,
    Turn,
    TurnEnd,
    blank_turn,
)
from policy.base import PolicyRequest, PolicyResponse


class Recorder(Protocol):
    """Where a streamed episode's record goes as it grows: an episode file being written
    (``collective.records.EpisodeWriter``) or a replay's check against the original."""

    def write(self, part: Part) -> None: ...


class Recording:
    """One live episode's record: ``emit`` appends an event (the hot path: a bound
    ``list.append``), ``turn``/``answered``/``ended`` keep the turns, ``curve`` the score as it
    changes; ``flush`` and ``close`` send it to the recorder, or ``close`` returns it whole."""

    def __init__(self, cfg: EpisodeConfig, recorder: Recorder | None) -> None:
        self.cfg = cfg
        self.events: list[Any] = []
        self.emit = self.events.append  # every event, in commit order
        self.turns: list[Turn] = []
        self.curve: list[tuple[float, float]] = []
        # With a recorder, the record goes out in chunks between instants (see flush): these
        # lists then hold only what came since, and these count what went.
        self.recorder = recorder
        self.written_events = self.written_turns = self.written_spaces = self.written_curve = 0
        self.ends: list[TurnEnd] = []  # turns' outcomes since the last chunk
        self.open_turns: dict[int, int] = {}  # id(turn) -> its index, until its action lands
        if recorder is not None:
            recorder.write(Opening(cfg))
        self.space_list: list[ActionSpace] = []  # every space a turn used, for the learner
        self.space_index: dict[int, int] = {}  # id(space) -> index in space_list

    def turn(self, actor: Actor, req: PolicyRequest, resp: PolicyResponse, at: float) -> Turn:
        """The turn of ``actor``'s answer ``resp`` to ``req``, landed at ``at`` (not kept:
        ``answered`` keeps a live one, and the episode appends the others)."""
        space = self.space_index.get(id(req.space))  # (space_number, but for a new space)
        if space is None:
            space = self.space_number(req.space)
        return Turn(
            agent=actor.id,
            turn=req.turn,
            role=actor.role,
            policy=actor.policy_key,
            asked=req.asked,
            answered=at,
            prompt=req.prompt if self.cfg.keep_prompts else "",
            text=resp.text,
            token_ids=resp.token_ids,
            logprobs=resp.logprobs,
            prompt_tokens=resp.prompt_tokens,
            version=resp.version,
            space=space,
        )

    def answered(self, turn: Turn) -> None:
        """Keep a turn whose action is still to land (its outcome comes by ``ended``)."""
        if self.recorder is not None:
            self.open_turns[id(turn)] = self.written_turns + len(self.turns)
        self.turns.append(turn)

    def ended(self, tr: Turn, tool: str, kind: str, ok: bool, result: str, now: float) -> None:
        """A turn's action landed: its outcome, in the turn and (streamed) among the ends."""
        tr.tool, tr.kind, tr.ok, tr.result, tr.finished = tool, kind, ok, result[:200], now
        if self.recorder is not None:
            self.ends.append(TurnEnd(self.open_turns.pop(id(tr)), tool, kind, ok, tr.result, now))

    def space_number(self, space: ActionSpace) -> int:
        i = self.space_index.get(id(space))
        if i is None:
            i = self.space_index[id(space)] = len(self.space_list)
            self.space_list.append(space)  # keeps it alive, so its id stays unique
        return i

    @property
    def event_count(self) -> int:
        return self.written_events + len(self.events)

    def flush(self) -> None:
        """Send what the record gained since the last chunk to the recorder. Called between
        instants only, so the outcomes sent are every outcome up to now, in the file's order
        (finished, index). Turns go as answered: one whose action landed already is sent
        blank, its outcome among the ends."""
        assert self.recorder is not None
        self.ends.sort(key=lambda e: (e.finished, e.index))
        curve = self.curve[self.written_curve :]
        self.recorder.write(
            Chunk(
                list(self.events),
                [blank_turn(t) for t in self.turns],
                self.ends,
                self.space_list[self.written_spaces :],
                curve,
            )
        )
        self.written_events += len(self.events)
        self.written_turns += len(self.turns)
        self.written_spaces = len(self.space_list)
        self.events.clear()  # in place: emit appends to it
        self.turns = []
        self.ends = []
        self.curve = self.curve[-1:]  # the last point stays: advance compares with it
        self.written_curve = 1

    def close(
        self,
        score: float,
        duration: float,
        end: str,
        stats: Stats,
        world_metrics: dict[str, float],
    ) -> Episode:
        """The episode's record. With a recorder, the rest of it and its closing go there, and
        what is returned holds everything but the events, turns, curve and spaces (empty)."""
        stats.events = self.event_count
        if self.recorder is not None:
            self.flush()
            self.recorder.write(
                Closing(score, duration, end, stats, world_metrics, self.written_turns)
            )
            return Episode(
                config=self.cfg,
                score=score,
                duration=duration,
                end=end,
                stats=stats,
                curve=[],
                events=[],
                turns=[],
                world_metrics=world_metrics,
            )
        return Episode(
            config=self.cfg,
            score=score,
            duration=duration,
            end=end,
            stats=stats,
            curve=self.curve,
            events=self.events,
            turns=self.turns,
            spaces=self.space_list,
            world_metrics=world_metrics,
        )
