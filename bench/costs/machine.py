"""This machine's measured throughput: peaks and in-loop rates, one model.

- :class:`MachinePeaks`: fp32 matmul flop/s and memory bandwidth, the roofline's divisors
  (``bench.costs.xla.roofline_ms``), measured once per machine key (CPU model, jax version, threads) and
  cached in ``<data root>/machine/peaks.json`` (:func:`machine_peaks`; entries of other keys stay).
- :class:`MachineRates`: in-loop GEMM flop/s by shape and rows, read bandwidth by working-set size, batched
  dots and layout moves, the latency map's cost-model inputs (:func:`measure_rates`,
  :func:`measure_dot_rates`, :func:`measure_move_rates`).

The peaks are the best of a few runs of a large jitted fp32 matmul and of a large jitted reduction /
copy; every rate is a :class:`_Probe`, a jitted loop whose carry makes each iteration do its work (XLA
cannot hoist it out of the loop), measured by :func:`_rates`.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from narbench_core.errors import UserError
from narbench_core.io import write_json


def machine_key() -> str:
    """CPU model | jax version | threads: what the cached peaks are keyed by."""
    from bench.measure.env import cpu_signature, thread_count

    return f"{cpu_signature()}|jax-{jax.__version__}|threads-{thread_count()}"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# ------------------------------------------------------------------------------------ the protocol

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


SAMPLE_S, ROUNDS = 0.05, 5                                      # the rate protocol (``_rates``)


# ---------------------------------------------------------------------------------- machine peaks

@dataclass(frozen=True)
class MachinePeaks:
    key: str                        # CPU model | jax version | threads
    peak_flops: float               # fp32 matmul, flop/s
    bandwidth: float                # bytes/s (best of a reduction and a copy)
    measured_at: str                # UTC ISO date-time of the measurement
    matmul_n: int
    stream_bytes: int


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


# ---------------------------------------------------------------------------------- machine rates

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


GEMM_ROWS = (1, 4, 16, 64, 256, 1024, 4096, 16384)
STREAM_BYTES = tuple(2**p for p in range(18, 30))               # 256 KiB .. 512 MiB


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
    return MachineRates(tables["gemm"], tables["stream"], _now(), machine_key())


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


