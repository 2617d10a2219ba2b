"""Iterative refinement (PaDIR inference, Appendix L.1.1), model-agnostic.

``refine_fn(tokens [b, n], mask [b, n]) -> logits [b, n, V]`` is one parallel decoder pass. Each of at
most T iterations runs one pass and takes the argmax at every position; a row stops early (keeps its
tokens, stops counting passes) once a pass changes none of its tokens. Between iterations the output may
be re-masked: ``none``; ``stutter`` (the later copies of a consecutive repeat are replaced, the paper's
choice); ``mask-predict`` (the N*(T-t)/T least confident tokens are replaced, t = passes done, N = the
row's length; confidences come from the latest pass). Replacements are ``<mask>`` or fresh random
tokens, matching the initial hypothesis. After the last iteration ``drop_repeats`` removes consecutive
repeats. k length hypotheses are flattened into the batch and the best is chosen by mean log-prob.
The loop state is a ``RefineState`` (named fields, after flax's WMT ``BeamState``).

With ``retain_history`` (as fairseq's iterative refinement generator) the result also holds a
``RefineHistory``: every pass's argmax tokens (before ``drop_repeats``) and which rows ran it, plus
whatever the callback returns beside its logits: ``refine_fn`` may return ``(logits, aux)`` with
``aux`` a pytree of ``[b, ...]`` arrays (e.g. attention weights), kept per pass. Without it nothing is
recorded and the loop is the same as before.

Random tokens are drawn uniformly from the non-special ids [4, vocab_size).
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from narbench_core import defaults
from narbench_core.tokens import EOS_ID, FIRST_REGULAR_ID, MASK_ID, PAD_ID, UNK_ID

Array = jax.Array
RefineFn = Callable[[Array, Array], Any]   # (tokens [b, n], mask [b, n]) -> logits [b, n, V] or (logits, aux)


class RefineHistory(NamedTuple):
    """Per-pass record of a refinement (T = the history's passes; passes never run stay zero)."""
    tokens: Array      # [T, b, n] int32 argmax tokens of each pass, before drop_repeats (0 outside the mask)
    active: Array      # [T, b] bool rows that ran the pass (not yet stopped, not batch padding)
    mask: Array        # [b, n] the refined positions of each row
    aux: Any           # pytree of [T, b, ...]: the callback's aux of each pass (None if it returns none)


class RefineOutput(NamedTuple):
    tokens: Array      # [b, n] final argmax tokens (0 outside the mask)
    score: Array       # [b] mean log-prob of the tokens over the row's positions
    passes: Array      # [b] decoder passes the row actually used
    history: Optional[RefineHistory] = None   # with retain_history only


class RefineState(NamedTuple):
    t: Array           # [] int32 passes run so far
    inputs: Array      # [b, n] int32 the next pass's input: the output, re-masked
    out: Array         # [b, n] int32 each row's latest argmax tokens (frozen once the row stops)
    conf: Array        # [b, n] float32 their log-probs
    finished: Array    # [b] bool rows that stopped (a pass changed nothing) or are batch padding
    passes: Array      # [b] int32 passes each row ran
    key: Array         # PRNG key for the replacement tokens
    history: Optional[RefineHistory]   # the buffers of retain_history, else None


def replacement_tokens(rng: Array, shape: tuple[int, ...], start: str, vocab_size: int) -> Array:
    """Tokens for (re)initialised positions: all ``<mask>`` or uniform random regular tokens."""
    if start == "mask":
        return jnp.full(shape, MASK_ID, jnp.int32)
    return jax.random.randint(rng, shape, FIRST_REGULAR_ID, vocab_size, dtype=jnp.int32)


def remask_stutter(tokens: Array, mask: Array, replacement: Array) -> Array:
    """Replace every token equal to its left neighbour (inside the mask) by ``replacement``:
    [a, a, a, b] -> [a, R, R, b]."""
    assert tokens.ndim == 2 and tokens.shape == mask.shape == replacement.shape
    repeat = jnp.pad(tokens[:, 1:] == tokens[:, :-1], ((0, 0), (1, 0)))             # [b, n]
    return jnp.where(repeat & (mask > 0), replacement, tokens)


def mask_predict_remask(tokens: Array, confidence: Array, mask: Array, replacement: Array, passes_done: Array,
                        num_iterations: int) -> Array:
    """Replace the floor(N * (T - t) / T) least confident tokens of each row (N = row length)."""
    assert tokens.ndim == 2 and confidence.shape == tokens.shape == mask.shape
    valid = mask > 0
    length = valid.sum(axis=1)                                                       # [b]
    count = (length * (num_iterations - passes_done)) // num_iterations                        # [b]
    conf = jnp.where(valid, confidence, jnp.inf)
    rank = jnp.argsort(jnp.argsort(conf, axis=1), axis=1)                            # [b, n] 0 = least confident
    return jnp.where(valid & (rank < count[:, None]), replacement, tokens)


def drop_repeats(tokens: Array, mask: Array) -> Array:
    """Drop consecutive repeats inside the mask and left-align: [a, a, b, b, 1, 0] -> [a, b, 1, 0, 0, 0]."""
    assert tokens.ndim == 2 and tokens.shape == mask.shape
    b, n = tokens.shape
    valid = mask > 0
    new = jnp.pad(tokens[:, 1:] != tokens[:, :-1], ((0, 0), (1, 0)), constant_values=True)
    keep = valid & new                                                               # [b, n]
    dest = jnp.where(keep, jnp.cumsum(keep, axis=1) - 1, n)                          # n = out of range: dropped
    rows = jnp.broadcast_to(jnp.arange(b)[:, None], (b, n))
    return jnp.zeros_like(tokens).at[rows, dest].set(tokens, mode="drop")


def _split_aux(out: Any) -> tuple[Array, Any]:
    """A refine callback's ``logits`` or ``(logits, aux)`` as ``(logits, aux or None)``."""
    return out if isinstance(out, tuple) else (out, None)


def _empty_history(refine_fn: RefineFn, tokens: Array, mask: Array, passes: int) -> RefineHistory:
    """Zeroed buffers for ``passes`` passes (the aux buffers take the callback's aux shapes)."""
    _, aux = _split_aux(jax.eval_shape(refine_fn, tokens, mask))
    return RefineHistory(tokens=jnp.zeros((passes,) + tokens.shape, jnp.int32),
                         active=jnp.zeros((passes, tokens.shape[0]), bool), mask=mask,
                         aux=jax.tree_util.tree_map(lambda s: jnp.zeros((passes,) + s.shape, s.dtype), aux))


def _record(history: RefineHistory, t: Array, tokens: Array, active: Array, aux: Any) -> RefineHistory:
    """Write pass ``t``'s argmax tokens, running rows and aux into the history buffers."""
    put = lambda buf, x: jax.lax.dynamic_update_index_in_dim(buf, x.astype(buf.dtype), t, axis=0)
    return history._replace(tokens=put(history.tokens, tokens), active=put(history.active, active),
                            aux=jax.tree_util.tree_map(put, history.aux, aux))


def last_position(mask: Array) -> Array:
    """[b, n] bool: each row's last position inside the mask (where a fixed EOS sits)."""
    return jnp.arange(mask.shape[1])[None, :] == (mask > 0).sum(axis=1, keepdims=True) - 1


def iterative_refinement(refine_fn: RefineFn, tokens: Array, mask: Array, num_iterations: int | Array, rng: Array,
                         remask: str = defaults.REMASK, start: str = defaults.START, vocab_size: int = 0,
                         early_stop: bool = True, active: Optional[Array] = None, retain_history: bool = False,
                         history_iterations: Optional[int] = None, fixed_eos: bool = False) -> RefineOutput:
    """At most ``num_iterations`` refinement passes from ``tokens`` (the initial hypothesis); with
    ``early_stop=False`` exactly ``num_iterations`` (benchmarks measure the cost of T passes so).
    ``num_iterations`` may be a traced int32 scalar, so one compiled loop serves every T.
    The argmax never emits pad, unk or ``<mask>``; with ``fixed_eos`` (a model trained so) EOS sits
    at each row's last position and is emitted nowhere else.

    ``retain_history`` also returns every pass's tokens, running rows and callback aux
    (``RefineHistory``) in buffers of ``history_iterations`` passes (default ``num_iterations``; required, and at
    least T, when ``num_iterations`` is traced)."""
    assert tokens.ndim == 2 and tokens.shape == mask.shape, (tokens.shape, mask.shape)
    if remask not in defaults.REMASK_MODES or start not in defaults.START_MODES:
        raise ValueError(f"remask must be one of {defaults.REMASK_MODES} and start one of {defaults.START_MODES}")
    if isinstance(num_iterations, int) and num_iterations < 1:   # may also be a traced int32 scalar
        raise ValueError("num_iterations must be >= 1")
    b, n = tokens.shape
    valid = mask > 0
    banned = jnp.asarray([i in (PAD_ID, UNK_ID, MASK_ID) or (fixed_eos and i == EOS_ID)
                          for i in range(FIRST_REGULAR_ID)])                          # [4] ids never argmaxed
    eos_here = last_position(mask) & valid if fixed_eos else jnp.zeros((b, n), bool)  # [b, n]
    tokens = jnp.where(valid, jnp.where(eos_here, EOS_ID, tokens), PAD_ID)
    history = None
    if retain_history:
        passes = num_iterations if history_iterations is None else history_iterations
        if not isinstance(passes, int) or (isinstance(num_iterations, int) and passes < num_iterations):
            raise ValueError("retain_history needs history_iterations, an int >= num_iterations (required when "
                             "num_iterations is traced)")
        history = _empty_history(refine_fn, tokens, mask, passes)

    def cond(state: RefineState):
        return (state.t < num_iterations) & ~jnp.all(state.finished)

    def body(state: RefineState) -> RefineState:
        key, sub = jax.random.split(state.key)
        logits, aux = _split_aux(refine_fn(state.inputs, mask))
        assert logits.ndim == 3 and logits.shape[:2] == (b, n), f"refine_fn returned {logits.shape}"
        logp = jax.nn.log_softmax(logits.astype(jnp.float32))                         # [b, n, V]
        allowed = logp.at[..., :FIRST_REGULAR_ID].set(jnp.where(banned, -jnp.inf, logp[..., :FIRST_REGULAR_ID]))
        new = jnp.where(eos_here, EOS_ID, jnp.argmax(allowed, axis=-1).astype(jnp.int32))
        new = jnp.where(valid, new, PAD_ID)                                           # [b, n]
        new_conf = jnp.take_along_axis(logp, new[..., None], axis=-1)[..., 0]        # [b, n]
        running = ~state.finished
        changed = jnp.any(new != state.out, axis=1)                                  # [b]
        out = jnp.where(running[:, None], new, state.out)
        conf = jnp.where(running[:, None], new_conf, state.conf)
        passes = state.passes + running.astype(jnp.int32)
        finished = (state.finished | ~changed) if early_stop else state.finished
        if remask == "none":
            inp = out
        else:
            repl = replacement_tokens(sub, (b, n), start, vocab_size)
            if remask == "stutter":
                inp = remask_stutter(out, mask, repl)
            else:
                inp = mask_predict_remask(out, conf, mask, repl, passes, num_iterations)
            inp = jnp.where(eos_here, EOS_ID, inp)
        history = None if state.history is None else _record(state.history, state.t, new, running, aux)
        return RefineState(state.t + 1, inp, out, conf, finished, passes, key, history)

    first = RefineState(t=jnp.int32(0), inputs=tokens, out=tokens, conf=jnp.zeros((b, n), jnp.float32),
                        finished=jnp.zeros(b, bool) if active is None else ~jnp.asarray(active, bool),
                        passes=jnp.zeros(b, jnp.int32), key=rng, history=history)
    final = jax.lax.while_loop(cond, body, first)
    score = jnp.sum(jnp.where(valid, final.conf, 0.0), axis=1) / jnp.maximum(valid.sum(axis=1), 1)
    return RefineOutput(final.out, score, final.passes, final.history)


def top_k_lengths(length_logits: Array, k: int, max_length: int) -> Array:
    """The k most likely lengths in [1, max_length]: [b, L + 1] logits -> [b, k] int32, best first."""
    assert length_logits.ndim == 2, length_logits.shape
    ids = jnp.arange(length_logits.shape[1])
    allowed = (ids >= 1) & (ids <= max_length)
    _, lengths = jax.lax.top_k(jnp.where(allowed, length_logits.astype(jnp.float32), -jnp.inf), k)
    return jnp.clip(lengths, 1, max_length).astype(jnp.int32)


def _pick_hypothesis(x: Array, best: Array) -> Array:
    """x [b*k, ...] -> [b, ...]: hypothesis ``best[i]`` [b] of each row ``i``."""
    b = best.shape[0]
    x = x.reshape((b, x.shape[0] // b) + x.shape[1:])                                # [b, k, ...]
    return jnp.take_along_axis(x, best.reshape((b, 1) + (1,) * (x.ndim - 2)), axis=1)[:, 0]


def refine_length_hypotheses(refine_fn: RefineFn, lengths: Array, capacity: int, num_iterations: int | Array, rng: Array,
                             remask: str = defaults.REMASK, start: str = defaults.START, vocab_size: int = 0,
                             early_stop: bool = True, active: Optional[Array] = None, retain_history: bool = False,
                             history_iterations: Optional[int] = None, fixed_eos: bool = False,
                             keep_repeats: bool = False) -> RefineOutput:
    """Refine k hypotheses per row in parallel (``refine_fn`` sees ``b * k`` rows, row ``i * k + j`` has
    length ``lengths[i, j]``; rows with ``active`` [b] False are batch padding and skipped) and keep
    each row's best by mean log-prob, with repeats dropped (the paper's last step; ``keep_repeats``: not, a
    diagnostic of what that step costs or buys).
    ``passes`` per row is the maximum over its k hypotheses (they share every pass); the history (see
    ``iterative_refinement``) is the best hypothesis's, so its own passes are ``history.active.sum(0)``."""
    assert lengths.ndim == 2, lengths.shape
    b, k = lengths.shape
    init_key, loop_key = jax.random.split(rng)
    mask = (jnp.arange(capacity)[None, :] < lengths.reshape(b * k, 1)).astype(jnp.int32)  # [b*k, n]
    first = jnp.where(mask > 0, replacement_tokens(init_key, (b * k, capacity), start, vocab_size), PAD_ID)
    flat_active = None if active is None else jnp.repeat(jnp.asarray(active, bool), k)   # [b*k]
    res = iterative_refinement(refine_fn, first, mask, num_iterations, loop_key, remask, start, vocab_size, early_stop,
                               flat_active, retain_history, history_iterations, fixed_eos)
    score = res.score.reshape(b, k)
    best = jnp.argmax(score, axis=1)                                                 # [b]
    best_mask = _pick_hypothesis(mask, best)                                         # [b, n]
    history = None
    if res.history is not None:
        per_pass = jax.vmap(lambda x: _pick_hypothesis(x, best))                     # [T, b*k, ...] -> [T, b, ...]
        history = RefineHistory(per_pass(res.history.tokens), per_pass(res.history.active), best_mask,
                                jax.tree_util.tree_map(per_pass, res.history.aux))
    picked = _pick_hypothesis(res.tokens, best)                                      # [b, n]
    return RefineOutput(picked if keep_repeats else drop_repeats(picked, best_mask), jnp.max(score, axis=1),
                        jnp.max(res.passes.reshape(b, k), axis=1), history)
