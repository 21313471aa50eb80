"""Tests of ``collective.records``: the episode file, its streaming, integrity and signs."""
