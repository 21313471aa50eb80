"""A pytest plugin: a test that pytest-timeout stops inside ``trio.run`` cannot break the tests
after it.

pytest-timeout's signal method raises its failure wherever the main thread happens to be. A
sleeping ``trio.run`` is waiting for I/O outside the generator that holds its run state, so the
failure leaves that generator suspended and trio's global run context set: every later
``trio.run`` in the process then fails with "Attempted to call run() from inside a run()", and
when the abandoned generator is finally collected it clears the run context of whatever run is
live then. After each test, this plugin finds any ``trio.run`` frame in the failure's traceback
and closes its generator, so trio's own cleanup runs at once, in order.

Before closing it, the run is marked finished for other threads: a worker thread the run
abandoned (``trio.to_thread.run_sync(..., abandon_on_cancel=True)``, as the Ray rollouts' streams
are) may still call back into it. trio marks a run finished only when its entry-queue task ends,
which an abandoned run never reaches; without the mark such a call writes to the run's closed
wakeup socket and trio prints ``OSError: [Errno 9] Bad file descriptor`` from the thread, long
after the test (with the mark the thread gets ``trio.RunFinishedError``, which trio's thread
machinery expects and ignores).
"""

from __future__ import annotations

import contextlib
import gc
import types
import warnings
from collections.abc import Iterator

import pytest
import trio


def _run_frames(exc: BaseException) -> Iterator[types.FrameType]:
    seen: set[int] = set()
    stack = [exc]
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        tb = e.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code is trio.run.__code__:
                yield tb.tb_frame
            tb = tb.tb_next
        stack += [x for x in (e.__cause__, e.__context__) if x is not None]
        if isinstance(e, BaseExceptionGroup):
            stack += list(e.exceptions)


def close_abandoned_runs(exc: BaseException) -> int:
    """Close what every ``trio.run`` that ``exc`` escaped left open: its run-loop generator (so
    trio's own cleanup clears the run context now) and its tasks' coroutines (so none is
    finalised later, in the middle of another test). Returns how many runs were closed."""
    closed = 0
    for frame in _run_frames(exc):
        gen = frame.f_locals.get("gen")
        if not isinstance(gen, types.GeneratorType) or gen.gi_frame is None:
            continue
        runner = frame.f_locals.get("runner")
        queue = getattr(runner, "entry_queue", None)
        if queue is not None:  # (the module docstring: threads calling back now get told)
            with queue.lock:
                queue.done = True
        tasks = list(getattr(runner, "tasks", ()))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # "guest run got abandoned": yes
            gen.close()
        for task in tasks:
            # Outside its run a task cannot unwind cleanly (trio's exits ask for the current
            # task); what matters is that it is closed now. Its nurseries are emptied, or each
            # would complain of orphaned children whenever it is collected.
            with contextlib.suppress(BaseException):
                task.coro.close()
            for nursery in task.child_nurseries:
                children = getattr(nursery, "_children", None)
                if isinstance(children, set):
                    children.clear()
        closed += 1
    if closed:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            gc.collect()  # the run's leftovers are freed here, not during a later test
    return closed


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    outcome = yield
    excinfo = outcome.excinfo
    if excinfo is not None:
        close_abandoned_runs(excinfo[1])
