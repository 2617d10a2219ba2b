"""Writers for a run folder: ``table.md``, ``leaderboard.md`` and plots (all in ``bench.report.pages``)."""
from __future__ import annotations

from bench.report.pages import (CURVE_PLOT, FASTEST_AR, ISOLATION_TABLE, LATENCY_TABLE, LEADERBOARD, NO_BLEURT,
                                PHASE_TABLE, PLOTS, RESULTS, STUTTER_CLAIM, SUMMARY, fastest_ar, isolation_note,
                                markdown_table, pareto_front, plot_bleu_vs_steps, plot_latency_cdf,
                                plot_learning_curves, plot_pareto, render_budgets, render_isolation,
                                render_leaderboard, render_phases, render_table, stutter_verdict, system_order,
                                test_sets, write_report)

__all__ = ["CURVE_PLOT", "FASTEST_AR", "ISOLATION_TABLE", "LATENCY_TABLE", "LEADERBOARD", "NO_BLEURT", "PHASE_TABLE",
           "PLOTS", "RESULTS", "STUTTER_CLAIM", "SUMMARY", "fastest_ar", "isolation_note", "markdown_table",
           "pareto_front", "plot_bleu_vs_steps", "plot_latency_cdf", "plot_learning_curves", "plot_pareto",
           "render_budgets", "render_isolation", "render_leaderboard", "render_phases", "render_table",
           "stutter_verdict", "system_order", "test_sets", "write_report"]
