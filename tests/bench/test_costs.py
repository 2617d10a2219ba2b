"""bench.costs: XLA flops/bytes against hand counts, per-batch combination, roofline, the machine probes and
peaks cache, projections; the names other packages use still import from bench.costs."""
from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bench import costs
from bench.costs import machine, xla
from narbench_core.errors import UserError
from fakes import JittedDecoder


def test_xla_cost_of_a_matmul_counts_by_hand():
    m, k, n = 3, 5, 7
    lowered = jax.jit(jnp.matmul).lower(jnp.ones((m, k)), jnp.ones((k, n)))
    cost = costs.xla_cost(lowered)
    assert cost.flops == 2 * m * k * n
    assert cost.bytes_accessed == 4 * (m * k + k * n + m * n)  # fp32 inputs read once, output written once


@pytest.fixture(scope="module")
def decoder():
    return JittedDecoder("j", passes=3, dim=32, buckets=(4, 8))


def test_decoder_cost_combines_encode_and_passes_per_batch(decoder):
    sources = ["a b", "c d e f g h", "i", "j k l"]   # buckets 4, 8, 4, 4
    passes = np.array([1, 3, 2, 5])
    c1 = costs.decoder_cost(decoder, sources, passes, batch_size=1)
    pass4 = 2 * 1 * 4 * 32 * 32                      # [1, 4, 32] @ [32, 32]
    pass8 = 2 * 1 * 8 * 32 * 32
    assert len(c1.buckets) == 2
    enc4 = costs.xla_cost(decoder.lower(decoder.prepare(["a"]), "encode")).flops
    enc8 = costs.xla_cost(decoder.lower(decoder.prepare(["c d e f g h"]), "encode")).flops
    np.testing.assert_allclose(c1.flops, [enc4 + 1 * pass4, enc8 + 3 * pass8, enc4 + 2 * pass4, enc4 + 5 * pass4])
    np.testing.assert_allclose(c1.batch_flops, c1.flops)
    assert c1.passes_mean == pytest.approx(2.75)
    assert c1.passes_p99 == pytest.approx(np.percentile(passes, 99))
    assert np.all(c1.bytes_accessed > 0)

    c2 = costs.decoder_cost(decoder, sources, passes, batch_size=2)
    # batch 0 = sentences 0-1 (bucket 8, max passes 3); batch 1 = 2-3 (bucket 4, max passes 5)
    b0 = costs.xla_cost(decoder.lower(decoder.prepare(sources[:2]), "encode")).flops + 3 * 2 * 2 * 8 * 32 * 32
    b1 = costs.xla_cost(decoder.lower(decoder.prepare(sources[2:]), "encode")).flops + 5 * 2 * 2 * 4 * 32 * 32
    np.testing.assert_allclose(c2.batch_flops, [b0, b0, b1, b1])
    np.testing.assert_allclose(c2.flops, [b0 / 2, b0 / 2, b1 / 2, b1 / 2])


class _InvariantDecoder:
    """A pass that multiplies by a projection of the source (loop-invariant, like cross-attention K/V)."""
    d = 16

    def __init__(self):
        self.w, self.v = jnp.ones((self.d, self.d)) * 0.1, jnp.ones((self.d, self.d)) * 0.2

    @staticmethod
    def _step(w, h, g):
        return jnp.tanh(h @ w) * g                                          # [b, n, d]

    def lower(self, src, part):
        if part == "encode":
            return jax.jit(lambda s: s * 2.0 + 1.0).lower(src)
        passes = {"pass": 1, "pass2": 2}[part]

        def chained(w, v, s, h):
            g = jnp.tanh(s @ v)                                                 # [b, n, d]: invariant
            for _ in range(passes):
                h = self._step(w, h, g)
            return h
        return jax.jit(chained).lower(self.w, self.v, src, src)


