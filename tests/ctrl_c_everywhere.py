"""Ctrl-C at every line of the engine: run by ``test_engine`` in a subprocess, where a hang is
something a timeout can catch (trio waiting forever for a task nobody will reschedule cannot be
caught from inside the process).

A reference run (after a warm one) lists, in order, every line of ``collective/`` it
executes. Then, for each one, a fresh run raises SIGINT (a real signal, through trio's handler)
the first time that line runs, as a user's Ctrl-C landing there would. Each run must stop with
KeyboardInterrupt, alone, within seconds; afterwards an uninterrupted run must record exactly
what the reference did (no state left behind). Prints one line per failure and exits 1, or
prints the count and exits 0.

Usage: ctrl_c_everywhere.py EVERY  (inject at every EVERY-th line of the list; 1: all of them)
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import threading
import types
from typing import Any

import msgspec
import trio

from collective import Conductor, EpisodeConfig
from policy.uniform import RandomPolicy

ROOT = os.path.dirname(sys.modules["collective"].__file__ or "")
# Three episodes at once, messages, and a CEO who hires and fires: every path of an instant.
CONFIGS = [
    EpisodeConfig(world="tally", agents=3, world_seed=1, sample_seed=1, time_limit=40),
    EpisodeConfig(world="tally", agents=1, budget=2, org="ceo", world_seed=5, time_limit=40),
    EpisodeConfig(world="tally", agents=2, world_seed=2, sample_seed=3, time_limit=40),
]
HANG_SECONDS = 20.0

Line = tuple[str, int]


def play(inject_at: Line | None, seen: list[Line] | None) -> list[bytes]:
    """Run CONFIGS; raise SIGINT the first time ``inject_at`` runs, or list lines in ``seen``."""
    fired = False
    known: set[Line] = set()

    def local(frame: types.FrameType, event: str, _: Any) -> Any:
        nonlocal fired
        if event == "line" and not fired:
            here = (frame.f_code.co_filename, frame.f_lineno)
            if seen is not None and here not in known:
                known.add(here)
                seen.append(here)
            if here == inject_at:
                fired = True
                signal.raise_signal(signal.SIGINT)
        return local

    def tracer(frame: types.FrameType, event: str, arg: Any) -> Any:
        if fired or not frame.f_code.co_filename.startswith(ROOT):
            return None
        return local(frame, event, arg)

    conductor = Conductor(RandomPolicy())
    sys.settrace(tracer)
    try:
        episodes = trio.run(lambda: conductor.play(CONFIGS, concurrency=len(CONFIGS)))
    finally:
        sys.settrace(None)
    return [msgspec.msgpack.encode(ep) for ep in episodes]


def main() -> int:
    every = int(sys.argv[1])
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as at a terminal
    thresholds = gc.get_threshold()
    play(None, None)  # warm: lines that run once per process (loading a world) are not meant
    lines: list[Line] = []
    reference = play(None, lines)
    failures = 0
    for k, line in enumerate(lines[::every]):
        where = f"{os.path.relpath(line[0], ROOT)}:{line[1]} (line {k * every} of {len(lines)})"
        watchdog = threading.Timer(HANG_SECONDS, lambda w=where: _hung(w))
        watchdog.start()
        try:
            play(line, None)
            got = "no KeyboardInterrupt"
        except KeyboardInterrupt:
            got = ""
        except BaseException as e:  # a group, or trio's internal error
            got = f"{type(e).__name__}: {e}"
        finally:
            watchdog.cancel()
        if got:
            print(f"Ctrl-C at {where}: {got}", flush=True)
            failures += 1
    if play(None, None) != reference:
        print("an uninterrupted run after the interrupted ones recorded something else")
        failures += 1
    if gc.get_threshold() != thresholds:
        print(f"gc thresholds left at {gc.get_threshold()}, were {thresholds}")
        failures += 1
    print(f"{len(lines[::every])} interrupted runs, {failures} failed")
    return 1 if failures else 0


def _hung(where: str) -> None:
    print(f"Ctrl-C at {where}: hung for {HANG_SECONDS:.0f} s", flush=True)
    os._exit(1)


if __name__ == "__main__":
    sys.exit(main())
