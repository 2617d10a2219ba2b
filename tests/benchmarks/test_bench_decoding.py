"""Decoding latency benchmarks of the harness's own decoders (pytest-benchmark: measured, never asserted).

Run: ``pytest tests/benchmarks/test_bench_decoding.py --benchmark-enable --benchmark-only -q`` (``--benchmark-enable``
overrides the ``--benchmark-disable`` in pyproject's addopts).
Every number comes from the decoder objects ``narbench run`` times (``models.decoders.make_decoder``)
and from ``bench.measure.timing`` (``warmup`` with compilation kept apart, then ``measure``), the harness's
one timing protocol. Fixed workload: the `small` preset (8k vocab) with random weights, batch 1, one
source sentence of 31 ids + EOS = 32 tokens (a fake vocabulary whose ``encode`` returns fixed ids),
source bucket 32, ``max_decode_length=32``, each sentence timed ``ROUNDS[...]`` times:
- AR greedy, cached vs uncached (``cached=False``), ``force_length=32``: exactly 32 decoder steps
  (EOS ignored); asserted through the ``passes`` the decoder returns. The uncached decoder projects
  only the position it needs to vocabulary logits. The plain uncached loop that projects every prefix
  position (the old ``test_ar_greedy_uncached_all_logits``, for comparing with CALIBRATION.md's 4.6x)
  is gone: the harness decoder cannot express it, and these benchmarks time only harness decoders;
- PaDIR, device phase only, the compiled executables of ``decoder.lower(prepared, "encode" / "pass")``
  (the exact computations the decoder runs), wrapped as a ``bench.measure.decoder.Decoder`` so
  ``bench.measure.timing`` times them like any system: encoder + length prediction (a ``length_hyps=1``
  decoder without ``force_length``, as the harness runs PaDIR); the encoder alone (the refine:T
  decoders below: with ``force_length`` the length predictor does not run; asserted: length 32);
  one bare decoder pass over 32 positions (1 length hypothesis);
- PaDIR ``refine:T`` for T = 1, 4, 10 with ``length_hyps=1``, ``force_length=32`` (the one length
  hypothesis is 32) and ``early_stop=False`` (exactly T passes; asserted through ``passes``).
AR and refine:T are timed in both phases of ``bench.measure.timing``: ``device`` (run + block: the encoder,
PaDIR's one small host read of the lengths, the decode loop) and ``end_to_end`` (the
paper's measure: also tokenize and detokenize, here the fake vocabulary's, so almost nothing).
``extra_info`` holds the summary of the per-sentence latencies (n/p50/p90/p99/mean ms, bench.measure.stats)
plus the ratios of p50s within one phase: ``uncached_over_cached_p50`` (the issue's target: >= 3x),
``over_T_passes_plus_encoder_p50`` = PaDIR-T / (T x pass + encoder), the like-for-like overhead of the
refinement loop (target <= 1.2; the parts are device-phase timings, so the device row is the exact
comparison), ``over_T_passes_plus_encoder_and_length_p50`` (the same with encoder + length
prediction, the older definition) and ``ar_cached_over_padir_p50``. pytest-benchmark's own stats
time the whole measured round (one ``measure`` call).
``NARBENCH_BENCH_ROUNDS=N`` times every sentence N times instead (quick runs while developing); untimed (the test
suite's run, ``--benchmark-disable``) each decodes it ``UNTIMED_ROUNDS`` times, enough for its checks, with the
``UNTIMED_PRESET`` model with one layer a side (conftest.py) in place of `small`.
"""
from __future__ import annotations

import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bench.measure import stats, timing
from bench.measure.decoder import DecodeOutput
from models import t5
from models.config import preset
from models.decoders import make_decoder

SRC, TGT, VOCAB = 32, 32, 8000
SOURCE = "one fixed source sentence"      # the fake vocabulary encodes any text to the same 31 ids
PHASES = ("device", "end_to_end")
ROUNDS = {"ar_cached": 60, "ar_uncached": 20, "padir_encode": 100, "padir_pass": 100, "padir_refine": 40}
if os.environ.get("NARBENCH_BENCH_ROUNDS"):
    ROUNDS = dict.fromkeys(ROUNDS, int(os.environ["NARBENCH_BENCH_ROUNDS"]))
AR = dict(buckets=(SRC,), max_decode_length=TGT, force_length=TGT)       # options of both AR systems
PADIR = dict(buckets=(SRC,), max_decode_length=TGT, length_hyps=1)       # options of every PaDIR system
MEDIANS: dict[tuple[str, str], float] = {}                              # (key, phase) -> p50 ms


class FixedVocabulary:
    """Encodes any text to the same 31 regular ids (the decoder appends EOS: 32 source tokens)."""

    vocab_size = VOCAB

    def __init__(self, seed: int = 7):
        self.ids = [int(i) for i in np.random.default_rng(seed).integers(4, VOCAB, size=SRC - 1)]

    def encode(self, text: str) -> list[int]:
        return list(self.ids)

    def decode(self, ids) -> str:
        return " ".join(str(int(i)) for i in ids)


