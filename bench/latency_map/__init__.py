"""The latency map (``narbench latency --map``): where PaDIR ``refine:T`` beats AR greedy, by model
size, target length and batch size, timed on random-weight models with every length forced, and a cost
model that predicts it from XLA costs and rates measured on the same machine.

- ``spec.py``: what a map measures (:class:`MapSpec`, whose hash names its folder under
  ``results/speedmap/``; :class:`Cell`, :class:`MapSystem`) and its file names;
- ``cells.py``: one cell: the random-weight decoders, timing, XLA cost columns, rows, re-costing;
- ``model.py``: the cost model (:class:`CostModel`, :func:`work_ms`, :func:`features`);
- ``run.py``: running and resuming a map (:func:`run_map`), its machine rates, :func:`write_outputs`;
- ``report.py``: ``speedmap.md`` (:func:`render`) and ``crossover.png`` (:func:`plot_crossover`).

The names callers use are re-exported here.
"""
from bench.latency_map.cells import (COST_METHOD, SOURCE, CellTiming, DecoderFactory, PartCosts,
                                     SyntheticVocabulary, cell_rows, cost_columns, gemm_dims, part_costs,
                                     projected_ms, random_weight_decoders, recost, time_cell)
from bench.latency_map.model import FEATURES, WORK, CostModel, apply_model, features, prediction_score, work_ms
from bench.latency_map.report import COLUMNS, plot_crossover, render
from bench.latency_map.run import ensure_rates, load_rates, run_map, write_outputs
from bench.latency_map.spec import (AR_NAME, MODEL, PLOT, PROJECTED, RATES, ROWS, SUITE, TABLE, Cell, MapSpec,
                                    MapSystem)

__all__ = [
    "AR_NAME", "MODEL", "PLOT", "PROJECTED", "RATES", "ROWS", "SUITE", "TABLE", "Cell", "MapSpec", "MapSystem",
    "COST_METHOD", "SOURCE", "CellTiming", "DecoderFactory", "PartCosts", "SyntheticVocabulary", "cell_rows",
    "cost_columns", "gemm_dims", "part_costs", "projected_ms", "random_weight_decoders", "recost", "time_cell",
    "FEATURES", "WORK", "CostModel", "apply_model", "features", "prediction_score", "work_ms",
    "ensure_rates", "load_rates", "run_map", "write_outputs",
    "COLUMNS", "plot_crossover", "render",
]
