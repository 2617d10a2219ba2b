"""Autoregressive search: greedy (cached and uncached) and beam search, model-agnostic.

Each algorithm is a pure function over a callback and runs its whole loop inside
``lax.while_loop`` over a named state (``GreedyState``, ``BeamState``, after flax's WMT example); a
loop stops as soon as every row is done. Decoding starts from token 0 (pad), as in T5. Every function
returns a ``SearchResult(tokens, scores, passes)`` where ``passes[i]`` is the number of decoder passes
row ``i`` needed (until it emitted EOS or, for beam search, until no alive beam could beat its
finished ones); positions after EOS hold 0. ``eos_id=NO_EOS`` never ends a row: every row decodes
``max_len`` tokens.

Cache convention for ``beam_search``: cache leaves with a leading ``batch * beam`` axis and rank >= 2
are reordered with their beams; scalars and vectors (step counters, lengths) are shared by all rows.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from narbench_core import defaults
from narbench_core.tokens import EOS_ID, PAD_ID

Array = jax.Array
NEG_INF = -1.0e7
NO_EOS = -1                   # an eos_id no token has: rows never end early
TokensToLogits = Callable[[Array, Any], tuple[Array, Any]]  # (tokens [b, 1], cache) -> (logits [b, V], cache)


class SearchResult(NamedTuple):
    tokens: Array             # greedy [b, max_len]; beam [b, beam, max_len] best first (0 after EOS)
    scores: Array             # greedy [b] sum log-prob; beam [b, beam] log-prob / length penalty
    passes: Array              # [b] int32 decoder passes the row needed


class GreedyState(NamedTuple):
    i: Array                  # [] int32 position of the current input token in ``seqs``
    seqs: Array               # [b, 1 + max_len] int32 the start token then the decoded tokens
    finished: Array           # [b] bool rows that emitted EOS (or are batch padding)
    scores: Array             # [b] float32 sum log-prob of the decoded tokens
    passes: Array              # [b] int32 decoder passes run while the row was unfinished
    cache: Any                # the callback's cache (None without a cache)


class BeamState(NamedTuple):
    i: Array                  # [] int32 position of the current input token in the sequences
    alive_seqs: Array         # [b, beam, 1 + max_len] int32 beams that have not ended
    alive_logp: Array         # [b, beam] float32 their log-probs (NEG_INF: empty beam)
    fin_seqs: Array           # [b, beam, 1 + max_len] int32 the best ended beams so far
    fin_scores: Array         # [b, beam] float32 their log-prob / length penalty (NEG_INF: none)
    cache: Any                # the callback's cache, leaves [b * beam, ...] follow their beams
    done: Array               # [b] bool rows whose finished beams no alive beam can beat (or padding)
    passes: Array              # [b] int32 decoder passes run while the row was not done


def _start_finished(active: Optional[Array], batch_size: int) -> Array:
    """Rows with ``active`` False (batch padding) start finished: they never extend the loop."""
    return jnp.zeros(batch_size, bool) if active is None else ~jnp.asarray(active, bool)


def _greedy_start(batch_size: int, max_len: int, active: Optional[Array], cache: Any) -> GreedyState:
    return GreedyState(i=jnp.int32(0), seqs=jnp.zeros((batch_size, max_len + 1), jnp.int32),
                       finished=_start_finished(active, batch_size), scores=jnp.zeros(batch_size, jnp.float32),
                       passes=jnp.zeros(batch_size, jnp.int32), cache=cache)


def _greedy_step(state: GreedyState, logits: Array, cache: Any, eos_id: int) -> GreedyState:
    """Append each unfinished row's argmax token; finished rows append 0 and stop counting."""
    assert logits.ndim == 2, f"the callback must return [batch, vocab], got {logits.shape}"
    finished = state.finished
    logp = jax.nn.log_softmax(logits.astype(jnp.float32))                            # [b, V]
    token = jnp.argmax(logp, axis=-1).astype(jnp.int32)                              # [b]
    scores = state.scores + jnp.where(finished, 0.0, jnp.take_along_axis(logp, token[:, None], 1)[:, 0])
    passes = state.passes + (~finished).astype(jnp.int32)
    token = jnp.where(finished, PAD_ID, token)
    seqs = jax.lax.dynamic_update_slice_in_dim(state.seqs, token[:, None], state.i + 1, axis=1)
    return GreedyState(state.i + 1, seqs, finished | (token == eos_id), scores, passes, cache)


