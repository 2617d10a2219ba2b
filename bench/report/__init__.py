"""Writers for a run folder: ``table.md``, ``leaderboard.md`` and plots, from its saved rows and samples only.

- ``pages``: the two pages, ``render_table`` (table.md) and ``render_leaderboard`` (leaderboard.md),
  with their prose (the stutter verdict, theory links), and ``write_report``, which writes the pages
  and the plots into the run folder.
- ``tables``: the column lists, ``markdown_table``, the order of systems and test sets, and the
  tables the pages are built from (the systems x test sets grid, training budgets, where the time
  goes, isolation and its note, the fastest AR).
- ``plots``: every plot (file names ``PLOTS`` and ``CURVE_PLOT``; the grid page's ``GRID_PAGE`` and
  ``GRID_PLOT``) and its helpers (the Pareto front, axes, labels).
- ``grid``: the grid page, ``grid.md`` and ``grid.png``: each ablation axis's effect on BLEU and latency
  against a reference value, cell by cell and on average, and an interaction of two axes.
"""
from __future__ import annotations

from bench.report.pages import render_leaderboard, render_table, write_report
from bench.report.plots import CURVE_PLOT, PLOTS
from bench.report.tables import RESULTS, markdown_table

__all__ = ["CURVE_PLOT", "PLOTS", "RESULTS", "markdown_table", "render_leaderboard", "render_table", "write_report"]
