"""Decoding latency benchmarks (pytest-benchmark: measured, never asserted).

Run: ``pytest tests/benchmarks/test_bench_decoding.py --benchmark-enable -q``.
The `small` preset (8k vocab) with random weights at batch 1, 32 source tokens:
- AR greedy, cached vs uncached, forced to exactly 32 decoder steps (an EOS id that never wins);
  uncached twice: projecting only the position it needs (the harness's) and all positions (plain);
- PaDIR: encoder + length prediction, one bare decoder pass over 32 positions, and T refinement
  steps with early stopping off (k = 1 length hypothesis fixed at 32).
Each benchmark stores n/p50/p90/p99 (ms) in ``extra_info``; the later ones add the ratios the issue
targets: uncached / cached (>= 3x) and PaDIR-T / (T x pass + encoder + length) (<= 1.2).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import decoding, refine, t5
from models.config import preset

SRC, TGT, VOCAB = 32, 32, 8000
NEVER = -1                    # an EOS id no argmax can produce: every row decodes TGT steps
MEDIANS: dict[str, float] = {}


def _record(benchmark, key):
    data = np.asarray(benchmark.stats.stats.data) * 1000.0                          # ms per call
    p50, p90, p99 = np.percentile(data, [50, 90, 99])
    benchmark.extra_info.update(n=int(data.size), p50_ms=float(p50), p90_ms=float(p90), p99_ms=float(p99))
    MEDIANS[key] = float(p50)


def _run(benchmark, fn, args, rounds, key):
    jax.block_until_ready(fn(*args))                                                # compile + warm
    benchmark.pedantic(lambda: jax.block_until_ready(fn(*args)), rounds=rounds, iterations=1, warmup_rounds=2)
    _record(benchmark, key)


@pytest.fixture(scope="module")
def source():
    return jax.random.randint(jax.random.key(7), (1, SRC), 4, VOCAB).at[:, -1].set(1)  # [1, 32]


@pytest.fixture(scope="module")
def ar():
    cfg = preset("small", vocab_size=VOCAB, dropout_rate=0.0)
    return cfg, t5.Transformer(cfg), t5.init_params(cfg, jax.random.key(0))


@pytest.fixture(scope="module")
def padir():
    cfg = preset("small", kind="padir", vocab_size=VOCAB, dropout_rate=0.0)
    return cfg, t5.PaDIR(cfg), t5.init_params(cfg, jax.random.key(1))


def test_ar_greedy_cached(benchmark, ar, source):
    cfg, model, params = ar

    @jax.jit
    def run(params, inputs):
        encoded = model.apply({"params": params}, inputs, method=t5.Transformer.encode)
        cache = t5.init_cache(cfg, 1, SRC, TGT)

        def step(tokens, cache):
            logits, state = model.apply({"params": params, "cache": cache}, encoded, inputs, tokens, decode=True,
                                        mutable=["cache"], method=t5.Transformer.decode)
            return logits[:, 0], state["cache"]
        return decoding.greedy_search(step, cache, 1, TGT, NEVER)

    assert int(run(params, source)[2][0]) == TGT
    _run(benchmark, run, (params, source), 60, "ar_cached")


def test_ar_greedy_uncached(benchmark, ar, source):
    cfg, model, params = ar

    @jax.jit
    def run(params, inputs):
        encoded = model.apply({"params": params}, inputs, method=t5.Transformer.encode)
        fn = lambda seqs, i: model.apply({"params": params}, encoded, inputs, seqs, logit_index=i,
                                         method=t5.Transformer.decode)[:, 0]
        return decoding.greedy_search_uncached(fn, 1, TGT, NEVER)

    _run(benchmark, run, (params, source), 20, "ar_uncached")
    if "ar_cached" in MEDIANS:
        benchmark.extra_info["uncached_over_cached_p50"] = MEDIANS["ar_uncached"] / MEDIANS["ar_cached"]


def test_ar_greedy_uncached_all_logits(benchmark, ar, source):
    """The plain uncached loop (as in CALIBRATION.md): each step projects every prefix position to
    vocabulary logits and keeps one. The test above projects only the position it needs, so it is the
    stronger baseline; this one is for comparing with the calibration's 4.6x."""
    cfg, model, params = ar

    @jax.jit
    def run(params, inputs):
        encoded = model.apply({"params": params}, inputs, method=t5.Transformer.encode)

        def fn(seqs, i):
            logits = model.apply({"params": params}, encoded, inputs, seqs, method=t5.Transformer.decode)
            return jax.lax.dynamic_index_in_dim(logits, i, axis=1, keepdims=False)   # [b, V]
        return decoding.greedy_search_uncached(fn, 1, TGT, NEVER)

    _run(benchmark, run, (params, source), 20, "ar_uncached_all_logits")
    if "ar_cached" in MEDIANS:
        benchmark.extra_info["uncached_over_cached_p50"] = MEDIANS["ar_uncached_all_logits"] / MEDIANS["ar_cached"]


def test_padir_encoder_and_length(benchmark, padir, source):
    cfg, model, params = padir

    @jax.jit
    def run(params, inputs):
        encoded = model.apply({"params": params}, inputs, method=t5.PaDIR.encode)
        return encoded, model.apply({"params": params}, encoded, inputs, method=t5.PaDIR.predict_length)

    _run(benchmark, run, (params, source), 100, "padir_encode")


def test_padir_one_decoder_pass(benchmark, padir, source):
    cfg, model, params = padir
    encoded = jax.jit(lambda p, x: model.apply({"params": p}, x, method=t5.PaDIR.encode))(params, source)
    tokens = jax.random.randint(jax.random.key(3), (1, TGT), 4, VOCAB)
    mask = jnp.ones((1, TGT), jnp.int32)
    run = jax.jit(lambda p, e, x, t, m: model.apply({"params": p}, e, x, t, m, method=t5.PaDIR.refine))
    _run(benchmark, run, (params, encoded, source, tokens, mask), 100, "padir_pass")


@pytest.mark.parametrize("steps", [1, 4, 10])
def test_padir_refine_T(benchmark, padir, source, steps):
    cfg, model, params = padir

    @functools.partial(jax.jit, static_argnums=(2,))
    def run(params, inputs, steps):
        encoded = model.apply({"params": params}, inputs, method=t5.PaDIR.encode)
        length_logits = model.apply({"params": params}, encoded, inputs, method=t5.PaDIR.predict_length)
        lengths = jnp.full((1, 1), TGT, jnp.int32) + 0 * jnp.argmax(length_logits, -1)[:, None]
        fn = lambda tok, m: model.apply({"params": params}, encoded, inputs, tok, m, method=t5.PaDIR.refine)
        out = refine.refine_length_hypotheses(fn, lengths, TGT, steps, jax.random.key(0), "stutter", "random",
                                              VOCAB, early_stop=False)
        return out.tokens, out.passes

    assert int(run(params, source, steps)[1][0]) == steps
    _run(benchmark, lambda p, x: run(p, x, steps), (params, source), 40, f"padir_T{steps}")
    if {"padir_pass", "padir_encode"} <= set(MEDIANS):
        budget = steps * MEDIANS["padir_pass"] + MEDIANS["padir_encode"]
        benchmark.extra_info["over_T_passes_plus_encoder_p50"] = MEDIANS[f"padir_T{steps}"] / budget
    if "ar_cached" in MEDIANS:
        benchmark.extra_info["ar_cached_over_padir_p50"] = MEDIANS["ar_cached"] / MEDIANS[f"padir_T{steps}"]
