"""Iterative refinement (PaDIR inference, Appendix L.1.1), model-agnostic.

``refine_fn(tokens [b, n], mask [b, n]) -> logits [b, n, V]`` is one parallel decoder pass. Each of at
most T steps runs one pass and takes the argmax at every position; a row stops early (keeps its
tokens, stops counting passes) once a pass changes none of its tokens. Between steps the output may
be re-masked: ``none``; ``stutter`` (the later copies of a consecutive repeat are replaced, the paper's
choice); ``mask-predict`` (the N*(T-t)/T least confident tokens are replaced, t = passes done, N = the
row's length; confidences come from the latest pass). Replacements are ``<mask>`` or fresh random
tokens, matching the initial hypothesis. After the last step ``drop_repeats`` removes consecutive
repeats. k length hypotheses are flattened into the batch and the best is chosen by mean log-prob.

Random tokens are drawn uniformly from the non-special ids [4, vocab_size).
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from narbench_core.defaults import INIT_MODES, REMASK_MODES
from narbench_core.tokens import FIRST_REGULAR_ID, MASK_ID, PAD_ID

Array = jax.Array
RefineFn = Callable[[Array, Array], Array]


class RefineOutput(NamedTuple):
    tokens: Array      # [b, n] final argmax tokens (0 outside the mask)
    score: Array       # [b] mean log-prob of the tokens over the row's positions
    passes: Array      # [b] decoder passes the row actually used


def replacement_tokens(rng: Array, shape: tuple[int, ...], init: str, vocab_size: int) -> Array:
    """Tokens for (re)initialised positions: all ``<mask>`` or uniform random regular tokens."""
    if init == "mask":
        return jnp.full(shape, MASK_ID, jnp.int32)
    return jax.random.randint(rng, shape, FIRST_REGULAR_ID, vocab_size, dtype=jnp.int32)


def remask_stutter(tokens: Array, mask: Array, replacement: Array) -> Array:
    """Replace every token equal to its left neighbour (inside the mask) by ``replacement``:
    [a, a, a, b] -> [a, R, R, b]."""
    assert tokens.ndim == 2 and tokens.shape == mask.shape == replacement.shape
    repeat = jnp.pad(tokens[:, 1:] == tokens[:, :-1], ((0, 0), (1, 0)))             # [b, n]
    return jnp.where(repeat & (mask > 0), replacement, tokens)


def mask_predict_remask(tokens: Array, confidence: Array, mask: Array, replacement: Array, passes_done: Array,
                        num_steps: int) -> Array:
    """Replace the floor(N * (T - t) / T) least confident tokens of each row (N = row length)."""
    assert tokens.ndim == 2 and confidence.shape == tokens.shape == mask.shape
    valid = mask > 0
    length = valid.sum(axis=1)                                                       # [b]
    count = (length * (num_steps - passes_done)) // num_steps                        # [b]
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


def iterative_refinement(refine_fn: RefineFn, tokens: Array, mask: Array, num_steps: int | Array, rng: Array,
                         remask: str = "stutter", init: str = "random", vocab_size: int = 0,
                         early_stop: bool = True, active: Optional[Array] = None) -> RefineOutput:
    """At most ``num_steps`` refinement passes from ``tokens`` (the initial hypothesis); with
    ``early_stop=False`` exactly ``num_steps`` (benchmarks measure the cost of T passes so).
    ``num_steps`` may be a traced int32 scalar, so one compiled loop serves every step count."""
    assert tokens.ndim == 2 and tokens.shape == mask.shape, (tokens.shape, mask.shape)
    if remask not in REMASK_MODES or init not in INIT_MODES:
        raise ValueError(f"remask must be one of {REMASK_MODES} and init one of {INIT_MODES}")
    if isinstance(num_steps, int) and num_steps < 1:   # may also be a traced int32 scalar
        raise ValueError("num_steps must be >= 1")
    b, n = tokens.shape
    valid = mask > 0
    tokens = jnp.where(valid, tokens, PAD_ID)

    def cond(state):
        t, _, _, _, finished, _, _ = state
        return (t < num_steps) & ~jnp.all(finished)

    def body(state):
        t, inp, out, conf, finished, passes, key = state
        key, sub = jax.random.split(key)
        logits = refine_fn(inp, mask)
        assert logits.ndim == 3 and logits.shape[:2] == (b, n), f"refine_fn returned {logits.shape}"
        logp = jax.nn.log_softmax(logits.astype(jnp.float32))                         # [b, n, V]
        new = jnp.where(valid, jnp.argmax(logp, axis=-1).astype(jnp.int32), PAD_ID)  # [b, n]
        new_conf = jnp.max(logp, axis=-1)                                            # [b, n]
        active = ~finished
        changed = jnp.any(new != out, axis=1)                                        # [b]
        out = jnp.where(active[:, None], new, out)
        conf = jnp.where(active[:, None], new_conf, conf)
        passes = passes + active.astype(jnp.int32)
        if early_stop:
            finished = finished | ~changed
        if remask == "none":
            inp = out
        else:
            repl = replacement_tokens(sub, (b, n), init, vocab_size)
            if remask == "stutter":
                inp = remask_stutter(out, mask, repl)
            else:
                inp = mask_predict_remask(out, conf, mask, repl, passes, num_steps)
        return t + 1, inp, out, conf, finished, passes, key

    finished = jnp.zeros(b, bool) if active is None else ~jnp.asarray(active, bool)    # batch padding: done
    state = (jnp.int32(0), tokens, tokens, jnp.zeros((b, n), jnp.float32), finished,
             jnp.zeros(b, jnp.int32), rng)
    _, _, out, conf, _, passes, _ = jax.lax.while_loop(cond, body, state)
    score = jnp.sum(jnp.where(valid, conf, 0.0), axis=1) / jnp.maximum(valid.sum(axis=1), 1)
    return RefineOutput(out, score, passes)


def top_k_lengths(length_logits: Array, k: int, max_length: int) -> Array:
    """The k most likely lengths in [1, max_length]: [b, L + 1] logits -> [b, k] int32, best first."""
    assert length_logits.ndim == 2, length_logits.shape
    ids = jnp.arange(length_logits.shape[1])
    allowed = (ids >= 1) & (ids <= max_length)
    _, lengths = jax.lax.top_k(jnp.where(allowed, length_logits.astype(jnp.float32), -jnp.inf), k)
    return jnp.clip(lengths, 1, max_length).astype(jnp.int32)


def refine_length_hypotheses(refine_fn: RefineFn, lengths: Array, capacity: int, num_steps: int | Array, rng: Array,
                             remask: str = "stutter", init: str = "random", vocab_size: int = 0,
                             early_stop: bool = True, active: Optional[Array] = None) -> RefineOutput:
    """Refine k hypotheses per row in parallel (``refine_fn`` sees ``b * k`` rows, row ``i * k + j`` has
    length ``lengths[i, j]``; rows with ``active`` [b] False are batch padding and skipped) and keep
    each row's best by mean log-prob, with repeats dropped.
    ``passes`` per row is the maximum over its k hypotheses (they share every pass)."""
    assert lengths.ndim == 2, lengths.shape
    b, k = lengths.shape
    init_key, loop_key = jax.random.split(rng)
    mask = (jnp.arange(capacity)[None, :] < lengths.reshape(b * k, 1)).astype(jnp.int32)  # [b*k, n]
    start = jnp.where(mask > 0, replacement_tokens(init_key, (b * k, capacity), init, vocab_size), PAD_ID)
    flat_active = None if active is None else jnp.repeat(jnp.asarray(active, bool), k)   # [b*k]
    res = iterative_refinement(refine_fn, start, mask, num_steps, loop_key, remask, init, vocab_size, early_stop,
                               flat_active)
    score = res.score.reshape(b, k)
    best = jnp.argmax(score, axis=1)                                                 # [b]
    tokens = jnp.take_along_axis(res.tokens.reshape(b, k, capacity), best[:, None, None], axis=1)[:, 0]
    best_mask = jnp.take_along_axis(mask.reshape(b, k, capacity), best[:, None, None], axis=1)[:, 0]
    return RefineOutput(drop_repeats(tokens, best_mask), jnp.max(score, axis=1),
                        jnp.max(res.passes.reshape(b, k), axis=1))
