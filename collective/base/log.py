"""Logging: structlog's event-and-fields style on top of the standard library's loggers.

A library does not configure logging on import; the application does. So the engine's loggers
(``get_logger``) render each event to one line and hand it to a ``logging`` logger named after
the module: unconfigured, Python prints warnings and errors to stderr and drops the rest, and
an application that embeds the engine routes or silences ``collective.*`` as it routes anything
else. The command line calls ``configure`` once: warnings only, ``-v`` for debug.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog


def get_logger(name: str) -> Any:
    """A structlog logger that writes through ``logging.getLogger(name)``."""
    return structlog.wrap_logger(
        logging.getLogger(name),
        wrapper_class=structlog.stdlib.BoundLogger,
        processors=[
            structlog.stdlib.filter_by_level,  # below the logger's level: dropped before rendering
            structlog.stdlib.add_log_level,
            structlog.processors.TimeStamper(fmt="%H:%M:%S"),
            structlog.processors.format_exc_info,
            structlog.dev.ConsoleRenderer(colors=False),
        ],
        cache_logger_on_first_use=True,
    )


class _Stderr(logging.StreamHandler):
    """Writes to ``sys.stderr`` as it is when each record comes (a caller may swap it)."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def configure(verbosity: int = 0) -> None:
    """The command line's logging: one line per event on stderr; debug with ``-v``. Loggers
    made with plain ``structlog.get_logger`` are routed the same way."""
    level = logging.DEBUG if verbosity > 0 else logging.WARNING
    handler = _Stderr()
    handler.setFormatter(logging.Formatter("%(message)s"))
    logging.basicConfig(level=level, handlers=[handler], force=True)
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(level),
        # sys.stderr as it is when a line is written: a test runner may have closed the old one.
        logger_factory=lambda *_: structlog.PrintLogger(sys.stderr),
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="%H:%M:%S"),
            structlog.processors.format_exc_info,
            structlog.dev.ConsoleRenderer(colors=False),
        ],
        cache_logger_on_first_use=False,
    )
