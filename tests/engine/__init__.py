"""Tests of ``collective.engine``: determinism, time, batching, organisations, hot paths."""
