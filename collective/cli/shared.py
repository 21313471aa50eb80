"""What every command of the ``collective`` command line shares: the registry of commands
(``COMMANDS``, filled by ``@command``), ``say`` (printing what reaches a terminal), ``--param``,
and the checks and summaries more than one command makes. A module of its own so that the
commands' modules (``collective.cli`` and ``collective.cli.episodes``) stand on it rather than on
each other."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from collective.base.args import param_value
from collective.base.outputs import printable
from collective.records import Episode, EpisodeStream

#: Each command's function by its name on the command line (``cmd_make_model``: ``make-model``).
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {}


def say(*values: object, file: Any = None) -> None:
    """``print``, with every control character escaped (``outputs.printable``): whatever an
    episode file, an agent or a world's error says reaches the terminal as text, never as a
    command to it (a title, a cleared screen). Line breaks in what is printed stay; a record's
    own line breaks are escaped where it is laid out one line each (``describe``)."""
    print(*(printable(str(v), keep_newlines=True) for v in values), file=file)


def command(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Register ``fn`` in ``COMMANDS`` under its name on the command line."""
    COMMANDS[fn.__name__.removeprefix("cmd_").replace("_", "-")] = fn
    return fn


def add_param(parser: argparse.ArgumentParser) -> None:
    """``--param KEY=VALUE``, read the same way by every command that builds a world."""
    parser.add_argument(
        "--param",
        type=_param,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a world parameter, read as JSON if it is JSON, then converted to the type the "
        "world constructor annotates (repeatable)",
    )


def _param(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, param_value(key, value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def input_paths(a: argparse.Namespace, *outputs: str) -> list[str]:
    """Every path the command's arguments could name but ``outputs``: each argument, and each
    part of a reference like ``file.py:Class`` or ``tiny:PATH``. An output that is one of
    these (device and inode) is refused before any work (``outputs.check_file``)."""
    found: list[str] = []
    for key, value in vars(a).items():
        if key in outputs:
            continue
        for v in value if isinstance(value, list | tuple) else [value]:
            if isinstance(v, tuple):  # --param KEY=VALUE
                v = v[-1]
            if isinstance(v, str | Path) and str(v):
                found += [str(v), *str(v).split(":")]
    return found


def episode_summary(ep: Episode | EpisodeStream, wall: float, out: str | None) -> dict[str, Any]:
    s = ep.stats
    return {
        "score": round(ep.score, 6),
        "duration": round(ep.duration, 3),
        "end": ep.end,
        "events": s.events,
        "turns": s.turns,
        "tokens": s.output_tokens,
        "messages": s.sent,
        "posts": s.posts,
        "world_metrics": ep.world_metrics,  # the world's own ``metrics()`` at the end
        "wall_time": round(wall, 3),
        "out": out,
    }


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401  (an optional extra)
    except ImportError:
        return False
    return True


def world_broke(name: str, line: str, a: argparse.Namespace) -> int:
    """A bug in the world: one line, exit 2. With ``-v`` the world's traceback has been logged
    already; the command's own (where it noticed) would read as a crash of the tool."""
    hint = "" if a.verbose else " (-v for the traceback)"
    say(f"collective {name}: error: {printable(' '.join(line.split()))}{hint}", file=sys.stderr)
    return 2


def close_policy(policy: Any) -> None:
    """Release what a policy holds (a server process it launched) once the command is done."""
    import trio

    trio.run(policy.aclose)
