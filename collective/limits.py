"""What this machine can hold: checked before a run, so a size it cannot hold is one line of
error, not a MemoryError traceback after minutes (or the kernel's OOM killer).

Two guards. ``check_agents`` refuses an agent count whose bare minimum (an idle agent costs about
3.7 KB, measured by ``bench/engine.py --million``) exceeds the memory available. ``memory_cap``
runs a block with the address space capped at what is in use plus half of what is available
(the other half is the run's: its agents, its record, the policy), so a world whose constructor
asks for too much (``--param size=10**9``) gets a MemoryError, which the caller turns into a
one-line error, instead of taking the machine's memory (and its neighbours') or being killed by
the kernel half-way.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

AGENT_BYTES = 4096  # at least this much per agent (3.7 KB idle, measured), for the estimate


def _read_int(path: str) -> int | None:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def available_memory() -> int | None:
    """Bytes this process may still allocate: the kernel's MemAvailable, or less under a cgroup
    limit; None where neither can be read (then nothing is refused on memory grounds)."""
    found: list[int] = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    limit = _read_int("/sys/fs/cgroup/memory.max")
    used = _read_int("/sys/fs/cgroup/memory.current")
    if limit is not None and used is not None:
        found.append(max(0, limit - used))
    return min(found) if found else None


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def check_agents(agents: int, what: str) -> None:
    """ValueError if ``agents`` agents cannot fit even at their idle minimum."""
    free = available_memory()
    need = agents * AGENT_BYTES
    if free is not None and need > free:
        raise ValueError(
            f"{what}: {agents:,} agents need at least {human(need)} (about "
            f"{human(AGENT_BYTES)} each), more than the {human(free)} of memory available"
        )


def _address_space() -> int | None:
    statm = Path("/proc/self/statm")
    try:
        return int(statm.read_text().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


@contextmanager
def memory_cap() -> Iterator[None]:
    """Run a block with the address space capped at its current size plus half the memory
    available: an allocation past that raises MemoryError in the block. (A no-op where the
    figures cannot be read.)"""
    try:
        import resource
    except ImportError:  # not a Unix
        yield
        return
    free, size = available_memory(), _address_space()
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if free is None or size is None:
        yield
        return
    cap = size + free // 2
    for bound in (soft, hard):
        if bound != resource.RLIM_INFINITY:
            cap = min(cap, bound)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
