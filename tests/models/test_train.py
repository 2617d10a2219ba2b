"""Training: tiny AR and PaDIR learn toy tasks to exact match; resume equals an uninterrupted run;
a diverging run stops with a clear error and keeps its last good checkpoint."""
from __future__ import annotations

import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from narbench_core.errors import UserError
from models import checkpoint, decoding, refine, t5
from models.batching import TokenPairs
from models.config import preset
from models.train import TrainConfig, train
from tiny_models import ONE_LAYER
from xla_settings import optimizations

VOCAB, MAX_LEN = 24, 12


def toy_pairs(n: int, mode: str, seed: int) -> tuple[list, list]:
    """Sources of 3-8 symbols from ids 4..19 (no two equal neighbours, so PaDIR's repeat-dropping
    cannot hurt), EOS-terminated; targets are the copy or the reversal."""
    rng = np.random.default_rng(seed)
    sources, targets = [], []
    for _ in range(n):
        s = 4 + np.cumsum(rng.integers(1, 16, size=rng.integers(3, 9))) % 16
        sources.append(list(s) + [1])
        targets.append((list(s[::-1]) if mode == "reverse" else list(s)) + [1])
    return sources, targets


def padded(seqs: list) -> np.ndarray:
    out = np.zeros((len(seqs), MAX_LEN), np.int32)
    for i, s in enumerate(seqs):
        out[i, :len(s)] = s
    return out


def toy_config(steps: int, **changes) -> TrainConfig:
    base = dict(steps=steps, batch_tokens=512, learning_rate=3e-2, warmup_steps=20, max_length=MAX_LEN,
                buckets=(MAX_LEN,), checkpoint_every=1000, label_smoothing=0.0)
    return TrainConfig(**{**base, **changes})


def tiny(kind: str, **changes):
    return preset("tiny", kind=kind, vocab_size=VOCAB, dropout_rate=0.0, **changes)


def exact_match(ckpt_dir, mode: str) -> float:
    """Share of 64 unseen toy sources decoded exactly (AR: uncached greedy; PaDIR: refine:4). Compiled without XLA's
    optimizations inside these ``optimized`` tests: the decode runs once (PaDIR's compiled ~8 s sooner so)."""
    with optimizations(False):
        return _exact_match(ckpt_dir, mode)


def _exact_match(ckpt_dir, mode: str) -> float:
    config, params, _ = checkpoint.load(ckpt_dir)
    model = t5.make_model(config)
    sources, targets = toy_pairs(64, mode, seed=123)
    x, y = jnp.asarray(padded(sources)), padded(targets)
    if config.kind == "ar":
        def decode(params, x):                                       # the weights are arguments, not constants
            step_logits = lambda seqs, i: model.apply({"params": params}, x, seqs)[:, i]          # [b, V]
            return decoding.greedy_search_uncached(step_logits, 64, MAX_LEN).tokens
    else:
        def decode(params, x):
            variables = {"params": params}
            encoded = model.apply(variables, x, method="encode")
            lengths = refine.top_k_lengths(model.apply(variables, encoded, x, method="predict_length"), 1, MAX_LEN)
            refine_fn = lambda tok, mask: model.apply(variables, encoded, x, tok, mask, method="refine")
            return refine.refine_length_hypotheses(
                refine_fn, lengths, MAX_LEN, 4, jax.random.PRNGKey(0), remask="none", vocab_size=VOCAB,
                fixed_eos=config.fixed_eos).tokens
    out = jax.jit(decode)(params, x)
    out = np.asarray(out)[:, :MAX_LEN]
    return float(np.mean([(out[i] == y[i]).all() for i in range(len(y))]))


@pytest.mark.slow
@pytest.mark.optimized
def test_ar_learns_reversal(tmp_path):
    data = TokenPairs.from_lists(*toy_pairs(4000, "reverse", seed=0))
    out = train("toy_reverse", tiny("ar"), toy_config(300), tmp_path / "ar", progress=False, data=data)
    assert exact_match(out, "reverse") >= 0.95
    meta = checkpoint.read_meta(out)
    assert meta["complete"] and meta["steps_done"] == 300 and meta["kind"] == "ar"
    for key in ("compile_seconds", "train_seconds", "wall_seconds", "target_tokens_per_second",
                "padding_share", "final_loss", "num_params"):
        assert meta[key] > 0, key
    assert isinstance(meta["stopped_seconds"], float)  # recorded; its values: tests/core/test_stopped.py (fake clocks)
    assert meta["final_loss"] < 0.1


