"""What the tests share; no tests here.

Imported as ``tests.support.NAME`` (pytest puts the checkout first on ``sys.path``, since
``tests/`` is a package). Some files are also run by path, so they import nothing from
``tests``: the worlds a test names as ``FILE.py:Class`` (``fragile.py``, ``hostile.py``,
``ear.py``) and the programs a test starts in a subprocess (``ctrl_c_everywhere.py``,
``batch_probe.py``, ``sglang_fake.py``); ``trio_timeouts.py`` is also loaded as a plugin by name
(``tests/project/test_suite_health.py``).

- ``busy``: deadlines scaled by the machine's load; ``trio_timeouts``: a timeout inside
  ``trio.run`` leaves the next test a clean run (both hooks, via ``tests/conftest.py``);
- ``episodes``: ``run`` and ``by_turn``, one episode with a scripted policy;
  ``programs``: agent programs (``jittery``); ``spaces``: hypothesis action spaces;
- ``training``: the small training config (as ``TrainConfig`` and as TOML) and what a rerun must
  match; ``cli``: the command line in a subprocess, as at a terminal;
- ``hf_tiny``, ``sglang_fake``: tiny Hugging Face models and a stand-in SGLang server;
- ``fragile``, ``hostile``, ``ear``: worlds that break, attack, or listen.
"""

from __future__ import annotations

from pathlib import Path

#: This folder: the files run or loaded by path.
SUPPORT = Path(__file__).resolve().parent
#: The checkout (configs/, examples/, bench/).
ROOT = SUPPORT.parent.parent
FRAGILE = SUPPORT / "fragile.py"
HOSTILE = SUPPORT / "hostile.py"
EAR = SUPPORT / "ear.py"
