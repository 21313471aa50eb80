"""Reproducible benchmarks: scripts that print and save figures (JSON + PNG under results/)."""
