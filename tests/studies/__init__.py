"""Tests of ``collective.studies`` and of the experiments (``experiments/``, run from bench/ and
``collective experiment``): scale, city, signs of life."""
