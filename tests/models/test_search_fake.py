"""Greedy and beam search driven by fixed-logit fake callbacks: exact sequences, scores and steps."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from models import decoding

EOS = 1


def markov_logits(table):
    """A callback whose next-token log-probs depend only on the current token: table[token] -> [V]."""
    logp = jnp.log(jnp.asarray(table, jnp.float32))                                  # [V, V]

    def tokens_to_logits(tokens, cache):
        return logp[tokens[:, 0]], cache + 1                                          # [b, V]
    return tokens_to_logits


# Vocab 0..4. From the start (0): 2 (0.6) or 3 (0.4). From 2: EOS 0.4, 2 0.3, 3 0.3. From 3: EOS 0.9.
TABLE = [[0.0, 0.0, 0.6, 0.4, 0.0],
         [1.0, 0.0, 0.0, 0.0, 0.0],
         [0.0, 0.4, 0.3, 0.3, 0.0],
         [0.0, 0.9, 0.05, 0.05, 0.0],
         [0.0, 0.0, 0.0, 0.0, 1.0]]
TABLE = np.where(np.asarray(TABLE) == 0, 1e-9, TABLE)


def test_greedy_follows_argmax_and_stops_at_eos():
    res = decoding.greedy_search(markov_logits(TABLE), jnp.int32(0), 2, 6, EOS)
    np.testing.assert_array_equal(res.tokens, [[2, 1, 0, 0, 0, 0]] * 2)
    np.testing.assert_allclose(res.scores, [np.log(0.6 * 0.4)] * 2, rtol=1e-5)
    np.testing.assert_array_equal(res.passes, [2, 2])


def test_greedy_rows_stop_independently():
    # Row 0 starts from a model that emits 4 forever, row 1 from the table above: row 1 needs 2 steps,
    # row 0 runs to max_len.
    logp = jnp.log(jnp.asarray(TABLE, jnp.float32))

    def fn(tokens, cache):
        row0 = jnp.log(jnp.asarray([1e-9, 1e-9, 1e-9, 1e-9, 1.0]))
        return jnp.stack([row0, logp[tokens[1, 0]]]), cache
    res = decoding.greedy_search(fn, jnp.int32(0), 2, 4, EOS)
    np.testing.assert_array_equal(res.tokens, [[4, 4, 4, 4], [2, 1, 0, 0]])
    np.testing.assert_array_equal(res.passes, [4, 2])


def test_uncached_greedy_sees_the_prefix():
    # Next token = (token at position i) + 1, EOS once the prefix reaches 3 tokens past the start.
    def seq_to_logits(seqs, i):
        last = jnp.take_along_axis(seqs, jnp.full((seqs.shape[0], 1), i), axis=1)[:, 0]
        nxt = jnp.where(i >= 3, EOS, last + 2)
        return jnp.where(jnp.arange(10)[None] == nxt[:, None], 0.0, -10.0)
    res = decoding.greedy_search_uncached(seq_to_logits, 1, 8, EOS)
    np.testing.assert_array_equal(res.tokens, [[2, 4, 6, 1, 0, 0, 0, 0]])
    np.testing.assert_array_equal(res.passes, [4])


def test_beam_finds_the_better_sequence_greedy_misses():
    res = decoding.beam_search(markov_logits(TABLE), jnp.int32(0), 1, 2, 6, alpha=0.0, eos_id=EOS)
    np.testing.assert_array_equal(res.tokens[0, 0], [3, 1, 0, 0, 0, 0])
    np.testing.assert_array_equal(res.tokens[0, 1], [2, 1, 0, 0, 0, 0])
    np.testing.assert_allclose(res.scores[0], [np.log(0.36), np.log(0.24)], rtol=1e-5)
    # Both beams end at step 2; every alive beam is then below 0.24, so the search stops.
    assert int(res.passes[0]) == 2


def test_beam_one_equals_greedy_on_fake():
    g = decoding.greedy_search(markov_logits(TABLE), jnp.int32(0), 1, 6, EOS)
    b = decoding.beam_search(markov_logits(TABLE), jnp.int32(0), 1, 1, 6, 0.0, EOS)
    np.testing.assert_array_equal(b.tokens[:, 0], g.tokens)
    np.testing.assert_allclose(b.scores[:, 0], g.scores, rtol=1e-6)
    np.testing.assert_array_equal(b.passes, g.passes)


def test_beam_length_penalty_prefers_longer_when_alpha_large():
    # From 0: EOS 0.5 or 2 (0.5); from 2: EOS 0.95. Raw: [EOS] 0.5 > [2, EOS] 0.475; with alpha = 2
    # the penalty (6/6)^2 = 1 vs (7/6)^2 ~ 1.36 favours the longer one.
    table = np.full((5, 5), 1e-9)
    table[0, 1], table[0, 2] = 0.5, 0.5
    table[2, 1] = 0.95
    table[2, 4] = 0.05
    table[4, 4] = 1.0
    short = decoding.beam_search(markov_logits(table), jnp.int32(0), 1, 2, 4, alpha=0.0, eos_id=EOS).tokens
    long = decoding.beam_search(markov_logits(table), jnp.int32(0), 1, 2, 4, alpha=2.0, eos_id=EOS).tokens
    np.testing.assert_array_equal(short[0, 0], [1, 0, 0, 0])
    np.testing.assert_array_equal(long[0, 0], [2, 1, 0, 0])


def test_beam_without_eos_returns_alive_beams():
    table = np.full((5, 5), 1e-9)
    table[:, 4] = 0.7
    table[:, 3] = 0.3
    # Beam 1 keeps 2 candidates per step (4 and 3), so EOS is never among them.
    res = decoding.beam_search(markov_logits(table), jnp.int32(0), 1, 1, 3, alpha=0.0, eos_id=EOS)
    np.testing.assert_array_equal(res.tokens[0, 0], [4, 4, 4])
    np.testing.assert_allclose(res.scores[0, 0], 3 * np.log(0.7), rtol=1e-5)
    assert int(res.passes[0]) == 3


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_length_penalty_is_gnmt(alpha):
    np.testing.assert_allclose(decoding.length_penalty(jnp.int32(10), alpha), (15 / 6) ** alpha, rtol=1e-6)


def test_no_eos_decodes_exactly_max_len():
    """``eos_id=NO_EOS`` (the decoders' force_length): EOS is an ordinary token, every row runs max_len."""
    greedy = decoding.greedy_search(markov_logits(TABLE), jnp.int32(0), 2, 5, decoding.NO_EOS)
    np.testing.assert_array_equal(greedy.tokens, [[2, 1, 0, 2, 1]] * 2)   # decoding goes on past EOS
    np.testing.assert_array_equal(greedy.passes, [5, 5])
    uncached = decoding.greedy_search_uncached(lambda seqs, i: jnp.zeros((1, 5)), 1, 4, decoding.NO_EOS)
    np.testing.assert_array_equal(uncached.passes, [4])
    beam = decoding.beam_search(markov_logits(TABLE), jnp.int32(0), 1, 2, 5, 0.0, decoding.NO_EOS)
    assert beam.tokens.shape == (1, 2, 5) and int(beam.passes[0]) == 5
    assert (np.asarray(beam.tokens[0, 0]) > 0).sum() >= 3                  # runs past its EOS


def test_padding_rows_start_finished():
    res = decoding.greedy_search(markov_logits(TABLE), jnp.int32(0), 2, 6, EOS, active=jnp.array([True, False]))
    np.testing.assert_array_equal(res.passes, [2, 0])
    np.testing.assert_array_equal(res.tokens[1], [0] * 6)
