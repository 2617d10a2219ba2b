"""Training throughput benchmarks (pytest-benchmark: measured, never asserted).

Run: ``pytest tests/benchmarks/test_bench_train.py --benchmark-enable --benchmark-only -q -s``.
- the machine's fp32 matmul peak: a jitted 2048 x 2048 matmul (best of the rounds, GFLOP/s);
  MFU divides by the harness's own peak (``bench.costs.machine.machine_peaks``), the one the roofline uses;
- one `small` train step (8k vocab, a 4096-padded-token batch of shape [128, 32], target lengths
  drawn so ~18% of it is padding, like bible de-en's buckets) for AR and PaDIR (2 stages); untimed (the test
  suite's run) the batch has ``UNTIMED_ROWS`` rows and the model is ``UNTIMED_PRESET`` with one layer a side
  (conftest.py): the same checks.
``extra_info`` holds target tokens/s and MFU = 6 x params x target tokens/s / peak. For PaDIR the
6 x params rule ignores its second decoder pass, so its MFU is a lower bound of the real utilisation.
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bench.costs.machine import machine_peaks
from models import sharding
from models.config import preset
from models.t5 import count_params
from models.train import TrainConfig, init_state, make_train_step

VOCAB, ROWS, LENGTH = 8000, 128, 32
PEAK: dict[str, float] = {}


def test_bench_matmul_peak(benchmark):
    n = 2048
    a = jnp.ones((n, n), jnp.float32)
    matmul = jax.jit(lambda x, y: x @ y)
    jax.block_until_ready(matmul(a, a))
    out = benchmark.pedantic(lambda: jax.block_until_ready(matmul(a, a)), rounds=5, iterations=1, warmup_rounds=1)
    assert float(out[0, 0]) == n                                  # ones @ ones: every entry is n
    if benchmark.stats is None:                                   # --benchmark-disable: run once, untimed
        return
    peak = 2.0 * n ** 3 / benchmark.stats.stats.min               # best round: the machine's peak
    PEAK["flops"] = peak
    benchmark.extra_info.update(peak_gflops=peak / 1e9, devices=jax.device_count())


def _batch(seed: int = 0, rows: int = ROWS) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(20, 33, size=(2, rows))                     # mean ~26 of 32: ~18% padding
    pos = np.arange(LENGTH)[None]
    out = {}
    for name, lens in zip(("inputs", "targets"), lengths):
        tokens = rng.integers(4, VOCAB, size=(rows, LENGTH))
        tokens[np.arange(rows), lens - 1] = 1                          # EOS
        out[name] = np.where(pos < lens[:, None], tokens, 0).astype(np.int32)
    return out


UNTIMED_ROWS = 8     # rows of the batch when the benchmark runs untimed (the test suite): the same checks, 1/16 the work


@pytest.mark.parametrize("kind", ["ar", "padir"])
def test_bench_train_step_small(benchmark, bench_preset, bench_overrides, kind):
    rows = ROWS if benchmark.enabled else UNTIMED_ROWS
    config = preset(bench_preset, kind=kind, vocab_size=VOCAB, **bench_overrides)
    cfg = TrainConfig(steps=1000, batch_tokens=rows * LENGTH)
    mesh = sharding.make_mesh()
    step, tx = make_train_step(config, cfg)
    state = init_state(config, cfg, tx, mesh)
    batch = sharding.shard_batch(_batch(rows=rows), mesh)
    rng = sharding.replicate(jax.random.PRNGKey(0), mesh)
    t0 = time.perf_counter()
    compiled = step.lower(state, batch, rng).compile()
    compile_s = time.perf_counter() - t0
    holder = {"state": compiled(state, batch, rng)[0]}                # warm-up step

    def one_step():
        holder["state"], metrics = compiled(holder["state"], batch, rng)
        return jax.block_until_ready(metrics)

    metrics = benchmark.pedantic(one_step, rounds=4, iterations=1, warmup_rounds=1)
    target_tokens = int((np.asarray(batch["targets"]) != 0).sum())
    assert np.isfinite(float(metrics["loss"])) and int(metrics["target_tokens"]) == target_tokens
    assert int(holder["state"].step) >= 2                         # the warm-up step and at least one more ran
    if benchmark.stats is None:                                   # --benchmark-disable: run once, untimed
        return
    seconds = benchmark.stats.stats.median          # a shared machine: min shows the uncontended speed
    best = benchmark.stats.stats.min
    tok_s = target_tokens / seconds
    peak = PEAK.get("flops") or machine_peaks().peak_flops
    params = count_params(holder["state"].params)
    benchmark.extra_info.update(
        kind=kind, params=params, target_tokens_per_step=target_tokens,
        padding_share=1 - target_tokens / (ROWS * LENGTH), seconds_per_step=seconds,
        target_tokens_per_s=tok_s, peak_gflops=peak / 1e9, mfu=6 * params * tok_s / peak,
        best_target_tokens_per_s=target_tokens / best, best_mfu=6 * params * target_tokens / best / peak,
        compile_s=compile_s, devices=jax.device_count())
    print(f"\n[{kind}] params {params:,}  step median {seconds:.2f}s (min {best:.2f}s)  {tok_s:,.0f} target "
          f"tok/s (best {target_tokens / best:,.0f})  MFU {6 * params * tok_s / peak:.1%} "
          f"(best {6 * params * target_tokens / best / peak:.1%}) of {peak / 1e9:.0f} GFLOP/s  "
          f"compile {compile_s:.1f}s")
