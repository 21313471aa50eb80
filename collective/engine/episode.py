"""One live episode: its worlds, its actors, its agenda of due events, and where effects land.

This is where an agent's message goes. Every effect on shared state (a tool call, a delivery, a
post, a hire or fire, a world's own event) is applied here, by the conductor, either when it
starts a parked actor's request (``start_requests``, in agent-id order) or when the simulated
clock reaches the effect (``advance``, in the agenda's order ``(time, priority, agent, seq)``:
see ``collective.engine.agenda``). Actors are resumed only inside ``advance``, so everything an
actor
reads was committed before it ran.

A world method that raises (anything but a tool's ``ToolError``) is a ``WorldBug``: it is
caught where the conductor entered the episode (``advance``, ``start_requests``), logged as a
``Failed`` event, and the episode ends ``world_error``, its record whole up to there.
"""

from __future__ import annotations

import inspect
import math
import operator
import time
from collections.abc import Awaitable, Coroutine
from typing import Any

import outcome
import trio

from collective.base.actions import (
    Action,
    ActionError,
    parse_action,
)
from collective.base.log import get_logger
from collective.base.primitives import PRIMITIVES
from collective.base.seeding import derive
from collective.engine.actor import (
    ACT,
    THINK_ACT,
    Actor,
    Dismissed,
    EpisodeOver,
    Program,
    Request,
    WorldStopped,
    prompt_digest,
)
from collective.engine.agenda import Agenda, Answer, Land, Resume, Timer, WorldEvent
from collective.engine.cast import Cast
from collective.engine.comms import Comms, Outcome
from collective.engine.quiescence import Quiescence, Resumed, Signalled
from collective.engine.recording import Recorder, Recording
from collective.engine.replayed import Replay, recorded_bug
from collective.records import (
    CHUNK_RECORDS,
    Asked,
    Began,
    Committed,
    Ended,
    Episode,
    EpisodeConfig,
    Failed,
    Fired,
    Happened,
    Hired,
    Rejected,
    Spawned,
    Stats,
    Thought,
    Woke,
)
from collective.world import Scalar, ToolError, World, WorldBug, checked_score
from collective.world.outside import from_record
from policy.base import PolicyRequest, PolicyResponse

log = get_logger("collective.engine.episode")

_BY_ID = operator.attrgetter("id")


# What the engine raises inside a program to end it: caught where the actor's task ends, also
# inside the group of a nursery of the program's own. (Not ``except*``: it wraps every bare
# exception in a group to match it, a cost per agent at each episode's end: bench/results/engine/.)
ENGINE_SIGNALS = (Dismissed, EpisodeOver, WorldStopped)


