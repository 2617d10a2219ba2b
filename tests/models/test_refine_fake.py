"""Iterative refinement with fake refine callbacks; stutter re-masking and drop_repeats (hypothesis)."""
from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from models import refine

V = 12


def fixed_target(target):
    """A refiner whose argmax is ``target`` whatever the input (a fixed point after one pass)."""
    target = jnp.asarray(target)

    def fn(tokens, mask):
        return jax.nn.one_hot(target, V) * 5.0                                         # [b, n, V]
    return fn


def shift_by_one(tokens, mask):
    """A refiner that never settles: argmax = input + 1 (wrapping inside the regular ids)."""
    nxt = 4 + (tokens - 4 + 1) % (V - 4)
    return jax.nn.one_hot(nxt, V) * 5.0


def test_stops_early_on_fixed_point():
    target = [[5, 6, 7, 1]]
    mask = jnp.ones((1, 4), jnp.int32)
    start = jnp.array([[9, 9, 9, 9]])
    out = refine.iterative_refinement(fixed_target(target), start, mask, 5, jax.random.key(0), remask="none")
    np.testing.assert_array_equal(out.tokens, target)
    assert int(out.passes[0]) == 2   # pass 1 changes everything, pass 2 changes nothing -> stop
    np.testing.assert_allclose(out.score, jax.nn.log_softmax(jnp.array([5.0] + [0.0] * (V - 1)))[0], rtol=1e-6)


def test_starting_at_the_fixed_point_takes_one_pass():
    target = [[5, 6, 1, 0]]
    mask = jnp.array([[1, 1, 1, 0]])
    out = refine.iterative_refinement(fixed_target(target), jnp.array(target), mask, 4, jax.random.key(0), "none")
    assert int(out.passes[0]) == 1


@pytest.mark.parametrize("steps", [1, 3, 6])
def test_never_more_than_T_passes(steps):
    start = jnp.array([[4, 5, 6, 7], [8, 9, 10, 11]])
    mask = jnp.array([[1, 1, 1, 1], [1, 1, 0, 0]])
    out = refine.iterative_refinement(shift_by_one, start, mask, steps, jax.random.key(0), remask="none")
    np.testing.assert_array_equal(out.passes, [steps, steps])
    expected = np.where(np.asarray(mask) > 0, 4 + (np.asarray(start) - 4 + steps) % (V - 4), 0)
    np.testing.assert_array_equal(out.tokens, expected)


@pytest.mark.parametrize("remask", ["none", "stutter", "mask-predict"])
def test_traced_step_count_matches_a_python_int(remask):
    """One jitted loop with T as an argument (how decoders share a compile) gives what a baked-in T gives."""
    start = jnp.array([[4, 4, 6, 7], [8, 9, 10, 11]])
    mask = jnp.array([[1, 1, 1, 1], [1, 1, 1, 0]])
    key = jax.random.key(3)
    traced = jax.jit(lambda t: refine.iterative_refinement(shift_by_one, start, mask, t, key, remask, vocab_size=V))
    for steps in (1, 2, 5):
        want = refine.iterative_refinement(shift_by_one, start, mask, steps, key, remask, vocab_size=V)
        got = traced(jnp.int32(steps))
        np.testing.assert_array_equal(got.tokens, want.tokens)
        np.testing.assert_array_equal(got.passes, want.passes)
    assert traced._cache_size() == 1


def test_finished_rows_keep_tokens_while_others_continue():
    # Row 0 reaches its fixed point at once; row 1 never settles.
    def fn(tokens, mask):
        logits = shift_by_one(tokens, mask)
        return logits.at[0].set(jax.nn.one_hot(jnp.array([5, 6, 1]), V) * 5.0)
    start = jnp.array([[5, 6, 1], [4, 4, 4]])
    out = refine.iterative_refinement(fn, start, jnp.ones((2, 3), jnp.int32), 4, jax.random.key(0), "none")
    np.testing.assert_array_equal(out.passes, [1, 4])
    np.testing.assert_array_equal(out.tokens[0], [5, 6, 1])
    np.testing.assert_array_equal(out.tokens[1], [8, 8, 8])


def test_stutter_remask_feeds_masks_to_the_next_pass():
    seen = []

    def fn(tokens, mask):
        jax.debug.callback(lambda t: seen.append(np.asarray(t).copy()), tokens)
        return jax.nn.one_hot(jnp.array([[5, 5, 5, 6, 1]]), V) * 5.0
    start = jnp.array([[4, 4, 4, 4, 4]])
    out = refine.iterative_refinement(fn, start, jnp.ones((1, 5), jnp.int32), 3, jax.random.key(0),
                                      remask="stutter", start="mask")
    np.testing.assert_array_equal(seen[1], [[5, 3, 3, 6, 1]])
    assert int(out.passes[0]) == 2


