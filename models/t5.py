"""T5.1.1-style encoder-decoder models: ``Transformer`` (AR, KV cache) and ``PaDIR`` (parallel
decoding by iterative refinement, Appendix L of the paper).

Conventions shared with training and decoding:
- token ids: 0 pad, 1 EOS, 2 unk, 3 ``<mask>``; AR decoder inputs are the targets shifted right with a
  leading 0 (``shift_right``); no BOS.
- one shared token embedding (``token_embedder``, init N(0, 1)) for encoder input, decoder input and
  output; output logits are ``embedding.attend(y) / sqrt(d_model)`` (T5.1.0 style, keeps the 8k-vocab
  small model at calibration model (a)'s parameter count).
- dropout only with ``enable_dropout=True`` (then pass ``rngs={"dropout": key}``).
- PaDIR's length is the number of non-pad target tokens INCLUDING the final EOS; the length predictor
  gives logits over 0..max_target_length (0 is never a valid length).
- the last decoder layer sows its attention weights into ``intermediates``:
  ``state["intermediates"]["decoder"]["self_attention"][0]`` and ``["cross_attention"][0]``,
  each ``[batch, heads, q, k]``.
Parameter paths follow t5x: ``encoder/layers_0/attention/query/kernel``, ``decoder/layers_0/
encoder_decoder_attention/...``, ``encoder/relpos_bias/rel_embedding``, ``decoder/decoder_norm/scale``.
"""
from __future__ import annotations

from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from models.config import ModelConfig
from models.layers import MlpBlock, MultiHeadAttention, RelativePositionBiases, RMSNorm

Array = jax.Array


def shift_right(targets: Array) -> Array:
    """AR decoder inputs: [b, n] targets -> [b, n] with a leading pad (0) and the last token dropped."""
    assert targets.ndim == 2, targets.shape
    return jnp.pad(targets, ((0, 0), (1, 0)))[:, :-1]


def _dropout(cfg: ModelConfig):
    return nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))


def _attention(cfg: ModelConfig, name: str) -> MultiHeadAttention:
    return MultiHeadAttention(cfg.num_heads, cfg.head_dim, cfg.dropout_rate, cfg.jnp_dtype, name=name)


class EncoderLayer(nn.Module):
    config: ModelConfig

    @nn.compact
    def __call__(self, x, mask, bias, enable_dropout: bool = False):
        cfg, det = self.config, not enable_dropout
        h = RMSNorm(dtype=cfg.jnp_dtype, name="pre_attention_layer_norm")(x)
        h, _ = _attention(cfg, "attention")(h, h, mask, bias, enable_dropout=enable_dropout)
        x = x + _dropout(cfg)(h, deterministic=det)
        h = RMSNorm(dtype=cfg.jnp_dtype, name="pre_mlp_layer_norm")(x)
        h = MlpBlock(cfg.d_ff, cfg.dropout_rate, cfg.jnp_dtype, name="mlp")(h, enable_dropout)
        return x + _dropout(cfg)(h, deterministic=det)


class Encoder(nn.Module):
    config: ModelConfig
    shared_embedding: nn.Module

    @nn.compact
    def __call__(self, inputs: Array, enable_dropout: bool = False, prefix: Optional[Array] = None) -> Array:
        """[b, s] ids -> [b, s, d]; with ``prefix`` [d] (a learned query such as PaDIR's [LENGTH]),
        that vector is prepended to the embedded inputs and the output is [b, 1 + s, d]."""
        assert inputs.ndim == 2, f"inputs must be [batch, length], got {inputs.shape}"
        cfg, det = self.config, not enable_dropout
        x = self.shared_embedding(inputs).astype(cfg.jnp_dtype)                     # [b, s, d]
        real = inputs > 0                                                            # [b, s]
        if prefix is not None:
            first = jnp.broadcast_to(prefix.astype(cfg.jnp_dtype), (x.shape[0], 1, x.shape[2]))
            x = jnp.concatenate([first, x], axis=1)                                  # [b, 1 + s, d]
            real = jnp.pad(real, ((0, 0), (1, 0)), constant_values=True)
        x = _dropout(cfg)(x, deterministic=det)
        pos = jnp.arange(x.shape[1])
        bias = RelativePositionBiases(cfg.relative_attention_num_buckets, cfg.relative_attention_max_distance,
                                      cfg.num_heads, True, cfg.jnp_dtype, name="relpos_bias")(pos, pos)
        mask = real[:, None, None, :]                                                # [b, 1, 1, s]
        for i in range(cfg.num_encoder_layers):
            x = EncoderLayer(cfg, name=f"layers_{i}")(x, mask, bias, enable_dropout)
        x = RMSNorm(dtype=cfg.jnp_dtype, name="encoder_norm")(x)
        return _dropout(cfg)(x, deterministic=det)                                   # [b, s, d]


