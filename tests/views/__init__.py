"""Tests of ``collective.views``: Chrome traces and swimlanes."""
