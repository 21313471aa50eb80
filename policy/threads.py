"""The process's sampling threads: one pool of each size per sampler, made once and shared by
every policy of the process (a training run serves several versions at once).

Each thread runs torch on one intra-op thread: on a small CPU that is the parallelism that pays
(a decode step is dozens of small kernels), and a prompt's kernels are then the same calls
whatever else is sampled beside it. A forked child has none of its parent's threads, so it
forgets the parent's pools and makes its own (``experiments.signs_of_life`` forks its
jobs)."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import torch

_POOLS: dict[tuple[str, int], ThreadPoolExecutor] = {}
_LOCK = threading.Lock()


def sampling_threads(name: str, workers: int) -> ThreadPoolExecutor:
    """The process's pool of ``workers`` threads named ``name`` (made on first use)."""
    with _LOCK:
        pool = _POOLS.get((name, workers))
        if pool is None:
            pool = _POOLS[name, workers] = ThreadPoolExecutor(
                workers, name, initializer=torch.set_num_threads, initargs=(1,)
            )
        return pool


def _forget_pools() -> None:
    global _LOCK
    _POOLS.clear()  # their threads were not copied: the executors would wait forever
    _LOCK = threading.Lock()  # (held by a thread of the parent's at the fork, it stays held)


os.register_at_fork(after_in_child=_forget_pools)
