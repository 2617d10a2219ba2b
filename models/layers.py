"""T5.1.1 building blocks in Flax linen: RMSNorm, gated-GELU MLP, relative position biases,
multi-head attention with an optional KV cache.

Parameter names follow t5x (``scale``, ``query``/``key``/``value``/``out``, ``wi_0``/``wi_1``/``wo``,
``rel_embedding``). Attention scales logits by 1/sqrt(head_dim) at run time (t5x folds it into the
query initialisation instead; the run-time form keeps any optimiser's learning rate meaningful).
"""
from __future__ import annotations

import math
from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array
NEG_INF = -1e10

default_kernel_init = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")


def flat_dot_general(lhs: Array, rhs: Array, dimension_numbers, precision=None, preferred_element_type=None,
                     **kwargs) -> Array:
    """``lax.dot_general`` for a dense layer, as one 2-D matmul where it can be: ``lhs`` [..., c1..cm] contracted
    with ``rhs`` [c1..cm, f1..fk] is reshaped to [N, C] @ [C, F] and back to [..., f1..fk]. The same products and
    sums; XLA's CPU backend runs the backward of the n-D form (a kernel gradient contracting batch and sequence
    axes together) markedly slower (docs/experiments.md, "Train steps as 2-D matmuls")."""
    (lc, rc), (lb, rb) = dimension_numbers
    m = len(lc)
    if lb or rb or tuple(lc) != tuple(range(lhs.ndim - m, lhs.ndim)) or tuple(rc) != tuple(range(m)) or m == lhs.ndim:
        return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                                   preferred_element_type=preferred_element_type, **kwargs)
    lead, contract, feats = lhs.shape[:-m], rhs.shape[:m], rhs.shape[m:]
    out = jax.lax.dot_general(lhs.reshape(math.prod(lead), math.prod(contract)),
                              rhs.reshape(math.prod(contract), math.prod(feats)), (((1,), (0,)), ((), ())),
                              precision=precision, preferred_element_type=preferred_element_type, **kwargs)
    return out.reshape(*lead, *feats)


class RMSNorm(nn.Module):
    """T5 layer norm: scale only, no mean subtraction, no bias."""
    epsilon: float = 1e-6
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: Array) -> Array:
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), jnp.float32)
        x32 = x.astype(jnp.float32)
        var = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
        return (x32 * jax.lax.rsqrt(var + self.epsilon) * scale).astype(self.dtype)


class MlpBlock(nn.Module):
    """Gated-GELU feed-forward: wo(gelu(wi_0 x) * wi_1 x)."""
    d_ff: int
    dropout_rate: float = 0.0
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: Array, enable_dropout: bool = False) -> Array:
        d_model = x.shape[-1]
        gate = nn.Dense(self.d_ff, use_bias=False, dtype=self.dtype, kernel_init=default_kernel_init,
                        dot_general=flat_dot_general, name="wi_0")(x)
        lin = nn.Dense(self.d_ff, use_bias=False, dtype=self.dtype, kernel_init=default_kernel_init,
                       dot_general=flat_dot_general, name="wi_1")(x)
        h = nn.gelu(gate, approximate=True) * lin                                     # [b, n, d_ff]
        h = nn.Dropout(self.dropout_rate, broadcast_dims=(-2,))(h, deterministic=not enable_dropout)
        return nn.Dense(d_model, use_bias=False, dtype=self.dtype, kernel_init=default_kernel_init,
                        dot_general=flat_dot_general, name="wo")(h)


