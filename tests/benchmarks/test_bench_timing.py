"""pytest-benchmark benchmarks that time decoders through bench.measure.timing (the harness's one protocol).

Each benchmark warms up (compile kept apart), then runs one interleaved ``timing.measure`` round over
a fixed sentence set; per-sentence p50/p90/p99 (bench.measure.stats) go to ``benchmark.extra_info`` (saved
JSON) and to the terminal summary. pytest-benchmark's own numbers time the whole measured round.
Run: ``pytest tests/benchmarks --benchmark-enable --benchmark-only`` (add ``--benchmark-json out.json`` to keep them).
"""
from __future__ import annotations

import random

import pytest

from bench.measure import stats, timing
from fakes import JittedDecoder

WORDS = ["alpha", "beta", "gamma", "delta", "light", "water", "stone", "river", "house", "night",
         "the", "and", "of", "to", "in", "a", "is", "was", "he", "she"]


def _sentences(n: int, seed: int = 0, max_words: int = 12) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, max_words))) for _ in range(n)]


def _time_and_record(benchmark, latency_rows, decoders, sources, phase="end_to_end", batch_size=1):
    compile_s = timing.warmup(decoders, batch_size)
    m = benchmark.pedantic(timing.measure, args=(decoders, sources),
                           kwargs=dict(batch_size=batch_size, phase=phase), rounds=1, iterations=1)
    first = decoders[0].name
    benchmark.extra_info.update(platform=m.platform, phase=phase, batch_size=batch_size, n_sentences=len(sources))
    for d in decoders:
        s = stats.summarize(m.latencies(d.name))
        extra = {"compile_s": compile_s[d.name],
                 "passes_mean": float(m.systems[d.name].passes.mean())}
        if d.name != first:
            extra["speedup_p50_vs_first"] = stats.paired_speedup(m.latencies(first), m.latencies(d.name)).median
        benchmark.extra_info[d.name] = {"p50_ms": s.p50, "p90_ms": s.p90, "p99_ms": s.p99, "mean_ms": s.mean,
                                        "n": s.n, "p99_ci_ms": s.p99_ci, **extra}
        latency_rows.append((benchmark.name, d.name, s, extra))
    return m


@pytest.mark.parametrize("phase", ["end_to_end", "device"])
def test_bench_jitted_fakes(benchmark, latency_rows, phase):
    """A sequential-looking (16 passes) and a parallel-looking (2 passes) jitted workload."""
    decoders = [JittedDecoder("fake-16pass", passes=16, dim=128, family="ar"),
                JittedDecoder("fake-2pass", passes=2, dim=128, family="nar")]
    m = _time_and_record(benchmark, latency_rows, decoders, _sentences(200), phase=phase)
    assert set(m.systems) == {"fake-16pass", "fake-2pass"}


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    """AR greedy and PaDIR refine:4 from the `tiny` preset with random weights and a toy vocabulary."""
    decoders = pytest.importorskip("models.decoders")
    import io

    import jax
    import seqio
    import sentencepiece as spm

    from models import t5
    from models.config import preset

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_sentences(400, seed=1)), model_writer=model, model_type="unigram",
        vocab_size=64, hard_vocab_limit=False, pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
        user_defined_symbols=["<mask>"], minloglevel=2, num_threads=1)
    path = tmp_path_factory.mktemp("bench-vocab") / "toy.model"
    path.write_bytes(model.getvalue())
    vocab = seqio.SentencePieceVocabulary(str(path))
    out = []
    for kind, spec, seed in (("ar", "greedy", 0), ("padir", "refine:4", 1)):
        config = preset("tiny", kind=kind, vocab_size=vocab.vocab_size, dropout_rate=0.0, max_target_length=32)
        params = t5.init_params(config, jax.random.key(seed))
        out.append(decoders.make_decoder(config, params, vocab, spec, buckets=(16,), max_decode_length=32))
    return out


def test_bench_tiny_ar_vs_padir(benchmark, latency_rows, tiny_models):
    m = _time_and_record(benchmark, latency_rows, tiny_models, _sentences(60, seed=2))
    assert all(len(t.hypotheses) == 60 for t in m.systems.values())