def test_loop_costs_count_loop_invariant_work_once_per_call():
    dec, src = _InvariantDecoder(), jnp.ones((2, 8, _InvariantDecoder.d))
    parts = costs.loop_costs(dec, src)
    step = costs.xla_cost(jax.jit(dec._step).lower(dec.w, src, src))
    invariant = costs.xla_cost(jax.jit(lambda v, s: jnp.tanh(s @ v)).lower(dec.v, src))
    encode = costs.xla_cost(dec.lower(src, "encode"))
    assert parts["pass"].flops == step.flops == 2 * 2 * 8 * 16 * 16 + 2 * 8 * 16   # matmul + multiply
    assert parts["encode"].flops == encode.flops + invariant.flops
    lone = costs.xla_cost(dec.lower(src, "pass"))
    assert lone.flops == parts["pass"].flops + invariant.flops                     # a lone pass counts both


def test_entry_ops_count_the_kernels_of_the_entry_computation():
    hlo = """HloModule m

%fused (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  ROOT %t = f32[4]{0} tanh(%p)
}

ENTRY %main (x: f32[4], w: f32[4,4]) -> (f32[4], f32[4]) {
  %x = f32[4]{0} parameter(0)
  %w = f32[4,4]{1,0} parameter(1)
  %c = f32[] constant(1)
  %d = f32[4]{0} dot(%x, %w), lhs_contracting_dims={0}, rhs_contracting_dims={0}
  %f = f32[4]{0} fusion(%d), kind=kLoop, calls=%fused
  %b = f32[2,2]{1,0} bitcast(%f)
  ROOT %out = (f32[4]{0}, f32[4]{0}) tuple(%d, %f)
}
"""
    assert costs.entry_ops(hlo) == 2                                   # the dot and the fusion
    cost = costs.xla_cost(jax.jit(lambda x, w: jnp.tanh(x @ w)).lower(jnp.ones((4, 8)), jnp.ones((8, 8))))
    assert cost.kernels >= 1


_HLO_WITH_ATTENTION = """HloModule m

%fused_move (p0: f32[2,8,4,16]) -> f32[2,4,8,16] {
  %p0 = f32[2,8,4,16]{3,2,1,0} parameter(0)
  %t0 = f32[2,4,8,16]{2,1,3,0} transpose(%p0), dimensions={0,2,1,3}
  ROOT %c0 = f32[2,4,8,16]{3,2,1,0} copy(%t0)
}

%fused_scale (p1: f32[2,4,8,16]) -> f32[2,4,8,16] {
  %p1 = f32[2,4,8,16]{3,2,1,0} parameter(0)
  %t1 = f32[2,4,8,16]{3,2,1,0} transpose(%p1), dimensions={0,1,2,3}
  ROOT %e = f32[2,4,8,16]{3,2,1,0} exponential(%t1)
}

%fused_scores (q: f32[2,4,8,16], k: f32[2,4,8,16]) -> f32[2,4,8,8] {
  %q = f32[2,4,8,16]{3,2,1,0} parameter(0)
  %k = f32[2,4,8,16]{3,2,1,0} parameter(1)
  ROOT %s = f32[2,4,8,8]{3,2,1,0} dot(%q, %k), lhs_batch_dims={0,1}, lhs_contracting_dims={3}, rhs_batch_dims={0,1}, rhs_contracting_dims={3}
}

ENTRY %main (x: f32[2,8,4,16], w: f32[16,16]) -> f32[2,4,1,8] {
  %x = f32[2,8,4,16]{3,2,1,0} parameter(0)
  %w = f32[16,16]{1,0} parameter(1)
  %m = f32[2,4,8,16]{3,2,1,0} fusion(%x), kind=kLoop, calls=%fused_move
  %e = f32[2,4,8,16]{3,2,1,0} fusion(%m), kind=kLoop, calls=%fused_scale
  %s = f32[2,4,8,8]{3,2,1,0} fusion(%m, %e), kind=kCustom, calls=%fused_scores
  %c = f32[2,4,8,8]{3,2,1,0} copy(%s)
  %r = f32[2,4,1,8]{3,2,1,0} slice(%c), slice={[0:2], [0:4], [0:1], [0:8]}
  %v = f32[2,4,1,8]{3,2,1,0} dot(%r, %c), lhs_batch_dims={0,1}, lhs_contracting_dims={3}, rhs_batch_dims={0,1}, rhs_contracting_dims={2}
  %d = f32[16,16]{1,0} dot(%w, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %out = f32[2,4,1,8]{3,2,1,0} tanh(%v)
}
"""


