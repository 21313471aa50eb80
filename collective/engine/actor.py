"""Actors: every agent is a trio task with a mailbox and channel subscriptions.

An actor's program is ordinary async code: observe, ``think`` (a policy call), ``act`` (a tool
or a communication primitive). Both calls park the task with the conductor; nothing an actor
does touches shared state directly. Between two parks an actor only reads: the world (frozen,
since the conductor commits effects only while every actor is parked), its own mailbox and its
channel cursors. That is why trio's scheduling order cannot change an episode.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from enum import IntEnum
from typing import Any, Final, Literal, Protocol

import trio

from collective.base.actions import ActionSpace, longest_action
from collective.base.seeding import derive_more
from collective.engine.comms import Comms, Message
from collective.engine.organisation import Organisation
from collective.engine.quiescence import Quiescence
from collective.records import EpisodeConfig, Turn
from collective.world import World
from policy.base import PolicyRequest, PolicyResponse


class RequestKind(IntEnum):
    """What a parked actor asks for: a policy answer, an action, or (the default program's
    turn) a policy answer acted on as given, which the conductor carries through without waking
    it."""

    THINK = 0
    ACT = 1
    THINK_ACT = 2


# The members as module constants (``Final``: a checker reads them as the literal members), for
# the hot path: compared by identity, ``request[0] is ACT``.
THINK: Final = RequestKind.THINK
ACT: Final = RequestKind.ACT
THINK_ACT: Final = RequestKind.THINK_ACT

# A parked actor's request, its kind and payload: the policy request to answer (THINK,
# THINK_ACT) or the action's text (ACT). A tuple, made once per park; a checker narrows the
# payload by the kind (``if request[0] is ACT``).
Request = (
    tuple[Literal[RequestKind.THINK, RequestKind.THINK_ACT], PolicyRequest]
    | tuple[Literal[RequestKind.ACT], str]
)


class Spaces(Protocol):
    """What an actor reads of its episode's cast (``collective.engine.cast.Cast``): its role's
    action space, and ``id_limit``, which grows (and the spaces with it) at each hire."""

    id_limit: int

    def space_for(self, role: str, group: int) -> ActionSpace: ...


class Stage(Protocol):
    """What an actor reads of the episode it plays in (``LiveEpisode``), and where it parks."""

    cfg: EpisodeConfig
    seed_root: int  # derive(cfg.sample_seed)
    now: float
    org: Organisation
    worlds: list[World]
    comms: Comms[Actor]
    quiet: Quiescence

    @property
    def cast(self) -> Spaces: ...  # (a property: read only, so the episode's Cast is one)

    def park(self, actor: Actor, request: Request) -> Coroutine[Any, Any, Any]: ...

    def observe_failed(self, actor: Actor, error: Exception) -> BaseException: ...

    def withdraw(self, actor: Actor) -> trio.lowlevel.Abort: ...


class Dismissed(BaseException):
    """Raised inside an actor's program when it is fired (the event is ``records.Fired``).

    The engine's signals to a program (this, ``EpisodeOver``, ``WorldStopped``) are
    BaseExceptions, as trio's ``Cancelled`` is: a program's ``except Exception`` around a turn
    must not swallow them, or turn them into a crash of the whole run."""


class EpisodeOver(BaseException):
    """Raised inside a parked actor's program when its episode ends (see ``LiveEpisode._end``):
    the end lets every parked actor go as a fire does, rather than have trio cancel each. A
    BaseException (see ``Dismissed``): a program's ``except Exception`` does not swallow the end
    and run on against closed worlds."""


class WorldStopped(BaseException):
    """Raised inside an actor's program when its observation raised: the world has a bug, and
    the episode ends at the next quiescence (see ``LiveEpisode.observe_failed``)."""


class Actor:
    """One agent. Slots keep an idle agent to a few hundred bytes beside its trio task.

    Who writes what: the park state (``request``, ``parked``, ``then_act``, ``waiting``,
    ``wait_token``, ``task``, ``acts``, ``turn_record``) only ``LiveEpisode``, whose parking section
    (``collective/engine/episode.py``) holds the contract and its state table; ``alive`` only
    ``Cast`` (who is in the episode); the mailbox, the cursors and what a prompt read
    (``inbox``, ``cursors``, ``read_ids``, ``missed``) ``Comms`` (``read_ids`` also ``prompt``,
    when nothing is unread), the last two reset by ``LiveEpisode`` once logged with the request;
    ``turn`` and the space (``space``, ``space_limit``, ``longest``) this class, at a request.
    Everyone else only reads."""

    __slots__ = (
        "acts",
        "alive",
        "cursors",
        "ep",
        "group",
        "id",
        "inbox",
        "local",
        "longest",
        "missed",
        "parked",
        "policy_key",
        "read_ids",
        "request",
        "role",
        "seed_root",
        "space",
        "space_limit",
        "task",
        "then_act",
        "turn",
        "turn_record",
        "wait_token",
        "waiting",
    )

    # Its trio task: a slot left unset until ``LiveEpisode._actor_main`` runs its program (read
    # only once it has parked, which it can only do after).
    task: trio.lowlevel.Task

    def __init__(self, ep: Stage, agent_id: int, role: str, group: int, local: int) -> None:
        self.ep = ep
        self.id = agent_id
        self.role = role
        self.group = group  # which world instance (islands) it lives in
        self.local = local  # its id inside that world
        self.policy_key = ep.org.policy_of(role)  # which of the conductor's policies answers it
        self.space: ActionSpace
        self.space_limit = 0  # the cast's id_limit its space was made for
        self.longest = 0  # longest_action(space)
        self._take_space()
        # derive(sample_seed, id), from the episode's derive(sample_seed): a turn's seed folds in
        # the turn: one fold a turn (its cost in instructions, which an idle agent of one turn
        # pays twice, root and turn: bench/results/engine/README.md, "Where an idle agent's
        # bookkeeping goes").
        self.seed_root = derive_more(ep.seed_root, agent_id)
        self.turn = 0
        self.acts = 0
        self.inbox: deque[Message] | None = None  # created on first delivery
        self.cursors: dict[str, int] = {}  # channel -> next post sequence to show
        self.request: Request | None = None
        self.read_ids: tuple[int, ...] = ()
        self.missed = 0  # channel posts rolled past before this agent could see them
        self.turn_record: Turn | None = None
        self.waiting = False
        self.wait_token = 0
        self.alive = True
        self.parked = False
        self.then_act = False  # its answer in flight is to be acted on as given (THINK_ACT)

    # -- what an agent program calls ------------------------------------------------------------

    # think, act and think_and_act are plain functions that return the parking coroutine
    # rather than coroutines of their own: ``await actor.think(p)`` reads the same, a park
    # creates one coroutine frame fewer, and an idle agent holds one frame less.

    def think(self, prompt: str) -> Coroutine[Any, Any, PolicyResponse]:
        """Ask the shared policy for the next action; answered at the next quiescence batch."""
        return self.ep.park(self, (THINK, self._request(prompt)))

    def think_and_act(self, prompt: str) -> Coroutine[Any, Any, str]:
        """``act((await think(prompt)).text)`` in one park: returns the action's result.

        The same requests, in the same instants and the same order, as the two calls; but the
        answer is handed straight to the action without resuming this task in between, so a
        turn costs trio one wake-and-park instead of two (the default program's whole turn)."""
        return self.ep.park(self, (THINK_ACT, self._request(prompt)))

    def _request(self, prompt: str) -> PolicyRequest:
        ep = self.ep
        cfg = ep.cfg
        if self.space_limit != ep.cast.id_limit:  # a hire grew the ids an agent may address
            self._take_space()
        turn = self.turn
        self.turn = turn + 1
        return PolicyRequest(
            agent=self.id,
            turn=turn,
            prompt=prompt,
            space=self.space,
            seed=derive_more(self.seed_root, turn),  # derive(sample_seed, id, turn)
            max_tokens=cfg.max_output_tokens,
            temperature=cfg.temperature,
            top_p=cfg.nucleus,
            asked=ep.now,
            # The pin is the trained policy's: a frozen policy has one version, for good.
            version=cfg.policy_version if self.policy_key == "trained" else -1,
            role=self.role,
        )

    def _take_space(self) -> None:
        """The action space of its role as the cast has it now: asked only when the ids agents
        may address have grown since (a hire), not at every request."""
        cast = self.ep.cast
        self.space = cast.space_for(self.role, self.group)
        self.space_limit = cast.id_limit
        self.longest = longest_action(self.space)

    def act(self, text: str) -> Coroutine[Any, Any, str]:
        """Take one action (validated by the conductor); returns its result when it lands."""
        return self.ep.park(self, (ACT, text))

    def abort(self, _: object) -> trio.lowlevel.Abort:
        """Cancelled while parked (the run around the episode was stopped; the episode's own
        end lets parked actors go with ``EpisodeOver`` instead): see ``LiveEpisode.withdraw``.
        (A method, not a closure made at every park.)"""
        return self.ep.withdraw(self)

    def observe(self) -> str:
        """The world's observation for this agent; one that raises or is not a str ends the
        episode (a bug in the world), and this agent's program with it."""
        try:
            text = self.ep.worlds[self.group].observe(self.local)
            if type(text) is not str:
                raise TypeError(f"observe() returned {type(text).__name__} {text!r:.60}, not a str")
        except Exception as e:
            raise self.ep.observe_failed(self, e) from e
        return text

    def prompt(self, last_result: str) -> str:
        """The observation, then what arrived since the last turn, then the last result.

        Reading consumes the mailbox and moves the channel cursors (``Comms.unread``). With an
        empty mailbox in an episode where nobody has posted (most turns of most episodes),
        nothing is unread, and the lines are joined without asking.
        """
        text = self.observe()
        comms = self.ep.comms
        if self.inbox or comms.posted:
            text = "\n".join([text, *comms.unread(self)])
        else:
            self.read_ids = ()  # what unread leaves when nothing is unread
        return f"{text}\nlast: {last_result}\n>"


def prompt_digest(prompt: str) -> str:
    """The prompt's 8-byte blake2b, in hex (``Asked.prompt``). Copied from an empty hash made
    once: a new blake2b parses its whole parameter block (key, salt, person, fanout, ...) each
    time, and this runs at every think."""
    h = _EMPTY_DIGEST.copy()
    h.update(prompt.encode())
    return h.hexdigest()


_EMPTY_DIGEST: Final = hashlib.blake2b(digest_size=8)


Program = Callable[[Actor], Awaitable[None]]


async def default_program(actor: Actor) -> None:
    """The agent loop every built-in organisation uses: observe, think, act, forever.

    The loop never ends by itself: the time limit, the world finishing, or being fired ends it.
    """
    result = "you have just started"
    while True:
        result = await actor.think_and_act(actor.prompt(result))
