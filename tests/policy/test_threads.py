"""policy.threads: the samplers' shared thread pools, and a forked child that samples."""

from __future__ import annotations

import multiprocessing

from policy.threads import sampling_threads


def _sample_in_child() -> None:
    assert sampling_threads("test-sample", 2).submit(sum, [1, 2]).result(timeout=20) == 3


def test_one_pool_a_name_and_size_and_a_forked_child_makes_its_own() -> None:
    """The same pool on every call; a child forked after the parent's pool ran gets a pool of
    its own that runs (the parent's would wait forever: its threads were not copied)."""
    pool = sampling_threads("test-sample", 2)
    assert sampling_threads("test-sample", 2) is pool
    assert sampling_threads("test-sample", 1) is not pool
    assert pool.submit(sum, [1, 2]).result() == 3
    child = multiprocessing.get_context("fork").Process(target=_sample_in_child)
    child.start()
    child.join(60)
    alive = child.is_alive()
    if alive:
        child.kill()
    assert not alive and child.exitcode == 0