def test_hlo_work_finds_batched_dots_and_layout_moves():
    dots, moves = costs.hlo_work(_HLO_WITH_ATTENTION)
    # Scores: batch 2 x 4, 8 rows, 16 contracted, 8 columns (inside a fusion); the second: 1 row, 8 contracted.
    # The plain [16, 16] dot has no batch dimensions: it is a dense layer's, not attention's.
    assert dots == {"8,8,16,8": 2.0 * 8 * 8 * 16 * 8, "8,1,8,8": 2.0 * 8 * 1 * 8 * 8}
    # The transpose-and-copy fusion (1 KiB x 4) and the plain copy (2 KiB) move data; a fusion that also
    # computes (the exponential) does not, nor do the transpose and copy inside the fusions themselves.
    assert moves == {str(2 * 4 * 8 * 16 * 4): 1.0, str(2 * 4 * 8 * 8 * 4): 1.0}


def test_hlo_work_of_a_compiled_attention_counts_both_products():
    b, h, q, k, d = 2, 3, 5, 7, 8
    attend = lambda x, y: jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", x, y)), y)
    cost = costs.xla_cost(jax.jit(attend).lower(jnp.ones((b, q, h, d)), jnp.ones((b, k, h, d))))
    assert sum(cost.dots.values()) == pytest.approx(2 * (2.0 * b * h * q * k * d))
    assert all(int(key.split(",")[0]) == b * h for key in cost.dots)


def test_a_program_is_compiled_once_for_its_cost():
    class Counting:
        compiles = 0

        def __init__(self, text, flops):
            self.text, self.flops = text, flops

        def as_text(self):
            return self.text

        def compile(self):
            Counting.compiles += 1
            return self

        def cost_analysis(self):
            return {"flops": self.flops, "bytes accessed": 8.0}

    hlo = "ENTRY %m (p: f32[2]) -> f32[2] {\n  ROOT %t = f32[2]{0} tanh(%p)\n}\n"
    first = costs.xla_cost(Counting("// program a\n" + hlo, 3.0))
    again = costs.xla_cost(Counting("// program a\n" + hlo, 3.0))
    other = costs.xla_cost(Counting("// program b\n" + hlo, 5.0))
    assert Counting.compiles == 2 and first == again and other.flops == 5.0


def test_machine_rates_interpolate_log_log_and_name_missing_shapes():
    rates = costs.MachineRates({"8,16": {"1": 1e9, "100": 1e11}}, {"1000": 4e10, "100000": 4e8}, "t")
    assert rates.gemm_rate(8, 16, 1) == pytest.approx(1e9) and rates.gemm_rate(8, 16, 1e6) == pytest.approx(1e11)
    assert rates.gemm_rate(8, 16, 10) == pytest.approx(1e10)           # halfway in log rows: geometric mean
    assert rates.bandwidth(1e4) == pytest.approx(4e9)
    with pytest.raises(UserError, match="no GEMM rate measured for d_model 4, d_ff 4"):
        rates.gemm_rate(4, 4, 1)
    measured = costs.measure_rates([(8, 16)], rows=(1, 32), stream_bytes=(2**12, 2**16), sample_s=1e-3, rounds=1)
    assert set(measured.gemm["8,16"]) == {"1", "32"} and set(measured.stream) == {str(2**12), str(2**16)}
    assert all(v > 0 for v in [*measured.gemm["8,16"].values(), *measured.stream.values()])


def test_dot_and_move_rates_are_measured_and_looked_up():
    rates = costs.MachineRates({}, {}, "t", dots={"4,1,8,16": 2e9}, moves={"1024": 1e10, "1048576": 1e9})
    assert rates.dot_rate("4,1,8,16") == 2e9 and rates.move_rate(32768) == pytest.approx(10 ** 9.5)
    with pytest.raises(UserError, match="no rate measured for the batched dot 4,8,8,16"):
        rates.dot_rate("4,8,8,16")
    with pytest.raises(UserError, match="no layout-move rates measured"):
        costs.MachineRates({}, {}, "t").move_rate(1e3)
    dots = costs.measure_dot_rates(["4,1,8,16", "2,8,8,8"], sample_s=1e-3, rounds=1)
    moves = costs.measure_move_rates((2**12, 2**14), sample_s=1e-3, rounds=1)
    assert set(dots) == {"4,1,8,16", "2,8,8,8"} and set(moves) == {str(2**12), str(2**14)}
    assert all(v > 0 for v in [*dots.values(), *moves.values()])


