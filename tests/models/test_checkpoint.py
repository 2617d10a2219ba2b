"""Checkpoint module: save/restore round trip, half-written steps ignored, load() for inference."""
from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from narbench_core.errors import UserError
from models import checkpoint
from models.config import preset
from models.t5 import init_params


def _tree(seed: int):
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    params = {"dense": {"kernel": jax.random.normal(k1, (130, 140))}, "bias": jax.random.normal(k2, (7,))}
    tx = optax.adafactor(1e-3)
    opt_state = tx.init(params)
    grads = jax.tree_util.tree_map(jnp.ones_like, params)
    _, opt_state = tx.update(grads, opt_state, params)             # non-trivial factored moments
    return params, opt_state


def _equal(a, b):
    jax.tree_util.tree_map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), a, b)


def test_save_restore_round_trip_keeps_two_newest(tmp_path):
    params, opt_state = _tree(0)
    for step in (3, 6, 9):
        checkpoint.save(tmp_path, step, jax.tree_util.tree_map(lambda x: x + step, params), opt_state)
    assert checkpoint.latest_step(tmp_path) == 9
    assert sorted(p.name for p in (tmp_path / "state").iterdir() if p.name.isdigit()) == ["6", "9"]
    zeros = jax.tree_util.tree_map(jnp.zeros_like, (params, opt_state))
    p, o, step = checkpoint.restore(tmp_path, *zeros)
    assert step == 9
    _equal(p, jax.tree_util.tree_map(lambda x: x + 9, params))
    _equal(o, opt_state)
    assert jax.tree_util.tree_structure(o) == jax.tree_util.tree_structure(opt_state)
    p6, _, _ = checkpoint.restore(tmp_path, *zeros, step=6)
    _equal(p6, jax.tree_util.tree_map(lambda x: x + 6, params))
    only, step = checkpoint.restore_params(tmp_path)
    _equal(only, jax.tree_util.tree_map(lambda x: x + 9, params))


def test_half_written_step_is_never_taken(tmp_path):
    params, opt_state = _tree(1)
    checkpoint.save(tmp_path, 5, params, opt_state)
    # What a crash during orbax's save of step 8 leaves behind: its temporary folder, unfinalised.
    tmp = tmp_path / "state" / "8.orbax-checkpoint-tmp-1234567"
    (tmp / "params").mkdir(parents=True)
    (tmp / "params" / "garbage").write_bytes(b"\0" * 10)
    assert checkpoint.latest_step(tmp_path) == 5
    _, step = checkpoint.restore_params(tmp_path)
    assert step == 5


def test_no_checkpoint_means_none_and_file_not_found(tmp_path):
    assert checkpoint.latest_step(tmp_path / "missing") is None
    with pytest.raises(FileNotFoundError):
        checkpoint.restore_params(tmp_path)


def test_meta_is_written_atomically(tmp_path):
    checkpoint.write_meta(tmp_path, {"a": 1})
    checkpoint.write_meta(tmp_path, {"a": 2, "b": [1, 2]})
    assert checkpoint.read_meta(tmp_path) == {"a": 2, "b": [1, 2]}
    assert [p.name for p in tmp_path.iterdir()] == ["narbench.json"]      # no temp files left
    assert checkpoint.read_meta(tmp_path / "nothing") is None


def test_load_for_inference(tmp_path):
    config = preset("tiny", kind="padir", vocab_size=40)
    params = init_params(config, jax.random.PRNGKey(0))
    with pytest.raises(UserError, match="no checkpoint"):
        checkpoint.load(tmp_path)
    meta = {"task": "toy", "model_config": config.to_dict(), "train_config": {"steps": 10},
            "complete": False, "steps_done": 4}
    checkpoint.write_meta(tmp_path, meta)
    with pytest.raises(UserError, match="no saved step"):
        checkpoint.load(tmp_path, require_complete=False)
    checkpoint.save(tmp_path, 4, params, optax.adafactor(1e-3).init(params))
    with pytest.raises(UserError, match="unfinished .*step 4 of 10"):
        checkpoint.load(tmp_path)
    checkpoint.write_meta(tmp_path, {**meta, "complete": True, "steps_done": 10})
    loaded_config, loaded, info = checkpoint.load(tmp_path)
    assert loaded_config == config and info["task"] == "toy" and info["restored_step"] == 4
    _equal(loaded, params)
    json.dumps(info)                                                      # meta stays plain JSON
