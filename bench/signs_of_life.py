"""Signs of life, earned: the study of :mod:`experiments.signs_of_life` (its docstring
says what it trains, measures and judges), run from the checkout.

    python bench/signs_of_life.py                 # everything: 7 variants x 3 seeds x 60 steps
    python bench/signs_of_life.py --quick --out /tmp/sol

Results go to ``bench/results/signs_of_life`` (``--out``); ``collective experiment
signs-of-life`` runs the same study from an installed copy.
"""

from __future__ import annotations

import sys

from experiments.signs_of_life import main

if __name__ == "__main__":
    sys.exit(main())
