"""A pytest plugin: deadlines that scale with how busy the machine is.

A test's deadlines (pytest-timeout's, and the waits a test bounds itself) are hang guards
written for a quiet machine. On a shared one (other jobs, the suite's own workers) the same work
takes longer in wall time by about the number of runnable processes per core: a suite that
passed on a quiet machine timed out at a load average of 18 on two cores. ``load_factor()`` is
that ratio (the larger of the 1- and 5-minute load averages over the cores this process may
run on, at least 1), ``scaled(seconds)`` a deadline of that many quiet seconds as of now, and
the hook below scales every test's pytest-timeout (its marker's or the configured one) by the
factor at the moment the test starts. A hang is still caught: later, by the same factor.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


def load_factor() -> float:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    one, five, _ = os.getloadavg()
    return max(1.0, max(one, five) / (cores or 1))


def scaled(seconds: float) -> float:
    """A deadline of ``seconds`` on a quiet machine, as long as this one's load makes it now."""
    return seconds * load_factor()


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """(Outside pytest-timeout's own wrapper, so it reads the scaled marker.)"""
    marker = item.get_closest_marker("timeout")
    args: tuple[object, ...] = ()
    kwargs: dict[str, object] = {}
    if marker is not None:
        args, kwargs = tuple(marker.args), dict(marker.kwargs)
        base = args[0] if args else kwargs.pop("timeout", None)
        args = args[1:]
    else:
        base = getattr(item.config, "_env_timeout", None)  # the ini's or --timeout's
    if isinstance(base, int | float) and base > 0:
        item.add_marker(pytest.mark.timeout(scaled(base), *args, **kwargs), append=False)
    yield


def pytest_report_header() -> str:
    return f"deadlines scaled by the load: x{load_factor():.1f} now"
