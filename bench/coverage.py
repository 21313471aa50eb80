"""How often a "95%" interval of collective/studies/intervals.py covers the truth, on simulated
designs of
the signs-of-life shape: S training seeds x 16 held-out instances, figure = seed effect (sd
``sd_seed``) + instance noise (sd 1), true mean 0. The figures behind intervals.py's docstring
(and tests/studies/test_intervals.py, which asserts them on fewer replicates):

- ``old``: the project's earlier ``bootstrap`` over seeds x instances (percentile);
- ``t``: ``seed_interval``, Student-t over the per-seed means;
- ``hier``: ``hierarchical_bootstrap``, seeds then instances, expanded percentile;
- ``hier-plain``: the same without the expansion (what ``old`` is, vectorised).

    python bench/coverage.py            # ~20 s on one core
"""

from __future__ import annotations

import sys

import numpy as np

from collective.studies.intervals import bootstrap, hierarchical_bootstrap, seed_interval


def covers(lo: float | None, hi: float | None) -> bool:
    return lo is not None and hi is not None and lo <= 0.0 <= hi


def main() -> int:
    rng = np.random.default_rng(2025)
    reps, n = 400, 16
    print(f"{'seeds':>5} {'sd_seed':>7} {'old':>6} {'t':>6} {'hier':>6} {'hier-plain':>10}")
    for seeds in (3, 6):
        for sd_seed in (1.0, 0.3, 0.0):
            got = dict.fromkeys(("old", "t", "hier", "hier-plain"), 0)
            for k in range(reps):
                y = rng.normal(0, sd_seed, (seeds, 1)) + rng.normal(0, 1, (seeds, n))
                a = bootstrap(y, boot=400, rng_seed=k)
                b = seed_interval(y.mean(axis=1))
                c = hierarchical_bootstrap(y, boot=1000, rng_seed=k)
                d = hierarchical_bootstrap(y, boot=1000, rng_seed=k, expand=False)
                for key, iv in (("old", a), ("t", b), ("hier", c), ("hier-plain", d)):
                    got[key] += covers(iv.lo, iv.hi)
            row = [got[k] / reps for k in ("old", "t", "hier", "hier-plain")]
            print(
                f"{seeds:>5} {sd_seed:>7.1f} "
                + " ".join(f"{v:>6.3f}" for v in row[:3])
                + f" {row[3]:>10.3f}"
            )
    print(f"({reps} simulated experiments per row; a coverage estimate's sd is about 0.011)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
