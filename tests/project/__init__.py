"""The project as a whole: import graph, packaging, the suite's health, bench smoke tests."""
