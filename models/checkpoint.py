"""Training checkpoints on disk: orbax for the arrays, ``narbench.json`` for what they are.

Layout of one checkpoint folder::

    <dir>/narbench.json       task, model config, train config, vocab path, steps done, metrics,
                              "complete" (true only once training reached its last step)
    <dir>/state/<step>/       orbax items "params" and "opt_state" (the step is the folder name)

Atomicity: orbax writes each step into a temporary folder and renames it when finalised, so a step
folder that a crash left half-written is never listed; ``narbench.json`` is replaced atomically
(``narbench_core.io``) and says ``complete`` only after the final step is saved.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jax
import numpy as np

from narbench_core.errors import UserError
from narbench_core.io import write_json

META_FILE = "narbench.json"
STATE_DIR = "state"


def _manager(ckpt_dir: Path, read_only: bool = False):
    import orbax.checkpoint as ocp

    # Readers open without `create` (orbax's own read_only mode only adds warnings here).
    options = ocp.CheckpointManagerOptions(
        max_to_keep=2, create=not read_only, enable_async_checkpointing=False)
    return ocp.CheckpointManager(Path(ckpt_dir).absolute() / STATE_DIR, options=options,
                                 item_names=("params", "opt_state"))


def read_meta(ckpt_dir: Path) -> dict | None:
    """The folder's ``narbench.json`` as a dict, or None when it has none."""
    path = Path(ckpt_dir) / META_FILE
    if not path.is_file():
        return None
    with open(path) as f:
        return json.load(f)


def write_meta(ckpt_dir: Path, meta: dict) -> None:
    write_json(Path(ckpt_dir) / META_FILE, meta)


def latest_step(ckpt_dir: Path) -> int | None:
    """The newest fully written step in ``ckpt_dir``, or None."""
    if not (Path(ckpt_dir) / STATE_DIR).is_dir():
        return None
    with _manager(ckpt_dir, read_only=True) as mngr:
        return mngr.latest_step()


def save(ckpt_dir: Path, step: int, params: Any, opt_state: Any) -> None:
    """Save params and optimizer state as ``step`` (blocking; keeps the two newest steps)."""
    import orbax.checkpoint as ocp

    with _manager(ckpt_dir) as mngr:
        mngr.save(int(step), args=ocp.args.Composite(
            params=ocp.args.StandardSave(params), opt_state=ocp.args.StandardSave(opt_state)),
            force=True)
        mngr.wait_until_finished()


def _abstract(tree: Any) -> Any:
    """ShapeDtypeStructs (keeping shardings) for a concrete or abstract pytree."""
    def leaf(x):
        sharding = getattr(x, "sharding", None)
        return jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=sharding)
    return jax.tree_util.tree_map(leaf, tree)


def restore(ckpt_dir: Path, params_like: Any, opt_state_like: Any,
            step: int | None = None) -> tuple[Any, Any, int]:
    """Restore ``(params, opt_state, step)`` shaped (and sharded) like the given templates.

    ``step`` None means the newest complete step; raises FileNotFoundError when there is none.
    """
    import orbax.checkpoint as ocp

    with _manager(ckpt_dir, read_only=True) as mngr:
        step = mngr.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint step in {ckpt_dir}")
        out = mngr.restore(step, args=ocp.args.Composite(
            params=ocp.args.StandardRestore(_abstract(params_like)),
            opt_state=ocp.args.StandardRestore(_abstract(opt_state_like))))
    return out["params"], out["opt_state"], int(step)


def restore_params(ckpt_dir: Path, step: int | None = None) -> tuple[Any, int]:
    """Restore only the params (as saved: nested dicts of arrays) and their step."""
    import orbax.checkpoint as ocp

    with _manager(ckpt_dir, read_only=True) as mngr:
        step = mngr.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint step in {ckpt_dir}")
        out = mngr.restore(step, args=ocp.args.Composite(params=ocp.args.StandardRestore()))
    return out["params"], int(step)


def load(checkpoint_dir: str | os.PathLike, require_complete: bool = True
         ) -> tuple[Any, Any, dict]:
    """``(model_config, params, meta)`` of a trained checkpoint folder, for inference.

    ``meta`` is the folder's ``narbench.json`` (task, train config, vocab path, steps done ...).
    Raises ``UserError`` when the folder has no checkpoint, or (``require_complete``) when its
    training has not finished.
    """
    from models.config import ModelConfig

    path = Path(checkpoint_dir)
    meta = read_meta(path)
    if meta is None:
        raise UserError(f"no checkpoint in {path} (no {META_FILE}); train one with `narbench train`"
                        " or pass the folder that `narbench train --out` wrote")
    if require_complete and not meta.get("complete"):
        raise UserError(f"training in {path} is unfinished (step {meta.get('steps_done', 0)} of "
                        f"{meta.get('train_config', {}).get('steps')}); re-run the same "
                        "`narbench train` command to resume it")
    try:
        params, step = restore_params(path)
    except FileNotFoundError:
        raise UserError(f"checkpoint {path} has no saved step; re-run `narbench train` to "
                        "produce it") from None
    meta = dict(meta, restored_step=step)
    model_config = ModelConfig.from_dict(meta["model_config"])
    return model_config, params, meta


IDENTITY_FIELDS = ("task", "model_config", "train_config", "vocab_hash", "data", "steps_done")


def identity(meta: dict) -> dict:
    """What names a trained model whatever folder it sits in: task, configs, vocabulary, data, steps
    (a student's checkpoint hash covers its teacher's or warm-start source's identity)."""
    return {k: meta.get(k) for k in IDENTITY_FIELDS}
