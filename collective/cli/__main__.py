"""``python -m collective.cli``: the ``collective`` command."""

import sys

from collective.cli import main

sys.exit(main())
