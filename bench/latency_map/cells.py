"""Latency map: where PaDIR beats AR greedy, by model size, target length and batch size, and a cost
model that predicts it (``narbench latency --map``).

Latency does not depend on training, so the map times random-weight models (seeded) on a synthetic
source of ``length`` tokens (``length - 1`` fixed random ids + EOS) with every target length forced:

- AR greedy decodes exactly ``length`` steps (EOS ends nothing; ``force_length``);
- PaDIR ``refine:T`` refines ``k`` hypotheses of exactly ``length`` tokens for exactly T passes
  (``force_length``, ``early_stop=False``: the length predictor does not run).

A *cell* is one (size, target length, batch size); its systems are timed interleaved by the harness's
one protocol (``bench.measure.timing.warmup``, then ``measure``, end to end). The number of timed calls per
system adapts to the cell: a pilot round times every system once (it counts as the first call), then
``calls = cell_seconds / round``, clipped to ``[min_calls, max_calls]``. Cells run cheapest first and each finished cell is
saved whole, so an interrupted map resumes where it stopped.

Cost model (:class:`CostModel`). Per system and cell, XLA's cost analysis of the compiled encoder and
of one more decoder pass (``bench.costs.loop_costs``: the work that does not depend on the tokens,
such as the source's cross-attention keys and values, counts once per call, as in the decode loop)
gives flops, bytes and kernels; the optimised HLO adds each batched dot (attention's score and value
products, by shape) and each layout move (a transpose or copy, by size) (``bench.costs.hlo_work``).
With rates measured on this machine inside jitted loops (``machine_rates.json``: fp32 GEMM flop/s of
the model's matmul shape by rows, each batched dot's flop/s, a transpose's bytes/s by size, read
bandwidth by working-set size) they become

    predicted_ms = c_call + c_pass * passes + c_kernel * kernels + c_work * work_ms
    work_ms = compute_ms + attention_ms + layout_ms + memory_ms                       (:func:`work_ms`)

(``kernels = encode + passes x pass``; each work term sums the encoder and every pass at the rate for
that part's shape or size) with non-negative coefficients fitted by
least squares on *relative* error over the calibration sizes only (default ``small``). Every row
carries ``predicted_p50_ms`` beside ``latency_p50_ms``; the report scores the prediction on the cells
it was not fitted on. Accelerator columns are roofline *projections* from published peaks (encode
+ passes x max(flops / peak, bytes / bandwidth): no launch overhead, no measured efficiency), never
measurements.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

import numpy as np

from bench import store as st
from narbench_core.digest import COMPACT, json_digest
from narbench_core.errors import UserError
from narbench_core.io import read_jsonl, write_jsonl, write_text
from narbench_core.markdown import table

if TYPE_CHECKING:      # jax-importing modules load on first use, so `narbench --help` stays light
    from bench import costs

SUITE = "speedmap"
ROWS = "rows.jsonl"
TABLE = "speedmap.md"
PLOT = "crossover.png"
RATES = "machine_rates.json"
AR_NAME = "ar-greedy"
PROJECTED = ("tpu-v3", "a100-sxm-80gb", "h100-sxm")      # accelerators the report projects onto
# How rows' cost columns were made; rows of another method are re-costed on resume (``recost``).
# "loop-ops": one more pass = two chained passes - one (loop-invariant work counted once per call), with
# kernel counts, GEMM shape and rows; "loop-ops-hlo": and each part's batched dots and layout moves read
# from the optimised HLO (``bench.costs.hlo_work``).
COST_METHOD = "loop-ops-hlo"


# ------------------------------------------------------------------------------------------- the map

@dataclass(frozen=True)
class MapSpec:
    """What one map measures (its hash names the run folder, so the same settings resume)."""

    sizes: tuple[str, ...] = ("small", "paper")
    lengths: tuple[int, ...] = (16, 32, 64, 128, 256)
    batches: tuple[int, ...] = (1, 8, 32)
    steps: tuple[int, ...] = (1, 2, 4, 10)
    hyps: tuple[int, ...] = (1, 5)
    calibrate: tuple[str, ...] = ("small",)   # sizes the cost model is fitted on
    vocab_size: int = 8000
    cell_seconds: float = 30.0                # timed seconds per cell (all systems), before clipping
    min_calls: int = 3
    max_calls: int = 50
    seed: int = 0

    def __post_init__(self):
        for name in ("sizes", "lengths", "batches", "steps", "hyps"):
            if not getattr(self, name):
                raise UserError(f"the map needs at least one value of {name}")
        for name in ("lengths", "batches", "steps", "hyps"):
            bad = [v for v in getattr(self, name) if int(v) != v or v < 1]
            if bad:
                raise UserError(f"{name} must be whole numbers >= 1, got {bad}")
        if not set(self.calibrate) <= set(self.sizes):
            raise UserError(f"calibration sizes {sorted(set(self.calibrate) - set(self.sizes))} are not among "
                            f"the map's sizes {list(self.sizes)}; pass --calibrate with one of them")
        if not 1 <= self.min_calls <= self.max_calls:
            raise UserError(f"need 1 <= min_calls <= max_calls, got {self.min_calls} and {self.max_calls}")
        if not self.cell_seconds > 0:
            raise UserError(f"cell_seconds must be > 0, got {self.cell_seconds}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def spec_hash(self) -> str:
        return json_digest(self.to_dict(), separators=COMPACT)

    def to_toml(self) -> str:
        from suites.spec import dump_toml

        return dump_toml(self.to_dict())

    def cells(self) -> list["Cell"]:
        """Every (size, length, batch), cheapest first: by tokens per call, then size as listed, then
        length; sizes interleave, so an unfinished map already holds cells of every size (the cost
        model's calibration and its held-out sizes)."""
        out = [Cell(s, int(n), int(b)) for s in self.sizes for n in self.lengths for b in self.batches]
        return sorted(out, key=lambda c: (c.length * c.batch, self.sizes.index(c.size), c.length))

    def systems(self) -> list["MapSystem"]:
        return [MapSystem(AR_NAME, "greedy", 0, 1)] + [
            MapSystem(f"padir-T{t}-k{k}", f"refine:{t}", int(t), int(k)) for k in self.hyps for t in self.steps]


@dataclass(frozen=True)
class Cell:
    size: str
    length: int      # source tokens = forced target tokens
    batch: int

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.size, self.length, self.batch)


