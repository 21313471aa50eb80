"""A pytest plugin: deadlines that scale with how busy the machine is.

A test's deadlines (pytest-timeout's, and the waits a test bounds itself) are hang guards
written for a quiet machine. On a shared one (other jobs, the suite's own workers) the same work
takes longer in wall time by about the number of runnable processes per core: a suite that
passed on a quiet machine timed out at a load average of 18 on two cores. ``load_factor()`` is
that ratio (the larger of the 1- and 5-minute load averages over the cores this process may
run on, at least 1), ``scaled(seconds)`` a deadline of that many quiet seconds as of now, and
the hook below scales every test's pytest-timeout (its marker's or the configured one) by the
factor at the moment the test starts. A hang is still caught: later, by the same factor.

Memory is the other thing a shared machine runs short of: a failed test whose report names a
memory kill (Ray's monitor, a worker the kernel's OOM killer took, a ``MemoryError``), or that
failed while the machine had under a tenth of its memory free, says so in its report
(``memory_note``), so that it is not read as a bug of the code it tested.
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


# What a failure's text says when memory, not the code, ended it: Ray's memory monitor, Ray's
# account of a worker that vanished (it names the kernel's OOM killer), Python's MemoryError.
KILLED_BY_MEMORY = (
    "OutOfMemoryError",
    "running low on memory",
    "memory usage threshold",
    "OOM killer",
    "MemoryError",
)


def available_memory() -> tuple[float, float]:
    """(available, total) GiB of the machine's memory, from /proc/meminfo ((0, 0) elsewhere)."""
    kib: dict[str, float] = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("MemAvailable", "MemTotal"):
                    kib[key] = float(value.split()[0])
        return kib["MemAvailable"] / 2**20, kib["MemTotal"] / 2**20
    except (OSError, KeyError, ValueError, IndexError):
        return 0.0, 0.0


def memory_note(failure: str) -> str | None:
    """A line for a failed test that memory may have ended: when its text names a memory kill,
    or the machine has under a tenth of its memory free now. None otherwise."""
    free, total = available_memory()
    named = next((s for s in KILLED_BY_MEMORY if s in failure), None)
    low = total > 0 and free < total / 10
    if named is None and not low:
        return None
    why = f"the failure says {named!r}" if named else "the machine's memory is nearly full"
    return (
        f"killed by memory? {why}; {free:.1f} of {total:.1f} GiB available now (other jobs' "
        "memory counts: rerun it alone to tell)"
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test that memory may have ended says so in its report."""
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        note = memory_note(str(report.longrepr))
        if note is not None:
            report.sections.append(("memory", note))
            if isinstance(report.longrepr, str):
                report.longrepr = f"{note}\n{report.longrepr}"


def pytest_report_header() -> str:
    return f"deadlines scaled by the load: x{load_factor():.1f} now"
