"""The latency map's cost model (:class:`CostModel`): a row's predicted p50 latency from its XLA costs
(the columns of ``bench.latency_map.cells.cost_columns``) and rates measured on this machine.

Per system and cell, XLA's cost analysis of the compiled encoder and of one more decoder pass
(``bench.costs.loop_costs``: the work that does not depend on the tokens, such as the source's
cross-attention keys and values, counts once per call, as in the decode loop) gives flops, bytes and
kernels; the optimised HLO adds each batched dot (attention's score and value products, by shape) and
each layout move (a transpose or copy, by size) (``bench.costs.hlo_work``). With rates measured on this
machine inside jitted loops (``machine_rates.json``: fp32 GEMM flop/s of the model's matmul shape by
rows, each batched dot's flop/s, a transpose's bytes/s by size, read bandwidth by working-set size)
they become

    predicted_ms = c_call + c_pass * passes + c_kernel * kernels + c_work * work_ms
    work_ms = compute_ms + attention_ms + layout_ms + memory_ms                       (:func:`work_ms`)

(``kernels = encode + passes x pass``; each work term sums the encoder and every pass at the rate for
that part's shape or size) with non-negative coefficients fitted by least squares on *relative* error
over the calibration sizes only (default ``small``). Every row carries ``predicted_p50_ms`` beside
``latency_p50_ms`` (:func:`apply_model`); the report scores the prediction on the cells it was not
fitted on (:func:`prediction_score`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Sequence

import numpy as np

from narbench_core.errors import UserError

if TYPE_CHECKING:      # jax-importing modules load on first use, so `narbench --help` stays light
    from bench import costs


FEATURES = ("call", "pass", "kernel", "work")    # ms per call, per pass, per kernel, x work ms (``work_ms``)
WORK = ("compute", "attention", "layout", "memory")


def work_ms(row: dict, rates: costs.MachineRates) -> dict[str, float]:
    """A row's work per call, in ms at the rates measured on this machine (``machine_rates.json``). Each
    part (the encoder, and every pass) adds:

    - compute: its flops other than batched dots, at the measured rate of the model's GEMM shape with
      that part's rows (encoder: batch x source tokens; a pass: batch x k x tokens it computes);
    - attention: each batched dot's flops (``hlo_work``: attention's score and value products) at the
      rate measured for that dot's shape;
    - layout: each layout move's bytes at the rate measured for a transpose of that size;
    - memory: its bytes at the bandwidth measured for a working set of that size (cache or DRAM)."""
    d, ff = row["gemm_dims"]

    def part(name: str, rows: float) -> np.ndarray:
        dots, moves = row[f"{name}_dots"], row[f"{name}_moves"]
        dense = max(row[f"{name}_flops"] - sum(dots.values()), 0.0)
        return 1e3 * np.array([dense / rates.gemm_rate(d, ff, rows),
                               sum(f / rates.dot_rate(k) for k, f in dots.items()),
                               sum(n * float(b) / rates.move_rate(float(b)) for b, n in moves.items()),
                               row[f"{name}_bytes"] / rates.bandwidth(row[f"{name}_bytes"])])

    total = part("encode", row["encode_rows"]) + float(row["passes"]) * part("pass", row["pass_rows"])
    return dict(zip(WORK, (float(v) for v in total)))


def features(row: dict, rates: costs.MachineRates) -> np.ndarray:
    """The cost model's inputs of one row: [1, passes, kernels, work ms]. The four kinds of work are
    times at measured rates, so they are added as one timeline with one coefficient (why one:
    docs/experiments.md, "Latency map")."""
    return np.array([1.0, float(row["passes"]), float(row["ops"]), sum(work_ms(row, rates).values())])


@dataclass(frozen=True)
class CostModel:
    """``predicted_ms = coef . features``: non-negative coefficients fitted on relative error."""

    coef: tuple[float, ...]
    calibrated_on: tuple[str, ...]
    cells_fitted: int
    rates: dict = field(default_factory=dict)      # when and where the machine rates were measured
    fitted_in: str = ""         # run id of the map it was fitted in, when not this one (``--cost-model``)

    @classmethod
    def load(cls, path: Path) -> "CostModel":
        """A model fitted in another map (its ``cost_model.json``), to score this map's rows without fitting."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
            model = cls(tuple(data["coef"]), tuple(data["calibrated_on"]), int(data["cells_fitted"]),
                        data.get("rates", {}), data.get("fitted_in") or path.resolve().parent.name)
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise UserError(f"cannot read a cost model from {path} ({err}); pass a map's cost_model.json") from None
        if len(model.coef) != len(FEATURES):
            raise UserError(f"{path} has {len(model.coef)} coefficients but this cost model has {len(FEATURES)} "
                            f"features ({', '.join(FEATURES)}); refit it by re-running its map")
        return model

    @classmethod
    def fit(cls, rows: Sequence[dict], rates: costs.MachineRates, sizes: Iterable[str]) -> "CostModel":
        from scipy.optimize import nnls

        sizes = tuple(sizes)
        fit_rows = [r for r in rows if r["size"] in sizes]
        if len(fit_rows) < len(FEATURES):
            raise UserError(f"the cost model needs at least {len(FEATURES)} timed rows of {list(sizes)} to fit, "
                            f"got {len(fit_rows)}; let the map time more of those cells first")
        x = np.stack([features(r, rates) for r in fit_rows])        # [n, features]
        y = np.array([r["latency_p50_ms"] for r in fit_rows])        # [n]
        coef, _ = nnls(x / y[:, None], np.ones_like(y))               # minimise sum ((pred - y) / y)^2
        return cls(tuple(float(c) for c in coef), sizes, len(fit_rows),
                   {"measured_at": rates.measured_at, "key": rates.key, "measured": dict(rates.measured)})

    def predict(self, row: dict, rates: costs.MachineRates) -> float:
        return float(features(row, rates) @ np.asarray(self.coef))


def apply_model(rows: Sequence[dict], model: CostModel, rates: costs.MachineRates) -> list[dict]:
    """Rows with ``predicted_p50_ms``, ``prediction_error`` ((predicted - measured) / measured),
    ``calibration`` (True: the model was fitted on this row's size in this map) and ``work_ms``."""
    out = []
    for r in rows:
        pred = model.predict(r, rates)
        out.append({**r, "predicted_p50_ms": pred, "prediction_error": pred / r["latency_p50_ms"] - 1.0,
                    "calibration": not model.fitted_in and r["size"] in model.calibrated_on,
                    "work_ms": work_ms(r, rates)})
    return out


def prediction_score(rows: Sequence[dict], tolerance: float = 0.25) -> tuple[int, int]:
    """(rows predicted within ``tolerance``, rows scored) over the rows the model was not fitted on."""
    held = [r for r in rows if not r["calibration"]]
    return sum(abs(r["prediction_error"]) <= tolerance for r in held), len(held)
