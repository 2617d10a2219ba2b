"""The Flax models: parameter layout, cache consistency, masks, sown attention weights."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from narbench_core.errors import UserError
from models import t5
from models.config import ModelConfig, preset

INPUTS = jnp.array([[5, 6, 7, 8, 1, 0], [9, 10, 1, 0, 0, 0]])
TARGETS = jnp.array([[11, 12, 13, 1, 0], [14, 15, 1, 0, 0]])


def test_presets_and_validation():
    small = preset("small", vocab_size=8000)
    assert (small.d_model, small.num_encoder_layers, small.num_heads) == (256, 3, 4)
    assert preset("paper", vocab_size=32000).d_ff == 2048
    assert small.replace(kind="padir").kind == "padir" and small.kind == "ar"
    assert ModelConfig.from_dict(small.to_dict()) == small
    with pytest.raises(UserError, match="known presets"):
        preset("huge")
    with pytest.raises(UserError):
        preset("tiny", kind="diffusion")
    with pytest.raises(UserError, match="unknown model config"):
        preset("tiny", colour="red")


def test_param_counts_match_calibration_and_paper():
    def count(cfg):
        model = t5.make_model(cfg)
        ones = jnp.ones((1, 4), jnp.int32)
        args = (ones, ones) if cfg.kind == "ar" else (ones, ones, ones)
        return t5.count_params(jax.eval_shape(lambda: model.init(jax.random.key(0), *args))["params"])
    # CALIBRATION.md model (a): 7.6M with an 8k vocab; the paper's model: 67M (ours 73M as T5.1.1).
    assert 7.0e6 < count(preset("small", vocab_size=8000)) < 8.0e6
    assert 65e6 < count(preset("paper", vocab_size=32000)) < 80e6


def test_t5x_parameter_names(ar_params, padir_params):
    assert set(ar_params) == {"token_embedder", "encoder", "decoder"}
    assert ar_params["encoder"]["layers_0"]["attention"]["query"]["kernel"].shape == (64, 4, 16)
    assert ar_params["encoder"]["relpos_bias"]["rel_embedding"].shape == (4, 16)
    assert set(ar_params["decoder"]["layers_1"]["mlp"]) == {"wi_0", "wi_1", "wo"}
    assert "encoder_decoder_attention" in ar_params["decoder"]["layers_0"]
    assert "positional_attention" in padir_params["decoder"]["layers_0"]
    assert "position_embedder" in padir_params["decoder"]
    assert padir_params["length_predictor"]["kernel"].shape == (64, 33)


def test_positional_attention_switch(padir_config):
    cfg = padir_config.replace(positional_attention=False)
    params = t5.init_params(cfg, jax.random.key(3))
    assert "positional_attention" not in params["decoder"]["layers_0"]


def test_cached_decode_matches_teacher_forcing(ar_config, ar_params):
    model = t5.Transformer(ar_config)
    dec_in = t5.shift_right(TARGETS)
    full = model.apply({"params": ar_params}, INPUTS, dec_in)                          # [b, n, V]
    encoded = model.apply({"params": ar_params}, INPUTS, method=t5.Transformer.encode)
    cache = t5.init_cache(ar_config, 2, INPUTS.shape[1], TARGETS.shape[1])
    steps = []
    for i in range(TARGETS.shape[1]):
        logits, state = model.apply({"params": ar_params, "cache": cache}, encoded, INPUTS, dec_in[:, i:i + 1],
                                    decode=True, mutable=["cache"], method=t5.Transformer.decode)
        cache = state["cache"]
        steps.append(logits)
    np.testing.assert_allclose(jnp.concatenate(steps, 1), full, atol=1e-4)
    one = model.apply({"params": ar_params}, encoded, INPUTS, dec_in, logit_index=jnp.int32(2),
                      method=t5.Transformer.decode)
    np.testing.assert_allclose(one[:, 0], full[:, 2], atol=1e-5)


def test_ar_decoder_is_causal(ar_config, ar_params):
    model = t5.Transformer(ar_config)
    dec_in = t5.shift_right(TARGETS)
    a = model.apply({"params": ar_params}, INPUTS, dec_in)
    b = model.apply({"params": ar_params}, INPUTS, dec_in.at[:, 3:].set(20))
    np.testing.assert_allclose(a[:, :3], b[:, :3], atol=1e-5)
    assert not np.allclose(a[:, 3:], b[:, 3:])


def test_padir_is_bidirectional_and_ignores_padding(padir_config, padir_params):
    model = t5.PaDIR(padir_config)
    mask = (TARGETS > 0).astype(jnp.int32)
    tok, length = model.apply({"params": padir_params}, INPUTS, TARGETS, mask)
    assert tok.shape == (2, 5, 64) and length.shape == (2, 33)
    # Changing a later token changes earlier outputs (bidirectional) ...
    tok2, _ = model.apply({"params": padir_params}, INPUTS, TARGETS.at[0, 2].set(20), mask)
    assert not np.allclose(tok[0, 0], tok2[0, 0])
    # ... but tokens under the padding mask and extra source padding (a larger bucket) change nothing.
    longer = jnp.pad(INPUTS, ((0, 0), (0, 10)))
    tok3, len3 = model.apply({"params": padir_params}, longer, TARGETS.at[1, 3:].set(20), mask)
    np.testing.assert_allclose(tok[1, :3], tok3[1, :3], atol=1e-5)
    np.testing.assert_allclose(length, len3, atol=1e-5)


def test_last_layer_attention_weights_are_sown(ar_config, ar_params, padir_config, padir_params):
    _, state = t5.Transformer(ar_config).apply({"params": ar_params}, INPUTS, t5.shift_right(TARGETS),
                                               mutable=["intermediates"])
    inter = state["intermediates"]["decoder"]
    assert inter["self_attention"][0].shape == (2, 4, 5, 5)
    assert inter["cross_attention"][0].shape == (2, 4, 5, 6)
    np.testing.assert_allclose(inter["cross_attention"][0].sum(-1), 1.0, atol=1e-5)
    assert float(jnp.abs(jnp.triu(inter["self_attention"][0], 1)).max()) == 0.0     # causal
    assert float(inter["cross_attention"][0][1, :, :, 3:].max()) < 1e-6             # source padding
    _, state = t5.PaDIR(padir_config).apply({"params": padir_params}, INPUTS, TARGETS,
                                            (TARGETS > 0).astype(jnp.int32), mutable=["intermediates"])
    self_w = state["intermediates"]["decoder"]["self_attention"][0]
    assert self_w.shape == (2, 4, 5, 5)
    assert float(self_w[1, :, :, 3:].max()) < 1e-6                                    # target padding


def test_dropout_needs_and_uses_an_rng(ar_config, ar_params):
    model = t5.Transformer(ar_config.replace(dropout_rate=0.5))
    dec_in = t5.shift_right(TARGETS)
    a = model.apply({"params": ar_params}, INPUTS, dec_in, enable_dropout=True, rngs={"dropout": jax.random.key(1)})
    b = model.apply({"params": ar_params}, INPUTS, dec_in, enable_dropout=True, rngs={"dropout": jax.random.key(2)})
    c = model.apply({"params": ar_params}, INPUTS, dec_in)
    d = model.apply({"params": ar_params}, INPUTS, dec_in)
    assert not np.allclose(a, b)
    np.testing.assert_array_equal(c, d)