def _greedy_loop(body: Callable[[GreedyState], GreedyState], state: GreedyState, max_len: int) -> SearchResult:
    cond = lambda s: (s.i < max_len) & ~jnp.all(s.finished)
    final = jax.lax.while_loop(cond, body, state)
    return SearchResult(final.seqs[:, 1:], final.scores, final.passes)


def greedy_search(tokens_to_logits: TokensToLogits, cache: Any, batch_size: int, max_len: int,
                  eos_id: int = EOS_ID, active: Optional[Array] = None) -> SearchResult:
    """Argmax decoding with a cache: tokens [b, max_len], scores [b] (sum log-prob), passes [b].
    ``active`` [b] (optional): rows to decode; the others (batch padding) are skipped."""

    def body(state: GreedyState) -> GreedyState:
        current = jax.lax.dynamic_slice_in_dim(state.seqs, state.i, 1, axis=1)     # [b, 1]
        logits, cache = tokens_to_logits(current, state.cache)                        # [b, V]
        return _greedy_step(state, logits, cache, eos_id)

    return _greedy_loop(body, _greedy_start(batch_size, max_len, active, cache), max_len)


def greedy_search_uncached(sequence_to_logits: Callable[[Array, Array], Array], batch_size: int, max_len: int,
                           eos_id: int = EOS_ID, active: Optional[Array] = None) -> SearchResult:
    """Greedy decoding without a cache: each step re-runs the decoder over the whole fixed-size prefix
    buffer. ``sequence_to_logits(seqs [b, max_len], i) -> logits [b, V]`` returns the logits at
    position ``i`` (the next-token prediction after ``seqs[:, :i + 1]``)."""

    def body(state: GreedyState) -> GreedyState:
        logits = sequence_to_logits(state.seqs[:, :max_len], state.i)                # [b, V]
        return _greedy_step(state, logits, None, eos_id)

    return _greedy_loop(body, _greedy_start(batch_size, max_len, active, None), max_len)


def length_penalty(length: Array, alpha: float) -> Array:
    """GNMT / t5x brevity penalty ((5 + length) / 6) ** alpha; scores are log-prob / penalty."""
    return ((5.0 + length.astype(jnp.float32)) / 6.0) ** alpha


def _gather_beams(x: Array, beam_idx: Array) -> Array:
    """x [b, k_old, ...] -> [b, k_new, ...] picking beams ``beam_idx`` [b, k_new]."""
    return jnp.take_along_axis(x, beam_idx.reshape(beam_idx.shape + (1,) * (x.ndim - 2)), axis=1)


def _gather_cache(cache: Any, beam_idx: Array, batch_size: int, beam_size: int) -> Any:
    def gather(leaf):
        if leaf.ndim < 2 or leaf.shape[0] != batch_size * beam_size:
            return leaf
        unflat = leaf.reshape((batch_size, beam_size) + leaf.shape[1:])
        return _gather_beams(unflat, beam_idx).reshape(leaf.shape)
    return jax.tree_util.tree_map(gather, cache)