def _cross_attention(attention: MultiHeadAttention, x: Array, encoded: Array, mask: Array, enable_dropout: bool):
    """Cross-attention of x [b*k, n, d] (k hypotheses of each source, source-major: rows i*k .. i*k + k - 1
    are source i's) to encoded [b, s, d] with mask [b, 1, 1, s]: each source's k*n query positions attend
    as one group, so its keys and values are projected once per sentence, not once per hypothesis (the
    queries never interact, so this is the same attention). Returns [b*k, n, d] and the weights
    [b*k, h, n, s]."""
    b, (rows, n, d) = encoded.shape[0], x.shape
    assert rows % b == 0, f"{rows} decoder rows are not a whole number of hypotheses of {b} sources"
    k = rows // b
    out, weights = attention(x.reshape(b, k * n, d), encoded, mask, enable_dropout=enable_dropout)
    heads, s = weights.shape[1], weights.shape[-1]
    weights = weights.reshape(b, heads, k, n, s).transpose(0, 2, 1, 3, 4).reshape(rows, heads, n, s)
    return out.reshape(rows, n, d), weights                                          # [b*k, n, d], [b*k, h, n, s]


class DecoderLayer(nn.Module):
    config: ModelConfig

    @nn.compact
    def __call__(self, x, encoded, self_mask, self_bias, cross_mask, pos_emb=None, pos_mask=None,
                 decode: bool = False, decode_index=None, enable_dropout: bool = False):
        cfg, det = self.config, not enable_dropout
        h = RMSNorm(dtype=cfg.jnp_dtype, name="pre_self_attention_layer_norm")(x)
        h, self_w = _attention(cfg, "self_attention")(h, h, self_mask, self_bias, decode=decode,
                                                       decode_index=decode_index, enable_dropout=enable_dropout)
        x = x + _dropout(cfg)(h, deterministic=det)
        if pos_emb is not None:  # PaDIR: positions as query and key, hidden states as values
            h = RMSNorm(dtype=cfg.jnp_dtype, name="pre_positional_attention_layer_norm")(x)
            h, _ = _attention(cfg, "positional_attention")(pos_emb, pos_emb, pos_mask, inputs_v=h,
                                                           enable_dropout=enable_dropout)
            x = x + _dropout(cfg)(h, deterministic=det)
        h = RMSNorm(dtype=cfg.jnp_dtype, name="pre_cross_attention_layer_norm")(x)
        h, cross_w = _cross_attention(_attention(cfg, "encoder_decoder_attention"), h, encoded, cross_mask,
                                      enable_dropout)
        x = x + _dropout(cfg)(h, deterministic=det)
        h = RMSNorm(dtype=cfg.jnp_dtype, name="pre_mlp_layer_norm")(x)
        h = MlpBlock(cfg.d_ff, cfg.dropout_rate, cfg.jnp_dtype, name="mlp")(h, enable_dropout)
        return x + _dropout(cfg)(h, deterministic=det), self_w, cross_w