class LiveEpisode:
    def __init__(
        self,
        cfg: EpisodeConfig,
        quiet: Quiescence,
        program: Program,
        replay: Replay | None = None,
        recorder: Recorder | None = None,
    ) -> None:
        self.cfg = cfg
        self.seed_root = derive(cfg.sample_seed)  # what every agent's seeds fold from
        self.quiet = quiet
        self.program = program
        self.replay = replay
        self.max_events = cfg.max_events
        self.capped = "event_limit"  # what reaching max_events ends the episode as
        bound = replay.most_events if replay is not None else None
        if bound is not None and bound < cfg.max_events:
            # The replay's own bound, not the cap the record declares: named apart, so a
            # diverged replay does not read as one that reached the 5,000,000-event cap.
            self.max_events, self.capped = bound, "replay_bound"
        # A replay's outside worlds open from the record, not from their service.
        with from_record(None if replay is None else replay.opening):
            self.cast = Cast(cfg)
        self.org = self.cast.org
        self.worlds = self.cast.worlds
        self.actors = self.cast.actors
        self.now = 0.0
        self.t0_wall = 0.0  # real mode: the trio clock reading at simulated time 0
        self.agenda = Agenda()
        self.pending: list[Actor] = []
        self.rec = Recording(cfg, recorder)  # (its Opening goes to the recorder now)
        self.emit = self.rec.emit  # the record: every event, in commit order
        self.stats = Stats()
        self.comms = Comms(cfg, self.org, self.actors, self.stats)
        self.ended = False
        self.end_reason = ""
        self.final_score = 0.0
        self.world_metrics: dict[str, float] = {}
        self.nursery: trio.Nursery | None = None
        # While an instant is being applied, actors resumed or hired at it are held here and
        # let run only once every event of the instant is applied (see advance).
        self.holding = False
        self.held: list[tuple[trio.lowlevel.Task, outcome.Outcome[Any]]] = []
        self.hired: list[Actor] = []
        self.failures: list[WorldBug] = []  # observations that raised, found at quiescence
        self.group_of = self.cast.group_of
        for w in self.worlds:
            for t, fn, args in w._attach(self):  # the events its constructor scheduled
                self.agenda.push(t, self.group_of[id(w)], WorldEvent(w, fn, args))
        try:
            self.rec.curve.append((0.0, self.score()))
        except WorldBug as bug:
            for w in self.worlds:
                w._detach()
            raise ValueError(f"world {cfg.world!r}: {bug.line()}") from bug.cause

    # -- setup ----------------------------------------------------------------------------------

    @trio.lowlevel.enable_ki_protection
    async def host(self, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Own the episode's nursery: its actors live and die in it, and the time limit cancels
        it (structured concurrency: nothing outlives its episode).

        The episode's tasks (this one, its actors', and the conductor's) are protected from
        KeyboardInterrupt: trio raises Ctrl-C in the main task at its next checkpoint instead of
        in whatever line of theirs was running. Raised between two lines, it could leave an
        actor taken off its park but never rescheduled (``_resume`` before ``_release``), and
        trio would then wait for it forever. Code they call (a world's tools, a program) is
        protected with them, so a world method that never returns is stopped by a kill, not by
        Ctrl-C; a training run resumes from its last step either way."""
        if self.cfg.clock == "real":
            self.t0_wall = trio.current_time()
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            for role, group, local in self.cast.starting():
                self.spawn(role, group, local, by=-1)
            task_status.started()
            await trio.sleep_forever()

    def spawn(self, role: str, group: int, local: int, by: int) -> Actor:
        actor = Actor(self, self.cast.new_id(group, local), role, group, local)
        self.cast.enter(actor)
        self.stats.peak_agents = max(self.stats.peak_agents, self.cast.alive)
        self.emit(Spawned(self.now, actor.id, role, by))
        self.quiet.running()
        if self.holding:
            self.hired.append(actor)
        else:
            self._start(actor)
        return actor

    def _start(self, actor: Actor) -> None:
        assert self.nursery is not None
        self.nursery.start_soon(self._actor_main, actor, name=f"agent-{actor.id}")

    @trio.lowlevel.enable_ki_protection  # (see host)
    async def _actor_main(self, actor: Actor) -> None:
        actor.task = trio.lowlevel.current_task()
        try:
            await self.program(actor)
        except ENGINE_SIGNALS:
            pass
        except BaseExceptionGroup as group:  # a program running a nursery of its own
            signals, rest = group.split(ENGINE_SIGNALS)
            if signals is None:
                raise
            if rest is not None:
                raise rest from None
        finally:
            self.cast.exit(actor)
            self.quiet.parked()

    # -- parking: the only way an actor waits ----------------------------------------------------
    #
    # The park/resume contract, written once (every write of the park state on Actor is in this
    # class; Actor.__init__ sets the first row). An actor's program waits only in ``park``: its
    # task blocks in trio's ``wait_task_rescheduled`` until the conductor reschedules it, and
    # EXACTLY ONE of three ends follows each park, each clearing ``parked`` (so a second is
    # refused: ``_resume`` asserts, ``withdraw`` fails, ``_let_go`` is called only if parked):
    #
    #   _resume(value)   the request's result (an answer, an action's result, a wake-up);
    #   _let_go(signal)  the program ends from its park: Dismissed (fired) or EpisodeOver (_end);
    #   withdraw         trio cancelled the park (the run was stopped); the actor leaves the cast.
    #
    # While an instant is applied (``holding``), a resumed or let-go task is kept in ``held`` and
    # rescheduled only by ``_release`` once the instant is whole: it is no longer ``parked`` but
    # still blocked in trio, so a cancellation meanwhile fails to withdraw it and lands at its
    # next park. Quiescence counts tasks that may run: ``park`` and a program's end count one
    # down; a task started or rescheduled counts up (``spawn``, ``_wake_task``, ``_release``,
    # ``withdraw``).
    #
    #   state       parked request         then_act  waiting  where it is referenced
    #   running     False  None            False     False    trio's run queue, or held
    #   asked       True   (kind, payload) -         False    pending, until start_requests
    #   thinking    True   None            kind is   False    the conductor's batch, then an
    #                                      THINK_ACT          Answer on the agenda
    #   acting      True   None            False     False    a Land, or a Resume (rejected,
    #                                                         or a hybrid tool's real time)
    #   waiting     True   None            False     True     channel subscriptions, a Timer
    #
    #   running  -> asked      park (the actor's own task); Dismissed at once if no longer alive
    #   asked    -> thinking   start_requests, in id order: THINK or THINK_ACT, into the batch
    #   asked    -> acting     start_requests: ACT, ``_begin`` (or -> waiting: ``wait``)
    #   thinking -> asked      _respond of a THINK_ACT: the answer becomes its ACT, unwoken
    #   thinking -> running    _respond of a THINK: _resume(answer)
    #   acting   -> running    _commit (or its Resume entry): _resume(result)
    #   waiting  -> running    _wake (a message, a post, news at once, or the Timer): _resume
    #   any parked -> ended    _let_go (fire, end) or withdraw: parked, request, waiting cleared
    #
    # Agenda entries left for an actor that a fire or a withdrawal let go are skipped: each is
    # checked against ``alive`` (a Timer also against ``waiting`` and ``wait_token``, which
    # ``_stop_waiting`` bumps) before anything resumes it; after the end nothing is applied.

    def park(self, actor: Actor, request: Request) -> Coroutine[Any, Any, Any]:
        """Park ``actor`` with its request: the coroutine returned is the wait, and the actor
        awaits it at once (``Actor.think``, ``Actor.act``, ``Actor.think_and_act``). A plain
        function returning trio's wait rather than a coroutine of its own: one frame fewer per
        park."""
        if not actor.alive:
            raise Dismissed()  # fired at the instant it was resumed, before it could run
        if self.ended:
            return self._park_late(actor, request)
        actor.request = request
        actor.parked = True
        self.pending.append(actor)
        self.quiet.parked()
        return trio.lowlevel.wait_task_rescheduled(actor.abort)

    async def _park_late(self, actor: Actor, request: Request) -> Any:
        await trio.lowlevel.checkpoint()  # the time limit has passed: let cancellation land
        return await self.park(actor, request)

    def withdraw(self, actor: Actor) -> trio.lowlevel.Abort:
        """``actor`` was cancelled while parked (trio calls this, through ``Actor.abort``).

        Not at the episode's own end: ``_end`` lets every parked actor go with ``EpisodeOver``
        before it cancels the nursery, and a later park meets the cancellation without parking
        (``_park_late``). Here the run around the conductor was stopped (a training run's
        ``stop_after``, Ctrl-C), possibly while the conductor was past its last checkpoint: a
        policy batch already answered (a worker thread's result is delivered even when a
        cancellation came meanwhile) or an async tool awaiting mid-instant. The conductor may
        then apply one more instant of this doomed episode before its own next checkpoint
        raises, and the agenda may still hold an answer, an action's effect, a resumption or a
        timer for the actor, or a post may wake it. So it is gone from here on, as a fired agent
        is: not alive, not waiting, and nothing still due resumes it. (Its program ends with the
        cancellation, whose record nobody keeps.)

        One resumed (or fired) at the instant being applied is still blocked in trio, held
        until the instant is whole (``_release``): that resumption is the engine's to deliver,
        so the abort fails, and the cancellation lands at its next park."""
        if not actor.parked:
            return trio.lowlevel.Abort.FAILED
        actor.request = None
        actor.parked = False
        actor.waiting = False  # a post or a timer wakes only those waiting
        self.cast.exit(actor)
        self.quiet.running()
        return trio.lowlevel.Abort.SUCCEEDED

    def _resume(self, actor: Actor, value: Any) -> None:
        assert actor.parked, f"agent {actor.id} resumed twice"
        actor.waiting = False
        actor.parked = False
        if self.holding:  # always, but for a fire outside an instant: counted at _release
            self.held.append((actor.task, Resumed(value)))
        else:
            self._wake_task(actor.task, Resumed(value))

    def _let_go(self, actor: Actor, signal: BaseException) -> None:
        """End a parked actor's program with one of ``ENGINE_SIGNALS``, raised from its park."""
        actor.parked = False
        actor.request = None
        actor.waiting = False  # (a fire has ended its wait already; the end has not)
        self._wake_task(actor.task, Signalled(signal))

    def _wake_task(self, task: trio.lowlevel.Task, value: outcome.Outcome[Any]) -> None:
        if self.holding:
            self.held.append((task, value))
        else:
            self.quiet.running()
            trio.lowlevel.reschedule(task, value)

    # -- starting requests, in canonical order --------------------------------------------------

    def start_requests(self, thinks: list[tuple[LiveEpisode, Actor, PolicyRequest]]) -> None:
        if self.failures:  # an observation raised: the lowest agent's, whatever trio's order
            self._fail(min(self.failures, key=lambda bug: bug.agent))
            return
        pending = sorted(self.pending, key=_BY_ID)
        self.pending = []
        try:
            self._start_each(pending, thinks)
        except WorldBug as bug:
            self._fail(bug)

    def _start_each(
        self, pending: list[Actor], thinks: list[tuple[LiveEpisode, Actor, PolicyRequest]]
    ) -> None:
        for actor in pending:
            request = actor.request
            if request is None:  # let go or withdrawn since it parked
                continue
            actor.request = None
            if request[0] is not ACT:  # THINK, or THINK_ACT
                actor.then_act = request[0] is THINK_ACT
                req = request[1]
                read = actor.read_ids
                self.emit(Asked(self.now, actor.id, req.turn, prompt_digest(req.prompt), read))
                if read:
                    self.stats.read += len(read)
                    actor.read_ids = ()  # consumed: a program thinking without a prompt reads none
                if actor.missed:
                    self.stats.missed_posts += actor.missed
                    actor.missed = 0
                thinks.append((self, actor, req))
            else:
                self._begin(actor, request[1])

    def answer(self, actor: Actor, req: PolicyRequest, resp: PolicyResponse) -> None:
        """Schedule a policy answer at the simulated time the latency model charges."""
        if self.replay is not None and (actor.id, req.turn) in self.replay.answered:
            at = self.replay.answered[(actor.id, req.turn)]  # real clock: latencies were measured
        elif self.cfg.clock == "real":
            at = max(self.now, trio.current_time() - self.t0_wall)
        else:
            at = self.cfg.latency.answer_at(self.now, resp.prompt_tokens, len(resp.token_ids))
        self.agenda.push(at, actor.id, Answer(actor, req, resp))

    def _begin(self, actor: Actor, text: str) -> None:
        act = actor.acts
        actor.acts += 1
        tr = actor.turn_record
        if tr is not None and tr.kind:
            tr = None  # its last turn has finished: this action is not that answer's
        try:
            # An answer past its bounds is invalid, whatever its first characters say (the
            # conductor kept only one token and one character past them: see ``bounded``).
            if tr is not None and len(tr.token_ids) > self.cfg.max_output_tokens:
                raise ActionError(
                    f"answer over max_output_tokens ({self.cfg.max_output_tokens}); cut there"
                )
            if len(text) > actor.longest:
                raise ActionError(
                    f"answer longer than any action ({actor.longest} characters); cut there"
                )
            action = parse_action(text, actor.space)
        except ActionError as e:
            self.stats.rejected += 1
            self.emit(Rejected(self.now, actor.id, act, text[:200], str(e)))
            self._finish_turn(actor, "", "invalid", False, f"error: {e}")
            self.agenda.push(self.now, actor.id, Resume(actor, f"error: {e}"))
            return
        self.stats.actions += 1
        if tr is not None:
            n = len(tr.token_ids)
            if action.kind == "world":
                self.stats.world_tokens += n
            elif action.kind == "comm":
                self.stats.comm_tokens += n
        if action.tool == "wait":
            self._begin_wait(actor, act, text, int(action.args[0]))
            return
        if action.kind == "world":
            world = self.worlds[actor.group]
            try:
                duration = world.tool_duration(action.tool, actor.local, action.args)
            except Exception as e:
                d = world._tool_decls[action.tool].duration
                fn = d if callable(d) else None  # (a number or an attribute's name: no source)
                bug = WorldBug(world, f"{action.tool} (duration)", e, agent=actor.id, fn=fn)
                raise bug from e
        else:
            duration = self.cfg.comm_duration
        until = self.now + duration
        self.emit(Began(self.now, actor.id, act, text, until))
        self.agenda.push(until, actor.id, Land(actor, act, action))

    def _begin_wait(self, actor: Actor, act: int, text: str, seconds: int) -> None:
        until = self.now + seconds if seconds else -1.0
        self.emit(Began(self.now, actor.id, act, text, until))
        actor.waiting = True
        actor.wait_token += 1
        news = self.comms.news_for(actor)
        if news:  # something arrived while it was thinking: wake it at once (in advance)
            self.agenda.push(self.now, actor.id, Timer(actor, act, actor.wait_token, news))
            return
        self.comms.subscribe(actor)
        if seconds:
            self.agenda.push(until, actor.id, Timer(actor, act, actor.wait_token, "timeout"))
        # A wait with no timeout leaves nothing on the heap: an idle agent costs no CPU.

    # -- advancing the clock: the only place actors are resumed ---------------------------------

    def next_due(self) -> float:
        return self.agenda.next_due()

    async def advance(self) -> None:
        """Move to the next instant with due events and apply them all, in canonical order."""
        if self.ended:  # a world bug found while requests were started
            return
        rec = self.rec
        if (
            rec.recorder is not None
            and max(len(rec.events), len(rec.turns)) >= CHUNK_RECORDS
            and self.next_due() != self.now
        ):
            rec.flush()  # between instants: every outcome of this one is in
        t = self.agenda.next_due()
        if t == math.inf:
            self._end("idle")  # everyone waits for a message nobody can send
            return
        if t >= self.cfg.time_limit:
            self.now = self.cfg.time_limit
            for w in self.worlds:
                w.now = self.now
            self._end("time_limit")
            return
        if self.cfg.clock == "real" and t > trio.current_time() - self.t0_wall:
            return
        self.now = t
        for w in self.worlds:
            w.now = t
        changed = False
        # Hold every resumption until the whole instant is applied: an async tool awaits in the
        # middle of it, and an actor let run then would read an instant half committed.
        self.holding = True
        try:
            agenda = self.agenda
            events = rec.events  # (flushed only between instants: the same list throughout)
            room = self.max_events - rec.written_events
            while (entry := agenda.pop_at(t)) is not None:
                if type(entry) is Answer:
                    self._respond(entry.actor, entry.req, entry.resp)
                elif type(entry) is Land:
                    landed = self._commit(entry.actor, entry.act, entry.action)
                    changed |= landed if type(landed) is bool else await landed
                elif type(entry) is Resume:
                    if entry.actor.alive:
                        self._resume(entry.actor, entry.value)
                elif type(entry) is WorldEvent:
                    self._happen(entry.world, entry.fn, entry.args)
                    changed = True
                else:
                    assert type(entry) is Timer
                    actor = entry.actor
                    if actor.alive and actor.waiting and actor.wait_token == entry.token:
                        self._wake(actor, entry.act, entry.reason)
                if len(events) >= room:
                    self._release()  # before the end cancels them: a held task is still parked
                    self._end(self.capped)
                    return
            self._release()
            if changed:
                s = self.score()
                if s != rec.curve[-1][1]:
                    rec.curve.append((t, s))
                if self.org.finished(self._done()):
                    self._end("done")
        except WorldBug as bug:
            self._release()
            self._fail(bug)
        except BaseException:
            # Cancelled in an async tool's await (the run was stopped): the actors held are
            # still blocked and their aborts failed (see withdraw), so let them go; each meets
            # the cancellation at its next park.
            self._release()
            raise

    def _release(self) -> None:
        self.holding = False
        self.quiet.running(len(self.held))
        reschedule = trio.lowlevel.reschedule
        for task, value in self.held:
            reschedule(task, value)
        for actor in self.hired:
            self._start(actor)
        self.held.clear()
        self.hired.clear()

    def _respond(self, actor: Actor, req: PolicyRequest, resp: PolicyResponse) -> None:
        if not actor.alive:
            # Fired while its answer was in flight: the answer was sampled all the same. Keep it
            # as a turn (no action), so a replay's policy gives the same answer, which then
            # lands at the same time, after the firing, and is dropped again.
            self.rec.turns.append(self.rec.turn(actor, req, resp, self.now))
            return
        n_out = len(resp.token_ids)
        self.stats.turns += 1
        self.stats.output_tokens += n_out
        self.stats.prompt_tokens += resp.prompt_tokens
        self.emit(
            Thought(
                self.now,
                actor.id,
                req.turn,
                req.asked,
                resp.text,
                resp.version,
                resp.prompt_tokens,
                n_out,
            )
        )
        turn = self.rec.turn(actor, req, resp, self.now)
        self.rec.answered(turn)
        actor.turn_record = turn
        if actor.then_act:
            # think_and_act: the answer becomes the action the actor would take on waking, as
            # if it had (it stays parked; the action starts at quiescence, in id order, as one
            # parked with act would). One wake-and-park per turn instead of two.
            actor.then_act = False
            actor.request = (ACT, resp.text)
            self.pending.append(actor)
        else:
            self._resume(actor, resp)

    def _commit(self, actor: Actor, act: int, action: Action) -> bool | Coroutine[Any, Any, bool]:
        """Apply an action's effect now; returns whether world state may have changed. A tool
        that returns an awaitable is finished by the coroutine returned instead, which says so
        once awaited: only then is a coroutine made, not for every action."""
        if not actor.alive:
            return False
        if action.kind != "world":
            ok, result = self._primitive(actor, action)
            self.emit(Committed(self.now, actor.id, act, action.tool, ok, result, 0.0))
            self._finish_turn(actor, action.tool, action.kind, ok, result)
            self._resume(actor, result)
            # Messages and posts reach the world through ``heard``, which may change its score.
            return PRIMITIVES[action.tool].heard
        world = self.worlds[actor.group]
        # Only a hybrid clock charges the tool's real time.
        t0 = time.perf_counter() if self.cfg.clock == "hybrid" else 0.0
        if world.outside and self.replay is not None:
            failed = self.replay.failures.get((actor.id, act))
            if failed is not None:  # the service failed here: so does the replay, as recorded
                raise recorded_bug(world, failed)
            recorded = self.replay.results.get((actor.id, act))
            if recorded is not None:  # the record stands in for the service
                ok, result = recorded
                try:
                    world.replayed(action.tool, actor.local, action.args, ok, result)
                except Exception as e:
                    ok, result = self._tool_failed(actor, action.tool, e)
                self._land_tool(actor, act, action.tool, ok, result, t0)
                return True
        try:
            value = world.call_tool(action.tool, actor.local, action.args)
            if type(value) is not str and inspect.isawaitable(value):  # str: the common case
                return self._commit_awaited(actor, act, action, value, t0)
            ok, result = True, str(value)
        except Exception as e:
            ok, result = self._tool_failed(actor, action.tool, e)
        self._land_tool(actor, act, action.tool, ok, result, t0)
        return True

    async def _commit_awaited(
        self, actor: Actor, act: int, action: Action, value: Awaitable[Any], t0: float
    ) -> bool:
        """The rest of ``_commit`` for a tool that returned an awaitable."""
        try:
            ok, result = True, str(await value)
        except Exception as e:
            ok, result = self._tool_failed(actor, action.tool, e)
        self._land_tool(actor, act, action.tool, ok, result, t0)
        return True

    def _tool_failed(self, actor: Actor, tool: str, e: Exception) -> tuple[bool, str]:
        """What a world tool's exception means, wherever the tool ran (called or awaited): a
        ``ToolError`` is the action's refused result; anything else is a bug in the world."""
        if isinstance(e, ToolError):
            return False, f"error: {e}"
        raise WorldBug(self.worlds[actor.group], f"{tool} (tool)", e, agent=actor.id) from e

    def _land_tool(
        self, actor: Actor, act: int, tool: str, ok: bool, result: str, t0: float
    ) -> None:
        """A world tool has returned: log it and hand its result back (after its measured real
        time, in a hybrid clock)."""
        real = time.perf_counter() - t0 if self.cfg.clock == "hybrid" else 0.0
        if self.replay is not None and (actor.id, act) in self.replay.real:
            real = self.replay.real[(actor.id, act)]
        if not ok:
            self.stats.tool_errors += 1
        self.emit(Committed(self.now, actor.id, act, tool, ok, result, real))
        self._finish_turn(actor, tool, "world", ok, result)
        if real > 0:
            self.agenda.push(self.now + real, actor.id, Resume(actor, result))
        elif actor.alive:  # (not when the run was stopped while an async tool awaited)
            self._resume(actor, result)

    # -- the world's own events, and its bugs ---------------------------------------------------

    def schedule_world_event(
        self, world: World, t: float, fn: Any, args: tuple[Scalar, ...]
    ) -> None:
        """``World.at`` during the episode: only while an instant is being committed (a tool, a
        world event, heard, join, leave), never from observe or score, which only read."""
        if not self.holding:
            raise RuntimeError(
                "at() and after() may be called from the constructor, a tool, a world event, "
                "heard, join or leave; observe, score, done and durations only read"
            )
        self.agenda.push(t, self.group_of[id(world)], WorldEvent(world, fn, args))

    def world_post(self, world: World, text: str) -> None:
        """``World.post``: a post from the world (sender -1) on its group's channels, waking
        the subscribers who wait for news. Messages from the world are not agents' posts, so
        ``stats.posts`` does not count them, and the world does not hear itself."""
        if not self.holding:
            raise RuntimeError(
                "post() may be called from a tool, a world event, heard, join or leave; "
                "observe, score, done and durations only read"
            )
        for name in self.cast.world_channels[self.group_of[id(world)]]:
            self._apply(None, self.comms.post(self.now, -1, name, text))

    def _happen(self, world: World, fn: Any, args: tuple[Scalar, ...]) -> None:
        name = getattr(fn, "__name__", type(fn).__name__)
        call = f"{name}({', '.join(repr(a) for a in args)})"
        self.emit(Happened(self.now, -1, self.group_of[id(world)], call))
        try:
            fn(*args)
        except Exception as e:
            raise WorldBug(world, f"{name} (world event)", e, fn=fn) from e

    def observe_failed(self, actor: Actor, error: Exception) -> WorldStopped:
        """An actor's observation raised (or was not a str). Actors run in whatever order trio
        picks, so the failure is only noted here; the conductor ends the episode with the
        lowest agent's at the next quiescence (``start_requests``)."""
        world = self.worlds[actor.group]
        self.failures.append(WorldBug(world, "observe", error, agent=actor.id, fn=world.observe))
        return WorldStopped()

    def _fail(self, bug: WorldBug) -> None:
        self._log_failure(bug)
        self._end("world_error")

    def _log_failure(self, bug: WorldBug) -> None:
        log.debug("world error", world=self.cfg.world, t=self.now, exc_info=bug.cause)
        self.emit(Failed(self.now, bug.agent, bug.world, bug.method, bug.error, bug.where))

    def _done(self) -> list[bool]:
        out = []
        for w in self.worlds:
            try:
                out.append(bool(w.done()))
            except Exception as e:
                raise WorldBug(w, "done", e, fn=w.done) from e
        return out

    def _finish_turn(self, actor: Actor, tool: str, kind: str, ok: bool, result: str) -> None:
        tr = actor.turn_record
        if tr is None or tr.kind:
            return
        self.rec.ended(tr, tool, kind, ok, result, self.now)

    # -- the communication primitives ------------------------------------------------------------

    def _primitive(self, actor: Actor, action: Action) -> tuple[bool, str]:
        tool, args = action.tool, action.args
        if tool == "hire":
            return self._hire(actor, str(args[0]))
        if tool == "fire":
            return self._fire(actor, int(args[0]))
        comms = self.comms
        if tool == "msg":
            out = comms.send(self.now, actor, int(args[0]), str(args[1]))
        elif tool == "post":
            out = comms.post(self.now, actor.id, str(args[0]), str(args[1]))
        elif tool == "read":
            out = comms.read(str(args[0]))
        elif tool == "put":
            out = comms.put(actor.id, str(args[0]))
        elif tool == "search":
            out = comms.search(str(args[0]))
        else:
            raise AssertionError(f"unhandled primitive {tool}")
        self._apply(actor, out)
        return out.ok, out.result

    def _apply(self, actor: Actor | None, out: Outcome[Actor]) -> None:
        """Land a communication's outcome: its events, then what the sender's world hears, then
        the wake-ups (of those still waiting: hearing may have woken one already)."""
        for e in out.events:
            self.emit(e)
        if out.heard is not None and actor is not None:
            self._heard(actor, actor.local, *out.heard)
        for other, reason in out.wake:
            if other.waiting:
                self._wake(other, other.acts - 1, reason)

    def _hire(self, actor: Actor, role: str) -> tuple[bool, str]:
        seat = self.cast.hire(actor, role)
        if isinstance(seat, str):
            return False, seat
        group, local = seat
        new = self.spawn(role, group, local, by=actor.id)
        self.cast.hired(actor, new)
        self.stats.hires += 1
        self.emit(Hired(self.now, actor.id, new.id, role))
        return True, f"hired agent {new.id} as {role}"

    def _fire(self, actor: Actor, target_id: int) -> tuple[bool, str]:
        target = self.cast.fire(actor, target_id)
        if isinstance(target, str):
            return False, target
        self.stats.fires += 1
        self.cast.leave(actor, target)
        self.emit(Fired(self.now, actor.id, target_id))
        if target.waiting:
            self._stop_waiting(target)
        if target.parked:
            # Parked on an in-flight request or a wait: end its program now. Its agenda entries
            # are skipped because it is no longer alive, and an action it was handed at this
            # instant (think_and_act) is never started. (If it was resumed at this very
            # instant, its next park raises Dismissed instead.)
            self._let_go(target, Dismissed())
        return True, f"fired agent {target_id}"

    # -- helpers ---------------------------------------------------------------------------------

    def _heard(self, sender: Actor, local: int, to: int | None, text: str) -> None:
        world = self.worlds[sender.group]
        try:
            world.heard(local, to, text)
        except Exception as e:
            raise WorldBug(world, "heard", e, agent=sender.id) from e

    def _stop_waiting(self, actor: Actor) -> None:
        self.comms.unsubscribe(actor)
        actor.waiting = False
        actor.wait_token += 1  # its timer, if any, is now stale

    def _wake(self, actor: Actor, act: int, reason: str) -> None:
        self._stop_waiting(actor)
        self.emit(Woke(self.now, actor.id, reason))
        result = f"woke: {reason}"
        self.emit(Committed(self.now, actor.id, act, "wait", True, result, 0.0))
        self._finish_turn(actor, "wait", "wait", True, result)
        self._resume(actor, result)

    def score(self) -> float:
        scores = []
        for w in self.worlds:
            try:
                scores.append(checked_score(w))
            except Exception as e:
                raise WorldBug(w, "score", e, fn=w.score) from e
        return float(self.org.combine(scores))

    def _end(self, reason: str) -> None:
        if reason != "world_error":
            try:
                self.final_score = self.score()
                self.world_metrics = self._metrics()
            except WorldBug as bug:
                self._log_failure(bug)
                reason = "world_error"
        for w in self.worlds:
            w._detach()
            try:
                w.close()
            except Exception as e:  # resources a world failed to release are a bug too
                if reason == "world_error":  # after a first bug, that one is the news
                    log.debug("close() raised too", world=self.cfg.world, exc_info=e)
                else:
                    self._log_failure(WorldBug(w, "close", e, fn=w.close))
                    reason = "world_error"
        if reason == "world_error":
            self.final_score = self.rec.curve[-1][1]  # the last score the world could give
            self.world_metrics = {}
        self.end_reason = reason
        self.stats.unread = sum(len(a.inbox) for a in self.actors.values() if a.inbox)
        self.emit(Ended(self.now, -1, reason, self.final_score))
        self.ended = True
        # Answers still in flight were sampled but land after the end: keep them as turns
        # (answered after the end, no action), so a replay's policy can give the same answers.
        for t, entry in self.agenda.in_order():
            if type(entry) is Answer:  # fired agents' too, for the same reason as in _respond
                self.rec.turns.append(self.rec.turn(entry.actor, entry.req, entry.resp, t))
        # Let every parked actor go with EpisodeOver, as a fire does, before cancelling the
        # nursery (which still stops the host and any actor not parked, at its next park):
        # trio's delivery of a cancellation to each of thousands of parked tasks costs about
        # twice as much per agent as ending them with an error (bench/results/engine/README.md).
        for actor in self.actors.values():
            if actor.parked:
                self._let_go(actor, EpisodeOver())
        assert self.nursery is not None
        self.nursery.cancel_scope.cancel()

    def _metrics(self) -> dict[str, float]:
        """``World.metrics()`` summed over the episode's worlds."""
        out: dict[str, float] = {}
        for w in self.worlds:
            try:
                for key, value in w.metrics().items():
                    out[key] = out.get(key, 0.0) + float(value)
            except Exception as e:
                raise WorldBug(w, "metrics", e, fn=w.metrics) from e
        return out

    @property
    def event_count(self) -> int:
        return self.rec.event_count

    def record(self) -> Episode:
        """The episode's record (:meth:`Recording.close`: with a recorder, what is returned
        holds everything but the events, turns, curve and spaces)."""
        return self.rec.close(
            self.final_score, self.now, self.end_reason, self.stats, self.world_metrics
        )
