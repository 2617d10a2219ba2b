"""Session fixtures for the model tests: tiny configs, random parameters, a tiny SentencePiece vocab."""
from __future__ import annotations

import random

import jax
import pytest

from models import t5
from models.config import preset

TINY_VOCAB = 64


@pytest.fixture(scope="session")
def ar_config():
    return preset("tiny", kind="ar", vocab_size=TINY_VOCAB, dropout_rate=0.0, max_target_length=32)


@pytest.fixture(scope="session")
def padir_config():
    return preset("tiny", kind="padir", vocab_size=TINY_VOCAB, dropout_rate=0.0, max_target_length=32)


@pytest.fixture(scope="session")
def ar_params(ar_config):
    return t5.init_params(ar_config, jax.random.key(0))


@pytest.fixture(scope="session")
def padir_params(padir_config):
    return t5.init_params(padir_config, jax.random.key(1))


WORDS = ["alpha", "beta", "gamma", "delta", "light", "water", "stone", "river", "house", "night",
         "the", "and", "of", "to", "in", "a", "is", "was", "he", "she"]


@pytest.fixture(scope="session")
def toy_sentences():
    rng = random.Random(0)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) for _ in range(400)]


@pytest.fixture(scope="session")
def tiny_vocab(tmp_path_factory, toy_sentences):
    """A SentencePiece vocabulary with narbench's id layout (0 pad, 1 EOS, 2 unk, 3 <mask>)."""
    import io

    import seqio
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(toy_sentences), model_writer=model, model_type="unigram",
        vocab_size=TINY_VOCAB, hard_vocab_limit=False, pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
        user_defined_symbols=["<mask>"], minloglevel=2, num_threads=1)
    path = tmp_path_factory.mktemp("vocab") / "toy.model"
    path.write_bytes(model.getvalue())
    vocab = seqio.SentencePieceVocabulary(str(path))
    assert vocab.tokenizer.piece_to_id("<mask>") == 3
    assert vocab.vocab_size <= TINY_VOCAB
    return vocab
