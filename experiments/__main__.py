"""``python -m experiments [-v] NAME ARGS``: the experiment ``collective experiment NAME ARGS``
runs (:func:`collective.cli.cmd_experiment` starts this), with the command's logging and its
one-line errors (:func:`collective.cli.run_command`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from collective.base import log as logsetup
from collective.base.args import Parser
from collective.cli import run_command
from experiments import signs_of_life

#: Each experiment's ``main(argv) -> exit code``, by the name the command line gives it.
EXPERIMENTS: dict[str, Callable[[list[str]], int]] = {"signs-of-life": signs_of_life.main}


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="collective experiment", description=__doc__.split("\n")[0])
    p.add_argument("-v", "--verbose", action="count", default=0, help="debug logging")
    p.add_argument("name", choices=sorted(EXPERIMENTS))
    p.add_argument("args", nargs=argparse.REMAINDER, help="passed on (e.g. --quick)")
    a = p.parse_args(argv)
    logsetup.configure(a.verbose)
    return run_command("experiment", a.verbose, lambda: EXPERIMENTS[a.name](a.args))


if __name__ == "__main__":
    sys.exit(main())
