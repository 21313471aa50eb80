"""``python -m experiments.signs_of_life``: the study, as ``collective experiment
signs-of-life`` runs it."""

import sys

from experiments.signs_of_life import main

sys.exit(main())
