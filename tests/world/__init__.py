"""Tests of ``collective.world``: declaring worlds and actions, world errors and events."""