class CompiledPart:
    """One part of a PaDIR decoder ("encode" or "pass") as a ``bench.measure.decoder.Decoder``: ``run`` calls
    the compiled executable of ``decoder.lower(prepared, part)`` on the fixed workload's arguments."""

    def __init__(self, decoder, part: str, name: str, encoded=None):
        self.decoder, self.part, self.name = decoder, part, name
        prepared = decoder.prepare([SOURCE])
        start = time.perf_counter()
        self.compiled = decoder.lower(prepared, part).compile()
        self.compile_s = time.perf_counter() - start
        inputs = jnp.asarray(prepared.inputs)
        if part == "encode":
            self.args = (decoder.params, inputs)
        else:                                                # encoded [1, 32, d]: the encode part's output
            tokens = jax.random.randint(jax.random.key(3), (1, TGT), 4, VOCAB, dtype=jnp.int32)
            self.args = (decoder.params, encoded, inputs, tokens, jnp.ones((1, TGT), jnp.int32))
        jax.block_until_ready(self.args)

    def prepare(self, sources):
        self.decoder.prepare(sources)                        # the decoder's tokenization (untimed: device)
        return self.args

    def run(self, prepared):
        return self.compiled(*prepared)

    def finish(self, outputs, prepared) -> DecodeOutput:
        return DecodeOutput([""], np.ones(1, np.int64))

    def warmup_inputs(self, batch_size: int):
        assert batch_size == 1, "the parts are compiled for batch 1"
        return [self.args]


UNTIMED_ROUNDS = 2   # sentences a benchmark decodes when it runs untimed (the test suite): its checks need no more


def _measure(benchmark, latency_rows, decoder, key: str, phase: str, rounds: int, check,
             extra_compile_s: float = 0.0):
    """``timing.warmup``, ``check`` that the workload is the one claimed, then one ``timing.measure``
    round of the same sentence ``rounds`` times (``UNTIMED_ROUNDS`` when the benchmark is not timed)."""
    rounds = rounds if benchmark.enabled else UNTIMED_ROUNDS
    compile_s = timing.warmup([decoder], 1)[decoder.name] + extra_compile_s
    check(decoder)
    m = benchmark.pedantic(timing.measure, args=([decoder], [SOURCE] * rounds),
                           kwargs=dict(batch_size=1, phase=phase), rounds=1, iterations=1)
    system = m.systems[decoder.name]
    s = stats.summarize(system.latencies_ms)
    MEDIANS[key, phase] = s.p50
    benchmark.extra_info.update(system=decoder.name, platform=m.platform, phase=phase, batch_size=1,
                                n=s.n, p50_ms=s.p50, p90_ms=s.p90, p99_ms=s.p99, mean_ms=s.mean,
                                p99_ci_ms=s.p99_ci, compile_s=compile_s,
                                passes_mean=float(system.passes.mean()))
    latency_rows.append((benchmark.name, decoder.name, s, {"compile_s": compile_s}))
    return system


def _ratio(benchmark, name: str, numerator: tuple[str, str], denominator) -> None:
    if numerator in MEDIANS and denominator:
        benchmark.extra_info[name] = MEDIANS[numerator] / denominator


def _check_source(decoder) -> None:
    prepared = decoder.prepare([SOURCE])
    assert prepared.inputs.shape == (1, SRC) and int((prepared.inputs > 0).sum()) == SRC, prepared.inputs
    assert int(prepared.inputs[0, -1]) == 1                                                  # EOS


@pytest.fixture(scope="module")
def vocab():
    return FixedVocabulary()


@pytest.fixture(scope="module")
def ar_model(bench_preset, bench_overrides):
    cfg = preset(bench_preset, kind="ar", vocab_size=VOCAB, dropout_rate=0.0, **bench_overrides)
    return cfg, t5.init_params(cfg, jax.random.key(0))


@pytest.fixture(scope="module")
def padir_model(bench_preset, bench_overrides):
    cfg = preset(bench_preset, kind="padir", vocab_size=VOCAB, dropout_rate=0.0, **bench_overrides)
    return cfg, t5.init_params(cfg, jax.random.key(1))


@pytest.fixture(scope="module")
def ar_decoders(ar_model, vocab):
    cfg, params = ar_model
    out = {"ar_cached": make_decoder(cfg, params, vocab, "greedy", name="ar-greedy-cached", **AR),
           "ar_uncached": make_decoder(cfg, params, vocab, "greedy", name="ar-greedy-uncached", cached=False,
                                       **AR)}
    for decoder in out.values():
        _check_source(decoder)
    return out


