"""Experiments run on the library: the signs-of-life study (:mod:`.signs_of_life`, its prior
:mod:`.prior` and shared setting :mod:`.setting`), village to city (:mod:`.city`), the learner's
cost on the Hugging Face path (:mod:`.learner_cost`), the run-by-run resumption they share
(:mod:`.resumable`) and the engine at a git ref (:mod:`.gitref`).

They are programs, not the library: ``collective``, ``policy`` and ``worlds`` import nothing of
this package (``tests/project/test_import_graph.py``), and what other code needs from a study
(the intervals findings are judged by, the scale study, a world's check, comparing reruns)
stays in :mod:`collective.studies`. The package ships in the wheel beside the library, so
``collective experiment signs-of-life`` runs from an installed copy (it starts
``python -m experiments.signs_of_life``: :func:`collective.cli.cmd_experiment`); ``bench/``
runs the same programs from a checkout.
"""