@pytest.mark.slow
@pytest.mark.optimized
@pytest.mark.parametrize("recipe, steps", [("plain", 400), ("reference", 250)])
def test_padir_learns_copy(tmp_path, recipe, steps):
    """Both the plain recipe and the reference one (fixed EOS, [LENGTH] query, stage-2 remasking), each in a number
    of steps it needs (2-core AMD EPYC VM, 2026-12-03, exact match: plain 0.14 / 0.55 / 0.80 at 200 / 250 / 300
    steps; reference 0.98 at 200, 1.0 at 250 to 400)."""
    data = TokenPairs.from_lists(*toy_pairs(4000, "copy", seed=0))
    ref = recipe == "reference"
    config = tiny("padir", fixed_eos=ref, length_token=ref)
    out = train("toy_copy", config, toy_config(steps, stage_remask=ref), tmp_path / "padir", progress=False, data=data)
    assert exact_match(out, "copy") >= 0.95
    meta = checkpoint.read_meta(out)
    assert meta["last_metrics"]["length_accuracy"] > 0.9
    assert meta["train_config"]["stages"] == 2 and meta["train_config"]["unmask_rate"] == 0.15


class _Interrupt(Exception):
    pass


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["ar", "padir"])
def test_resume_equals_uninterrupted_run(tmp_path, kind):
    data = TokenPairs.from_lists(*toy_pairs(300, "copy", seed=1))
    config = preset("tiny", kind=kind, vocab_size=VOCAB, **ONE_LAYER)   # dropout on: keys must line up too
    cfg = toy_config(12, checkpoint_every=4, learning_rate=1e-2, warmup_steps=3)
    whole = train("toy", config, cfg, tmp_path / "whole", progress=False, data=data)

    def stop_at_6(step, metrics):
        if step == 6:
            raise _Interrupt
    with pytest.raises(_Interrupt):
        train("toy", config, cfg, tmp_path / "split", progress=False, data=data, on_step=stop_at_6)
    meta = checkpoint.read_meta(tmp_path / "split")
    assert not meta["complete"] and meta["steps_done"] == 4 and checkpoint.latest_step(tmp_path / "split") == 4
    seen = []
    train("toy", config, cfg, tmp_path / "split", progress=False, data=data,
          on_step=lambda step, m: seen.append(step))
    assert seen == list(range(4, 12))                               # resumed after the last checkpoint
    _, a, _ = checkpoint.load(whole)
    _, b, meta = checkpoint.load(tmp_path / "split")
    assert meta["complete"] and meta["steps_done"] == 12
    jax.tree_util.tree_map(lambda u, v: np.testing.assert_allclose(u, v, rtol=1e-6, atol=1e-7), a, b)
    # A finished run is skipped: no step runs again.
    train("toy", config, cfg, tmp_path / "split", progress=False, data=data,
          on_step=lambda step, m: pytest.fail("a finished training ran again"))


@pytest.mark.slow
def test_divergence_stops_and_keeps_last_good_checkpoint(tmp_path):
    data = TokenPairs.from_lists(*toy_pairs(300, "copy", seed=2))
    cfg = toy_config(30, checkpoint_every=1, learning_rate=1e30, warmup_steps=4)   # explodes in warm-up
    out = tmp_path / "nan"
    with pytest.raises(UserError, match=r"diverged at step (\d+)") as err:
        train("toy", tiny("ar", **ONE_LAYER), cfg, out, progress=False, data=data)
    failed = int(re.search(r"diverged at step (\d+)", str(err.value)).group(1))
    last = checkpoint.latest_step(out)
    assert last is not None and 1 <= last < failed
    assert f"step {last}" in str(err.value)
    meta = checkpoint.read_meta(out)
    assert not meta["complete"] and meta["steps_done"] == last
    params, _ = checkpoint.restore_params(out)
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree_util.tree_leaves(params))
    with pytest.raises(UserError, match="unfinished"):
        checkpoint.load(out)


