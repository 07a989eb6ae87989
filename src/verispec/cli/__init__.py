"""The ``verispec`` command: ``main`` (generate, analyze, rules, simulate, models, serve) and ``bench`` (sweeps,
reports, comparisons). The only floor that imports lazily, for start-up time."""

from verispec.cli.main import main

__all__ = ["main"]
