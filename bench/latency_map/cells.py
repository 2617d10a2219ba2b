"""One cell of the latency map: its decoders, its timing, its XLA costs and its rows.

Latency does not depend on training, so the map times random-weight models (seeded) on a synthetic
source of ``length`` tokens (``length - 1`` fixed random ids + EOS) with every target length forced:

- AR greedy decodes exactly ``length`` tokens, one decoder pass each (EOS ends nothing; ``force_length``);
- PaDIR ``refine:T`` refines ``k`` hypotheses of exactly ``length`` tokens for exactly T passes
  (``force_length``, ``early_stop=False``: the length predictor does not run).

A *cell* is one (size, target length, batch size); its systems are timed interleaved by the harness's
one protocol (``bench.measure.timing.warmup``, then ``measure``, end to end). The number of timed calls per
system adapts to the cell: a pilot round times every system once (it counts as the first call), then
``calls = cell_seconds / round``, clipped to ``[min_calls, max_calls]``.

Each row carries its XLA costs (:func:`cost_columns`): the compiled encoder and one more decoder pass
(``bench.costs.loop_costs``), the batched dots and layout moves of the optimised HLO
(``bench.costs.hlo_work``), and roofline *projections* onto the accelerators of :data:`PROJECTED` at
their published peaks (``bench.costs.ACCELERATORS``; encode + passes x max(flops / peak, bytes /
bandwidth): no launch overhead, no measured efficiency), never measurements.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from bench.latency_map.spec import AR_NAME, PROJECTED, Cell, MapSpec, MapSystem

if TYPE_CHECKING:      # jax-importing modules load on first use, so `narbench --help` stays light
    from bench import costs

# How rows' cost columns were made; rows of another method are re-costed on resume (``recost``).
# "loop-ops": one more pass = two chained passes - one (loop-invariant work counted once per call), with
# kernel counts, GEMM shape and rows; "loop-ops-hlo": and each part's batched dots and layout moves read
# from the optimised HLO (``bench.costs.hlo_work``).
COST_METHOD = "loop-ops-hlo"


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
            extra = {} if s.iterations == 0 else dict(length_hyps=s.length_hyps, early_stop=False, seed=spec.seed)
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


# ----------------------------------------------------------------------------- XLA costs and rows

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


def device_fields(env: dict) -> dict:
    """What a map row says of where it was timed (the run's env.json): the platform, the device's kind and
    driver, and ``device_projection``, the published entry of that device (``bench.costs.for_device``; None on
    a CPU or a device narbench states no peaks for), whose projection the row then carries too."""
    from bench import costs

    return {"platform": env.get("platform"), "device_kind": env.get("device_kind"),
            "device_driver": env.get("device_driver"),
            "device_projection": costs.for_device(env.get("device_kind")) if env.get("platform") != "cpu" else None}


def projections(device_projection: str | None) -> tuple[str, ...]:
    """The accelerators a row is projected onto: ``PROJECTED`` and the device it was timed on, where known."""
    extra = (device_projection,) if device_projection and device_projection not in PROJECTED else ()
    return PROJECTED + extra


def cell_rows(cell: Cell, systems: Sequence[MapSystem], timed: CellTiming, parts: dict[str, PartCosts],
              peaks: costs.MachinePeaks, cpu: str, device: dict | None = None) -> list[dict]:
    """One row per system of a timed cell (prediction columns are filled by :func:`apply_model`); ``device``:
    :func:`device_fields` of the run."""
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
            "family": s.kind, "iterations": s.iterations or None,
            "length_hyps": s.length_hyps, "passes": passes, "calls": timed.calls,
            "latency_p50_ms": summary.p50, "latency_p99_ms": summary.p99, "latency_mean_ms": summary.mean,
            "p99_reliable": summary.p99_reliable, "latencies_ms": [float(x) for x in lat],
            "phase_p50_ms": {k: float(np.median(v)) for k, v in phase.items()},
            "speedup_p50_vs_ar": None if ar is None else float(np.median(ar) / summary.p50),
            "speedup_p99_vs_ar": None if ar is None else float(np.percentile(ar, 99) / summary.p99),
            "compile_s": float(timed.compile_s.get(s.name, 0.0)),
            "cpu_model": cpu, **(device or {}),
        }
        rows.append({**row, **cost_columns(parts[s.name], passes, peaks, cell, s,
                                           (device or {}).get("device_projection"))})
    return rows


def cost_columns(part: PartCosts, passes: int, peaks: costs.MachinePeaks, cell: Cell, system: MapSystem,
                 device_projection: str | None = None) -> dict:
    """A row's XLA cost columns (``COST_METHOD``), GEMM shape and rows, roofline bound and projections (onto
    ``PROJECTED`` and the device it was timed on: :func:`projections`)."""
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
    for name in projections(device_projection):
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
        out = [{**r, **cost_columns(parts[r["system"]], r["passes"], peaks, cell, by_name[r["system"]],
                                    r.get("device_projection"))}
               if (r["size"], r["target_length"], r["batch_size"]) == key and r["system"] in by_name else r
               for r in out]
    return out


def projected_ms(part: PartCosts, passes: int, accelerator: str) -> float:
    """Roofline bound on a published accelerator (a projection): encode + passes x one pass."""
    from bench import costs

    acc = costs.accelerator(accelerator)
    bound = lambda c: costs.roofline_ms(c.flops, c.bytes_accessed, acc.peak_flops, acc.bandwidth)
    return bound(part.encode) + passes * bound(part.step)
