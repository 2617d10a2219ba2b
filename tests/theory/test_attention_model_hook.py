"""The attention hook on a tiny random-initialised PaDIR model (shapes, ranges, bookkeeping)."""
from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from theory import attention, attention_model


class _FakeVocab:
    """encode: one id per word, ids 4..vocab-1 (no SentencePiece model needed)."""

    def __init__(self, size: int):
        self.vocab_size = size

    def encode(self, text: str) -> list[int]:
        return [4 + sum(map(ord, w)) % (self.vocab_size - 4) for w in text.split()]


@pytest.fixture(scope="module")
def analysed():
    from models import t5
    from models.config import preset
    from models.decoders import make_decoder

    config = preset("tiny", kind="padir", vocab_size=24, dropout_rate=0.0, max_target_length=16,
                    num_encoder_layers=1, num_decoder_layers=1)
    decoder = make_decoder(config, t5.init_params(config, jax.random.key(0)), _FakeVocab(24), "refine:2",
                           length_hyps=2, remask="none", seed=0)
    sources = [" ".join(f"w{(i * 7 + j) % 11}" for j in range(3 + i % 6)) for i in range(10)]
    return attention_model.analyse_model(decoder, sources, batch_size=8)


def test_pairs_and_bookkeeping(analysed):
    stats, info = analysed
    assert 1 <= info["sentences"] <= 10
    assert info["total_pairs"] == stats.stutter.size >= info["sentences"]
    assert info["stutter_pairs"] == int(stats.stutter.sum())
    assert 0.0 <= info["converged_share"] <= 1.0 and 1.0 <= info["passes_mean"] <= 2.0
    assert (info["iterations"], info["length_hyps"], info["remask"], info["start"], info["seed"]) == (2, 2, "none",
                                                                                                "random", 0)
    heads = 4
    assert stats.self_scores.shape == (info["total_pairs"], 2, heads)
    assert stats.tv.shape == stats.cosine.shape == (info["total_pairs"], heads)


def test_values_are_probabilities_and_distances(analysed):
    stats, _ = analysed
    assert np.isfinite(stats.self_scores).all() and (stats.self_scores >= 0).all() and (stats.self_scores <= 1).all()
    assert ((stats.tv >= -1e-6) & (stats.tv <= 1 + 1e-6)).all()
    assert ((stats.cosine >= 0) & (stats.cosine <= 1)).all()
    for k in (1, 2):
        assert stats.self_topk[k].dtype == bool and stats.cross_topk[k].dtype == bool
    assert (stats.cross_topk[2] >= stats.cross_topk[1]).all()      # a top-1 overlap is a top-2 overlap
    rows = attention.summarize(stats)
    assert sum(r["pairs"] for r in rows) == stats.stutter.size
    assert "Table 5" in attention.markdown_tables(rows)


@pytest.mark.slow
def test_cli_attention_from_a_run_folder(tmp_path):
    """End to end: a saved tiny PaDIR checkpoint + a `narbench run`-style folder -> Tables 4-5 page."""
    import io
    import sentencepiece as spm

    from bench.cli import main
    from models import checkpoint, t5
    from models.config import preset
    from theory import writer

    words = ["alpha", "beta", "gamma", "light", "water", "stone", "the", "and", "of", "river"]
    sentences = [" ".join(words[(i * j + j) % len(words)] for j in range(2 + i % 5)) for i in range(60)]
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_writer=buf, model_type="unigram",
                                   vocab_size=32, hard_vocab_limit=False, pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
                                   user_defined_symbols=["<mask>"], minloglevel=2, num_threads=1)
    vocab_path = tmp_path / "toy.model"
    vocab_path.write_bytes(buf.getvalue())
    config = preset("tiny", kind="padir", vocab_size=32, dropout_rate=0.0, max_target_length=16,
                    num_encoder_layers=1, num_decoder_layers=1)
    ckpt = tmp_path / "ckpt"
    checkpoint.save(ckpt, 1, t5.init_params(config, jax.random.key(2)), {"count": np.zeros((), np.int32)})
    checkpoint.write_meta(ckpt, {"task": "toy", "model_config": config.to_dict(), "vocab_path": str(vocab_path),
                                 "complete": True, "steps_done": 1})
    run = tmp_path / "results" / "toy" / "r1"
    run.mkdir(parents=True)
    from bench.rows import SCHEMA_VERSION, Row, columns

    row = Row({**{c.name: None for c in columns()}, "schema_version": SCHEMA_VERSION, "family": "padir",
               "paradigm": "nar", "system": "padir-s2", "test_set": "test", "checkpoint": str(ckpt), "iterations": 2,
               "decoder": "refine:2", "decoder_options": {"length_hyps": 2, "remask": "stutter", "start": "random",
                                                          "seed": 0}})
    (run / "rows.jsonl").write_text(json.dumps(dict(row)) + "\n")
    (run / "samples.jsonl").write_text("".join(
        json.dumps({"system": "padir-s2", "test_set": "test", "index": i, "source": s}) + "\n"
        for i, s in enumerate(sentences[:12])))
    (run.parent / "latest").write_text("r1\n")
    out = tmp_path / "out"
    assert main(["theory", "attention", "--run", str(run.parent / "latest"), "--batch-size", "8",
                 "--results-dir", str(out)]) == 0
    page = writer.latest_run(out, "attention")
    text = (page / "table.md").read_text()
    assert "Table 4" in text and "padir-s2" in text and "refine:2" in text
    rows = [json.loads(x) for x in (page / "rows.jsonl").read_text().splitlines()]
    assert [r["stutter"] for r in rows] == [True, False]
    assert rows[0]["pairs"] + rows[1]["pairs"] == rows[0]["total_pairs"] > 0
    assert rows[0]["pairs"] == rows[0]["stutter_pairs"]


def test_job_from_run_picks_most_iterations_then_best_bleu(tmp_path):
    from bench.cli.theory import job_from_run

    """Without --system, the analysed model is the NAR row with the most refinement iterations; a tie goes to the higher BLEU."""
    from bench.rows import SCHEMA_VERSION, Row, columns

    def row(system, test_set, checkpoint, iterations, bleu):
        nar = iterations is not None
        return dict(Row({**{c.name: None for c in columns()}, "schema_version": SCHEMA_VERSION, "system": system,
                         "family": "padir" if nar else "ar", "paradigm": "nar" if nar else "ar",
                         "test_set": test_set, "checkpoint": checkpoint, "iterations": iterations, "bleu": bleu,
                         "decoder": f"refine:{iterations}" if nar else "greedy",
                         "decoder_options": {"length_hyps": 5, "remask": "stutter", "start": "random", "seed": 0}}))

    rows = [row("ar-greedy", "test", "ar", None, 30.0), row("padir-s4", "test", "c4", 4, 9.0),
            row("padir-s10", "test", "c10", 10, 1.5), row("padir-s10-distill", "test", "c10d", 10, 2.9),
            row("padir-s10-distill", "test+refs", "c10d", 10, 3.5)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "samples.jsonl").write_text("".join(
        json.dumps({"system": r["system"], "test_set": r["test_set"], "index": i, "source": f"{r['system']} {i}"}) + "\n"
        for r in rows for i in (1, 0)))
    job = job_from_run(str(tmp_path))
    assert job.checkpoint.endswith("c10d") and job.iterations == 10   # resolved under the data root
    assert job.sources == ("padir-s10-distill 0", "padir-s10-distill 1")
    assert job.origin.endswith("test set test")      # the run's first test set, not the higher-BLEU test+refs
    assert job_from_run(str(tmp_path), system="padir-s4").checkpoint.endswith("c4")
