"""Decoders: prepare / run / finish with tiny random models and a tiny SentencePiece vocabulary."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from narbench_core.errors import UserError
from models import decoders

SOURCES = ["the river and the stone", "alpha beta", "she was in the house of light and water"]
OPTS = dict(buckets=(16,), max_decode_length=16)


def roundtrip(decoder, sources=SOURCES):
    prepared = decoder.prepare(sources)
    outputs = decoder.run(prepared)
    jax.block_until_ready(outputs)
    return decoder.finish(outputs, prepared)


@pytest.fixture(scope="module")
def ar_greedy(ar_config, ar_params, tiny_vocab):
    return decoders.make_decoder(ar_config, ar_params, tiny_vocab, "greedy", **OPTS)


def test_ar_greedy_roundtrip(ar_greedy):
    assert ar_greedy.name == "greedy"   # system names are the harness families'; a decoder defaults to its spec
    out = roundtrip(ar_greedy)
    assert len(out.hypotheses) == 3 and all(isinstance(h, str) for h in out.hypotheses)
    assert out.passes.shape == (3,) and np.all((out.passes >= 1) & (out.passes <= 16))
    # Deterministic, and a sentence's output does not depend on its batch-mates.
    again = roundtrip(ar_greedy, SOURCES[1:2])
    assert again.hypotheses[0] == out.hypotheses[1]


def test_ar_greedy_uncached_matches_cached(ar_config, ar_params, tiny_vocab, ar_greedy):
    uncached = decoders.make_decoder(ar_config, ar_params, tiny_vocab, "greedy", cached=False, **OPTS)
    a, b = roundtrip(ar_greedy), roundtrip(uncached)
    assert a.hypotheses == b.hypotheses
    np.testing.assert_array_equal(a.passes, b.passes)


def test_ar_beam_and_lowering(ar_config, ar_params, tiny_vocab):
    beam = decoders.make_decoder(ar_config, ar_params, tiny_vocab, "beam:2", name="ar-beam2", **OPTS)
    assert beam.name == "ar-beam2" and beam.parsed.k == 2
    out = roundtrip(beam)
    assert len(out.hypotheses) == 3
    warm = beam.warmup_inputs(1)
    assert len(warm) == 1 and warm[0].inputs.shape == (1, 16)
    for part in ("encode", "pass"):
        cost = beam.lower(warm[0], part).compile().cost_analysis()
        assert cost is not None
    with pytest.raises(UserError):
        beam.lower(warm[0], "everything")


def test_warmed_batch_size_pads_small_batches(ar_greedy):
    ar_greedy.warmup_inputs(4)
    prepared = ar_greedy.prepare(SOURCES)
    assert prepared.inputs.shape == (4, 16) and prepared.num_sources == 3
    assert len(ar_greedy.finish(ar_greedy.run(prepared), prepared).hypotheses) == 3


@pytest.mark.parametrize("remask,init", [("stutter", "random"), ("mask-predict", "mask")])
def test_padir_refine_roundtrip(padir_config, padir_params, tiny_vocab, remask, init):
    dec = decoders.make_decoder(padir_config, padir_params, tiny_vocab, "refine:3", length_hyps=2,
                                remask=remask, init=init, **OPTS)
    assert dec.parsed.k == 3 and dec.length_hyps == 2 and dec.remask == remask
    warm = dec.warmup_inputs(1)
    assert {w.target_bucket for w in warm} == {16}
    out = roundtrip(dec)
    assert len(out.hypotheses) == 3
    assert np.all((out.passes >= 1) & (out.passes <= 3))
    assert dec.lower(warm[0], "pass").compile() is not None


def test_spec_and_option_errors(ar_config, ar_params, padir_config, padir_params, tiny_vocab):
    with pytest.raises(UserError, match="needs a PaDIR checkpoint \\(refine:T"):
        decoders.make_decoder(padir_config, padir_params, tiny_vocab, "beam:4")
    with pytest.raises(UserError, match="needs an AR checkpoint"):
        decoders.make_decoder(ar_config, ar_params, tiny_vocab, "refine:4")
    with pytest.raises(UserError, match=">= 1"):
        decoders.make_decoder(padir_config, padir_params, tiny_vocab, "refine:0")
    with pytest.raises(UserError, match="unknown decoder"):
        decoders.make_decoder(ar_config, ar_params, tiny_vocab, "sample")
    with pytest.raises(UserError, match="unknown remask"):
        decoders.make_decoder(padir_config, padir_params, tiny_vocab, "refine:2", remask="sometimes")
    with pytest.raises(UserError, match=r"options \['temperature'\] do not apply"):
        decoders.make_decoder(ar_config, ar_params, tiny_vocab, "greedy", temperature=0.5)
    with pytest.raises(UserError, match=r"options \['length_hyps'\] do not apply to an AR checkpoint"):
        decoders.make_decoder(ar_config, ar_params, tiny_vocab, "greedy", length_hyps=5)


def test_load_decoder_errors(tmp_path):
    with pytest.raises(UserError, match="no checkpoint"):
        decoders.load_decoder(tmp_path / "missing", "greedy")
    with pytest.raises(UserError, match="refine:T"):
        decoders.load_decoder(tmp_path / "missing", "refine:x")


def test_load_decoder_from_checkpoint_folder(tmp_path, ar_config, ar_params, tiny_vocab):
    from models import checkpoint

    ckpt = tmp_path / "ckpt"
    checkpoint.save(ckpt, 5, ar_params, {"count": np.zeros((), np.int32)})
    checkpoint.write_meta(ckpt, {"task": "toy", "kind": "ar", "model_config": ar_config.to_dict(),
                                 "train_config": {"steps": 5}, "vocab_path": tiny_vocab.sentencepiece_model_file,
                                 "steps_done": 5, "complete": True})
    dec = decoders.load_decoder(ckpt, "greedy", **OPTS)
    assert dec.name == "greedy"
    with pytest.raises(UserError, match="needs a PaDIR checkpoint"):
        decoders.load_decoder(ckpt, "refine:2")
    out = roundtrip(dec)
    assert len(out.hypotheses) == 3


def test_batch_padding_rows_do_not_extend_the_loop(ar_greedy, padir_config, padir_params, tiny_vocab):
    # A padding row starts finished: 0 passes, so it never keeps the loop running.
    ar_greedy.warmup_inputs(4)
    prepared = ar_greedy.prepare(SOURCES[:1])
    tokens, passes, _ = ar_greedy.run(prepared)
    assert list(np.asarray(passes)[1:]) == [0, 0, 0] and int(np.asarray(tokens)[1:].max()) == 0
    dec = decoders.make_decoder(padir_config, padir_params, tiny_vocab, "refine:2", length_hyps=1, **OPTS)
    dec.warmup_inputs(2)
    prepared = dec.prepare(SOURCES[:1])
    assert prepared.inputs.shape[0] == 2
    assert list(np.asarray(dec.run(prepared)[1])) == [int(dec.finish(dec.run(prepared), prepared).passes[0]), 0]
