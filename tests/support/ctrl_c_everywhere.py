"""Ctrl-C at every line: run by the tests in a subprocess, where a hang is something a timeout
can catch (trio waiting forever for a task nobody will reschedule cannot be caught from inside
the process). Each run raises SIGINT (a real signal, through trio's handler) when a chosen
line of ``collective/`` runs, as a user's Ctrl-C landing there would.

``engine EVERY``: a reference run of three episodes (after a warm one) lists, in order, every
line of ``collective/`` it executes; then, for every EVERY-th, a fresh run is interrupted the
first time that line runs. Each must stop with KeyboardInterrupt, alone, within seconds;
afterwards an uninterrupted run must record exactly what the reference did (nothing left
behind).

``train N CONFIG``: the training run CONFIG describes (a small one) is interrupted at N lines
spread evenly over the lines it executes in the main thread, then resumed: every resumed run
must end as the uninterrupted one does (its metrics but the wall-clock figures, its episode
files byte for byte). A signal that lands before the run directory exists leaves nothing to
resume.

Prints one line per failure and exits 1, or prints the count and exits 0.
"""

from __future__ import annotations

import gc
import os
import shutil
import signal
import sys
import tempfile
import threading
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import trio

from collective import Conductor, EpisodeConfig
from collective.rl.rundir import StepMetrics
from collective.rl.train import Interrupted, load_config, read_metrics, train
from policy.uniform import RandomPolicy

ROOT = os.path.dirname(sys.modules["collective"].__file__ or "")
# Three episodes at once, messages, and a CEO who hires and fires: every path of an instant.
CONFIGS = [
    EpisodeConfig(world="tally", agents=3, world_seed=1, sample_seed=1, time_limit=40),
    EpisodeConfig(world="tally", agents=1, budget=2, org="ceo", world_seed=5, time_limit=40),
    EpisodeConfig(world="tally", agents=2, world_seed=2, sample_seed=3, time_limit=40),
]
HANG_SECONDS = 60.0

Line = tuple[str, int]
T = TypeVar("T")


def interrupted(
    fn: Callable[[], T], *, at: Line | int | None, seen: list[Line] | None
) -> tuple[T, int]:
    """``fn()`` and the lines it ran, raising SIGINT the first time line ``at`` runs (or at the
    ``at``-th line run), and listing each line's first run in ``seen``; only ``collective/``'s
    lines in the main thread count."""
    fired = False
    count = 0
    known: set[Line] = set()

    def local(frame: types.FrameType, event: str, _: Any) -> Any:
        nonlocal fired, count
        if event == "line" and not fired:
            here = (frame.f_code.co_filename, frame.f_lineno)
            count += 1
            if seen is not None and here not in known:
                known.add(here)
                seen.append(here)
            if here == at or count == at:
                fired = True
                signal.raise_signal(signal.SIGINT)
        return local

    def tracer(frame: types.FrameType, event: str, arg: Any) -> Any:
        if fired or not frame.f_code.co_filename.startswith(ROOT):
            return None
        if threading.current_thread() is not threading.main_thread():
            return None
        return local(frame, event, arg)

    sys.settrace(tracer)
    try:
        return fn(), count
    finally:
        sys.settrace(None)


def play() -> list[bytes]:
    conductor = Conductor(RandomPolicy())
    episodes = trio.run(lambda: conductor.play(CONFIGS, concurrency=len(CONFIGS)))
    return [msgspec.msgpack.encode(ep) for ep in episodes]


def engine(every: int) -> int:
    thresholds = gc.get_threshold()
    play()  # warm: lines that run once per process (loading a world) are not meant
    lines: list[Line] = []
    reference, _ = interrupted(play, at=None, seen=lines)
    failures = 0
    for k, line in enumerate(lines[::every]):
        where = f"{os.path.relpath(line[0], ROOT)}:{line[1]} (line {k * every} of {len(lines)})"
        with Watchdog(where):
            try:
                interrupted(play, at=line, seen=None)
                got = "no KeyboardInterrupt"
            except KeyboardInterrupt:
                got = ""
            except BaseException as e:  # a group, or trio's internal error
                got = f"{type(e).__name__}: {e}"
        if got:
            print(f"Ctrl-C at {where}: {got}", flush=True)
            failures += 1
    if play() != reference:
        print("an uninterrupted run after the interrupted ones recorded something else")
        failures += 1
    if gc.get_threshold() != thresholds:
        print(f"gc thresholds left at {gc.get_threshold()}, were {thresholds}")
        failures += 1
    print(f"{len(lines[::every])} interrupted runs, {failures} failed")
    return failures


def training(n: int, config: str, tmp: Path) -> int:
    cfg = load_config(config)

    def comparable(run: Path) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
        metrics = [
            {k: v for k, v in msgspec.to_builtins(m).items() if k not in StepMetrics.WALL_CLOCK}
            for m in read_metrics(run)
        ]
        return metrics, {p.name: p.read_bytes() for p in sorted(run.glob("episodes/*.msgpack"))}

    train(cfg, tmp / "whole", progress=False)  # (also warm: see engine)
    _, lines = interrupted(lambda: train(cfg, tmp / "counted", progress=False), at=None, seen=None)
    reference = comparable(tmp / "whole")
    failures = 0
    for i in range(n):
        k = 1 + i * lines // n
        run = tmp / f"run{i}"
        where = f"line {k} of {lines}"
        with Watchdog(where):
            try:
                interrupted(lambda run=run: train(cfg, run, progress=False), at=k, seen=None)
            except (Interrupted, KeyboardInterrupt):
                pass
            except BaseException as e:
                print(f"Ctrl-C at {where}: {type(e).__name__}: {e}", flush=True)
                failures += 1
                continue
            if run.exists() and len(read_metrics(run)) < cfg.steps:
                train(cfg, run, resume=True, progress=False)
        if run.exists() and comparable(run) != reference:
            print(f"Ctrl-C at {where}: the resumed run differs from the uninterrupted one")
            failures += 1
        shutil.rmtree(run, ignore_errors=True)
    print(f"{n} interrupted runs, {failures} failed")
    return failures


class Watchdog:
    """Ends the process, saying where, if the block takes over HANG_SECONDS."""

    def __init__(self, where: str) -> None:
        self.timer = threading.Timer(HANG_SECONDS, self.hung, (where,))

    def __enter__(self) -> None:
        self.timer.start()

    def __exit__(self, *_: object) -> None:
        self.timer.cancel()

    @staticmethod
    def hung(where: str) -> None:
        print(f"Ctrl-C at {where}: hung for {HANG_SECONDS:.0f} s", flush=True)
        os._exit(1)


def main() -> int:
    mode, number = sys.argv[1], int(sys.argv[2])
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as at a terminal
    if mode == "engine":
        return 1 if engine(number) else 0
    with tempfile.TemporaryDirectory() as tmp:
        return 1 if training(number, sys.argv[3], Path(tmp)) else 0


if __name__ == "__main__":
    sys.exit(main())