def relative_position_bucket(relative_position: Array, bidirectional: bool, num_buckets: int,
                             max_distance: int) -> Array:
    """T5's bucketing of (key position - query position): exact for small distances, log-spaced up
    to ``max_distance``. Causal buckets (bidirectional=False) map every future offset to bucket 0."""
    n = -relative_position
    ret = jnp.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        ret = ret + (n < 0).astype(jnp.int32) * num_buckets
        n = jnp.abs(n)
    else:
        n = jnp.maximum(n, 0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    scaled = jnp.log(jnp.maximum(n, 1).astype(jnp.float32) / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (scaled * (num_buckets - max_exact)).astype(jnp.int32)
    large = jnp.minimum(large, num_buckets - 1)
    return ret + jnp.where(is_small, n, large)


class RelativePositionBiases(nn.Module):
    """Learned per-head scalar bias for each relative-position bucket (shared by all layers)."""
    num_buckets: int
    max_distance: int
    num_heads: int
    bidirectional: bool
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, q_positions: Array, k_positions: Array) -> Array:
        assert q_positions.ndim == 1 and k_positions.ndim == 1, (q_positions.shape, k_positions.shape)
        table = self.param("rel_embedding", nn.initializers.variance_scaling(1.0, "fan_avg", "uniform"),
                           (self.num_heads, self.num_buckets), jnp.float32)          # [h, buckets]
        rel = k_positions[None, :] - q_positions[:, None]                          # [q, k]
        buckets = relative_position_bucket(rel, self.bidirectional, self.num_buckets, self.max_distance)
        bias = jnp.take(table, buckets, axis=1)                                     # [h, q, k]
        return bias[None].astype(self.dtype)                                        # [1, h, q, k]


class MultiHeadAttention(nn.Module):
    """Dot-product attention; returns (output [b, q, d], weights [b, h, q, k]).

    ``inputs_v`` (default: ``inputs_kv``) lets positional attention use positions as query and key
    and hidden states as values. With ``decode=True`` keys/values go to the "cache" collection
    (``cached_key``/``cached_value`` [b, L, h, head_dim]); the first (init) call sizes the cache from a
    full-length input, later calls write one position at ``decode_index`` and attend over all L keys
    (the caller's mask hides the unwritten ones). Cross-attention keys/values are not cached: XLA's
    while-loop invariant code motion already projects the encoder output once per decode (the
    optimised HLO of the greedy loop has no [s, d] x [d, d] dot in its body); caching them by hand
    measured no faster.
    """
    num_heads: int
    head_dim: int
    dropout_rate: float = 0.0
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, inputs_q: Array, inputs_kv: Array, mask: Optional[Array] = None,
                 bias: Optional[Array] = None, *, inputs_v: Optional[Array] = None, decode: bool = False,
                 decode_index: Optional[Array] = None, enable_dropout: bool = False):
        assert inputs_q.ndim == 3 and inputs_kv.ndim == 3, (inputs_q.shape, inputs_kv.shape)
        inputs_v = inputs_kv if inputs_v is None else inputs_v
        features = (self.num_heads, self.head_dim)
        dense = lambda name: nn.DenseGeneral(features, axis=-1, use_bias=False, dtype=self.dtype,
                                             kernel_init=default_kernel_init, dot_general=flat_dot_general,
                                             name=name)
        query = dense("query")(inputs_q)                                            # [b, q, h, hd]
        key = dense("key")(inputs_kv)                                               # [b, k, h, hd]
        value = dense("value")(inputs_v)                                            # [b, k, h, hd]

        if decode:
            initialized = self.has_variable("cache", "cached_key")
            cached_key = self.variable("cache", "cached_key", jnp.zeros, key.shape, key.dtype)
            cached_value = self.variable("cache", "cached_value", jnp.zeros, value.shape, value.dtype)
            if initialized:
                assert inputs_q.shape[1] == 1, "decode=True expects one new position per call"
                start = (0, decode_index, 0, 0)
                key = jax.lax.dynamic_update_slice(cached_key.value, key, start)    # [b, L, h, hd]
                value = jax.lax.dynamic_update_slice(cached_value.value, value, start)
                cached_key.value, cached_value.value = key, value

        query = query / jnp.sqrt(self.head_dim).astype(self.dtype)
        logits = jnp.einsum("bqhd,bkhd->bhqk", query, key).astype(jnp.float32)     # [b, h, q, k]
        if bias is not None:
            logits = logits + bias.astype(jnp.float32)
        if mask is not None:
            logits = jnp.where(mask, logits, NEG_INF)
        weights = jax.nn.softmax(logits, axis=-1)                                   # [b, h, q, k]
        dropped = nn.Dropout(self.dropout_rate)(weights, deterministic=not enable_dropout)
        out = jnp.einsum("bhqk,bkhd->bqhd", dropped.astype(self.dtype), value)     # [b, q, h, hd]
        out = nn.DenseGeneral(inputs_q.shape[-1], axis=(-2, -1), use_bias=False, dtype=self.dtype,
                              kernel_init=default_kernel_init, dot_general=flat_dot_general,
                              name="out")(out)                                     # [b, q, d]
        return out, weights
