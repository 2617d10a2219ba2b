"""The harness: timing, quality metrics, cost model, grid runner, results store, reports, CLI."""
