"""Training budgets and learning curves: train_flops sums the compiled step's cost per batch shape;
curve points land at the interval, keep evaluation out of train_seconds and survive a resume."""
from __future__ import annotations

import math
from types import SimpleNamespace

import jax
import numpy as np
import pytest

import models.train
from models import checkpoint, curves
from models.batching import BucketedBatches, TokenPairs
from models.train import TrainConfig, flops_per_step, seconds_per_step, train
from narbench_core.errors import UserError
from narbench_core.tokens import EOS_ID
from tiny_models import ONE_LAYER


@pytest.fixture(scope="module")
def copy_data(tiny_vocab, toy_sentences) -> TokenPairs:
    ids = [list(tiny_vocab.encode(s)) + [EOS_ID] for s in toy_sentences]
    return TokenPairs.from_lists(ids, ids)


@pytest.fixture(scope="module")
def dev(tiny_vocab, toy_sentences) -> curves.DevSet:
    held = toy_sentences[-12:]
    return curves.DevSet(tuple(held), tuple(held), tiny_vocab)


def config(steps: int, **changes) -> TrainConfig:
    base = dict(steps=steps, batch_tokens=256, learning_rate=1e-2, warmup_steps=2, max_length=32,
                buckets=(16, 32), checkpoint_every=1000, label_smoothing=0.0)
    return TrainConfig(**{**base, **changes})


def test_eval_every_is_not_part_of_the_checkpoint_identity():
    assert TrainConfig(eval_every=7).to_dict() == TrainConfig().to_dict()
    assert "eval_every" not in TrainConfig(eval_every=7).to_dict()
    with pytest.raises(UserError, match="eval_every"):
        TrainConfig(eval_every=-1)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["ar", "padir"])
def test_train_flops_sum_the_compiled_step_per_batch_shape(tmp_path, copy_data, dev, kind, request, monkeypatch):
    cfg = config(6, eval_every=6)
    model = {"ar": request.getfixturevalue("ar_config").replace(**ONE_LAYER),
             "padir": request.getfixturevalue("padir_config").replace(**ONE_LAYER)}.get
    out = train("toy", model(kind), cfg, tmp_path / kind, progress=False, data=copy_data, dev=dev)
    meta = checkpoint.read_meta(out)
    per_shape = meta["step_flops"]                                  # "BxL" -> flops of one step
    assert per_shape and all(f > 0 for f in per_shape.values())
    batches = BucketedBatches(copy_data, cfg.batch_tokens, cfg.max_length, cfg.buckets, cfg.seed,
                              num_shards=jax.device_count())
    shapes = [batches.batch(step)["targets"].shape for step in range(cfg.steps)]
    expected = sum(per_shape[f"{b}x{n}"] for b, n in shapes)
    assert meta["train_flops"] == pytest.approx(expected, rel=1e-12) and meta["train_flops"] > 0
    # The estimate before training: the same compiled steps, weighted by batches per epoch.
    mix = batches.batches_per_shape()
    mean = sum(per_shape[f"{b}x{n}"] * count for (b, n), count in mix) / sum(c for _, c in mix)
    assert flops_per_step("toy", model(kind), cfg, data=copy_data) == pytest.approx(mean, rel=1e-12)
    # Measured the same way for every kind (narbench_core.probe): on a fake clock every timed run takes 0.25 s,
    # longer than sample_s, so each run is one step and each shape's median step 0.25 s.
    if kind == "ar":
        ticks = iter(np.arange(0.0, 1000.0, 0.25))
        monkeypatch.setattr(models.train, "time", SimpleNamespace(perf_counter=lambda: float(next(ticks))))
        assert seconds_per_step("toy", model(kind), cfg, data=copy_data, rounds=3) == pytest.approx(0.25)
    # One learning-curve point, at the last step, decoded with the kind's curve decoder.
    (point,) = curves.read_curve(out)
    assert point["step"] == 6 and 0.0 <= point["dev_bleu"] <= 100.0 and math.isfinite(point["dev_nll"])
    if kind == "padir":      # length accuracy on dev: exact <= within 2 tokens, both shares
        assert 0.0 <= point["dev_length_exact"] <= point["dev_length_within2"] <= 1.0
    else:
        assert "dev_length_exact" not in point


class _Interrupt(Exception):
    pass