@dataclass(frozen=True)
class MapSystem:
    name: str
    spec: str        # decoder spec: greedy | refine:T
    steps: int       # T (0 for AR)
    length_hyps: int

    @property
    def kind(self) -> str:
        """The model kind the system runs on (models.config.ModelConfig.kind): its rows' family."""
        return "ar" if self.steps == 0 else "padir"

    def tokens_per_pass(self, length: int) -> int:
        """Target positions one decoder pass computes per hypothesis: one AR step, or all of them."""
        return 1 if self.steps == 0 else int(length)


# -------------------------------------------------------------------------------------- decoders

class SyntheticVocabulary:
    """Encodes any text to the same ``length - 1`` seeded random regular ids (the decoders append EOS)."""

    def __init__(self, vocab_size: int, length: int, seed: int = 0):
        from narbench_core.tokens import FIRST_REGULAR_ID

        self.vocab_size = vocab_size
        rng = np.random.default_rng(seed)
        self.ids = [int(i) for i in rng.integers(FIRST_REGULAR_ID, vocab_size, size=max(length - 1, 0))]

    def encode(self, text: str) -> list[int]:
        return list(self.ids)

    def decode(self, ids) -> str:
        return " ".join(str(int(i)) for i in ids)


DecoderFactory = Callable[[Cell, Sequence[MapSystem]], list[Any]]


def random_weight_decoders(spec: MapSpec) -> DecoderFactory:
    """The harness's own decoders (``models.decoders.make_decoder``) on random-weight models of each
    size (one AR and one PaDIR model per size, seeded, sized for the longest target length)."""
    import functools

    import jax

    from models import t5
    from models.config import preset
    from models.decoders import make_decoder

    longest = max(spec.lengths)

    @functools.lru_cache(maxsize=None)
    def model(size: str, kind: str):
        base = preset(size, kind=kind, vocab_size=spec.vocab_size)
        config = base.replace(max_target_length=max(longest, base.max_target_length))
        rng = jax.random.fold_in(jax.random.key(spec.seed), 0 if kind == "ar" else 1)
        return config, t5.init_params(config, rng)

    def make(cell: Cell, systems: Sequence[MapSystem]) -> list[Any]:
        vocab = SyntheticVocabulary(spec.vocab_size, cell.length, spec.seed)
        shapes = dict(buckets=(cell.length,), max_decode_length=cell.length, force_length=cell.length)
        out = []
        for s in systems:
            config, params = model(cell.size, s.kind)
            extra = {} if s.steps == 0 else dict(length_hyps=s.length_hyps, early_stop=False, seed=spec.seed)
            out.append(make_decoder(config, params, vocab, s.spec, name=s.name, **shapes, **extra))
        return out

    return make


