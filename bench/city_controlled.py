"""Village to city, with its controls: the study of :mod:`experiments.city` (its
docstring is the full protocol), run from the checkout.

    python bench/city_controlled.py            # train (resumable), run, summarise
    python bench/city_controlled.py --summarise-only

Results go to ``bench/results/city/controlled`` (``--out``). The city's worlds live in
``worlds/city.py``; the names below keep episodes recorded as
``bench.city_controlled:CityWorkshop`` (before the study moved into the package) resolving.
"""

from __future__ import annotations

import sys

from experiments.city import main
from worlds.city import CityPublicKeys as CityPublicKeys
from worlds.city import CityWorkshop as CityWorkshop

if __name__ == "__main__":
    sys.exit(main())