class Decoder(nn.Module):
    """AR (``causal=True``: causal mask, causal buckets, optional KV cache) or PaDIR decoder
    (bidirectional, padding mask only, learned absolute positions, positional attention)."""
    config: ModelConfig
    shared_embedding: nn.Module
    causal: bool

    @nn.compact
    def __call__(self, encoded: Array, inputs: Array, tokens: Array, token_mask: Optional[Array] = None,
                 decode: bool = False, enable_dropout: bool = False, logit_index: Optional[Array] = None) -> Array:
        assert encoded.ndim == 3 and inputs.ndim == 2 and tokens.ndim == 2, (encoded.shape, inputs.shape, tokens.shape)
        cfg, det = self.config, not enable_dropout
        b, n = tokens.shape
        x = self.shared_embedding(tokens).astype(cfg.jnp_dtype)                     # [b, n, d]
        q_pos = k_pos = jnp.arange(n)
        decode_index, pos_emb, pos_mask = None, None, None
        if self.causal:
            self_mask = (k_pos[None, :] <= q_pos[:, None])[None, None]              # [1, 1, n, n]
            if decode:
                # Cache bookkeeping: `index` = next position; `written` [L] only carries the cache length.
                ready = self.has_variable("cache", "index")
                index = self.variable("cache", "index", lambda: jnp.zeros((), jnp.int32))
                written = self.variable("cache", "written", lambda: jnp.zeros((n,), jnp.int32))
                if ready:
                    assert n == 1, "decode=True expects tokens of shape [batch, 1]"
                    decode_index = index.value
                    k_pos = jnp.arange(written.value.shape[0])                       # [L]
                    q_pos = decode_index[None]                                       # [1]
                    self_mask = (k_pos <= decode_index)[None, None, None, :]         # [1, 1, 1, L]
                    written.value = written.value.at[decode_index].set(1)
                    index.value = decode_index + 1
        else:
            assert token_mask is not None and token_mask.shape == tokens.shape, "PaDIR needs a [b, n] mask"
            assert n <= cfg.max_target_length, f"hypothesis length {n} > max_target_length"
            pos_table = nn.Embed(cfg.max_target_length, cfg.d_model, dtype=cfg.jnp_dtype,
                                 embedding_init=nn.initializers.normal(1.0), name="position_embedder")
            positions = jnp.broadcast_to(pos_table(k_pos)[None], (b, n, cfg.d_model))  # [b, n, d]
            x = x + positions
            self_mask = (token_mask > 0)[:, None, None, :]                           # [b, 1, 1, n]
            if cfg.positional_attention:
                pos_emb, pos_mask = positions, self_mask
        self_bias = RelativePositionBiases(cfg.relative_attention_num_buckets, cfg.relative_attention_max_distance,
                                           cfg.num_heads, not self.causal, cfg.jnp_dtype,
                                           name="relpos_bias")(q_pos, k_pos)        # [1, h, q, k]
        cross_mask = (inputs > 0)[:, None, None, :]                                  # [b, 1, 1, s]
        x = _dropout(cfg)(x, deterministic=det)
        for i in range(cfg.num_decoder_layers):
            x, self_w, cross_w = DecoderLayer(cfg, name=f"layers_{i}")(
                x, encoded, self_mask, self_bias, cross_mask, pos_emb, pos_mask,
                decode=decode, decode_index=decode_index, enable_dropout=enable_dropout)
        self.sow("intermediates", "self_attention", self_w)                         # [b, h, q, k]
        self.sow("intermediates", "cross_attention", cross_w)                       # [b, h, q, s]
        if logit_index is not None:  # only one position's logits (uncached AR decoding)
            x = jax.lax.dynamic_slice_in_dim(x, logit_index, 1, axis=1)             # [b, 1, d]
        x = RMSNorm(dtype=cfg.jnp_dtype, name="decoder_norm")(x)
        x = _dropout(cfg)(x, deterministic=det)
        b, n, d = x.shape             # one 2-D matmul, as the dense layers (layers.flat_dot_general: why)
        logits = self.shared_embedding.attend(x.astype(jnp.float32).reshape(b * n, d)).reshape(b, n, -1)  # [b, n, V]
        return logits / jnp.sqrt(jnp.float32(cfg.d_model))


def _token_embedder(cfg: ModelConfig) -> nn.Embed:
    return nn.Embed(cfg.vocab_size, cfg.d_model, dtype=cfg.jnp_dtype, param_dtype=jnp.float32,
                    embedding_init=nn.initializers.normal(1.0), name="token_embedder")


class Transformer(nn.Module):
    """Autoregressive T5: ``encode``, ``decode`` (teacher-forced or one cached step), ``__call__``."""
    config: ModelConfig

    def setup(self):
        self.token_embedder = _token_embedder(self.config)
        self.encoder = Encoder(self.config, self.token_embedder)
        self.decoder = Decoder(self.config, self.token_embedder, causal=True)

    def encode(self, inputs: Array, enable_dropout: bool = False) -> Array:
        return self.encoder(inputs, enable_dropout)                                  # [b, s, d]

    def decode(self, encoded: Array, inputs: Array, decoder_input_tokens: Array, decode: bool = False,
               enable_dropout: bool = False, logit_index: Optional[Array] = None) -> Array:
        """Logits [b, n, V]; with ``decode=True`` tokens are [b, 1] and the "cache" is updated; with
        ``logit_index`` (a scalar position) only that position's logits [b, 1, V]."""
        return self.decoder(encoded, inputs, decoder_input_tokens, decode=decode, enable_dropout=enable_dropout,
                            logit_index=logit_index)

    def __call__(self, inputs: Array, decoder_input_tokens: Array, enable_dropout: bool = False) -> Array:
        encoded = self.encode(inputs, enable_dropout)
        return self.decode(encoded, inputs, decoder_input_tokens, enable_dropout=enable_dropout)