# ----------------------------------------------------------------------------------------- timing

SOURCE = "a synthetic source sentence"   # SyntheticVocabulary encodes any text to the cell's ids


@dataclass(frozen=True)
class CellTiming:
    """What timing one cell gave, per system: one entry per timed call, in call order."""
    latencies_ms: dict[str, np.ndarray]      # system -> [calls] ms
    phase_ms: dict[str, list[dict]]          # system -> [calls] phase -> ms
    passes: dict[str, int]                   # system -> decoder passes per call
    compile_s: dict[str, float]              # system -> warm-up seconds
    calls: int


def time_cell(decoders: Sequence[Any], cell: Cell, spec: MapSpec, platform: str | None = None,
              on_call: Callable[[int, int], None] | None = None) -> CellTiming:
    """Warm up, time one interleaved round (the pilot, which counts as the first call), then enough
    further rounds for ``calls = cell_seconds / pilot round`` calls in all (clipped to
    ``[min_calls, max_calls]``)."""
    from bench.measure import timing

    compile_s = timing.warmup(decoders, cell.batch, platform=platform)
    runs = [timing.measure(decoders, [SOURCE] * cell.batch, batch_size=cell.batch, platform=platform)]
    round_s = sum(float(runs[0].latencies(d.name)[0]) for d in decoders) / 1e3
    calls = int(np.clip(math.floor(spec.cell_seconds / max(round_s, 1e-9)), spec.min_calls, spec.max_calls))
    if on_call is not None:
        on_call(1, calls)
    if calls > 1:
        progress = None if on_call is None else (lambda done, total: on_call(1 + done // cell.batch, calls))
        runs.append(timing.measure(decoders, [SOURCE] * (cell.batch * (calls - 1)), batch_size=cell.batch,
                                   platform=platform, on_batch=progress))
    names = [d.name for d in decoders]
    # Every sentence of a call shares the call's time and phases: keep one per call.
    return CellTiming(
        latencies_ms={n: np.concatenate([m.latencies(n)[::cell.batch] for m in runs]) for n in names},
        phase_ms={n: [p for m in runs for p in m.systems[n].phase_ms[::cell.batch]] for n in names},
        passes={n: int(max(np.max(m.systems[n].passes) for m in runs)) for n in names},
        compile_s=dict(compile_s), calls=calls)


@dataclass(frozen=True)
class PartCosts:
    """XLA flops / bytes / kernels of one decoder's encoder (with the decode's loop-invariant work) and
    of one more decoder pass (``bench.costs.loop_costs``), and its model's GEMM shape (d_model, d_ff)."""
    encode: costs.XlaCost
    step: costs.XlaCost
    dims: tuple[int, int] = (0, 0)

    def total(self, passes: float) -> costs.XlaCost:
        from bench import costs

        return costs.XlaCost(self.encode.flops + passes * self.step.flops,
                             self.encode.bytes_accessed + passes * self.step.bytes_accessed,
                             self.encode.kernels + passes * self.step.kernels)   # totals only: dots and moves stay per part


def gemm_dims(decoder: Any) -> tuple[int, int]:
    """(d_model, d_ff) of a decoder's model: the matmul shape whose measured rate the cost model uses."""
    return int(decoder.config.d_model), int(decoder.config.d_ff)


def part_costs(decoders: Sequence[Any], systems: Sequence[MapSystem], batch: int) -> dict[str, PartCosts]:
    """Per system, the encoder's and one pass's XLA cost (PaDIR systems that differ only in T share
    their programs, so each (kind, k) is lowered once)."""
    from bench import costs

    out: dict[str, PartCosts] = {}
    shared: dict[tuple[str, int], PartCosts] = {}
    for decoder, s in zip(decoders, systems):
        key = (s.kind, s.length_hyps)
        if key not in shared:
            prepared = decoder.prepare([SOURCE] * batch)
            parts = costs.loop_costs(decoder, prepared)
            shared[key] = PartCosts(parts["encode"], parts["pass"], gemm_dims(decoder))
        out[s.name] = shared[key]
    return out


def cell_rows(cell: Cell, systems: Sequence[MapSystem], timed: CellTiming, parts: dict[str, PartCosts],
              peaks: costs.MachinePeaks, cpu: str) -> list[dict]:
    """One row per system of a timed cell (prediction columns are filled by :func:`apply_model`)."""
    from bench.measure import stats

    ar = timed.latencies_ms.get(AR_NAME)
    rows = []
    for s in systems:
        lat = timed.latencies_ms[s.name]
        summary = stats.summarize(lat)
        passes = timed.passes[s.name]
        phase: dict[str, list[float]] = {}
        for p in timed.phase_ms[s.name]:
            for name, ms in p.items():
                phase.setdefault(name, []).append(ms)
        row = {
            "size": cell.size, "target_length": cell.length, "batch_size": cell.batch, "system": s.name,
            "family": s.kind, "steps": s.steps or None,
            "length_hyps": s.length_hyps, "passes": passes, "calls": timed.calls,
            "latency_p50_ms": summary.p50, "latency_p99_ms": summary.p99, "latency_mean_ms": summary.mean,
            "p99_reliable": summary.p99_reliable, "latencies_ms": [float(x) for x in lat],
            "phase_p50_ms": {k: float(np.median(v)) for k, v in phase.items()},
            "speedup_p50_vs_ar": None if ar is None else float(np.median(ar) / summary.p50),
            "speedup_p99_vs_ar": None if ar is None else float(np.percentile(ar, 99) / summary.p99),
            "compile_s": float(timed.compile_s.get(s.name, 0.0)),
            "cpu_model": cpu,
        }
        rows.append({**row, **cost_columns(parts[s.name], passes, peaks, cell, s)})
    return rows


def cost_columns(part: PartCosts, passes: int, peaks: costs.MachinePeaks, cell: Cell, system: MapSystem) -> dict:
    """A row's XLA cost columns (``COST_METHOD``), GEMM shape and rows, roofline bound and projections."""
    from bench import costs

    total = part.total(passes)
    out = {"cost_method": COST_METHOD,
           "encode_flops": part.encode.flops, "encode_bytes": part.encode.bytes_accessed,
           "encode_ops": part.encode.kernels,
           "pass_flops": part.step.flops, "pass_bytes": part.step.bytes_accessed, "pass_ops": part.step.kernels,
           "encode_dots": dict(part.encode.dots), "pass_dots": dict(part.step.dots),
           "encode_moves": dict(part.encode.moves), "pass_moves": dict(part.step.moves),
           "flops": total.flops, "bytes": total.bytes_accessed, "ops": total.kernels,
           "gemm_dims": list(part.dims), "encode_rows": cell.batch * cell.length,
           "pass_rows": cell.batch * system.length_hyps * system.tokens_per_pass(cell.length),
           "roofline_ms": costs.roofline_ms(total.flops, total.bytes_accessed, peaks.peak_flops, peaks.bandwidth)}
    for name in PROJECTED:
        out[f"projection_{name}_ms"] = projected_ms(part, passes, name)
    return out


def recost(rows: Sequence[dict], spec: MapSpec, factory: DecoderFactory, peaks: costs.MachinePeaks) -> list[dict]:
    """Rows with their cost columns recomputed where an earlier ``COST_METHOD`` made them (timing
    untouched): XLA costs depend only on shapes, so no cell is timed again."""
    stale = sorted({(r["size"], r["target_length"], r["batch_size"]) for r in rows
                    if r.get("cost_method") != COST_METHOD})
    if not stale:
        return list(rows)
    systems = spec.systems()
    by_name = {s.name: s for s in systems}
    out = list(rows)
    for key in stale:
        cell = Cell(*key)
        parts = part_costs(factory(cell, systems), systems, cell.batch)
        out = [{**r, **cost_columns(parts[r["system"]], r["passes"], peaks, cell, by_name[r["system"]])}
               if (r["size"], r["target_length"], r["batch_size"]) == key and r["system"] in by_name else r
               for r in out]
    return out


def projected_ms(part: PartCosts, passes: int, accelerator: str) -> float:
    """Roofline bound on a published accelerator (a projection): encode + passes x one pass."""
    from bench import costs

    acc = costs.accelerator(accelerator)
    bound = lambda c: costs.roofline_ms(c.flops, c.bytes_accessed, acc.peak_flops, acc.bandwidth)
    return bound(part.encode) + passes * bound(part.step)


# -------------------------------------------------------------------------------------- cost model

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
    times at measured rates, so they are added as one timeline with one coefficient: fitting one
    coefficient each over-fits the calibration size, where they move together (README, latency map)."""
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


# ------------------------------------------------------------------------------------------- the run

def run_map(spec: MapSpec, out_root: Path, command: str, factory: DecoderFactory | None = None,
            peaks: costs.MachinePeaks | None = None, env: dict | None = None, platform: str | None = None,
            progress: bool = True, force: bool = False, rates: costs.MachineRates | None = None,
            model: CostModel | None = None) -> Path:
    """Time every missing cell into ``<out_root>/speedmap/<run_id>/rows.jsonl`` (resuming an unfinished
    run of the same settings), then fit the cost model and write the table and the plot."""
    from bench import costs

    if spec.calibrate and model is not None:      # before any cell is timed
        raise UserError("a map fits its own cost model on its calibration sizes or is scored by another map's "
                        "(--cost-model), not both")
    run, resumed = st.open_run(Path(out_root), SUITE, spec.spec_hash(), spec.to_toml(), command, force=force)
    if env is not None and not (run.path / st.ENV).is_file():
        run.write_env(env)
    cpu = (env or run.env()).get("cpu_model", "unknown")
    peaks = peaks or costs.machine_peaks()
    factory = factory or random_weight_decoders(spec)
    systems = spec.systems()
    rows = read_jsonl(run.path / ROWS)
    if any(r.get("cost_method") != COST_METHOD for r in rows):
        rows = recost(rows, spec, factory, peaks)
        write_jsonl(run.path / ROWS, rows)
    done = {(r["size"], r["target_length"], r["batch_size"]) for r in rows}
    todo = [c for c in spec.cells() if c.key not in done]
    bar = None
    if progress and todo:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(todo), unit="cell", desc="speedmap", dynamic_ncols=True)
    for cell in todo:
        if bar is not None:
            bar.set_postfix_str(f"{cell.size} len {cell.length} batch {cell.batch}, compiling")
        decoders = factory(cell, systems)
        label = f"{cell.size} len {cell.length} batch {cell.batch}"
        on_call = None if bar is None else (lambda done, total: bar.set_postfix_str(f"{label}, call {done}/{total}"))
        timed = time_cell(decoders, cell, spec, platform, on_call=on_call)
        parts = part_costs(decoders, systems, cell.batch)
        rows = [r for r in rows if (r["size"], r["target_length"], r["batch_size"]) != cell.key]
        rows += cell_rows(cell, systems, timed, parts, peaks, cpu)
        write_jsonl(run.path / ROWS, rows)           # whole file: a kill leaves the previous cells intact
        ensure_rates(run.path, rows, rates)
        write_outputs(run.path, spec, model)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    ensure_rates(run.path, rows, rates)
    write_outputs(run.path, spec, model)
    st.finish_run(run)
    return run.path


def load_rates(run_dir: Path) -> costs.MachineRates | None:
    from bench import costs

    path = run_dir / RATES
    return costs.MachineRates(**json.loads(path.read_text())) if path.is_file() else None


def ensure_rates(run_dir: Path, rows: Sequence[dict], given: costs.MachineRates | None = None) -> None:
    """``machine_rates.json`` in the run folder covers every GEMM shape, batched dot and layout move of
    ``rows``: the ``given`` rates, else measured here for what they lack (``bench.costs.measure_rates``,
    ``measure_dot_rates``, ``measure_move_rates``: about 1.5 s a rate, ~30 s for a GEMM shape's table)."""
    from bench import costs

    stored = load_rates(run_dir)
    have = given or stored
    shapes = sorted({tuple(r["gemm_dims"]) for r in rows})
    missing = [(d, ff) for d, ff in shapes if have is None or f"{d},{ff}" not in have.gemm]
    if missing:
        fresh = costs.measure_rates(missing)
        have = fresh if have is None else dataclasses.replace(have, gemm={**have.gemm, **fresh.gemm})
    if have is None:             # no rows
        return
    dots = sorted({k for r in rows for part in ("encode_dots", "pass_dots") for k in r.get(part, {})} - set(have.dots))
    now = lambda: datetime.now(timezone.utc).isoformat(timespec="seconds")     # when each table was (last) added
    if dots:
        have = dataclasses.replace(have, dots={**have.dots, **costs.measure_dot_rates(dots)},
                                   measured={**have.measured, "dots": now()})
    if not have.moves:
        have = dataclasses.replace(have, moves=costs.measure_move_rates(), measured={**have.measured, "moves": now()})
    if have != stored:
        write_text(run_dir / RATES, json.dumps(asdict(have), indent=2) + "\n")


MODEL = "cost_model.json"


def write_outputs(run_dir: Path, spec: MapSpec, model: CostModel | None = None) -> None:
    """Fit the cost model on the calibration sizes (once they have enough timed rows), add its
    predictions to ``rows.jsonl`` and write ``speedmap.md`` and ``crossover.png`` (after every cell,
    so an unfinished map can be read). A map with no calibration sizes fits nothing: it is scored by
    ``model`` (fitted in another map), or by the one it was first given (its ``cost_model.json``)."""
    rows = read_jsonl(run_dir / ROWS)
    if not rows:
        raise UserError(f"{run_dir} has no timed cells; run `narbench latency --map` until some finish")
    fitted = [r for r in rows if r["size"] in spec.calibrate]
    rates = load_rates(run_dir)
    if model is None and not spec.calibrate and (run_dir / MODEL).is_file():
        model = CostModel.load(run_dir / MODEL)
    if model is None and len(fitted) >= len(FEATURES) and rates:
        model = CostModel.fit(rows, rates, spec.calibrate)
    if model is not None and rates:
        rows = apply_model(rows, model, rates)
        write_jsonl(run_dir / ROWS, rows)
        write_text(run_dir / MODEL, json.dumps(asdict(model), indent=2) + "\n")
    plot_crossover(rows, spec, run_dir / PLOT)
    done = {(r["size"], r["target_length"], r["batch_size"]) for r in rows}
    write_text(run_dir / TABLE, render(rows, spec, model, st.RunStore(run_dir).env(),
                                       run_finished=all(c.key in done for c in spec.cells()), rates=rates))


# ---------------------------------------------------------------------------------------- reports

def _padir(rows: Sequence[dict]) -> list[dict]:
    """The refinement rows: every row that is not the AR baseline's."""
    return [r for r in rows if r["family"] != "ar"]


def plot_crossover(rows: Sequence[dict], spec: MapSpec, path: Path) -> None:
    """Speedup of PaDIR over AR greedy (p50) against target length: one panel per size and batch,
    one colour per T, solid k=1 / dashed k>1."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    sizes = [s for s in spec.sizes if any(r["size"] == s for r in rows)]
    fig, axes = plt.subplots(len(sizes), len(spec.batches), figsize=(4.2 * len(spec.batches), 3.4 * len(sizes)),
                             squeeze=False, sharey=True)
    colours = dict(zip(spec.steps, plt.get_cmap("viridis")(np.linspace(0.0, 0.85, len(spec.steps)))))
    styles = ["-", "--", ":", "-."]
    for i, size in enumerate(sizes):
        for j, batch in enumerate(spec.batches):
            ax = axes[i][j]
            ax.axhline(1.0, color="0.4", lw=0.8)
            for hi, k in enumerate(spec.hyps):
                for t in spec.steps:
                    pts = sorted((r["target_length"], r["speedup_p50_vs_ar"]) for r in _padir(rows)
                                 if r["size"] == size and r["batch_size"] == batch and r["steps"] == t
                                 and r["length_hyps"] == k)
                    if pts:
                        ax.plot(*zip(*pts), marker="o", ms=3, color=colours[t], ls=styles[hi % len(styles)],
                                label=f"T={t}, k={k}")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
            ax.set_xticks(list(spec.lengths), [str(n) for n in spec.lengths])
            ax.set_title(f"{size}, batch {batch}", fontsize=10)
            if i == len(sizes) - 1:
                ax.set_xlabel("target length (tokens)")
            if j == 0:
                ax.set_ylabel("speedup vs AR greedy (p50)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="upper center", ncol=min(len(labels), 8), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fmt_x(v: float | None) -> str:
    if v is None:
        return "-"
    return f"**{v:.2f}x**" if v >= 1.0 else f"{v:.2f}x"


# The measured-rows table: one column list (key, header, format).
COLUMNS = (
    ("size", "size", str), ("target_length", "length", str), ("batch_size", "batch", str),
    ("system", "system", str), ("calls", "calls", str),
    ("latency_p50_ms", "p50 ms", lambda v: f"{v:.1f}"), ("latency_p99_ms", "p99 ms", lambda v: f"{v:.1f}"),
    ("speedup_p50_vs_ar", "speedup p50", _fmt_x), ("speedup_p99_vs_ar", "speedup p99", _fmt_x),
    ("predicted_p50_ms", "predicted p50 ms", lambda v: f"{v:.1f}"),
    ("prediction_error", "error", lambda v: f"{100 * v:+.0f}%"),
    ("calibration", "fitted on", lambda v: "yes" if v else "no"),
)


def _table(rows: Sequence[dict], columns=COLUMNS) -> list[str]:
    return table([h for _, h, _ in columns],
                 ([fmt(r[key]) if r.get(key) is not None else "-" for key, _, fmt in columns] for r in rows),
                 "".join("l" if key in ("size", "system") else "r" for key, _, _ in columns))


def render(rows: Sequence[dict], spec: MapSpec, model: CostModel | None, env: dict, run_finished: bool = True,
           rates: costs.MachineRates | None = None) -> str:
    """``speedmap.md``: where PaDIR wins (speedup grids), the cost model's accuracy, projections, rows."""
    cpu = env.get("cpu_model", "unknown CPU")
    lines = ["# Latency map: AR greedy vs PaDIR refine:T (k length hypotheses)", "",
             f"Measured on **{cpu}** ({env.get('threads', '?')} threads, {env.get('platform', 'cpu')}), "
             f"random-weight models (seed {spec.seed}), vocabulary {spec.vocab_size:,}, source length = target "
             "length, every target length forced (AR: exactly that many steps; PaDIR: k hypotheses of that "
             "length, exactly T passes, no early stop). End-to-end latency per call, timed interleaved "
             f"by `bench.measure.timing`; {spec.min_calls}-{spec.max_calls} calls per system and cell "
             f"(about {spec.cell_seconds:g} s of timed rounds per cell). Speedup = AR greedy p50 / PaDIR p50 "
             "(bold: PaDIR is faster). p99 ratios come from few calls; with forced lengths they mostly repeat "
             "the p50 ones.", ""]
    for size in spec.sizes:
        for batch in spec.batches:
            cell_rows_ = [r for r in _padir(rows) if r["size"] == size and r["batch_size"] == batch]
            if not cell_rows_:
                continue
            lengths = [n for n in spec.lengths if any(r["target_length"] == n for r in cell_rows_)]
            ar = {r["target_length"]: r for r in rows if r["family"] == "ar" and r["size"] == size
                  and r["batch_size"] == batch}
            body = [["AR greedy p50 ms", *(f"{ar[n]['latency_p50_ms']:.1f}" if n in ar else "-" for n in lengths)]]
            for k in spec.hyps:
                for t in spec.steps:
                    by_len = {r["target_length"]: r for r in cell_rows_ if r["steps"] == t and r["length_hyps"] == k}
                    body.append([f"T={t}, k={k}", *(_fmt_x(by_len[n]["speedup_p50_vs_ar"]) if n in by_len else "-"
                                                    for n in lengths)])
            lines += [f"## {size}, batch {batch}: PaDIR speedup over AR greedy (p50)", "",
                      *table(["", *(f"{n} tok" for n in lengths)], body, "l"), ""]
    if not run_finished:
        lines += [f"**Unfinished map**: {len({(r['size'], r['target_length'], r['batch_size']) for r in rows})} of "
                  f"{len(spec.cells())} cells timed so far; re-running the command resumes it.", ""]
    lines += _model_lines(rows, model, rates) + _projection_lines(rows, spec)
    lines += ["", "## Every timed row", ""] + _table(rows) + [""]
    return "\n".join(lines)


def _model_lines(rows: Sequence[dict], model: CostModel | None, rates: costs.MachineRates | None) -> list[str]:
    if model is None:
        return ["## Cost model", "", "Not fitted yet: the calibration sizes have fewer than "
                f"{len(FEATURES)} timed rows.", ""]
    within, scored = prediction_score(rows)
    c = model.coef
    lines = ["## Cost model", "",
              f"`predicted = {c[0]:.3f} ms per call + {c[1]:.4f} ms per pass + {1e3 * c[2]:.2f} µs per kernel + "
              f"{c[3]:.3f} x work`, fitted (non-negative least squares on relative error) on the "
              f"{model.cells_fitted} rows of {', '.join(model.calibrated_on)}"
              + (f" **in another map, `{model.fitted_in}`**: none of this map's rows was fitted on" if model.fitted_in
                 else "") + ". Flops, bytes and kernels are XLA's "
              "cost analysis of the compiled encoder and of one more decoder pass (two chained passes minus one: "
              "the loop-invariant work counts once per call); batched dots (attention's products) and layout "
              "moves (transposes and copies) are read from the optimised HLO. work = compute + attention + layout "
              "+ memory, each at a rate measured on this machine inside a jitted loop: the other flops at the fp32 "
              "GEMM rate of the model's matmul shape and the part's rows, each batched dot at its shape's rate, "
              "each move at a transpose's rate for its size, bytes at the read bandwidth for a working set of that "
              f"size (this map's `{RATES}`, measured {_measured(rates)}). Each row's "
              "`work_ms` gives the four terms.", ""]
    if scored:
        errors = np.array([abs(r["prediction_error"]) for r in rows if not r["calibration"]])
        lines.append(f"Rows it was **not** fitted on: **{within} of {scored} ({100 * within / scored:.0f}%) "
                     f"predicted within ±25%**; median absolute error {100 * np.median(errors):.0f}%, "
                     f"worst {100 * errors.max():.0f}%.")
    else:
        lines.append("No row outside the calibration sizes has been timed yet, so the prediction is not scored.")
    fitted = np.array([abs(r["prediction_error"]) for r in rows if r["calibration"]])
    if fitted.size:
        lines.append(f"On the rows it was fitted on: median absolute error {100 * np.median(fitted):.0f}%.")
    return lines + [""]


def _measured(rates: costs.MachineRates | None) -> str:
    if rates is None:
        return "?"
    return ", ".join([rates.measured_at] + [f"{name} {at}" for name, at in sorted(rates.measured.items())])


def _projection_lines(rows: Sequence[dict], spec: MapSpec) -> list[str]:
    from bench import costs

    peaks = "; ".join(f"{a.name} {a.peak_flops / 1e12:,.0f} TFLOP/s {a.dtype}, {a.bandwidth / 1e9:,.0f} GB/s"
                      for a in map(costs.accelerator, PROJECTED))
    lines = ["## Projections (roofline bounds, not measurements)", "",
             "Encoder + passes x max(flops / peak, bytes / bandwidth) with each accelerator's published dense "
             f"peak ({peaks}): no launch or per-step overhead, which on an accelerator is "
             "what AR pays most, so these bound from below and flatter neither side's fixed costs. "
             "Speedup of PaDIR T=4 over AR greedy at batch 1:", ""]
    body = []
    for r in sorted(_padir(rows), key=lambda r: (spec.sizes.index(r["size"]), r["target_length"], r["length_hyps"])):
        if r["batch_size"] != 1 or r["steps"] != 4:
            continue
        ar = next((a for a in rows if a["family"] == "ar" and (a["size"], a["target_length"], a["batch_size"])
                   == (r["size"], r["target_length"], 1)), None)
        if ar is None:
            continue
        proj = [ar[f"projection_{n}_ms"] / r[f"projection_{n}_ms"] for n in PROJECTED]
        body.append([r["size"], r["target_length"], r["length_hyps"], _fmt_x(r["speedup_p50_vs_ar"]),
                     *(f"{p:.1f}x" for p in proj)])
    return lines + table(["size", "length", "k", "CPU measured", *PROJECTED], body, "l")
