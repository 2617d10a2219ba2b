"""XLA costs of a decoder: flops, bytes and kernels per batch and per sentence, and the roofline bound.

Per batch (the unit the timer measures), ``flops = encode + max(passes in batch) x pass`` (and the
same for bytes), from ``cost_analysis()`` of the compiled ``decoder.lower(prepared, part)``: a whole
decode loop cannot be costed directly because XLA's cost analysis counts a ``while`` body once.
``pass`` is the cost of one more pass: "pass2" (two chained passes) minus "pass" (one). Work that does
not depend on the tokens (the cross-attention keys and values of the source) runs once in two chained
passes as it does in the decode loop (XLA hoists it out of the ``while`` body), so it is counted once
per call, in ``encode`` (:func:`loop_costs`); a lone pass would count it on every pass (at `paper` size,
batch 32, 64 tokens, AR: 15.0 GFLOP a lone pass, 2.1 GFLOP one more pass). Roofline-bound latency =
``max(flops / peak_flops, bytes / bandwidth)``: no real run can be faster, so ``bound / measured`` (the
share of the bound reached) says how far a latency is from what the hardware allows. Each sentence
gets its batch's bound and latency; per-sentence flops are the batch's divided by the sentences in it.
Each distinct shape signature of ``decoder.prepare`` output is lowered and compiled once (first batch
seen): a decoder whose per-pass program depends on input *values* within one shape is costed at that
batch's.

The peaks the bound divides by: this machine's (``bench.costs.machine``) or an accelerator's
published ones (``bench.costs.accelerators``).
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from narbench_core.digest import text_digest
from bench.measure.timing import batches

if TYPE_CHECKING:
    from bench.costs.machine import MachinePeaks


@dataclass(frozen=True)
class XlaCost:
    flops: float
    bytes_accessed: float
    kernels: float = 0.0     # kernels the compiled program launches (instructions of its entry computation)
    # From the optimised HLO (:func:`hlo_work`): flops of each batched dot (attention's score and value
    # products) by "B,M,K,N" (batch, rows, contraction, columns), and layout moves (transposes and copies
    # that only rearrange data) as "output bytes" -> kernels of that size.
    dots: dict = field(default_factory=dict)
    moves: dict = field(default_factory=dict)


# Entry-computation instructions that launch no kernel.
_FREE_OPCODES = frozenset({"parameter", "constant", "tuple", "get-tuple-element", "bitcast"})


def entry_ops(hlo_text: str) -> int:
    """Kernels an optimised HLO module's entry computation runs: its instructions other than
    parameters, constants, tuples and bitcasts (a fusion or a library call is one kernel)."""
    comps, entry = _computations(hlo_text)
    return sum(op not in _FREE_OPCODES for _, _, op, _, _ in comps.get(entry, []))


_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*(\(.*?\)|\S+)\s+([a-z][a-z0-9-]*)\(([^)]*)\)(.*)$")
_ARRAY = re.compile(r"([a-z]+[0-9]*)\[([0-9,]*)\]")
_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4,
                "f64": 8, "s64": 8, "u64": 8}
_MOVE_OPCODES = frozenset({"transpose", "copy"})                 # kernels that only rearrange data ...
_MOVE_FREE = frozenset({"parameter", "bitcast", "reshape"})      # ... with these around them in a fusion


def _dims(shape: str) -> list[int]:
    found = _ARRAY.match(shape)
    return [int(d) for d in found.group(2).split(",") if d] if found else []


def _shape_bytes(shape: str) -> int:
    return sum(_DTYPE_BYTES.get(dtype, 4) * math.prod(int(d) for d in dims.split(",") if d)
               for dtype, dims in _ARRAY.findall(shape))


def _attr_dims(attrs: str, name: str) -> list[int]:
    found = re.search(rf"{name}=\{{([0-9,]*)\}}", attrs)
    return [int(d) for d in found.group(1).split(",") if d] if found else []


def _computations(hlo_text: str) -> tuple[dict[str, list[tuple]], str]:
    """An HLO module's computations, name -> its instructions as (name, shape, opcode, operands,
    attributes), and the entry computation's name."""
    comps: dict[str, list[tuple]] = {}
    entry, current = "", None
    for line in hlo_text.splitlines():
        if line and not line[0].isspace() and line.rstrip().endswith("{"):
            head = line.split()[1] if line.startswith("ENTRY ") else line.split()[0]
            current = head.lstrip("%")
            comps[current] = []
            entry = current if line.startswith("ENTRY ") else entry
        elif current is not None and (found := _INSTRUCTION.match(line)):
            comps[current].append(found.groups())
    return comps, entry


