"""Quiescence: knowing, without polling, that every actor of every episode is parked.

One counter of actor tasks that may run. An actor let run (started, resumed, woken by a
cancellation) counts up; one that parks or ends counts down. The conductor parks itself until
the count is zero, and is rescheduled by whoever brought it there. Only the conductor moves
simulated time, and only at quiescence, so everything an actor reads was committed before it
ran.
"""

from __future__ import annotations

import trio


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
            trio.lowlevel.reschedule(task)

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