def test_loop_costs_split_dots_and_moves_like_flops():
    class Attending:
        """Encode: no product; each pass: one [2, 4, 8] x [2, 8, 8] batched product of the carried state."""
        def lower(self, x, part):
            step = lambda v: jnp.einsum("bmk,bkn->bmn", v, jnp.swapaxes(v, 1, 2) @ jnp.ones((4, 8)))
            fns = {"encode": lambda v: v * 2.0, "pass": step, "pass2": lambda v: step(step(v))}
            return jax.jit(fns[part]).lower(x)

    parts = costs.loop_costs(Attending(), jnp.ones((2, 4, 8)))
    assert parts["pass"].dots == {"2,4,8,8": 2.0 * 2 * 4 * 8 * 8}
    assert parts["encode"].dots == {}


def test_roofline_share_and_bound(decoder):
    sources = ["a b", "c d e"]
    c = costs.decoder_cost(decoder, sources, [2, 2])
    peaks = costs.MachinePeaks(key="k", peak_flops=1e9, bandwidth=1e8, measured_at="t", matmul_n=1, stream_bytes=1)
    bound = np.maximum(c.batch_flops / 1e9, c.batch_bytes / 1e8) * 1e3
    np.testing.assert_allclose(c.bound_ms(1e9, 1e8), bound)
    assert costs.roofline_ms(2e9, 1e8, 1e9, 1e8) == pytest.approx(2000.0)     # compute-bound
    assert costs.roofline_ms(1e6, 5e8, 1e9, 1e8) == pytest.approx(5000.0)     # memory-bound
    share = costs.roofline_share(c, bound * 4, peaks)
    np.testing.assert_allclose(share, [0.25, 0.25])
    with pytest.raises(ValueError):
        costs.roofline_share(c, [1.0], peaks)


def test_projection_is_labelled_and_uses_published_peaks(decoder):
    c = costs.decoder_cost(decoder, ["a b", "c"], [3, 1])
    proj = costs.project(c, "tpu-v4")
    acc = costs.ACCELERATORS["tpu-v4"]
    assert proj.label == "projection" == costs.PROJECTION_LABEL
    np.testing.assert_allclose(proj.bound_ms, 1e3 * np.maximum(c.batch_flops / acc.peak_flops,
                                                                c.batch_bytes / acc.bandwidth))
    with pytest.raises(UserError, match="known"):
        costs.project(c, "tpu-v99")


@pytest.mark.parametrize("kind, name", [
    ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA H100 PCIe", "h100-pcie"), ("NVIDIA H200", "h200-sxm"),
    ("NVIDIA H200 NVL", None), ("NVIDIA A100-SXM4-80GB", "a100-sxm-80gb"), ("TPU v4", "tpu-v4"),
    ("cpu", None), (None, None)])
def test_a_device_kind_finds_its_published_peaks_or_none(kind, name):
    assert costs.for_device(kind) == name
    if name:
        assert costs.accelerator(name).source.startswith(("NVIDIA", "Google"))


def test_machine_peaks_are_measured_once_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("NARBENCH_DATA", str(tmp_path))
    peaks = costs.machine_peaks(matmul_n=128, stream_mib=4, sample_s=1e-3, rounds=2)
    assert peaks.peak_flops > 1e6 and peaks.bandwidth > 1e6
    assert peaks.key == costs.machine_key() and "jax-" in peaks.key and "threads-" in peaks.key
    stored = json.loads((tmp_path / "machine" / "peaks.json").read_text())
    assert stored[peaks.key]["peak_flops"] == peaks.peak_flops

    def _fail(**_):
        raise AssertionError("should have used the cache")

    monkeypatch.setattr(machine, "measure_peaks", _fail)
    assert costs.machine_peaks() == peaks
    (tmp_path / "machine" / "peaks.json").write_text("{corrupt")
    monkeypatch.setattr(machine, "measure_peaks", lambda **kw: peaks)
    assert costs.machine_peaks() == peaks  # corrupt cache -> re-measured and rewritten
    assert json.loads((tmp_path / "machine" / "peaks.json").read_text())[peaks.key]["bandwidth"] == peaks.bandwidth


