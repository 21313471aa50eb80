"""Tests of ``collective.studies`` and the studies bench/ runs: scale, city, signs of life."""