@pytest.fixture(scope="module")
def padir_decoders(padir_model, vocab):
    """refine:T for T in 1, 4, 10 (one shared compiled refinement loop: T is a traced argument)."""
    cfg, params = padir_model
    out = {t: make_decoder(cfg, params, vocab, f"refine:{t}", name=f"padir-refine{t}", early_stop=False,
                           force_length=TGT, **PADIR) for t in (1, 4, 10)}
    _check_source(out[1])
    return out


@pytest.fixture(scope="module")
def padir_parts(padir_model, vocab, padir_decoders):
    """Encoder + length prediction (the harness's PaDIR, lengths predicted), the encoder alone and one
    pass (both of the refine:T decoders above)."""
    cfg, params = padir_model
    predicted = make_decoder(cfg, params, vocab, "refine:1", name="padir-predicted-length", **PADIR)
    assert predicted.force_length is None
    forced = padir_decoders[1]
    encode = CompiledPart(forced, "encode", "padir-encoder")
    encoded, _ = encode.run(encode.args)
    return {"encode+length": CompiledPart(predicted, "encode", "padir-encoder+length"), "encode": encode,
            "pass": CompiledPart(forced, "pass", "padir-one-pass", encoded)}


def _check_ar(decoder) -> None:
    out = jax.device_get(decoder.run(decoder.prepare([SOURCE])))
    assert out.tokens.shape == (1, TGT) and int(out.passes[0]) == TGT, (out.tokens.shape, out.passes)


@pytest.mark.parametrize("phase", PHASES)
def test_ar_greedy_cached(benchmark, latency_rows, ar_decoders, phase):
    decoder = ar_decoders["ar_cached"]
    system = _measure(benchmark, latency_rows, decoder, "ar_cached", phase, ROUNDS["ar_cached"], _check_ar)
    assert (system.passes == TGT).all(), system.passes


@pytest.mark.parametrize("phase", PHASES)
def test_ar_greedy_uncached(benchmark, latency_rows, ar_decoders, phase):
    decoder = ar_decoders["ar_uncached"]
    assert not decoder.cached
    system = _measure(benchmark, latency_rows, decoder, "ar_uncached", phase, ROUNDS["ar_uncached"], _check_ar)
    assert (system.passes == TGT).all(), system.passes
    _ratio(benchmark, "uncached_over_cached_p50", ("ar_uncached", phase), MEDIANS.get(("ar_cached", phase)))


def test_padir_encoder_and_length(benchmark, latency_rows, padir_parts):
    def check(part):
        encoded, lengths = part.run(part.args)
        assert encoded.shape[:2] == (1, SRC) and lengths.shape == (1, 1), (encoded.shape, lengths.shape)
        assert 1 <= int(lengths[0, 0]) <= TGT, lengths                              # predicted, capped

    part = padir_parts["encode+length"]
    _measure(benchmark, latency_rows, part, "padir_encode_length", "device", ROUNDS["padir_encode"], check,
             part.compile_s)


def test_padir_encoder(benchmark, latency_rows, padir_parts):
    def check(part):
        encoded, lengths = part.run(part.args)
        assert encoded.shape[:2] == (1, SRC) and np.asarray(lengths).tolist() == [[TGT]], lengths

    part = padir_parts["encode"]
    _measure(benchmark, latency_rows, part, "padir_encode", "device", ROUNDS["padir_encode"], check,
             part.compile_s)


def test_padir_one_decoder_pass(benchmark, latency_rows, padir_parts):
    def check(part):
        assert part.args[3].shape == part.args[4].shape == (1, TGT)
        logits = part.run(part.args)
        assert logits.shape == (1, TGT, VOCAB), logits.shape                       # 32 positions, k = 1

    part = padir_parts["pass"]
    _measure(benchmark, latency_rows, part, "padir_pass", "device", ROUNDS["padir_pass"], check, part.compile_s)


@pytest.mark.parametrize("phase", PHASES)
@pytest.mark.parametrize("iterations", [1, 4, 10])
def test_padir_refine_T(benchmark, latency_rows, padir_decoders, iterations, phase):
    def check(decoder):
        out = jax.device_get(decoder.run(decoder.prepare([SOURCE])))
        assert out.tokens.shape == (1, TGT) and int(out.passes[0]) == iterations, (out.tokens.shape, out.passes)

    key = f"padir_T{iterations}"
    system = _measure(benchmark, latency_rows, padir_decoders[iterations], key, phase, ROUNDS["padir_refine"], check)
    assert (system.passes == iterations).all(), system.passes
    for name, encoder in (("over_T_passes_plus_encoder_p50", "padir_encode"),
                          ("over_T_passes_plus_encoder_and_length_p50", "padir_encode_length")):
        if {("padir_pass", "device"), (encoder, "device")} <= set(MEDIANS):
            budget = iterations * MEDIANS["padir_pass", "device"] + MEDIANS[encoder, "device"]
            _ratio(benchmark, name, (key, phase), budget)
    if ("ar_cached", phase) in MEDIANS:
        benchmark.extra_info["ar_cached_over_padir_p50"] = MEDIANS["ar_cached", phase] / MEDIANS[key, phase]
