"""Greedy and beam search on a tiny random AR model: cached == uncached, beam 1 == greedy, beam k
scores >= greedy's and equal the teacher-forced log-prob of the returned sequence.

A random T5 with tied N(0, 1) embeddings mostly copies its input token and never ends, so the test
model shrinks the embeddings (less copying) and adds an EOS bonus from a row-specific position on
(EOS_FROM), applied alike in the cached step, the uncached pass and teacher forcing."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import decoding, t5

INPUTS = jnp.array([[5, 6, 7, 8, 9, 1, 0, 0], [10, 11, 1, 0, 0, 0, 0, 0], [12, 13, 14, 15, 16, 17, 18, 1]])
MAX_LEN = 10
EOS = 1
EOS_FROM = jnp.array([3, 6, 20])   # row 2 never gets the bonus: it runs to MAX_LEN


def eos_bonus(positions, rows_per_sentence):
    """[b * rows, n] bonus added to the EOS logit at decoder ``positions`` [n]."""
    start = jnp.repeat(EOS_FROM, rows_per_sentence)[:, None]
    return jnp.where(positions[None, :] >= start, 6.0, 0.0)


@pytest.fixture(scope="module")
def searches(ar_config, ar_params):
    model = t5.Transformer(ar_config)
    ar_params = dict(ar_params, token_embedder={"embedding": ar_params["token_embedder"]["embedding"] * 0.3})
    b, s = INPUTS.shape

    def setup(params, inputs, rows):
        encoded = model.apply({"params": params}, inputs, method=t5.Transformer.encode)
        encoded, inputs = jnp.repeat(encoded, rows, 0), jnp.repeat(inputs, rows, 0)
        cache = t5.init_cache(ar_config, b * rows, s, MAX_LEN)

        def step(tokens, cache):
            position = cache["decoder"]["index"]
            logits, state = model.apply({"params": params, "cache": cache}, encoded, inputs, tokens, decode=True,
                                        mutable=["cache"], method=t5.Transformer.decode)
            return logits[:, 0].at[:, EOS].add(eos_bonus(position[None], rows)[:, 0]), state["cache"]
        return encoded, inputs, cache, step

    @jax.jit
    def greedy(params, inputs):
        _, _, cache, step = setup(params, inputs, 1)
        return decoding.greedy_search(step, cache, b, MAX_LEN, EOS)

    @jax.jit
    def uncached(params, inputs):
        encoded, inputs, _, _ = setup(params, inputs, 1)
        fn = lambda seqs, i: model.apply({"params": params}, encoded, inputs, seqs, logit_index=i,
                                         method=t5.Transformer.decode)[:, 0].at[:, EOS].add(eos_bonus(i[None], 1)[:, 0])
        return decoding.greedy_search_uncached(fn, b, MAX_LEN, EOS)

    @functools.partial(jax.jit, static_argnums=(2, 3))
    def beam(params, inputs, k, alpha):
        _, _, cache, step = setup(params, inputs, k)
        return decoding.beam_search(step, cache, b, k, MAX_LEN, alpha, EOS)

    @jax.jit
    def sequence_logprob(params, inputs, tokens):
        logits = model.apply({"params": params}, inputs, t5.shift_right(tokens))
        logits = logits.at[:, :, EOS].add(eos_bonus(jnp.arange(tokens.shape[1]), 1))
        logp = jax.nn.log_softmax(logits)
        picked = jnp.take_along_axis(logp, tokens[..., None], -1)[..., 0]
        first_eos = jnp.cumsum(tokens == EOS, axis=1) - (tokens == EOS)              # EOS itself counts
        return jnp.sum(jnp.where(first_eos == 0, picked, 0.0), axis=1)

    return dict(greedy=lambda: greedy(ar_params, INPUTS), uncached=lambda: uncached(ar_params, INPUTS),
                beam=lambda k, a=0.0: beam(ar_params, INPUTS, k, a),
                logprob=lambda toks: sequence_logprob(ar_params, INPUTS, toks))


def test_cached_and_uncached_greedy_agree(searches):
    g = searches["greedy"]()
    assert list(np.asarray(g.passes)) == [4, 7, MAX_LEN]       # the rows end at different steps
    assert int(g.tokens[0, 3]) == EOS and int(g.tokens[0, 4:].max()) == 0
    u = searches["uncached"]()
    np.testing.assert_array_equal(g.tokens, u.tokens)
    np.testing.assert_array_equal(g.passes, u.passes)
    np.testing.assert_allclose(g.scores, u.scores, rtol=1e-4)
    np.testing.assert_allclose(g.scores, searches["logprob"](g.tokens), rtol=1e-4)


def test_beam_one_equals_greedy(searches):
    g, b = searches["greedy"](), searches["beam"](1)
    np.testing.assert_array_equal(b.tokens[:, 0], g.tokens)
    np.testing.assert_allclose(b.scores[:, 0], g.scores, rtol=1e-4)
    np.testing.assert_array_equal(b.passes, g.passes)


def test_beam_k_scores_at_least_greedy_and_match_the_model(searches):
    g, b = searches["greedy"](), searches["beam"](4)
    b_tok, b_score = b.tokens, b.scores
    assert np.all(np.asarray(b_score[:, 0]) >= np.asarray(g.scores) - 1e-4)
    assert np.all(np.diff(np.asarray(b_score), axis=1) <= 1e-6)                      # best first
    # With alpha = 0 a beam's score is its log-prob: re-scoring by teacher forcing checks that the KV
    # cache followed every beam reordering.
    for j in range(4):
        np.testing.assert_allclose(b_score[:, j], searches["logprob"](b_tok[:, j]), rtol=1e-4, atol=1e-4)
    assert np.all((np.asarray(b.passes) >= 1) & (np.asarray(b.passes) <= MAX_LEN))