def hlo_work(hlo_text: str) -> tuple[dict, dict]:
    """Two things XLA's cost analysis lumps in with the rest, read from an optimised HLO module:

    - ``dots``: flops of every dot with batch dimensions (in a transformer: attention's score and
      value products), by ``"B,M,K,N"`` (batch, lhs rows, contraction, rhs columns);
    - ``moves``: layout moves, ``"output bytes" -> count``: kernels (a ``transpose`` or ``copy``, or a
      fusion of nothing but those, bitcasts and reshapes) launched by a non-fused computation.

    Each computation counts once per call site (a ``while`` body once, as in ``cost_analysis``)."""
    comps, entry = _computations(hlo_text)
    fused = {c for insts in comps.values() for _, _, op, _, attrs in insts if op == "fusion"
             for c in re.findall(r"calls=%([\w.\-]+)", attrs)}
    dots: dict[str, float] = {}
    moves: dict[str, float] = {}

    def visit(comp: str, times: float) -> None:
        shapes = {name: shape for name, shape, *_ in comps.get(comp, [])}
        for name, shape, op, operands, attrs in comps.get(comp, []):
            if op == "dot" and "lhs_batch_dims" in attrs:
                lhs, rhs = (shapes.get(o.strip().lstrip("%"), "") for o in operands.split(",")[:2])
                ld, rd = _dims(lhs), _dims(rhs)
                lb, lc = _attr_dims(attrs, "lhs_batch_dims"), _attr_dims(attrs, "lhs_contracting_dims")
                rb, rc = _attr_dims(attrs, "rhs_batch_dims"), _attr_dims(attrs, "rhs_contracting_dims")
                if ld and rd:
                    b, k = math.prod(ld[i] for i in lb), math.prod(ld[i] for i in lc)
                    m = math.prod(d for i, d in enumerate(ld) if i not in lb and i not in lc)
                    n = math.prod(d for i, d in enumerate(rd) if i not in rb and i not in rc)
                    key = f"{b},{m},{k},{n}"
                    dots[key] = dots.get(key, 0.0) + times * 2.0 * b * m * k * n
            called = re.findall(r"(?:calls|body)=%([\w.\-]+)", attrs)
            if comp not in fused and (op in _MOVE_OPCODES or op == "fusion" and called and all(
                    o in _MOVE_FREE or o in _MOVE_OPCODES for c in called for _, _, o, _, _ in comps.get(c, []))):
                size = str(_shape_bytes(shape))
                moves[size] = moves.get(size, 0.0) + times
            for c in called:
                visit(c, times)

    visit(entry, 1.0)
    return dots, moves


_COSTS: dict[str, XlaCost] = {}     # program text digest -> its cost (one compile per distinct program)


def xla_cost(lowered: Any) -> XlaCost:
    """Flops, bytes accessed and kernels (``entry_ops``) of a ``jax.stages.Lowered`` after compilation.
    Programs are compiled once per process: decoders that lower the same program (PaDIR refine:T
    differing only in T, a decoder costed on two test sets) share its cost."""
    key = text_digest(lowered.as_text())
    if key not in _COSTS:
        compiled = lowered.compile()
        analysis = compiled.cost_analysis()
        if isinstance(analysis, (list, tuple)):  # older jax: one dict per device program
            analysis = analysis[0] if analysis else {}
        if not analysis or "flops" not in analysis:
            raise ValueError("XLA cost analysis returned no flops for this computation")
        text = compiled.as_text()
        dots, moves = hlo_work(text)
        _COSTS[key] = XlaCost(float(analysis.get("flops", 0.0)), float(analysis.get("bytes accessed", 0.0)),
                              float(entry_ops(text)), dots, moves)
    return _COSTS[key]


def loop_costs(decoder: Any, prepared: Any) -> dict[str, XlaCost]:
    """``{"encode": ..., "pass": ...}`` of one prepared batch: the encoder plus the decode's
    loop-invariant work (once per call), and one more decoder pass (see the module docstring)."""
    enc, one, two = (xla_cost(decoder.lower(prepared, part)) for part in ("encode", "pass", "pass2"))

    def added(two_: float, one_: float) -> float:
        """What the second pass adds, within [0, one pass]."""
        return min(max(two_ - one_, 0.0), one_)

    def added_each(two_: dict, one_: dict) -> dict:
        """``added`` per key (dot shape or move size), keeping the keys it adds something for."""
        return {k: m for k in sorted(set(two_) | set(one_)) if (m := added(two_.get(k, 0.0), one_.get(k, 0.0)))}

    def once(enc_: dict, one_: dict, step_: dict) -> dict:
        """Per key: the encoder plus one pass, minus what every further pass repeats (runs once per call)."""
        return {k: v for k in sorted(set(enc_) | set(one_))
                if (v := enc_.get(k, 0.0) + one_.get(k, 0.0) - step_.get(k, 0.0)) > 0}

    step = XlaCost(added(two.flops, one.flops), added(two.bytes_accessed, one.bytes_accessed),
                   added(two.kernels, one.kernels), added_each(two.dots, one.dots), added_each(two.moves, one.moves))
    return {"encode": XlaCost(enc.flops + one.flops - step.flops,
                              enc.bytes_accessed + one.bytes_accessed - step.bytes_accessed,
                              enc.kernels + one.kernels - step.kernels,
                              once(enc.dots, one.dots, step.dots), once(enc.moves, one.moves, step.moves)),
            "pass": step}