class PaDIR(nn.Module):
    """Non-autoregressive refiner: ``encode``, ``predict_length``, ``refine``, ``__call__``."""
    config: ModelConfig

    def setup(self):
        cfg = self.config
        self.token_embedder = _token_embedder(cfg)
        self.encoder = Encoder(cfg, self.token_embedder)
        self.decoder = Decoder(cfg, self.token_embedder, causal=False)
        classes = 2 * cfg.max_target_length + 1 if cfg.length_offset else cfg.max_target_length + 1
        self.length_predictor = nn.Dense(classes, dtype=jnp.float32, name="length_predictor")
        if cfg.length_token:  # the reference's [LENGTH] token: a learned query the encoder reads with the source
            self.length_query = self.param("length_query", nn.initializers.normal(1.0), (cfg.d_model,))

    def encode(self, inputs: Array, enable_dropout: bool = False) -> Array:
        """[b, s, d] (with ``length_token``: [b, 1 + s, d], the [LENGTH] query's output first; the
        other methods take the encoding as it comes from here)."""
        return self.encoder(inputs, enable_dropout, self.length_query if self.config.length_token else None)

    def _source(self, encoded: Array) -> Array:
        """The encoding of the source tokens alone: [b, s, d]."""
        return encoded[:, 1:] if self.config.length_token else encoded

    def predict_length(self, encoded: Array, inputs: Array) -> Array:
        """Logits [b, max_target_length + 1] over target lengths (EOS included), from the [LENGTH]
        query's encoding, else from the masked mean of the encoder output. With ``length_offset`` the
        predictor scores offsets from the source length and they are laid out here as absolute lengths,
        so the loss and the decoders never see the difference."""
        assert encoded.ndim == 3 and inputs.ndim == 2, (encoded.shape, inputs.shape)
        if self.config.length_token:
            logits = self.length_predictor(encoded[:, 0].astype(jnp.float32))
        else:
            mask = (inputs > 0).astype(jnp.float32)[:, :, None]                      # [b, s, 1]
            pooled = (encoded.astype(jnp.float32) * mask).sum(1) / jnp.maximum(mask.sum(1), 1.0)  # [b, d]
            logits = self.length_predictor(pooled)
        if not self.config.length_offset:
            return logits                                                            # [b, M + 1]
        return offset_to_length_logits(logits, (inputs > 0).sum(-1), self.config.max_target_length)

    def refine(self, encoded: Array, inputs: Array, hypothesis_tokens: Array, hypothesis_mask: Array,
               enable_dropout: bool = False) -> Array:
        """One parallel decoder pass: token logits [b*k, n, V] for every position of k hypotheses of
        each of b sources (tokens and mask [b*k, n], source-major; encoded and inputs [b, ...] once per
        source, not repeated: the cross-attention groups each source's hypotheses)."""
        return self.decoder(self._source(encoded), inputs, hypothesis_tokens, hypothesis_mask,
                            enable_dropout=enable_dropout)

    def __call__(self, inputs: Array, hypothesis: Array, hypothesis_mask: Array, enable_dropout: bool = False):
        encoded = self.encode(inputs, enable_dropout)
        token_logits = self.refine(encoded, inputs, hypothesis, hypothesis_mask, enable_dropout)
        return token_logits, self.predict_length(encoded, inputs)


def offset_to_length_logits(offset_logits: Array, source_lengths: Array, max_length: int) -> Array:
    """[b, 2M + 1] logits over offsets -M..M (class j = offset j - M) and [b] source lengths (EOS
    included) -> [b, M + 1] logits over lengths 0..M: length L scores offset L - source length
    (clipped into -M..M, so a source longer than M still has defined scores)."""
    lengths = jnp.arange(max_length + 1)[None, :]                                   # [1, M + 1]
    index = jnp.clip(lengths - source_lengths[:, None] + max_length, 0, 2 * max_length)  # [b, M + 1]
    return jnp.take_along_axis(offset_logits, index, axis=1)


def make_model(config: ModelConfig) -> nn.Module:
    """The module for ``config.kind``."""
    return Transformer(config) if config.kind == "ar" else PaDIR(config)


def init_params(config: ModelConfig, rng: Array, source_length: int = 8, target_length: int = 8):
    """Fresh parameters (the "params" collection) for ``config``; shapes do not depend on the lengths."""
    model = make_model(config)
    inputs = jnp.ones((1, source_length), jnp.int32)
    targets = jnp.ones((1, min(target_length, config.max_target_length)), jnp.int32)
    args = (inputs, targets) if config.kind == "ar" else (inputs, targets, jnp.ones_like(targets))
    return jax.jit(lambda key: model.init(key, *args)["params"])(rng)


def init_cache(config: ModelConfig, batch_size: int, source_length: int, max_decode_length: int):
    """An empty AR decoding cache for ``max_decode_length`` positions (all zeros, built from shapes)."""
    assert config.kind == "ar", "only the AR Transformer has a decoding cache"
    model = Transformer(config)
    encoded = jnp.zeros((batch_size, source_length, config.d_model), config.jnp_dtype)
    inputs = jnp.ones((batch_size, source_length), jnp.int32)
    tokens = jnp.zeros((batch_size, max_decode_length), jnp.int32)
    shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), encoded, inputs, tokens, decode=True,
                                               method=Transformer.decode))["cache"]
    return jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def count_params(params: Any) -> int:
    return int(sum(x.size for x in jax.tree_util.tree_leaves(params)))
