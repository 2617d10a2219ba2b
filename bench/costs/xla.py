"""Cost model: decoder passes, XLA flops/bytes, the machine's measured peaks, and the roofline bound.

Per batch (the unit the timer measures), ``flops = encode + max(passes in batch) x pass`` (and the
same for bytes), from ``cost_analysis()`` of the compiled ``decoder.lower(prepared, part)``: a whole
decode loop cannot be costed directly because XLA's cost analysis counts a ``while`` body once.
``pass`` is the cost of one more pass: "pass2" (two chained passes) minus "pass" (one). Work that does
not depend on the tokens (the cross-attention keys and values of the source) runs once in two chained
passes as it does in the decode loop (XLA hoists it out of the ``while`` body), so it is counted once
per call, in ``encode`` (:func:`loop_costs`); a lone pass would count it on every pass (at `paper` size,
batch 32, 64 tokens, AR: 15.0 GFLOP a lone pass, 2.1 GFLOP one more pass). Roofline-bound latency = ``max(flops / peak_flops,
bytes / bandwidth)``: no real run can be faster, so ``bound / measured`` (the share of the bound
reached) says how far a latency is from what the hardware allows. Each sentence gets its batch's
bound and latency; per-sentence flops are the batch's divided by the sentences in it. Each distinct
shape signature of ``decoder.prepare`` output is lowered and compiled once (first batch seen): a
decoder whose per-pass program depends on input *values* within one shape is costed at that batch's.

Machine peaks are measured once (best of a few runs of a large jitted fp32 matmul and of a large
jitted reduction / copy) and cached in ``<data root>/machine/peaks.json`` keyed by CPU model, jax
version and thread count. Accelerator figures are *projections* from published peaks
(:data:`ACCELERATORS`), always labelled so and never mixed into measured columns.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from narbench_core.digest import text_digest
from narbench_core.errors import UserError
from narbench_core.io import write_json
from bench.measure.timing import batches

PROJECTION_LABEL = "projection"


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


# ---------------------------------------------------------------------------------- machine peaks

@dataclass(frozen=True)
class MachinePeaks:
    key: str                        # CPU model | jax version | threads
    peak_flops: float               # fp32 matmul, flop/s
    bandwidth: float                # bytes/s (best of a reduction and a copy)
    measured_at: str                # UTC ISO date-time of the measurement
    matmul_n: int
    stream_bytes: int


def machine_key() -> str:
    from bench.measure.env import cpu_signature, thread_count

    return f"{cpu_signature()}|jax-{jax.__version__}|threads-{thread_count()}"


def _best_seconds(fn, *args, repeats: int) -> float:
    jax.block_until_ready(fn(*args))  # compile + first touch
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - start)
    return best


def measure_peaks(matmul_n: int = 2048, stream_mib: int = 256, repeats: int = 5, seed: int = 0) -> MachinePeaks:
    """Measure fp32 matmul throughput and memory bandwidth on the default device (a few seconds)."""
    key = jax.random.PRNGKey(seed)
    a = jax.random.normal(key, (matmul_n, matmul_n), jnp.float32)
    b = jax.random.normal(jax.random.fold_in(key, 1), (matmul_n, matmul_n), jnp.float32)
    t_mm = _best_seconds(jax.jit(jnp.matmul), a, b, repeats=repeats)
    n_elems = stream_mib * 2**20 // 4
    x = jnp.arange(n_elems, dtype=jnp.float32)
    t_sum = _best_seconds(jax.jit(jnp.sum), x, repeats=repeats)                     # reads 4n bytes
    t_copy = _best_seconds(jax.jit(lambda v: v * 2.0), x, repeats=repeats)          # reads + writes 8n
    bandwidth = max(4 * n_elems / t_sum, 8 * n_elems / t_copy)
    return MachinePeaks(key=machine_key(), peak_flops=2 * matmul_n**3 / t_mm, bandwidth=bandwidth,
                        measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                        matmul_n=matmul_n, stream_bytes=4 * n_elems)


@dataclass(frozen=True)
class MachineRates:
    """In-loop throughput measured on this machine (``measure_rates``): fp32 GEMM flop/s of a
    transformer layer's matmul shapes by rows, and read bandwidth by working-set size. Inside a jitted
    loop, so no per-call dispatch is in them; rates between measured points are interpolated log-log
    (clamped at the ends)."""
    gemm: dict            # "d_model,d_ff" -> {"rows": flop/s}
    stream: dict          # "bytes" -> bytes/s
    measured_at: str
    key: str = ""
    dots: dict = field(default_factory=dict)     # batched dot "B,M,K,N" (``hlo_work``) -> flop/s
    moves: dict = field(default_factory=dict)    # "bytes" -> bytes/s of a transpose that writes that many
    measured: dict = field(default_factory=dict)  # table ("dots", "moves") -> UTC time, when measured later

    def dot_rate(self, key: str) -> float:
        if key not in self.dots:
            raise UserError(f"no rate measured for the batched dot {key}; measure it (bench.costs.measure_dot_rates)")
        return float(self.dots[key])

    def move_rate(self, nbytes: float) -> float:
        if not self.moves:
            raise UserError("no layout-move rates measured; measure them (bench.costs.measure_move_rates)")
        return _loglog(self.moves, nbytes)

    def gemm_rate(self, d_model: int, d_ff: int, rows: float) -> float:
        table = self.gemm.get(f"{int(d_model)},{int(d_ff)}")
        if not table:
            raise UserError(f"no GEMM rate measured for d_model {d_model}, d_ff {d_ff}; measure the map's sizes "
                            f"(measured: {', '.join(self.gemm)})")
        return _loglog(table, rows)

    def bandwidth(self, nbytes: float) -> float:
        return _loglog(self.stream, nbytes)


def _loglog(table: dict, x: float) -> float:
    xs = np.array([float(k) for k in table])
    order = np.argsort(xs)
    ys = np.array([float(v) for v in table.values()])[order]
    return float(np.exp(np.interp(np.log(max(float(x), 1.0)), np.log(xs[order]), np.log(ys))))


@dataclass(frozen=True)
class _Probe:
    """One rate to measure: ``run(n, init, *args)`` runs ``n`` iterations of a loop body doing ``work``
    (flops or bytes) each."""
    run: Any
    init: Any
    args: tuple
    work: float


def _loop(body) -> Any:
    """``run(n, carry, *args)``: ``n`` iterations of ``body(carry, *args)`` in one jitted ``fori_loop``
    (``n`` and ``args`` are arguments, so one compile serves every length and XLA cannot fold them)."""
    return jax.jit(lambda n, c, *a: jax.lax.fori_loop(0, n, lambda _, v: body(v, *a), c))


def _seconds(probe: _Probe, n: int) -> float:
    start = time.perf_counter()
    jax.block_until_ready(probe.run(n, probe.init, *probe.args))
    return time.perf_counter() - start


def _rates(probes: dict[Any, _Probe], sample_s: float, rounds: int) -> dict[Any, float]:
    """Work per second of each probe, as the timer measures latency: each probe's loop is sized to take
    about ``sample_s``, then ``rounds`` rounds run every probe once in turn, and each rate is its median
    round. Rates from single short loops (best of 3, a few ms each) wandered 1.1-2.3x between runs on a
    2-core VM; these repeat within 20% for 91-100% of entries (README, latency map)."""
    sized: dict[Any, int] = {}
    for name, probe in probes.items():
        _seconds(probe, 1)                                       # compile and first touch
        n, seconds = 1, _seconds(probe, 1)
        for _ in range(4):                                       # grow until a loop is long enough to time
            if seconds >= sample_s / 4:
                break
            n = max(2 * n, int(n * sample_s / max(seconds, 1e-6) / 2))
            seconds = _seconds(probe, n)
        sized[name] = max(1, round(n * sample_s / seconds))     # from the last (n, seconds) timed together
    samples: dict[Any, list[float]] = {name: [] for name in probes}
    for _ in range(rounds):
        for name, probe in probes.items():
            samples[name].append(_seconds(probe, sized[name]) / sized[name])
    return {name: probes[name].work / float(np.median(s)) for name, s in samples.items()}


GEMM_ROWS = (1, 4, 16, 64, 256, 1024, 4096, 16384)
STREAM_BYTES = tuple(2**p for p in range(18, 30))               # 256 KiB .. 512 MiB
SAMPLE_S, ROUNDS = 0.05, 5                                      # the rate protocol (``_rates``)


def measure_rates(shapes: Sequence[tuple[int, int]], rows: Sequence[int] = GEMM_ROWS,
                  stream_bytes: Sequence[int] = STREAM_BYTES, sample_s: float = SAMPLE_S, rounds: int = ROUNDS,
                  seed: int = 0) -> MachineRates:
    """GEMM rates of ``[rows, d] @ [d, ff] @ [ff, d]`` per (d, ff) in ``shapes`` and per row count, and the
    bandwidth of reading a ``bytes`` array (:func:`_rates`)."""
    key = jax.random.PRNGKey(seed)
    probes: dict[tuple, _Probe] = {}
    gemm = _loop(lambda v, a, b: jnp.tanh((v @ a) @ b))
    for d, ff in shapes:
        w1 = jax.random.normal(key, (d, ff), jnp.float32) / np.sqrt(d)
        w2 = jax.random.normal(jax.random.fold_in(key, 1), (ff, d), jnp.float32) / np.sqrt(ff)
        for m in rows:
            x = jax.random.normal(jax.random.fold_in(key, 2), (m, d), jnp.float32)
            probes[("gemm", f"{d},{ff}", str(m))] = _Probe(gemm, x, (w1, w2), 4.0 * m * d * ff)
    # Each iteration reads the whole array (|data - carry| cannot be hoisted out of the loop).
    stream = _loop(lambda c, x: c * 0.5 + jnp.sum(jnp.abs(x - c)) * 1e-9)
    for nbytes in stream_bytes:
        data = jax.random.uniform(jax.random.fold_in(key, 3), (nbytes // 4,), jnp.float32)
        probes[("stream", str(nbytes))] = _Probe(stream, jnp.float32(1.0), (data,), float(nbytes))
    measured = _rates(probes, sample_s, rounds)
    tables: dict = {"gemm": {}, "stream": {}}
    for (table, *where), rate in measured.items():
        if table == "gemm":
            tables["gemm"].setdefault(where[0], {})[where[1]] = rate
        else:
            tables["stream"][where[0]] = rate
    return MachineRates(tables["gemm"], tables["stream"], datetime.now(timezone.utc).isoformat(timespec="seconds"),
                        machine_key())


def measure_dot_rates(keys: Sequence[str], sample_s: float = SAMPLE_S, rounds: int = ROUNDS, seed: int = 0) -> dict:
    """flop/s of each batched dot ``"B,M,K,N"`` (``[B, M, K] @ [B, K, N]``), in a loop whose carry scales
    the right operand (so the dot cannot be hoisted out of the loop) (:func:`_rates`)."""
    key = jax.random.PRNGKey(seed)
    run = _loop(lambda s, x, y: s * 0.5 + jnp.sum(jnp.einsum("bmk,bkn->bmn", x, y * s)) * 1e-12)
    probes = {}
    for k in keys:
        b, m, kk, n = (int(v) for v in k.split(","))
        lhs = jax.random.normal(key, (b, m, kk), jnp.float32)
        rhs = jax.random.normal(jax.random.fold_in(key, 1), (b, kk, n), jnp.float32)
        probes[k] = _Probe(run, jnp.float32(1.0), (lhs, rhs), 2.0 * b * m * kk * n)
    return _rates(probes, sample_s, rounds)


MOVE_BYTES = tuple(2**p for p in range(12, 29, 2))             # 4 KiB .. 256 MiB


def measure_move_rates(sizes: Sequence[int] = MOVE_BYTES, sample_s: float = SAMPLE_S, rounds: int = ROUNDS,
                       seed: int = 0) -> dict:
    """Bytes/s written by a materialised transpose (``[n, n, 64]`` -> its first two axes swapped, the kind
    of move XLA makes between attention's head-major and position-major layouts), by output bytes."""
    run = _loop(lambda c: jnp.transpose(c, (1, 0, 2)) * 0.5)
    probes = {}
    for nbytes in sizes:
        n = max(1, int(round(math.sqrt(nbytes / 256))))
        probes[str(256 * n * n)] = _Probe(run, jax.random.normal(jax.random.PRNGKey(seed), (n, n, 64), jnp.float32),
                                          (), 256.0 * n * n)
    return _rates(probes, sample_s, rounds)


def _peaks_path():
    from narbench_core.paths import subdir

    return subdir("machine") / "peaks.json"


def machine_peaks(refresh: bool = False, **measure_kwargs) -> MachinePeaks:
    """Cached peaks for this machine (measured on the first call per key, or when ``refresh``)."""
    path = _peaks_path()
    cache: dict = {}
    if path.is_file():
        try:
            cache = json.loads(path.read_text())
        except json.JSONDecodeError:
            cache = {}  # a corrupt cache is re-measured and rewritten
    key = machine_key()
    if not refresh and key in cache:
        return MachinePeaks(**cache[key])
    peaks = measure_peaks(**measure_kwargs)
    cache[peaks.key] = asdict(peaks)
    write_json(path, cache)
    return peaks


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


# -------------------------------------------------------------------------------- projections

@dataclass(frozen=True)
class Accelerator:
    name: str
    peak_flops: float   # flop/s at the dtype below, dense
    bandwidth: float    # bytes/s, HBM
    dtype: str
    source: str


# Published vendor peaks (dense, no sparsity). Projections assume matmuls at this dtype.
ACCELERATORS: dict[str, Accelerator] = {
    "tpu-v3": Accelerator("tpu-v3", 123e12, 900e9, "bf16", "Google Cloud TPU v3 system architecture (per chip)"),
    "tpu-v4": Accelerator("tpu-v4", 275e12, 1200e9, "bf16", "Google Cloud TPU v4 system architecture"),
    "tpu-v5e": Accelerator("tpu-v5e", 197e12, 819e9, "bf16", "Google Cloud TPU v5e documentation"),
    "a100-sxm-80gb": Accelerator("a100-sxm-80gb", 156e12, 2039e9, "tf32", "NVIDIA A100 datasheet"),
    "h100-sxm": Accelerator("h100-sxm", 494.7e12, 3350e9, "tf32", "NVIDIA H100 datasheet"),
}


@dataclass(frozen=True)
class Projection:
    """Roofline lower bound on an accelerator: a projection, not a measurement."""

    accelerator: str
    label: str                  # always PROJECTION_LABEL
    bound_ms: np.ndarray        # [n_sentences]
    p50_bound_ms: float


def accelerator(name: str) -> Accelerator:
    if name not in ACCELERATORS:
        raise UserError(f"unknown accelerator {name!r}; known: {', '.join(sorted(ACCELERATORS))}")
    return ACCELERATORS[name]


def project(cost: DecoderCost, name: str) -> Projection:
    """Roofline-bound latency of ``cost`` on a published accelerator (labelled ``projection``)."""
    acc = accelerator(name)
    bound = cost.bound_ms(acc.peak_flops, acc.bandwidth)
    return Projection(accelerator=acc.name, label=PROJECTION_LABEL, bound_ms=bound,
                      p50_bound_ms=float(np.percentile(bound, 50)))
