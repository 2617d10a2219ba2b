"""The reference PaDIR recipe details: fixed EOS, stage-2 remasking, no special tokens emitted, the
[LENGTH] query, warm start from an AR checkpoint, glancing training, and config fields that keep old
checkpoint hashes."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import checkpoint, losses, refine, t5
from models.batching import TokenPairs
from models.config import ModelConfig, preset
from models.train import TrainConfig, checkpoint_dir_for, loss_fn, seeded_params, train, warm_start_params
from narbench_core.tokens import EOS_ID, FIRST_REGULAR_ID, MASK_ID, PAD_ID, UNK_ID
from tiny_models import ONE_LAYER

V = 16


def test_unhashed_at_default_fields_keep_old_identities_until_set():
    assert "length_token" not in ModelConfig().to_dict() and "fixed_eos" not in ModelConfig().to_dict()
    assert "stage_remask" not in TrainConfig().to_dict()
    on = ModelConfig(kind="padir", length_token=True, fixed_eos=True).to_dict()
    assert on["length_token"] is True and on["fixed_eos"] is True
    assert TrainConfig(stage_remask=True).to_dict()["stage_remask"] is True
    assert ModelConfig.from_dict(ModelConfig(fixed_eos=True).to_dict()).fixed_eos


@pytest.mark.parametrize("fixed_eos", [False, True])
def test_noise_never_touches_eos_when_fixed(fixed_eos):
    targets = jnp.asarray([[5, 6, 7, 8, 9, 10, EOS_ID, 0], [11, 12, EOS_ID, 0, 0, 0, 0, 0]] * 8)
    kept_eos = []
    for seed in range(20):
        noisy = losses.padir_noise(jax.random.key(seed), targets, 0.0, 1000, fixed_eos)
        assert np.all(np.asarray(noisy)[np.asarray(targets) == 0] == 0)          # pad stays pad
        kept_eos.append(np.all(np.asarray(noisy)[np.asarray(targets) == EOS_ID] == EOS_ID))
    assert all(kept_eos) if fixed_eos else not any(kept_eos)


def test_refinement_never_emits_special_tokens_and_fixes_eos():
    b, n = 2, 6
    mask = jnp.asarray([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], jnp.int32)

    def favour_specials(tokens, m):    # the model would emit pad/unk/<mask>/EOS everywhere
        logits = jnp.zeros((b, n, V)).at[:, :, [PAD_ID, UNK_ID, MASK_ID, EOS_ID]].set(jnp.asarray([9., 8., 7., 6.]))
        return logits.at[:, :, 5].set(1.0)

    for fixed_eos in (False, True):
        out = refine.iterative_refinement(favour_specials, jnp.full((b, n), 4, jnp.int32), mask, 2,
                                          jax.random.key(0), vocab_size=V, fixed_eos=fixed_eos)
        toks = np.asarray(out.tokens)
        real = np.asarray(mask) > 0
        assert not np.isin(toks[real], [PAD_ID, UNK_ID, MASK_ID]).any()
        if fixed_eos:
            assert toks[0, 3] == EOS_ID and toks[1, 5] == EOS_ID
            assert (toks[real] == EOS_ID).sum() == 2 and (toks[real][toks[real] != EOS_ID] == 5).all()
        else:
            assert (toks[real] == EOS_ID).all()         # EOS may be emitted by a model trained without it fixed


def test_length_query_reads_the_source():
    cfg = preset("tiny", kind="padir", vocab_size=V, dropout_rate=0.0, length_token=True, max_target_length=16,
                 **ONE_LAYER)
    params = t5.init_params(cfg, jax.random.key(0))
    assert params["length_query"].shape == (cfg.d_model,)
    model = t5.make_model(cfg)
    inputs = jnp.asarray([[5, 6, 7, EOS_ID, 0, 0], [5, 6, 7, 8, 9, EOS_ID]], jnp.int32)
    encoded = model.apply({"params": params}, inputs, method=t5.PaDIR.encode)
    assert encoded.shape == (2, 7, cfg.d_model)                                   # [LENGTH] first
    lengths = model.apply({"params": params}, encoded, inputs, method=t5.PaDIR.predict_length)
    assert lengths.shape == (2, cfg.max_target_length + 1)
    assert not np.allclose(lengths[0], lengths[1])
    tokens = jnp.full((2, 5), 6, jnp.int32)
    logits = model.apply({"params": params}, encoded, inputs, tokens, jnp.ones_like(tokens), method=t5.PaDIR.refine)
    assert logits.shape == (2, 5, V)


def test_offset_logits_are_laid_out_as_lengths():
    offsets = jnp.arange(2 * 8 + 1, dtype=jnp.float32)[None].repeat(2, 0)          # class j = offset j - 8
    lengths = np.asarray(t5.offset_to_length_logits(offsets, jnp.asarray([3, 12]), 8))
    assert lengths.shape == (2, 9)
    np.testing.assert_array_equal(lengths[0], np.arange(9) - 3 + 8)                 # length L <- offset L - 3
    np.testing.assert_array_equal(lengths[1], np.clip(np.arange(9) - 12 + 8, 0, 16))  # source longer than M


def test_offset_predictor_follows_the_source_length():
    """With offsets, a predictor that only learned its bias (all offsets but +1 at -inf) predicts
    source length + 1 for any source; absolute classes would predict one length for all."""
    cfg = preset("tiny", kind="padir", vocab_size=V, dropout_rate=0.0, length_token=True, length_offset=True,
                 max_target_length=16, **ONE_LAYER)
    params = t5.init_params(cfg, jax.random.key(0))
    assert params["length_predictor"]["kernel"].shape == (cfg.d_model, 2 * 16 + 1)
    bias = np.full(2 * 16 + 1, -1e4, np.float32)
    bias[16 + 1] = 0.0
    params = {**params, "length_predictor": {"kernel": jnp.zeros_like(params["length_predictor"]["kernel"]),
                                             "bias": jnp.asarray(bias)}}
    model = t5.make_model(cfg)
    inputs = jnp.asarray([[5, 6, 7, EOS_ID, 0, 0], [5, 6, 7, 8, 9, EOS_ID]], jnp.int32)
    encoded = model.apply({"params": params}, inputs, method=t5.PaDIR.encode)
    logits = model.apply({"params": params}, encoded, inputs, method=t5.PaDIR.predict_length)
    assert logits.shape == (2, 17)
    np.testing.assert_array_equal(np.argmax(logits, -1), [5, 7])
    np.testing.assert_array_equal(refine.top_k_lengths(logits, 1, 16)[:, 0], [5, 7])
    assert "length_offset" not in ModelConfig(kind="padir").to_dict()
    assert ModelConfig.from_dict(cfg.to_dict()).length_offset


def test_warm_start_copies_the_ar_weights_it_should():
    ar = t5.init_params(preset("tiny", vocab_size=V), jax.random.key(1))
    padir_cfg = preset("tiny", kind="padir", vocab_size=V, length_token=True)
    fresh = t5.init_params(padir_cfg, jax.random.key(2))
    params, report = warm_start_params(fresh, ar)
    assert "token_embedder/embedding" in report["copied"]
    assert "decoder/layers_0/self_attention/query/kernel" in report["copied"]
    assert "decoder/layers_1/encoder_decoder_attention/out/kernel" in report["copied"]
    assert "encoder/relpos_bias/rel_embedding" in report["copied"]
    for path in ("decoder/relpos_bias/rel_embedding", "decoder/position_embedder/embedding", "length_query",
                 "length_predictor/kernel", "decoder/layers_0/positional_attention/query/kernel"):
        assert path in report["fresh"], path
    np.testing.assert_array_equal(params["encoder"]["layers_0"]["mlp"]["wo"]["kernel"],
                                  ar["encoder"]["layers_0"]["mlp"]["wo"]["kernel"])
    np.testing.assert_array_equal(params["decoder"]["relpos_bias"]["rel_embedding"],
                                  fresh["decoder"]["relpos_bias"]["rel_embedding"])


@pytest.mark.slow
def test_warm_started_training_records_its_source(tmp_path):
    rng = np.random.default_rng(0)
    seqs = [list(rng.integers(FIRST_REGULAR_ID, V, size=int(rng.integers(3, 9)))) + [EOS_ID] for _ in range(64)]
    data = TokenPairs.from_lists(seqs, seqs)
    ar_cfg = preset("tiny", vocab_size=V, dropout_rate=0.0, **ONE_LAYER)
    cfg = TrainConfig(steps=2, batch_tokens=256, max_length=16, buckets=(16,), warmup_steps=1, checkpoint_every=2)
    ar_dir = train("toy", ar_cfg, cfg, tmp_path / "ar", progress=False, data=data)
    padir_cfg = ar_cfg.replace(kind="padir", fixed_eos=True, length_token=True)
    student = train("toy", padir_cfg, cfg.replace(stage_remask=True), tmp_path / "padir", progress=False,
                    data=data, init_from=ar_dir)
    meta = checkpoint.read_meta(student)
    assert meta["init"]["from"] == checkpoint.identity(checkpoint.read_meta(ar_dir))
    assert meta["init"]["copied"] > 10 and "length_query" in meta["init"]["fresh"]
    params, warm = seeded_params(padir_cfg, cfg, ar_dir)
    assert warm["copied"] == meta["init"]["copied"]


def test_checkpoint_hash_covers_the_warm_start_source(tmp_path, monkeypatch):
    monkeypatch.setattr("models.batching.task_identity", lambda task: {"vocab_hash": "v", "data": "d"})
    src = tmp_path / "src"
    checkpoint.write_meta(src, {"task": "t", "model_config": {}, "train_config": {}, "steps_done": 5, "complete": True})
    cfg, tc = preset("tiny", kind="padir", vocab_size=V), TrainConfig()
    plain, warm = checkpoint_dir_for("t", cfg, tc), checkpoint_dir_for("t", cfg, tc, src)
    assert plain != warm
    checkpoint.write_meta(src, {"task": "t", "model_config": {}, "train_config": {}, "steps_done": 6, "complete": True})
    assert checkpoint_dir_for("t", cfg, tc, src) != warm


def test_glancing_reveals_a_share_of_the_errors_annealed_over_training():
    assert float(losses.glancing_ratio(jnp.asarray(0), 100, 0.5, 0.3)) == pytest.approx(0.5)
    assert float(losses.glancing_ratio(jnp.asarray(50), 100, 0.5, 0.3)) == pytest.approx(0.4)
    assert float(losses.glancing_ratio(jnp.asarray(500), 100, 0.5, 0.3)) == pytest.approx(0.3)
    targets = jnp.asarray([[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, EOS_ID, 0],
                           [5, 6, 7, EOS_ID, 0, 0, 0, 0, 0, 0, 0, 0]])
    predicted = jnp.asarray([[5, 6, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4],                # 8 wrong + a wrong EOS
                             [5, 6, 7, EOS_ID, 9, 9, 9, 9, 9, 9, 9, 9]])           # all right (pads ignored)
    np.testing.assert_array_equal(losses.glancing_counts(predicted, targets, 1.0), [9, 0])
    np.testing.assert_array_equal(losses.glancing_counts(predicted, targets, 1.0, fixed_eos=True), [8, 0])
    np.testing.assert_array_equal(losses.glancing_counts(predicted, targets, 0.3), [3, 0])      # round(2.7)
    for seed in range(5):     # the glanced count of reference tokens survives the noise, no more and no less
        noisy = losses.padir_noise(jax.random.key(seed), targets, 0.15, 10_000, True, jnp.asarray([4, 0]))
        same = (np.asarray(noisy) == np.asarray(targets)) & (np.asarray(targets) > EOS_ID)
        assert same.sum(axis=1).tolist() == [4, 0]


def test_glancing_loss_depends_on_the_step_and_stays_finite():
    cfg = preset("tiny", kind="padir", vocab_size=V, dropout_rate=0.0, fixed_eos=True, length_token=True,
                 max_target_length=16, **ONE_LAYER)
    params = t5.init_params(cfg, jax.random.key(0))
    tc = TrainConfig(steps=10, glancing=True, stage_remask=True)
    assert TrainConfig(glancing=True).to_dict()["glancing"] is True and "glancing" not in TrainConfig().to_dict()
    batch = {"inputs": jnp.asarray([[5, 6, 7, 8, EOS_ID, 0]] * 4, jnp.int32),
             "targets": jnp.asarray([[9, 10, 11, 12, 13, 14, EOS_ID, 0]] * 4, jnp.int32)}
    loss = jax.jit(loss_fn(cfg, tc, t5.make_model(cfg)))
    first, _ = loss(params, batch, jax.random.key(1), jnp.asarray(0))
    last, metrics = loss(params, batch, jax.random.key(1), jnp.asarray(10))
    assert np.isfinite(float(first)) and np.isfinite(float(last)) and float(first) != float(last)
    plain, _ = jax.jit(loss_fn(cfg, tc.replace(glancing=False), t5.make_model(cfg)))(params, batch, jax.random.key(1))
    assert np.isfinite(float(plain))


def test_glancing_ratios_are_training_fields_and_glancing_silences_the_unmasking_rate():
    # At their defaults the ratios stay out of the checkpoint identity: checkpoints trained before keep their hash.
    assert "glance_start" not in TrainConfig(glancing=True).to_dict()
    assert TrainConfig(glancing=True, glance_end=0.5).to_dict()["glance_end"] == 0.5
    with pytest.raises(Exception, match="glance_start"):
        TrainConfig(glance_start=1.5)
    cfg = preset("tiny", kind="padir", vocab_size=V, dropout_rate=0.0, fixed_eos=True, length_token=True,
                 max_target_length=16, **ONE_LAYER)
    params = t5.init_params(cfg, jax.random.key(0))
    batch = {"inputs": jnp.asarray([[5, 6, 7, 8, EOS_ID, 0]] * 4, jnp.int32),
             "targets": jnp.asarray([[9, 10, 11, 12, 13, 14, EOS_ID, 0]] * 4, jnp.int32)}

    def loss_at(tc: TrainConfig) -> float:
        return float(jax.jit(loss_fn(cfg, tc, t5.make_model(cfg)))(params, batch, jax.random.key(1), jnp.asarray(0))[0])

    glat = TrainConfig(steps=10, glancing=True, stage_remask=True)
    # The ratio acts: revealing every error at step 0 (glance_start = 1) changes stage 1's input and the loss ...
    assert loss_at(glat) != loss_at(glat.replace(glance_start=1.0))
    # ... the unmasking rate does not: with glancing, padir_noise gets the glanced counts and never reads it.
    assert loss_at(glat.replace(unmask_rate=0.9)) == loss_at(glat)
    assert loss_at(glat.replace(glancing=False, unmask_rate=0.9)) != loss_at(glat.replace(glancing=False))
