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
import importlib

# Where each re-exported name lives. They load on first use (PEP 562), so that importing the package (the CLI's
# parser reads MapSpec's defaults at every start) costs no SciPy or JAX.
_HOMES = {
    "cells": ("COST_METHOD", "SOURCE", "CellTiming", "DecoderFactory", "PartCosts", "SyntheticVocabulary", "cell_rows",
              "cost_columns", "gemm_dims", "part_costs", "projected_ms", "random_weight_decoders", "recost",
              "time_cell"),
    "model": ("FEATURES", "WORK", "CostModel", "apply_model", "features", "prediction_score", "work_ms"),
    "report": ("COLUMNS", "plot_crossover", "render"),
    "run": ("ensure_rates", "load_rates", "run_map", "write_outputs"),
    "spec": ("AR_NAME", "MODEL", "PLOT", "PROJECTED", "RATES", "ROWS", "SUITE", "TABLE", "Cell", "MapSpec",
             "MapSystem"),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}
__all__ = [name for names in _HOMES.values() for name in names]


def __getattr__(name: str):
    if name not in _HOME_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_HOME_OF[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
