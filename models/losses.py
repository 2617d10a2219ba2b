"""Training losses and PaDIR's input noise (pure jnp functions, used inside the jitted train step).

Token ids: 0 = pad, 1 = EOS, 2 = unk, 3 = <mask>. Random replacement tokens are drawn from
``[FIRST_REGULAR_ID, vocab_size)`` = ids >= 4, so noise never produces pad (which would change the
decoder's padding mask), EOS, unk or <mask>.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from narbench_core.tokens import EOS_ID, FIRST_REGULAR_ID, PAD_ID


def token_cross_entropy(logits: jax.Array, targets: jax.Array, weights: jax.Array,
                        label_smoothing: float = 0.0) -> dict[str, jax.Array]:
    """Sums over weighted positions of the (smoothed) cross-entropy, the plain NLL and the hits.

    logits [B, L, V] (any float dtype; computed in float32), targets [B, L] int, weights [B, L].
    Smoothing spreads ``label_smoothing`` uniformly over all V classes (target included):
    loss = (1 - ls) * nll + ls * (logsumexp - mean logit). The target's logit is picked by a comparison with
    the class index, fused into the passes over [B, L, V] (a gather's backward is a scatter, which XLA's CPU
    backend runs as a pass of its own), and a hit is a target logit at the row's maximum (a tie counts).
    """
    assert logits.ndim == 3 and targets.ndim == 2, (logits.shape, targets.shape)
    logits = logits.astype(jnp.float32)
    lse = jax.nn.logsumexp(logits, axis=-1)                                        # [B, L]
    is_target = jnp.arange(logits.shape[-1]) == targets[..., None]                 # [B, L, V]
    target_logit = jnp.where(is_target, logits, 0.0).sum(axis=-1)                  # [B, L]
    nll = lse - target_logit
    loss = nll
    if label_smoothing:
        loss = (1.0 - label_smoothing) * nll + label_smoothing * (lse - logits.mean(axis=-1))
    hits = (target_logit >= logits.max(axis=-1)).astype(jnp.float32)
    w = weights.astype(jnp.float32)
    return {"loss_sum": (loss * w).sum(), "nll_sum": (nll * w).sum(),
            "correct_sum": (hits * w).sum(), "weight_sum": w.sum()}


def shift_right(targets: jax.Array) -> jax.Array:
    """AR decoder inputs: targets shifted one position right with 0 (pad = T5's start id) first."""
    return jnp.pad(targets, ((0, 0), (1, 0)))[:, :-1]


def target_lengths(targets: jax.Array, num_classes: int) -> jax.Array:
    """[B] number of non-pad target tokens (EOS included), clipped to ``num_classes - 1``."""
    return jnp.minimum((targets != PAD_ID).sum(axis=-1), num_classes - 1)


def random_tokens(rng: jax.Array, shape: tuple[int, ...], vocab_size: int) -> jax.Array:
    """Uniform ids in ``[FIRST_REGULAR_ID, vocab_size)``."""
    return jax.random.randint(rng, shape, FIRST_REGULAR_ID, vocab_size, dtype=jnp.int32)


def padir_noise(rng: jax.Array, targets: jax.Array, unmask_rate: float, vocab_size: int,
                fixed_eos: bool = False, n_keep: jax.Array | None = None) -> jax.Array:
    """PaDIR's initial hypothesis X(0) for training: per sentence, round(unmask_rate * n) of its
    n target tokens (chosen uniformly) stay correct, the others become random tokens; pad stays pad.
    With ``fixed_eos`` (the reference implementation) EOS is never noised and not among the n: at
    inference the decoder places it at the predicted length. ``n_keep`` [B] (glancing training)
    gives each sentence's count of correct tokens instead of the rate.

    targets [B, L] int -> [B, L] int32.
    """
    assert targets.ndim == 2, targets.shape
    keep_rng, token_rng = jax.random.split(rng)
    eos = (targets == EOS_ID) if fixed_eos else jnp.zeros(targets.shape, bool)    # [B, L]
    real = (targets != PAD_ID) & ~eos                                             # [B, L] noisable
    n = real.sum(axis=-1, keepdims=True)                                          # [B, 1]
    if n_keep is None:
        n_keep = jnp.round(unmask_rate * n).astype(jnp.int32)                     # [B, 1]
    else:
        n_keep = jnp.minimum(n_keep.reshape(-1, 1).astype(jnp.int32), n)          # [B, 1]
    scores = jnp.where(real, jax.random.uniform(keep_rng, targets.shape), 2.0)   # pads rank last
    rank = jnp.argsort(jnp.argsort(scores, axis=-1), axis=-1)                     # [B, L] 0 = first
    keep = (real & (rank < n_keep)) | eos
    noise = random_tokens(token_rng, targets.shape, vocab_size)
    return jnp.where(keep, targets, jnp.where(real, noise, PAD_ID)).astype(jnp.int32)


def glancing_ratio(step: jax.Array, total_steps: int, start: float, end: float) -> jax.Array:
    """GLAT's glancing ratio at ``step``: linear from ``start`` to ``end`` over ``total_steps``."""
    frac = jnp.clip(step.astype(jnp.float32) / max(total_steps, 1), 0.0, 1.0)
    return start + (end - start) * frac


def glancing_counts(predicted: jax.Array, targets: jax.Array, ratio: jax.Array, fixed_eos: bool = False) -> jax.Array:
    """GLAT (Qian et al. 2021): per sentence, how many reference tokens to reveal, ``ratio`` x the
    Hamming distance between a no-gradient prediction and the reference (rounded; EOS not counted
    with ``fixed_eos``). predicted, targets [B, L] -> [B] int32."""
    real = targets != PAD_ID
    if fixed_eos:
        real = real & (targets != EOS_ID)
    wrong = ((predicted != targets) & real).sum(axis=-1)                          # [B]
    return jnp.round(ratio * wrong).astype(jnp.int32)