def roofline_ms(flops: float, bytes_accessed: float, peak_flops: float, bandwidth: float) -> float:
    """Lower bound on latency in ms: ``max(flops / peak, bytes / bandwidth)``."""
    return 1e3 * max(flops / peak_flops, bytes_accessed / bandwidth)


# ------------------------------------------------------------------------------- decoder costs

def _bucket_key(prepared: Any) -> Any:
    """Shape signature of a prepared batch (arrays -> shape + dtype, recursing into containers and
    dataclasses; plain scalars by value). Batches with equal keys are costed with one lowering."""
    if dataclasses.is_dataclass(prepared) and not isinstance(prepared, type):
        return (type(prepared).__name__,) + tuple(
            (f.name, _bucket_key(getattr(prepared, f.name))) for f in dataclasses.fields(prepared))
    if hasattr(prepared, "shape") and hasattr(prepared, "dtype"):
        return ("array", tuple(prepared.shape), str(prepared.dtype))
    if isinstance(prepared, dict):
        return ("dict",) + tuple((k, _bucket_key(v)) for k, v in sorted(prepared.items(), key=lambda kv: str(kv[0])))
    if isinstance(prepared, (list, tuple)):
        return (type(prepared).__name__,) + tuple(_bucket_key(v) for v in prepared)
    if prepared is None or isinstance(prepared, (bool, int, float, str)):
        return prepared
    return type(prepared).__name__


@dataclass(frozen=True)
class DecoderCost:
    """Per-sentence cost of one decoder on one test set (arrays aligned with the sources)."""

    name: str
    passes_mean: float
    passes_p99: float
    flops: np.ndarray            # [n_sentences] per-sentence share of its batch's flops
    bytes_accessed: np.ndarray   # [n_sentences]
    batch_flops: np.ndarray      # [n_sentences] flops of the batch the sentence ran in
    batch_bytes: np.ndarray      # [n_sentences]
    buckets: dict                # bucket key (str) -> {"encode": XlaCost, "pass": XlaCost}

    def bound_ms(self, peak_flops: float, bandwidth: float) -> np.ndarray:
        """Roofline-bound latency of each sentence's batch, ms ``[n_sentences]``."""
        return 1e3 * np.maximum(self.batch_flops / peak_flops, self.batch_bytes / bandwidth)


def decoder_cost(decoder: Any, sources: Sequence[str], passes: Sequence[int] | np.ndarray,
                 batch_size: int = 1) -> DecoderCost:
    """Flops/bytes per sentence from XLA cost analysis of ``encode`` and one ``pass`` per shape bucket
    (:func:`loop_costs`)."""
    passes = np.asarray(passes, dtype=np.float64).reshape(-1)
    if passes.size != len(sources):
        raise ValueError(f"{passes.size} pass counts for {len(sources)} sources")
    n = len(sources)
    flops, nbytes = np.zeros(n), np.zeros(n)
    batch_flops, batch_bytes = np.zeros(n), np.zeros(n)
    buckets: dict[str, dict[str, XlaCost]] = {}
    for idx in batches(n, batch_size):
        prepared = decoder.prepare([sources[i] for i in idx])
        key = repr(_bucket_key(prepared))
        if key not in buckets:
            buckets[key] = loop_costs(decoder, prepared)
        enc, step = buckets[key]["encode"], buckets[key]["pass"]
        runs = passes[idx.start:idx.stop].max()  # the batch loops until its slowest sentence is done
        f = enc.flops + runs * step.flops
        b = enc.bytes_accessed + runs * step.bytes_accessed
        batch_flops[idx.start:idx.stop], batch_bytes[idx.start:idx.stop] = f, b
        flops[idx.start:idx.stop], nbytes[idx.start:idx.stop] = f / len(idx), b / len(idx)
    return DecoderCost(name=decoder.name, passes_mean=float(passes.mean()),
                       passes_p99=float(np.percentile(passes, 99)), flops=flops, bytes_accessed=nbytes,
                       batch_flops=batch_flops, batch_bytes=batch_bytes, buckets=buckets)


def cost_of(decoder: Any, sources: Sequence[str], passes: Sequence[int] | np.ndarray,
            batch_size: int = 1) -> DecoderCost | None:
    """``decoder_cost``, or None for a decoder that runs outside XLA (``xla_costs = False``: CTranslate2)."""
    if not getattr(decoder, "xla_costs", True):
        return None
    return decoder_cost(decoder, sources, passes, batch_size)


def roofline_share(cost: DecoderCost, latencies_ms: Sequence[float] | np.ndarray, peaks: MachinePeaks) -> np.ndarray:
    """Per sentence, the share of the roofline bound the measured latency reaches (1.0 = at the bound)."""
    lat = np.asarray(latencies_ms, dtype=np.float64)
    if lat.shape != cost.flops.shape:
        raise ValueError(f"{lat.size} latencies for {cost.flops.size} sentences")
    return cost.bound_ms(peaks.peak_flops, peaks.bandwidth) / lat

