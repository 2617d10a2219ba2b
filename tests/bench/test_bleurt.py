"""bench.measure.bleurt on tiny checkpoints the test builds (WordPiece and SentencePiece), and its user errors."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from bench.measure import bleurt
from narbench_core.errors import UserError

tf = pytest.importorskip("tensorflow")

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "cat", "sat", "##s", "on", "mat", ".", "a", "un", "##aff", "##able"]
MAX_LEN = 12


def _weights(vocab_size: int) -> np.ndarray:
    return (np.arange(vocab_size, dtype=np.float32) * 0.37) % 1.0 - 0.5


def _tiny_model_numpy(ids, mask, segments, weights):
    """What the tiny SavedModel computes: sum_j mask_j * w[id_j] + 0.1 * sum_j segment_j."""
    return (weights[ids] * mask).sum(-1) + 0.1 * segments.sum(-1)


def _save_tiny_model(path: Path, vocab_size: int, max_len: int) -> None:
    spec = [tf.TensorSpec([None, max_len], tf.int64, name=n) for n in ("input_ids", "input_mask", "segment_ids")]

    class Tiny(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(_weights(vocab_size))

        @tf.function(input_signature=spec)
        def serve(self, input_ids, input_mask, segment_ids):
            mask = tf.cast(input_mask, tf.float32)
            score = tf.reduce_sum(tf.gather(self.w, input_ids) * mask, -1)
            score += 0.1 * tf.reduce_sum(tf.cast(segment_ids, tf.float32), -1)
            return {"predictions": score}

    module = Tiny()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})


@pytest.fixture(scope="module")
def wordpiece_ckpt(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("bleurt-wp") / "BLEURT-tiny-test"
    _save_tiny_model(path, len(VOCAB), MAX_LEN)
    (path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    (path / "bleurt_config.json").write_text(json.dumps({
        "name": "tiny-test", "bert_config_file": "bert_config.json", "max_seq_length": MAX_LEN,
        "vocab_file": "vocab.txt", "do_lower_case": True, "sp_model": None, "dynamic_seq_length": False}))
    return path


def test_encoding_matches_hand_ids(wordpiece_ckpt):
    tok = bleurt.WordPieceTokenizer(wordpiece_ckpt / "vocab.txt", do_lower_case=True)
    assert tok.tokenize("The cats sat.") == ["the", "cat", "##s", "sat", "."]
    assert tok.tokenize("Unaffable dog") == ["un", "##aff", "##able", "[UNK]"]
    assert tok.tokenize("Thé\u00a0CAT") == ["the", "cat"]  # accents stripped, odd whitespace
    ids, mask, seg = bleurt.encode_pair("The cats sat.", "a cat", tok, MAX_LEN)
    assert ids == [2, 4, 5, 7, 6, 10, 3, 11, 5, 3, 0, 0]
    assert mask == [1] * 10 + [0, 0]
    assert seg == [0] * 7 + [1] * 3 + [0, 0]
    # Truncation: 8 slots -> 5 tokens; the longer side (the reference) loses its last tokens.
    ids, mask, seg = bleurt.encode_pair("The cats sat.", "a cat", tok, 8)
    assert ids == [2, 4, 5, 7, 3, 11, 5, 3] and mask == [1] * 8 and seg == [0] * 5 + [1] * 3


def test_scores_equal_the_tiny_model(wordpiece_ckpt):
    scorer = bleurt.BleurtScorer(wordpiece_ckpt)
    refs = ["The cats sat.", "a cat on the mat", "the mat", "cat cat cat cat cat cat cat cat cat cat"]
    cands = ["a cat", "the cat sat on a mat .", "", "cat"]
    scores = scorer.score(refs, cands, batch_size=3)  # two batches
    ids, mask, seg = bleurt.encode_batch(refs, cands, scorer.tokenizer, MAX_LEN)
    expected = _tiny_model_numpy(ids, mask, seg, _weights(len(VOCAB)))
    np.testing.assert_allclose(scores, expected, rtol=1e-6)
    w = _weights(len(VOCAB))  # the first pair by hand
    hand = w[[2, 4, 5, 7, 6, 10, 3, 11, 5, 3]].sum() + 0.1 * 3
    assert scores[0] == pytest.approx(hand, rel=1e-6)
    assert bleurt.corpus_bleurt(scorer, refs, cands) == pytest.approx(float(np.mean(expected)), rel=1e-6)


def test_checkpoint_from_env(wordpiece_ckpt, monkeypatch):
    monkeypatch.delenv(bleurt.ENV_VAR, raising=False)
    assert bleurt.load_scorer(None) is None
    assert bleurt.corpus_bleurt(None, ["a"], ["a"]) is None
    monkeypatch.setenv(bleurt.ENV_VAR, str(wordpiece_ckpt))
    assert bleurt.resolve_checkpoint(None) == wordpiece_ckpt
    assert bleurt.load_scorer(None).max_seq_length == MAX_LEN


def test_sentencepiece_checkpoint(tmp_path):
    spm = pytest.importorskip("sentencepiece")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(["the cat sat on the mat", "a dog ran in the park", "cats and dogs",
                                 "the mat is red", "on a sunny day"] * 20))
    path = tmp_path / "BLEURT-sp"
    path.mkdir()
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(path / "sent_piece"), vocab_size=30,
                                   user_defined_symbols=["[CLS]", "[SEP]"], model_type="unigram",
                                   minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=str(path / "sent_piece.model"))
    _save_tiny_model(path, sp.get_piece_size(), 16)
    (path / "bleurt_config.json").write_text(json.dumps({
        "name": "sp-test", "max_seq_length": 16, "vocab_file": None, "do_lower_case": None,
        "sp_model": "sent_piece", "dynamic_seq_length": True}))
    scorer = bleurt.BleurtScorer(path)
    ref, cand = "the cat sat", "a dog"
    ids = [sp.piece_to_id("[CLS]"), *sp.encode(ref), sp.piece_to_id("[SEP]"), *sp.encode(cand), sp.piece_to_id("[SEP]")]
    w = _weights(sp.get_piece_size())
    expected = w[ids].sum() + 0.1 * (len(sp.encode(cand)) + 1)
    assert scorer.score([ref], [cand]) == pytest.approx([expected], rel=1e-6)


def _one_line_user_error(path) -> str:
    with pytest.raises(UserError) as err:
        bleurt.BleurtScorer(path)
    message = str(err.value)
    assert "\n" not in message and "--bleurt-checkpoint" in message
    return message


def test_missing_or_malformed_checkpoints(tmp_path, wordpiece_ckpt):
    assert "not a directory" in _one_line_user_error(tmp_path / "nope")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "bleurt_config.json" in _one_line_user_error(empty)
    broken = tmp_path / "broken"
    shutil.copytree(wordpiece_ckpt, broken)
    (broken / "bleurt_config.json").write_text("{not json")
    assert "malformed" in _one_line_user_error(broken)
    (broken / "bleurt_config.json").write_text(json.dumps({"max_seq_length": 12}))
    assert "neither sp_model nor vocab_file" in _one_line_user_error(broken)
    (broken / "bleurt_config.json").write_text(json.dumps({"max_seq_length": 12, "vocab_file": "missing.txt",
                                                           "do_lower_case": True}))
    assert "missing.txt" in _one_line_user_error(broken)
    no_model = tmp_path / "no_model"
    no_model.mkdir()
    shutil.copy(wordpiece_ckpt / "vocab.txt", no_model)
    shutil.copy(wordpiece_ckpt / "bleurt_config.json", no_model)
    assert "SavedModel" in _one_line_user_error(no_model)
    corrupt = tmp_path / "corrupt"
    shutil.copytree(wordpiece_ckpt, corrupt)
    (corrupt / "saved_model.pb").write_bytes(b"garbage")
    assert "could not be loaded" in _one_line_user_error(corrupt)
