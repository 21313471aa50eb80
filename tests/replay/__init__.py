"""Tests of ``collective.replay``: replay, fork and diff."""