def beam_search(tokens_to_logits: TokensToLogits, cache: Any, batch_size: int, beam_size: int, max_len: int,
                alpha: float = defaults.LENGTH_PENALTY, eos_id: int = EOS_ID,
                active: Optional[Array] = None) -> SearchResult:
    """Beam search with the GNMT length penalty (t5x style). The callback sees ``batch * beam`` rows
    (row ``i * beam + j`` is beam ``j`` of sentence ``i``); ``cache`` must already be laid out so.

    Returns tokens [b, beam, max_len] best first, scores [b, beam] (log-prob / length penalty),
    passes [b]. A row stops once its worst finished beam beats the best score any alive beam could
    still reach; rows with no finished beam at ``max_len`` fall back to their alive beams."""
    b, k = batch_size, beam_size
    max_penalty = length_penalty(jnp.int32(max_len), alpha)

    def row_done(alive_logp, finished_scores):
        # Log-probs only fall as beams grow; with alpha >= 0 the largest reachable score divides by
        # the largest penalty.
        best_alive = alive_logp[:, 0] / jnp.where(alpha >= 0, max_penalty, 1.0)      # [b]
        return jnp.min(finished_scores, axis=1) >= best_alive

    def cond(state: BeamState):
        return (state.i < max_len) & ~jnp.all(state.done)

    def body(state: BeamState) -> BeamState:
        i, alive_seqs, alive_logp, done = state.i, state.alive_seqs, state.alive_logp, state.done
        current = jax.lax.dynamic_slice_in_dim(alive_seqs, i, 1, axis=2).reshape(b * k, 1)  # [b*k, 1]
        logits, cache = tokens_to_logits(current, state.cache)
        assert logits.ndim == 2, f"tokens_to_logits must return [batch*beam, vocab], got {logits.shape}"
        vocab = logits.shape[-1]
        logp = jax.nn.log_softmax(logits.astype(jnp.float32)).reshape(b, k, vocab)  # [b, k, V]
        cand = (alive_logp[:, :, None] + logp).reshape(b, k * vocab)                 # [b, k*V]
        top_logp, top_idx = jax.lax.top_k(cand, 2 * k)                              # [b, 2k]
        top_beam, top_token = top_idx // vocab, (top_idx % vocab).astype(jnp.int32)
        top_seqs = _gather_beams(alive_seqs, top_beam)                               # [b, 2k, L+1]
        top_seqs = jax.lax.dynamic_update_slice_in_dim(top_seqs, top_token[:, :, None], i + 1, axis=2)
        is_eos = top_token == eos_id                                                  # [b, 2k]

        # Alive: best k candidates that did not end.
        alive_cand = top_logp + jnp.where(is_eos, NEG_INF, 0.0)
        new_alive_logp, keep = jax.lax.top_k(alive_cand, k)                          # [b, k]
        new_alive_seqs = _gather_beams(top_seqs, keep)
        cache = _gather_cache(cache, _gather_beams(top_beam, keep), b, k)

        # Finished: merge the ended candidates with the finished beams so far; keep the best k.
        valid_eos = is_eos & (top_logp > NEG_INF / 2)                                # not from a dead beam
        fin_cand = jnp.where(valid_eos, top_logp / length_penalty(i + 1, alpha), NEG_INF)
        all_scores = jnp.concatenate([state.fin_scores, fin_cand], axis=1)           # [b, 3k]
        all_seqs = jnp.concatenate([state.fin_seqs, top_seqs], axis=1)               # [b, 3k, L+1]
        new_fin_scores, pick = jax.lax.top_k(all_scores, k)
        new_fin_seqs = _gather_beams(all_seqs, pick)

        # Rows already done keep their state (and stop counting passes).
        keep_old = done[:, None]
        alive_logp = jnp.where(keep_old, alive_logp, new_alive_logp)
        alive_seqs = jnp.where(keep_old[:, :, None], alive_seqs, new_alive_seqs)
        fin_scores = jnp.where(keep_old, state.fin_scores, new_fin_scores)
        fin_seqs = jnp.where(keep_old[:, :, None], state.fin_seqs, new_fin_seqs)
        passes = state.passes + (~done).astype(jnp.int32)
        done = done | row_done(alive_logp, fin_scores)
        return BeamState(i + 1, alive_seqs, alive_logp, fin_seqs, fin_scores, cache, done, passes)

    seqs = jnp.zeros((b, k, max_len + 1), jnp.int32)                                 # [b, k, 1 + L]
    start = BeamState(i=jnp.int32(0), alive_seqs=seqs,
                      alive_logp=jnp.tile(jnp.array([0.0] + [NEG_INF] * (k - 1), jnp.float32), (b, 1)),
                      fin_seqs=seqs, fin_scores=jnp.full((b, k), NEG_INF, jnp.float32), cache=cache,
                      done=_start_finished(active, b), passes=jnp.zeros(b, jnp.int32))
    final = jax.lax.while_loop(cond, body, start)

    # Rows without any finished beam return their alive beams, scored at their full length.
    none_finished = ~jnp.any(final.fin_scores > NEG_INF / 2, axis=1)                 # [b]
    tokens = jnp.where(none_finished[:, None, None], final.alive_seqs, final.fin_seqs)[:, :, 1:]
    scores = jnp.where(none_finished[:, None], final.alive_logp / max_penalty, final.fin_scores)
    return SearchResult(tokens, scores, final.passes)