def test_optimizer_choice():
    """Both optimizers give a finite update that changes the parameters; an unknown one is a one-line error."""
    from models.train import make_optimizer

    params = {"w": jnp.ones((4, 3)), "b": jnp.zeros((3,))}
    grads = {"w": jnp.full((4, 3), 0.5), "b": jnp.ones((3,))}
    for name in ("adafactor", "adam"):
        tx = make_optimizer(toy_config(10, optimizer=name))
        updates, _ = tx.update(grads, tx.init(params), params)
        flat = jnp.concatenate([u.ravel() for u in jax.tree_util.tree_leaves(updates)])
        assert bool(jnp.all(jnp.isfinite(flat))) and float(jnp.abs(flat).max()) > 0, name
    with pytest.raises(UserError, match="optimizer"):
        toy_config(10, optimizer="sgd")


def _truncate_largest(folder):
    """Keep the first half of the largest file in ``folder`` (or of ``folder`` itself, a file)."""
    path = max((p for p in [folder, *folder.rglob("*")] if p.is_file()), key=lambda p: p.stat().st_size)
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)


@pytest.mark.slow
def test_damaged_checkpoint_is_retrained_or_refused(tmp_path, capsys):
    """A cached checkpoint with a truncated file is refused in one line with retrain_damaged=False (the
    folder untouched), and by default moved to <folder>.damaged and trained afresh; an unfinished one
    whose optimiser state is truncated, or a truncated narbench.json, the same."""
    data = TokenPairs.from_lists(*toy_pairs(100, "copy", seed=3))
    cfg = toy_config(2, warmup_steps=1, checkpoint_every=1)
    out, model = tmp_path / "ar", tiny("ar", **ONE_LAYER)
    never = lambda step, m: pytest.fail("a refused checkpoint trained")
    train("toy", model, cfg, out, progress=False, data=data)
    _truncate_largest(out / "state" / "2" / "params")
    before = sorted((p.relative_to(out), p.stat().st_size) for p in out.rglob("*"))
    with pytest.raises(UserError, match=rf"checkpoint {out} is damaged: the parameters of step 2 cannot be read .*"
                                        "delete it to retrain it .*--refuse-damaged") as err:
        train("toy", model, cfg, out, progress=False, data=data, retrain_damaged=False, on_step=never)
    assert len(str(err.value).splitlines()) == 1
    assert sorted((p.relative_to(out), p.stat().st_size) for p in out.rglob("*")) == before
    assert not (tmp_path / "ar.damaged").exists()

    capsys.readouterr()
    seen = []
    train("toy", model, cfg, out, progress=False, data=data, on_step=lambda step, m: seen.append(step))
    assert seen == [0, 1]                                                 # trained afresh
    assert f"checkpoint {out} is damaged (the parameters of step 2" in capsys.readouterr().err
    assert sorted(p.relative_to(tmp_path / "ar.damaged") for p in (tmp_path / "ar.damaged").rglob("*")) == \
        sorted(p for p, _ in before)                                      # moved aside whole
    assert checkpoint.load(out)[2]["steps_done"] == 2

    def stop_after_first(step, m):
        if step == 1:
            raise _Interrupt
    shutil.rmtree(out)
    with pytest.raises(_Interrupt):
        train("toy", model, cfg, out, progress=False, data=data, on_step=stop_after_first)
    assert checkpoint.latest_step(out) == 1 and not checkpoint.read_meta(out)["complete"]
    _truncate_largest(out / "state" / "1" / "opt_state")
    seen.clear()
    train("toy", model, cfg, out, progress=False, data=data, on_step=lambda step, m: seen.append(step))
    assert seen == [0, 1] and (tmp_path / "ar.damaged-2").is_dir()        # not resumed from step 1

    _truncate_largest(out / "narbench.json")
    seen.clear()
    train("toy", model, cfg, out, progress=False, data=data, on_step=lambda step, m: seen.append(step))
    assert seen == [0, 1] and (tmp_path / "ar.damaged-3").is_dir()
    assert "narbench.json is not valid JSON" in capsys.readouterr().err
