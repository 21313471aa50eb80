"""Tests of the built-in worlds (``worlds/``) and the repo world's sandbox."""
