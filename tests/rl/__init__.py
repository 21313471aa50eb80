"""Tests of ``collective.rl``: the RLCR loop, its math, config, run directory, loggers, Ray."""
