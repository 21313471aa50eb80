"""Progress on a terminal: what a command that takes more than a few seconds shows while it
works, on stderr, and only where stderr is a terminal (a pipe, a file or a test reads the
command's output, not a bar redrawn in place).

The commands measure progress on the simulated clock (how far the episode has got of its time
limit) where they run or read an episode: a 512-agent episode spends its time evenly over it,
while its events and its agents' turns are not known until it ends.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any


def on_terminal() -> bool:
    """Whether stderr is a terminal, where a bar may be drawn."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed
        return False


class Clock:
    """A bar over simulated seconds, ``0..total`` (nothing off a terminal). ``at(t)`` moves it
    to ``t``, never back; ``close()`` clears it."""

    def __init__(self, total: float, desc: str) -> None:
        from tqdm import tqdm

        self.shown = 0.0
        self.bar: Any = tqdm(
            total=round(total, 3),
            desc=desc,
            unit="sim s",
            disable=not on_terminal(),
            leave=False,
            dynamic_ncols=True,
            mininterval=0.5,
            bar_format="{desc}: {percentage:3.0f}%|{bar}| t={n:.0f} of {total:.0f} simulated s "
            "[{elapsed}<{remaining}]",
        )

    def at(self, t: float) -> None:
        if t > self.shown:
            self.bar.update(round(min(t, self.bar.total) - self.shown, 3))
            self.shown = min(t, self.bar.total)

    def close(self) -> None:
        self.bar.close()


def note(line: str) -> None:
    """One line on stderr, on a terminal only: what a long step is doing."""
    if on_terminal():
        print(line, file=sys.stderr, flush=True)


def step_clock(bar: Any, total: float, label: str) -> Callable[[float], None]:
    """A callback that shows, beside a bar over steps (tqdm's), how far a step's episodes have
    got on the simulated clock, until the bar first moves: a run's first step can take a minute
    with its bar at 0%. Redrawn each 1% of ``total``."""
    start, shown = bar.n, [-total]

    def at(t: float) -> None:
        if bar.n == start and t >= shown[0] + total / 100:
            shown[0] = t
            bar.set_postfix_str(f"{label}: t={t:.0f} of {total:.0f} simulated s")

    return at
