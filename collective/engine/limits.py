"""What this machine can hold: checked before a run, so a size it cannot hold is one line of
error, not a MemoryError traceback after minutes (or the kernel's OOM killer).

Two guards. ``check_fits`` adds up what a run will hold, from measured constants (below) and
what a world says of itself (``World.footprint``), and refuses in one line, before any work,
a run that will not fit in the memory available: every agent of a run, every group's world
(which must fit in half, the half ``memory_cap`` lets a world be built in), and in training the
episodes in flight and those a step holds for the learner, and an hf model held in this
machine's memory (``collective.rl.checks.model_parts``: the model, its training state, its
served copies with the decoder's float64 weights, the backward at its token budget).
``memory_cap`` runs a block with the
address space capped at what is in use plus half of what is available (the other half is the
run's: its agents, its record, the policy), so a world that cannot say what it needs and asks
for too much gets a MemoryError, which the caller turns into a one-line error, instead of taking
the machine's memory (and its neighbours') or being killed by the kernel half-way.

The constants are peak resident set slopes between two sizes, each run in a fresh process, so
the interpreter and the imports cancel out (``bench/footprint.py``; the figures are in
``bench/results/footprint/README.md``; rerun it after a change to what an agent or an episode
holds).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collective.world import World

# One agent of a running episode (actor, prompt, request, turn record): a peak-RSS slope,
# rounded up (bench/results/footprint/README.md).
AGENT_BYTES = 6144
# One training episode, in flight and then held for the learner, per agent: a peak-RSS slope,
# rounded down to a power of two (bench/results/footprint/README.md).
EPISODE_AGENT_BYTES = 512 * 1024
# A Hugging Face learner's backward pass, per prompt + output token of one chunk
# (``chunk_tokens``), per layer x hidden unit of the model: a peak-RSS slope on SmolLM2-135M
# with LoRA, rounded up (bench/results/learner_memory/README.md); without and with gradient
# checkpointing.
BACKWARD_UNIT_BYTES = 14
CHECKPOINTED_UNIT_BYTES = 8


def _read_int(path: str) -> int | None:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def available_memory() -> int | None:
    """Bytes this process may still allocate: the kernel's MemAvailable, or less under a cgroup
    limit or an address-space limit (``ulimit -v``); None where none can be read (then nothing
    is refused on memory grounds)."""
    found: list[int] = []
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    except (ImportError, OSError):
        soft = None
    size = _address_space()
    if soft is not None and soft != resource.RLIM_INFINITY and size is not None:
        found.append(max(0, soft - size))
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


def check_fits(what: str, parts: dict[str, int], *, world: int = 0) -> str:
    """ValueError, one line naming the parts, if ``parts`` (bytes by what holds them) add up to
    more than the memory available, or the largest world alone (``world`` bytes, counted in the
    parts too) to more than the half of it a world is built in (``memory_cap``). Returns the
    one line of what it will take (and of what is available, where that can be read)."""
    free = available_memory()
    need = sum(parts.values())
    said = ", ".join(f"{name} {human(n)}" for name, n in parts.items() if n)
    if free is None:
        return f"{what} need at least {human(need)} ({said})"
    if world > free // 2:
        raise ValueError(
            f"{what}: the world needs at least {human(world)}, more memory than half of the "
            f"{human(free)} this machine has available (the other half is the run's)"
        )
    if need > free:
        raise ValueError(
            f"{what} need at least {human(need)} ({said}), more than the {human(free)} of "
            "memory available"
        )
    return f"{what} need at least {human(need)} ({said}), of the {human(free)} available"


def check_agents(agents: int, what: str, world_bytes: int = 0, largest_world: int = 0) -> None:
    """ValueError if ``agents`` agents (about :data:`AGENT_BYTES` each) and their worlds
    (``world_bytes`` in all, the largest ``largest_world``) cannot fit."""
    check_fits(
        f"{what}: {agents:,} agents",
        {f"agents at {human(AGENT_BYTES)} each": agents * AGENT_BYTES, "worlds": world_bytes},
        world=largest_world,
    )


def world_footprint(cls: type[World], n_agents: int, params: dict[str, Any], ref: str) -> int:
    """What ``cls`` says its state takes for ``n_agents`` with ``params`` (converted), 0 where
    it cannot say; a footprint that raises or is not a count of bytes is a one-line error."""
    try:
        got = cls.footprint(n_agents, **params)
    except Exception as e:
        raise ValueError(f"world {ref!r}: footprint() raised {type(e).__name__}: {e}") from None
    if not isinstance(got, int) or isinstance(got, bool) or got < 0:
        raise ValueError(f"world {ref!r}: footprint() returned {got!r}, not bytes (an int >= 0)")
    return got


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