@pytest.mark.slow
def test_curve_points_at_the_interval_survive_a_resume(tmp_path, copy_data, dev, ar_config):
    model = {"ar": ar_config.replace(**ONE_LAYER)}.get
    cfg = config(8, eval_every=2, checkpoint_every=4)
    whole = train("toy", model("ar"), cfg, tmp_path / "whole", progress=False, data=copy_data, dev=dev)
    points = curves.read_curve(whole)
    assert [p["step"] for p in points] == [2, 4, 6, 8]
    meta = checkpoint.read_meta(whole)
    assert points[-1]["seconds"] == meta["train_seconds"]           # train time only, up to that step
    assert [p["seconds"] for p in points] == sorted(p["seconds"] for p in points)
    assert meta["eval_seconds"] == pytest.approx(sum(p["eval_seconds"] for p in points))
    assert all(math.isfinite(p["dev_nll"]) and 0.0 <= p["dev_bleu"] <= 100.0 for p in points)
    assert points[-1]["dev_nll"] < points[0]["dev_nll"]            # it learns the copy task

    def stop_after_7(step, metrics):
        if step == 6:                                               # 7 steps done: points 2, 4, 6; checkpoint 4
            raise _Interrupt
    with pytest.raises(_Interrupt):
        train("toy", model("ar"), cfg, tmp_path / "split", progress=False, data=copy_data, dev=dev,
              on_step=stop_after_7)
    before = curves.read_curve(tmp_path / "split")
    assert [p["step"] for p in before] == [2, 4, 6] and checkpoint.latest_step(tmp_path / "split") == 4
    train("toy", model("ar"), cfg, tmp_path / "split", progress=False, data=copy_data, dev=dev)
    after = curves.read_curve(tmp_path / "split")
    assert [p["step"] for p in after] == [2, 4, 6, 8]               # 6 redone after the checkpoint, no duplicate
    assert after[:2] == before[:2]                                  # kept as written (same eval_seconds)
    # Evaluating changes nothing in training: the resumed curve is the uninterrupted one.
    np.testing.assert_allclose([p["dev_nll"] for p in after], [p["dev_nll"] for p in points], rtol=1e-5)
    assert [p["dev_bleu"] for p in after] == pytest.approx([p["dev_bleu"] for p in points], abs=1e-6)
    # train_flops keeps its running total across the resume: every step run counts, redone ones too.
    batches = BucketedBatches(copy_data, cfg.batch_tokens, cfg.max_length, cfg.buckets, cfg.seed,
                              num_shards=jax.device_count())
    per_shape = meta["step_flops"]
    flops = lambda steps: sum(per_shape["{}x{}".format(*batches.batch(s)["targets"].shape)] for s in steps)  # noqa: E731
    assert meta["train_flops"] == pytest.approx(flops(range(8)), rel=1e-12)
    split = checkpoint.read_meta(tmp_path / "split")
    assert split["train_flops"] == pytest.approx(flops(range(7)) + flops(range(4, 8)), rel=1e-12)
    assert split["step_flops"] == per_shape


def test_in_memory_training_with_curves_needs_a_dev_set(tmp_path, copy_data, ar_config):
    with pytest.raises(UserError, match="dev set"):
        train("toy", ar_config, config(2, eval_every=1), tmp_path / "x", progress=False, data=copy_data)


def test_a_task_that_knows_every_valid_target_scores_dev_bleu_against_all_of_them():
    dial = curves.dev_set("synthetic_d100", n=20)
    assert len(dial.others) == 2 and all(len(r) == 20 for r in dial.others)
    assert curves.dev_set("synthetic_d0", n=20).others == ()
    # An output that is another valid target than the task's own scores 100 against all of them.
    other_mode = list(dial.others[0])
    score = lambda dev, hyps: curves.DevEvaluator.bleu(SimpleNamespace(dev=dev), hyps)   # noqa: E731
    assert score(dial, other_mode) == pytest.approx(100.0)
    single = curves.DevSet(dial.sources, dial.references, dial.vocab)
    assert score(single, other_mode) < 50.0


def test_dev_nll_is_measured_against_the_nll_targets(tmp_path, copy_data, dev, ar_config):
    """A distilled task's dev set carries its teacher's outputs as the NLL targets (``nll_targets``): dev NLL is
    measured against them, dev BLEU against the references, and the record says which."""
    import dataclasses

    model, cfg = ar_config.replace(**ONE_LAYER), config(6, eval_every=6)
    others = tuple(reversed(dev.references))                  # targets the copy model was not trained towards
    taught = dataclasses.replace(dev, nll_targets=others)
    assert taught.targets == others and dev.targets == dev.references
    plain = train("toy", model, cfg, tmp_path / "plain", progress=False, data=copy_data, dev=dev)
    other = train("toy", model, cfg, tmp_path / "other", progress=False, data=copy_data, dev=taught)
    assert checkpoint.read_meta(plain)["dev_nll_targets"] == "references"
    assert checkpoint.read_meta(other)["dev_nll_targets"] == "teacher outputs"
    (a,), (b,) = curves.read_curve(plain), curves.read_curve(other)
    assert b["dev_bleu"] == pytest.approx(a["dev_bleu"])      # the same references, the same outputs
    assert b["dev_nll"] != pytest.approx(a["dev_nll"], rel=1e-4)  # other targets, another NLL
    _, params, _ = checkpoint.load(other)
    scorer, _ = models.train._curve_setup("toy", model, cfg, tmp_path / "x", 0,
                                          curves.DevSet(dev.sources, others, dev.vocab), in_memory=True)
    assert scorer.nll(params) == pytest.approx(b["dev_nll"], rel=1e-6)   # as if those were the references
    with pytest.raises(UserError, match="one per source"):
        dataclasses.replace(dev, nll_targets=others[1:])
