"""Logging with structlog: quiet by default (warnings only), ``-v`` for debug."""

from __future__ import annotations

import logging
import sys

import structlog


def configure(verbosity: int = 0) -> None:
    level = logging.DEBUG if verbosity > 0 else logging.WARNING
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(level),
        # sys.stderr as it is when a line is written, not when this ran: whoever replaced it since
        # (a test runner capturing output) may have closed the old one.
        logger_factory=lambda *_: structlog.PrintLogger(sys.stderr),
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="%H:%M:%S"),
            structlog.processors.format_exc_info,
            structlog.dev.ConsoleRenderer(colors=False),
        ],
        cache_logger_on_first_use=False,
    )


if not structlog.is_configured():
    configure(0)
