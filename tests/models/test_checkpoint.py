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


def _truncate(path):
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)


def _largest(folder):
    return max((p for p in folder.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


def test_damaged_files_are_named_never_half_read(tmp_path):
    """A truncated params or optimiser file, or a truncated narbench.json: every reader raises
    DamagedCheckpoint naming the folder; templates that do not fit a whole checkpoint stay a plain error."""
    params, opt_state = _tree(2)
    healthy, damaged = tmp_path / "healthy", tmp_path / "damaged"
    for path in (healthy, damaged):
        checkpoint.save(path, 3, params, opt_state)
        checkpoint.write_meta(path, {"model_config": preset("tiny", kind="ar", vocab_size=40).to_dict(),
                                     "complete": True, "steps_done": 3})
    assert checkpoint.verify(healthy, opt_state=True) == 3
    wrong = {"dense": {"kernel": jnp.zeros((3, 3))}, "bias": jnp.zeros((7,))}
    with pytest.raises(Exception) as err:                          # a bug, not damage: as orbax raises it
        checkpoint.restore(healthy, wrong, opt_state)
    assert not isinstance(err.value, checkpoint.DamagedCheckpoint)

    _truncate(_largest(damaged / "state" / "3" / "opt_state"))
    assert checkpoint.verify(damaged) == 3                         # the params alone still read whole
    with pytest.raises(checkpoint.DamagedCheckpoint, match=r"is damaged: the parameters and optimiser state of step 3 cannot"):
        checkpoint.verify(damaged, opt_state=True)
    with pytest.raises(checkpoint.DamagedCheckpoint, match="the parameters and optimiser state of step 3"):
        checkpoint.restore(damaged, *jax.tree_util.tree_map(jnp.zeros_like, (params, opt_state)))

    _truncate(_largest(damaged / "state" / "3" / "params"))
    for read in (checkpoint.restore_params, checkpoint.verify, checkpoint.load):
        with pytest.raises(checkpoint.DamagedCheckpoint) as err:
            read(damaged)
        assert err.value.path == damaged and str(err.value).startswith(f"checkpoint {damaged} is damaged: ")
        assert "of step 3 cannot be read (" in str(err.value) and len(str(err.value).splitlines()) == 1

    _truncate(damaged / checkpoint.META_FILE)
    with pytest.raises(checkpoint.DamagedCheckpoint, match="narbench.json is not valid JSON"):
        checkpoint.read_meta(damaged)
    with pytest.raises(checkpoint.DamagedCheckpoint, match="narbench.json is not valid JSON"):
        checkpoint.load(damaged)


def test_set_aside_moves_and_never_deletes(tmp_path):
    """The files go to <folder>.damaged (then -2 ...); the folder and the holder's lock stay."""
    from narbench_core.lock import LOCK_FILE

    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / LOCK_FILE).write_text("me")
    for expected in ("ckpt.damaged", "ckpt.damaged-2"):
        (folder / "narbench.json").write_text("{")
        (folder / "state").mkdir()
        assert checkpoint.set_aside(folder) == tmp_path / expected
        assert sorted(p.name for p in folder.iterdir()) == [LOCK_FILE]
        assert sorted(p.name for p in (tmp_path / expected).iterdir()) == ["narbench.json", "state"]
        assert (tmp_path / expected / "narbench.json").read_text() == "{"


def test_a_damage_report_silences_only_the_reads_orbax_abandoned(tmp_path, monkeypatch):
    """orbax closes its event loop with the other reads of a failed restore in flight; Python would report
    each (hundreds of lines after the one-line error). After a damage report those reports are dropped:
    an orbax read's coroutine, tensorstore finishing into the closed loop; anything else still reaches
    the hook that was installed."""
    import os
    import sys
    import types

    params, opt_state = _tree(3)
    checkpoint.save(tmp_path, 1, params, opt_state)
    reported = []
    monkeypatch.setattr(sys, "unraisablehook", reported.append)
    _truncate(_largest(tmp_path / "state" / "1" / "params"))
    with pytest.raises(checkpoint.DamagedCheckpoint):
        checkpoint.restore_params(tmp_path)
    scope = {}
    exec(compile("async def read():\n    pass\n", os.path.join("site-packages", "orbax", "serialization.py"), "exec"),
         scope)
    abandoned = scope["read"]()

    def unraisable(obj, exc):
        return types.SimpleNamespace(object=obj, exc_value=exc, exc_type=type(exc), exc_traceback=None, err_msg=None)
    dropped = [unraisable(abandoned, Exception("Encountered error while reading array index")),
               unraisable(None, RuntimeError("Event loop is closed"))]
    kept = [unraisable(None, RuntimeError("something else")), unraisable(object(), Exception("elsewhere"))]
    for report in dropped + kept:
        sys.unraisablehook(report)
    abandoned.close()
    assert all(any(r is k for r in reported) for k in kept)
    assert not any(r is d for r in reported for d in dropped)


def test_abandoned_reads_are_dropped_from_the_start_of_a_read(tmp_path, monkeypatch):
    """tensorstore can finish an abandoned read into orbax's closed loop before the failure reaches
    ``_reading``'s handler: the hook must already be in place when the read starts."""
    import sys
    import types

    reported = []
    monkeypatch.setattr(sys, "unraisablehook", reported.append)
    closed = types.SimpleNamespace(object=None, exc_value=RuntimeError("Event loop is closed"),
                                   exc_type=RuntimeError, exc_traceback=None, err_msg=None)
    with checkpoint._reading(tmp_path, "the parameters of step 1"):
        sys.unraisablehook(closed)                       # before anything failed
    assert reported == []