def test_mask_predict_remasks_least_confident():
    tokens = jnp.array([[5, 6, 7, 8, 1, 0]])
    conf = jnp.array([[-0.1, -3.0, -0.2, -2.0, -0.05, -9.0]])
    mask = jnp.array([[1, 1, 1, 1, 1, 0]])
    repl = jnp.full((1, 6), 3)
    # N = 5, T = 4, t = 1: floor(5 * 3 / 4) = 3 least confident of the 5 real positions.
    out = refine.mask_predict_remask(tokens, conf, mask, repl, jnp.array([1]), 4)
    np.testing.assert_array_equal(out, [[5, 3, 3, 3, 1, 0]])
    out = refine.mask_predict_remask(tokens, conf, mask, repl, jnp.array([4]), 4)
    np.testing.assert_array_equal(out, tokens)


def test_top_k_lengths_skip_zero_and_cap():
    logits = jnp.array([[9.0, 1.0, 5.0, 3.0, 8.0, 7.0]])   # lengths 0..5
    np.testing.assert_array_equal(refine.top_k_lengths(logits, 3, 4), [[4, 2, 3]])


def test_length_hypotheses_pick_best_mean_logprob():
    # b = 1, k = 2 hypotheses of lengths 3 and 2: the refiner is confident only at length 2.
    def fn(tokens, mask):
        length = mask.sum(axis=1)                                                      # [b*k]
        scale = jnp.where(length == 2, 8.0, 1.0)[:, None, None]
        target = jnp.array([[6, 6, 1, 0], [7, 1, 0, 0]])
        return jax.nn.one_hot(target, V) * scale
    out = refine.refine_length_hypotheses(fn, jnp.array([[3, 2]]), 4, 3, jax.random.key(0), "stutter", "random", V)
    np.testing.assert_array_equal(out.tokens, [[7, 1, 0, 0]])
    assert int(out.passes[0]) == 2


def test_keep_repeats_skips_only_the_last_step():
    # one hypothesis of length 4 whose fixed point repeats a token: dropped by default, kept on request
    fn = fixed_target([[6, 6, 7, 1]])
    args = (fn, jnp.array([[4]]), 4, 3, jax.random.key(0), "none", "random", V)
    np.testing.assert_array_equal(refine.refine_length_hypotheses(*args).tokens, [[6, 7, 1, 0]])
    kept = refine.refine_length_hypotheses(*args, keep_repeats=True)
    np.testing.assert_array_equal(kept.tokens, [[6, 6, 7, 1]])
    assert int(kept.passes[0]) == int(refine.refine_length_hypotheses(*args).passes[0])


