"""The test suite, in folders by layer (each tests what its name says, on the real engine):

- ``engine/``: the conductor's invariants, its hot paths, organisations (``collective.engine``);
- ``records/``: the episode file: schema, streaming, integrity, signs (``collective.records``);
- ``world/``: declaring a world, its errors and events (``collective.world``);
- ``worlds/``: the built-in worlds and the repo world's sandbox (``worlds/``);
- ``replay/``: replay, fork and diff (``collective.replay``);
- ``views/``: trace and swimlane (``collective.views``);
- ``rl/``: training: the loop, its math, config, run directory, loggers, plots, Ray
  (``collective.rl``);
- ``studies/``: the studies and ``collective check`` (``collective.studies``), the experiments
  (``experiments/``);
- ``policy/``: the tiny, Hugging Face and SGLang policies and their grammars (``policy/``);
- ``cli/``: the command line as a program: bad input, hostile files, what it prints;
- ``project/``: the project as a whole: the import graph, packaging, the suite's own health,
  the bench scripts the suite runs;
- ``support/``: what the tests share (helpers, fixtures, the worlds and programs they run by
  path); no tests.

``conftest.py`` (here) holds the hooks and fixtures: load-scaled deadlines, the xdist schedule.
"""
