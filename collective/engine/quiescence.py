"""Quiescence: knowing, without polling, that every actor of every episode is parked.

One counter of actor tasks that may run. An actor let run (started, resumed, woken by a
cancellation) counts up; one that parks or ends counts down. The conductor parks itself until
the count is zero, and is rescheduled by whoever brought it there. Only the conductor moves
simulated time, and only at quiescence, so everything an actor reads was committed before it
ran.

Actors and the conductor park with trio's ``wait_task_rescheduled`` and are rescheduled with one
of the outcomes here (``Resumed``, ``Signalled``), at every turn and every instant.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Generator
from typing import Any, NoReturn

import outcome
import trio


class Resumed(outcome.Outcome[Any]):
    """What a parked actor's wait returns: ``outcome.Value``'s behaviour, as trio's
    ``reschedule`` takes an ``Outcome``, without its attrs-made constructor and its guard against
    a second unwrap (a Value made and unwrapped at every park is a share of a turn's cost worth
    cutting: its count is in ``bench/results/engine/README.md``, "Issue 28: the hot path cut").
    The guard is the parking contract's here: one resumption per park. (Nothing in it changes
    when unwrapped, so one may be sent again: ``_NOTHING`` below, the conductor's wake.)"""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def unwrap(self) -> Any:
        return self.value

    def send(self, gen: Generator[Any, Any, object]) -> Any:
        return gen.send(self.value)

    async def asend(self, agen: AsyncGenerator[Any, Any]) -> Any:
        return await agen.asend(self.value)


class Signalled(outcome.Outcome[NoReturn]):
    """``outcome.Error``'s behaviour, as ``Resumed`` is Value's: an engine signal raised from a
    park (one per agent at every episode's end)."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def unwrap(self) -> NoReturn:
        captured_error = self.error
        try:
            raise captured_error
        finally:  # (as outcome does: no cycle through this frame's traceback)
            del captured_error, self

    def send(self, gen: Generator[Any, Any, object]) -> Any:
        return gen.throw(self.error)

    async def asend(self, agen: AsyncGenerator[Any, Any]) -> Any:
        return await agen.athrow(self.error)


# The conductor's resumption: it is sent nothing, and a Resumed has no once-only state.
_NOTHING = Resumed(None)


class Quiescence:
    __slots__ = ("_waiting", "runnable")

    def __init__(self) -> None:
        self.runnable = 0  # actor tasks not parked
        self._waiting: trio.lowlevel.Task | None = None  # the conductor, parked until quiet

    def running(self, n: int = 1) -> None:
        """``n`` actor tasks were let run (started, rescheduled, or woken to be cancelled)."""
        self.runnable += n

    def parked(self) -> None:
        """An actor parked or finished."""
        self.runnable -= 1
        if self.runnable == 0 and self._waiting is not None:
            task, self._waiting = self._waiting, None
            trio.lowlevel.reschedule(task, _NOTHING)

    async def wait(self) -> None:
        """Return once no actor task may run. The conductor parks itself, as actors do, rather
        than waiting on a trio.Event: this happens at every simulated instant, and an Event
        (with its parking lot) per instant is a measurable share of the cost per agent-turn."""
        while self.runnable:
            self._waiting = trio.lowlevel.current_task()
            await trio.lowlevel.wait_task_rescheduled(self._abort)

    def _abort(self, _: object) -> trio.lowlevel.Abort:
        self._waiting = None
        return trio.lowlevel.Abort.SUCCEEDED