def test_drop_repeats_example():
    toks = jnp.array([[5, 5, 6, 6, 1, 0], [7, 8, 7, 7, 7, 1]])
    mask = jnp.array([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
    np.testing.assert_array_equal(refine.drop_repeats(toks, mask), [[5, 6, 1, 0, 0, 0], [7, 8, 7, 1, 0, 0]])


N = 10
_seq = st.lists(st.integers(4, 7), min_size=1, max_size=N)
_drop = jax.jit(refine.drop_repeats)
_stutter = jax.jit(refine.remask_stutter)


def _pad(seq):
    toks = np.zeros((1, N), np.int32)
    toks[0, : len(seq)] = seq
    mask = (np.arange(N) < len(seq)).astype(np.int32)[None]
    return toks, mask


@settings(max_examples=60, deadline=None)
@given(_seq)
def test_drop_repeats_matches_groupby(seq):
    toks, mask = _pad(seq)
    expected = [k for k, _ in itertools.groupby(seq)]
    got = np.asarray(_drop(toks, mask))[0]
    np.testing.assert_array_equal(got, expected + [0] * (N - len(expected)))


@settings(max_examples=60, deadline=None)
@given(_seq)
def test_stutter_remask_replaces_exactly_the_later_copies(seq):
    toks, mask = _pad(seq)
    got = np.asarray(_stutter(toks, mask, np.full_like(toks, 3)))[0]
    for i, tok in enumerate(seq):
        repeat = i > 0 and seq[i - 1] == tok
        assert got[i] == (3 if repeat else tok)
    assert (got[len(seq):] == 0).all()
    # Dropping the masks of a stutter-remasked sequence leaves the de-duplicated sequence.
    assert [t for t in got[: len(seq)] if t != 3] == [k for k, _ in itertools.groupby(seq)]


def test_early_stop_off_runs_all_passes():
    out = refine.iterative_refinement(fixed_target([[5, 1]]), jnp.array([[9, 9]]), jnp.ones((1, 2), jnp.int32), 4,
                                      jax.random.key(0), "none", early_stop=False)
    assert int(out.passes[0]) == 4
    np.testing.assert_array_equal(out.tokens, [[5, 1]])


def with_aux(fn):
    """``fn`` plus an aux pytree: the pass's input tokens and their row sums."""
    return lambda tokens, mask: (fn(tokens, mask), {"inputs": tokens, "sums": tokens.sum(axis=1)})


def test_history_off_is_none_and_ignores_aux():
    start, mask = jnp.array([[4, 5, 6, 7]]), jnp.ones((1, 4), jnp.int32)
    plain = refine.iterative_refinement(shift_by_one, start, mask, 3, jax.random.key(0), "none")
    aux = refine.iterative_refinement(with_aux(shift_by_one), start, mask, 3, jax.random.key(0), "none")
    assert plain.history is None and aux.history is None
    np.testing.assert_array_equal(plain.tokens, aux.tokens)


def test_history_records_every_pass_and_the_running_rows():
    # Row 0 settles after pass 1 (stops after pass 2); row 1 never settles; T = 4, buffer of 5 passes.
    def fn(tokens, mask):
        logits = shift_by_one(tokens, mask)
        return logits.at[0].set(jax.nn.one_hot(jnp.array([5, 6, 1]), V) * 5.0)
    start = jnp.array([[5, 6, 9], [4, 4, 4]])
    mask = jnp.array([[1, 1, 1], [1, 1, 0]])
    out = refine.iterative_refinement(with_aux(fn), start, mask, 4, jax.random.key(0), "none", retain_history=True,
                                      history_iterations=5)
    plain = refine.iterative_refinement(fn, start, mask, 4, jax.random.key(0), "none")
    for field in ("tokens", "score", "passes"):
        np.testing.assert_array_equal(getattr(out, field), getattr(plain, field))
    h = out.history
    assert h.tokens.shape == (5, 2, 3) and h.active.shape == (5, 2)
    np.testing.assert_array_equal(h.active, [[1, 1], [1, 1], [0, 1], [0, 1], [0, 0]])
    np.testing.assert_array_equal(h.active.sum(axis=0), out.passes)
    np.testing.assert_array_equal(h.tokens[:4, 1], [[5, 5, 0], [6, 6, 0], [7, 7, 0], [8, 8, 0]])
    np.testing.assert_array_equal(h.tokens[1, 0], out.tokens[0])
    np.testing.assert_array_equal(h.tokens[4], 0)                              # never run
    np.testing.assert_array_equal(h.mask, mask)
    np.testing.assert_array_equal(h.aux["inputs"][0], start * mask)           # pass 1 saw the start
    np.testing.assert_array_equal(h.aux["inputs"][1, 1], h.tokens[0, 1])      # remask none: the last output
    np.testing.assert_array_equal(h.aux["sums"][:4, 1], h.aux["inputs"][:4, 1].sum(axis=1))


def test_history_with_a_traced_step_count_needs_a_buffer_size():
    start, mask = jnp.array([[4, 5]]), jnp.ones((1, 2), jnp.int32)
    run = lambda t, **kw: refine.iterative_refinement(shift_by_one, start, mask, t, jax.random.key(0), "none",
                                                      early_stop=False, retain_history=True, **kw)
    with pytest.raises(ValueError, match="history_iterations"):
        jax.jit(run)(jnp.int32(2))
    with pytest.raises(ValueError, match="history_iterations"):
        run(3, history_iterations=2)
    h = jax.jit(lambda t: run(t, history_iterations=4))(jnp.int32(2)).history
    np.testing.assert_array_equal(h.active[:, 0], [1, 1, 0, 0])


def test_history_of_length_hypotheses_is_the_best_ones():
    # b = 2, k = 2: the refiner is confident only at length 2, the best hypothesis of both rows.
    def fn(tokens, mask):
        length = mask.sum(axis=1)                                                      # [b*k]
        scale = jnp.where(length == 2, 8.0, 1.0)[:, None, None]
        target = jnp.tile(jnp.array([[6, 6, 1, 0], [7, 1, 0, 0]]), (2, 1))
        return jax.nn.one_hot(target, V) * scale, {"length": length}
    lengths = jnp.array([[3, 2], [2, 3]])
    out = refine.refine_length_hypotheses(fn, lengths, 4, 3, jax.random.key(0), "stutter", "random", V,
                                          retain_history=True)
    h = out.history
    assert h.tokens.shape == (3, 2, 4) and h.active.shape == (3, 2)
    np.testing.assert_array_equal(h.mask, [[1, 1, 0, 0]] * 2)
    np.testing.assert_array_equal(h.aux["length"][:2], [[2, 2], [2, 2]])
    last = np.asarray(h.active.sum(axis=0)) - 1                                      # each row's final pass
    final = np.asarray(h.tokens)[last, np.arange(2)]
    np.testing.assert_array_equal(refine.drop_repeats(jnp.asarray(final), h.mask), out.tokens)
