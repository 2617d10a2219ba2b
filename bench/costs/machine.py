"""This machine's measured throughput: one model, measured by one protocol.

- :class:`MachinePeaks`: fp32 matmul flop/s and memory bandwidth, the roofline's divisors
  (``bench.costs.xla.roofline_ms``), measured once per machine key (CPU model, jax version, threads) and
  cached in ``<data root>/machine/peaks.json`` (:func:`machine_peaks`; entries of other keys stay).
- :class:`MachineRates`: in-loop GEMM flop/s by shape and rows, read bandwidth by working-set size, batched
  dots and layout moves, the latency map's cost-model inputs (:func:`measure_rates`,
  :func:`measure_dot_rates`, :func:`measure_move_rates`).

Every figure is a :class:`_Probe`, a jitted loop whose carry makes each iteration do its work (XLA cannot
hoist it out of the loop), measured by :func:`_rates`: ``narbench_core.probe`` sizes each loop to about
``sample_s``, runs ``rounds`` interleaved rounds and takes each probe's median round.
"""
from __future__ import annotations

import functools
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
from narbench_core.probe import ROUNDS, SAMPLE_S, seconds_per_iteration


def machine_key() -> str:
    """CPU model | jax version | threads (| the accelerator's kind, where JAX's default backend is one): what the
    cached peaks are keyed by, so a GPU host's CPU peaks and its GPU's never share an entry."""
    from bench.measure.env import cpu_signature, thread_count

    key = f"{cpu_signature()}|jax-{jax.__version__}|threads-{thread_count()}"
    if jax.default_backend() != "cpu":
        key += f"|{jax.default_backend()}-{jax.devices()[0].device_kind}"
    return key


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# ------------------------------------------------------------------------------------ the protocol

@dataclass
class _Probe:
    """One rate to measure: ``run(n, init, *args)`` runs ``n`` iterations of a loop body doing ``work``
    (flops or bytes) each. With ``donate`` (built by :func:`_donating`) the loop updates its carry in
    place and each call's result is the next call's ``init``: a large carry is neither allocated nor
    copied per call."""
    run: Any
    init: Any
    args: tuple
    work: float
    donate: bool = False


def _loop(body, donate: bool = False) -> Any:
    """``run(n, carry, *args)``: ``n`` iterations of ``body(carry, *args)`` in one jitted ``fori_loop``
    (``n`` and ``args`` are arguments, so one compile serves every length and XLA cannot fold them). With
    ``donate`` the result reuses the carry's buffer."""
    return jax.jit(lambda n, c, *a: jax.lax.fori_loop(0, n, lambda _, v: body(v, *a), c),
                   donate_argnums=(1,) if donate else ())


def _donating(body, init: Any, args: tuple, work: float) -> _Probe:
    """A probe whose loop carries an array it updates in place (``init`` is consumed)."""
    return _Probe(_loop(body, donate=True), init, args, work, donate=True)


def _seconds(probe: _Probe, n: int) -> float:
    start = time.perf_counter()
    out = jax.block_until_ready(probe.run(n, probe.init, *probe.args))
    seconds = time.perf_counter() - start
    if probe.donate:
        probe.init = out
    return seconds


def _rates(probes: dict[Any, _Probe], sample_s: float, rounds: int) -> dict[Any, float]:
    """Work per second of each probe: its work over its median seconds per iteration
    (``narbench_core.probe.seconds_per_iteration``: loops sized to ~``sample_s``, ``rounds`` interleaved
    rounds). Why this protocol: docs/experiments.md, "Machine probes"."""
    runs = {name: functools.partial(_seconds, probe) for name, probe in probes.items()}
    return {name: probes[name].work / s for name, s in seconds_per_iteration(runs, sample_s, rounds).items()}


def _read_all(c: Any, x: Any) -> Any:
    """One iteration of the read probe: reads every element of ``x`` (``|x - carry|`` cannot be hoisted)."""
    return c * 0.5 + jnp.sum(jnp.abs(x - c)) * 1e-9


# ---------------------------------------------------------------------------------- machine peaks

@dataclass(frozen=True)
class MachinePeaks:
    """The machine's fp32 matmul and memory-bandwidth peaks (:func:`measure_peaks`)."""
    key: str                        # CPU model | jax version | threads
    peak_flops: float               # fp32 matmul, flop/s
    bandwidth: float                # bytes/s (the faster of a reduction and an in-place copy)
    measured_at: str                # UTC ISO date-time of the measurement
    matmul_n: int
    stream_bytes: int


def measure_peaks(matmul_n: int = 2048, stream_mib: int = 256, sample_s: float = SAMPLE_S, rounds: int = ROUNDS,
                  seed: int = 0) -> MachinePeaks:
    """fp32 matmul throughput and memory bandwidth on the default device, by the rates' protocol
    (:func:`_rates`; a few seconds): an ``[n, n] @ [n, n]`` matmul of the carry, and over a ``stream_mib``
    array a reduction (reads it: 4 bytes an element) and an in-place copy (reads and writes it: 8)."""
    key = jax.random.PRNGKey(seed)
    a = jax.random.normal(key, (matmul_n, matmul_n), jnp.float32)
    b = jax.random.normal(jax.random.fold_in(key, 1), (matmul_n, matmul_n), jnp.float32) / np.sqrt(matmul_n)
    n_elems = stream_mib * 2**20 // 4
    probes = {
        "matmul": _donating(lambda v, w: jnp.tanh(v @ w), a, (b,), 2.0 * matmul_n**3),
        "sum": _Probe(_loop(_read_all), jnp.float32(1.0), (jnp.arange(n_elems, dtype=jnp.float32),), 4.0 * n_elems),
        "copy": _donating(lambda v: v * -1.0, jnp.arange(n_elems, dtype=jnp.float32), (), 8.0 * n_elems),
    }
    rates = _rates(probes, sample_s, rounds)
    return MachinePeaks(key=machine_key(), peak_flops=rates["matmul"], bandwidth=max(rates["sum"], rates["copy"]),
                        measured_at=_now(), matmul_n=matmul_n, stream_bytes=4 * n_elems)


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
    stream = _loop(_read_all)
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