def test_bucket_key_sees_inside_dataclasses():
    from dataclasses import dataclass

    @dataclass
    class Prepared:  # like models.decoders.Prepared: not a pytree
        inputs: np.ndarray
        num_sources: int
        target_bucket: int | None = None

    key = xla._bucket_key
    a = Prepared(np.zeros((1, 16), np.int32), 1)
    assert key(a) == key(Prepared(np.ones((1, 16), np.int32), 1))          # values do not matter
    assert key(a) != key(Prepared(np.zeros((1, 32), np.int32), 1))         # shapes do
    assert key(a) != key(Prepared(np.zeros((1, 16), np.int64), 1))         # dtypes do
    assert key(a) != key(Prepared(np.zeros((1, 16), np.int32), 1, 32))     # scalar fields do
    assert key({"ids": a.inputs}) != key({"ids": a.inputs[:, :8]})


def test_rates_size_each_loop_then_interleave_rounds_and_take_medians():
    calls: list[tuple[str, int]] = []

    def probe(name: str) -> machine._Probe:
        return machine._Probe(lambda n, c: calls.append((name, n)) or c, 0.0, (), 10.0)

    rates = machine._rates({"a": probe("a"), "b": probe("b")}, sample_s=1e-3, rounds=3)
    timed = calls[-6:]                                     # the rounds, after each probe was sized
    assert [name for name, _ in timed] == ["a", "b"] * 3
    assert len({n for name, n in timed if name == "a"}) == 1 and all(n >= 1 for _, n in timed)
    assert set(rates) == {"a", "b"} and all(r > 0 for r in rates.values())


def test_rates_are_work_over_the_protocols_seconds_per_iteration(monkeypatch):
    """``_rates`` times each probe by ``_seconds`` through ``narbench_core.probe`` (its sizing and rounds
    are tested in tests/core/test_probe.py): here every run takes 2 ms an iteration."""
    monkeypatch.setattr(machine, "_seconds", lambda probe, n: 2e-3 * n)
    probes = {"flops": machine._Probe(None, None, (), 6e9), "bytes": machine._Probe(None, None, (), 4e6)}
    assert machine._rates(probes, sample_s=0.05, rounds=3) == {"flops": pytest.approx(3e12),
                                                              "bytes": pytest.approx(2e9)}


def test_a_donating_probe_carries_its_result_into_the_next_call():
    probe = machine._donating(lambda v: v + 1.0, jnp.zeros(4), (), 16.0)
    first = probe.init
    machine._seconds(probe, 3)
    machine._seconds(probe, 2)
    assert probe.init is not first
    np.testing.assert_array_equal(np.asarray(probe.init), np.full(4, 5.0))   # 3 iterations, then 2 more


def test_peaks_are_the_matmul_and_the_faster_stream_probe_by_the_rates_protocol(monkeypatch):
    seen = {}

    def rates(probes, sample_s, rounds):
        seen.update(probes=probes, sample_s=sample_s, rounds=rounds)
        return {"matmul": 5e10, "sum": 2e10, "copy": 3e10}

    monkeypatch.setattr(machine, "_rates", rates)
    peaks = machine.measure_peaks(matmul_n=16, stream_mib=1, sample_s=0.2, rounds=7)
    assert (peaks.peak_flops, peaks.bandwidth) == (5e10, 3e10)
    assert (peaks.matmul_n, peaks.stream_bytes, seen["sample_s"], seen["rounds"]) == (16, 2**20, 0.2, 7)
    probes = seen["probes"]
    assert {k: p.work for k, p in probes.items()} == {"matmul": 2.0 * 16**3, "sum": 2.0**20, "copy": 2.0**21}
    # Each iteration works on the carry: two iterations of the matmul are two chained products.
    mm = probes["matmul"]
    a, w = np.array(mm.init), np.array(mm.args[0])      # copies: the run consumes its carry
    out = mm.run(2, mm.init, *mm.args)
    np.testing.assert_allclose(np.asarray(out), np.tanh(np.tanh(a @ w) @ w), rtol=1e-4, atol=1e-5)
