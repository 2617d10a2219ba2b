"""Training checkpoints on disk: orbax for the arrays, ``narbench.json`` for what they are.

Layout of one checkpoint folder::

    <dir>/narbench.json       task, model config, train config, vocab path, steps done, metrics,
                              "complete" (true only once training reached its last step)
    <dir>/state/<step>/       orbax items "params" and "opt_state" (the step is the folder name)
    <dir>/kept/<step>/        a copy of a step that later saves do not delete: where the plateau rule
                              fired (``models.train``), for a training continued past its plateau

Atomicity: orbax writes each step into a temporary folder and renames it when finalised, so a step
folder that a crash left half-written is never listed; ``narbench.json`` is replaced atomically
(``narbench_core.io``) and says ``complete`` only after the final step is saved.

Damage (a truncated or missing file, from a full disk or a bad copy) is never half-read: a
``narbench.json`` that is not JSON, or a step orbax cannot read whole, raises ``DamagedCheckpoint``
(a one-line ``UserError`` naming the folder). ``verify`` reads a folder's newest step to find out,
and ``set_aside`` moves a damaged folder's files out of the way (``models.train`` then retrains it).
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import jax
import numpy as np

from narbench_core.errors import UserError
from narbench_core.io import digest_files, file_digests, new_folder, write_json

META_FILE = "narbench.json"
STATE_DIR = "state"
KEPT_DIR = "kept"          # steps kept past the two newest (keep_step)
ITEM_NAMES = {"params": "parameters", "opt_state": "optimiser state"}    # a step's orbax items, as errors name them


class DamagedCheckpoint(UserError):
    """A checkpoint folder that cannot be read whole; ``path`` is the folder, ``what`` what is wrong."""

    def __init__(self, path: str | os.PathLike, what: str):
        self.path, self.what = Path(path), what
        super().__init__(f"checkpoint {path} is damaged: {what}; re-run the `narbench train` or `narbench run` "
                         "that wrote it to retrain it (it moves the damaged folder aside)")


def _reason(err: BaseException) -> str:
    """The first line of the innermost cause of ``err``, shortened: what a damage message quotes."""
    while err.__cause__ is not None:
        err = err.__cause__
    text = (str(err).strip().splitlines() or [type(err).__name__])[0]
    return text if len(text) <= 160 else text[:157] + "..."


def _abandoned_read(unraisable) -> bool:
    """Whether an unraisable exception comes from a read orbax abandoned: its coroutine, collected with
    its failure, or tensorstore finishing the read into orbax's closed event loop."""
    code = getattr(unraisable.object, "cr_code", None)
    if code is not None:
        return f"{os.sep}orbax{os.sep}" in code.co_filename
    return (unraisable.object is None and isinstance(unraisable.exc_value, RuntimeError)
            and str(unraisable.exc_value) == "Event loop is closed")


def _drop_abandoned_reads() -> None:
    """Keep a damage report one line: when one array of a restore fails, orbax closes its event loop with
    the other reads still in flight, and Python reports each one's failure when it ends or is collected
    (``Exception ignored in: ...`` and a traceback, often at exit: up to hundreds of lines). They are the
    damage reported; other unraisable exceptions still go to the hook that was installed."""
    previous = sys.unraisablehook
    if getattr(previous, "drops_orbax_reads", False):
        return

    def hook(unraisable):
        if not _abandoned_read(unraisable):
            previous(unraisable)
    hook.drops_orbax_reads = True
    sys.unraisablehook = hook


@contextlib.contextmanager
def _reading(ckpt_dir: Path, what: str):
    """Any failure of orbax reading ``what`` (files as saved, no template to mismatch) is damage. The
    abandoned reads of a failure are dropped from the read's start: tensorstore may finish one into the
    closed loop before the failure reaches this frame (a flake: one "Event loop is closed" traceback
    around the one-line error)."""
    _drop_abandoned_reads()
    try:
        yield
    except (UserError, MemoryError):
        raise
    except Exception as err:    # noqa: BLE001 - tensorstore raises ValueError, JSONDecodeError, bare Exception
        raise DamagedCheckpoint(ckpt_dir, f"{what} cannot be read ({_reason(err)})") from err


def _manager(ckpt_dir: Path, read_only: bool = False, folder: str = STATE_DIR):
    import orbax.checkpoint as ocp

    # Readers open without `create` (orbax's own read_only mode only adds warnings here).
    options = ocp.CheckpointManagerOptions(
        max_to_keep=2, create=not read_only, enable_async_checkpointing=False)
    return ocp.CheckpointManager(Path(ckpt_dir).absolute() / folder, options=options,
                                 item_names=("params", "opt_state"))


def read_meta(ckpt_dir: Path) -> dict | None:
    """The folder's ``narbench.json`` as a dict, or None when it has none."""
    path = Path(ckpt_dir) / META_FILE
    if not path.is_file():
        return None
    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DamagedCheckpoint(ckpt_dir, f"{META_FILE} is not valid JSON ({_reason(err)})") from None
    if not isinstance(meta, dict):
        raise DamagedCheckpoint(ckpt_dir, f"{META_FILE} holds no record")
    return meta


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
        try:
            out = mngr.restore(step, args=ocp.args.Composite(
                params=ocp.args.StandardRestore(_abstract(params_like)),
                opt_state=ocp.args.StandardRestore(_abstract(opt_state_like))))
        except Exception:
            verify(ckpt_dir, opt_state=True, step=step)   # damaged files: DamagedCheckpoint; else
            raise                                          # the templates do not fit (a bug): as is
    return out["params"], out["opt_state"], int(step)


def restore_params(ckpt_dir: Path, step: int | None = None, kept: bool = False) -> tuple[Any, int]:
    """Restore only the params (as saved: nested dicts of arrays) and their step (``kept``: of a step
    ``keep_step`` kept)."""
    import orbax.checkpoint as ocp

    with _manager(ckpt_dir, read_only=True, folder=KEPT_DIR if kept else STATE_DIR) as mngr:
        step = mngr.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint step in {ckpt_dir}")
        with _reading(ckpt_dir, f"the {ITEM_NAMES['params']} of step {step}"):
            out = mngr.restore(step, args=ocp.args.Composite(params=ocp.args.StandardRestore()))
    return out["params"], int(step)


def keep_step(ckpt_dir: Path, step: int) -> Path:
    """Copy saved step ``step`` to ``<dir>/kept/<step>/``, where later saves never delete it (whole or not at
    all, ``narbench_core.io.new_folder``); returns the copy. A step kept already is left as it is."""
    import shutil

    kept = Path(ckpt_dir) / KEPT_DIR / str(int(step))
    if not kept.is_dir():
        saved = Path(ckpt_dir) / STATE_DIR / str(int(step))
        new_folder(kept, lambda tmp: shutil.copytree(saved, tmp, dirs_exist_ok=True))
    return kept


def kept_steps(ckpt_dir: Path) -> list[int]:
    """The steps ``keep_step`` kept in ``ckpt_dir``, in order."""
    folder = Path(ckpt_dir) / KEPT_DIR
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.is_dir() else []


def verify(ckpt_dir: Path, opt_state: bool = False, step: int | None = None) -> int | None:
    """Read step ``step`` (default: the newest) of ``ckpt_dir`` whole, as saved: its parameters and,
    with ``opt_state``, its optimiser state; ``DamagedCheckpoint`` if any file is truncated or missing.
    Returns the step read (None when the folder has no step)."""
    import orbax.checkpoint as ocp

    items = ("params", "opt_state") if opt_state else ("params",)
    with _manager(ckpt_dir, read_only=True) as mngr:
        step = mngr.latest_step() if step is None else step
        if step is None:
            return None
        with _reading(ckpt_dir, f"the {' and '.join(ITEM_NAMES[k] for k in items)} of step {step}"):
            mngr.restore(step, args=ocp.args.Composite(**{k: ocp.args.StandardRestore() for k in items}))
    return int(step)


def set_aside(ckpt_dir: Path) -> Path:
    """Move what a (damaged) checkpoint folder holds into ``<folder>.damaged`` (``.damaged-2`` ... if taken),
    leaving the folder itself and the lock of the process holding it (``narbench_core.lock``) in place;
    returns where it went. Nothing is deleted."""
    from narbench_core.lock import LOCK_FILE

    ckpt_dir = Path(ckpt_dir)
    aside, n = ckpt_dir.with_name(ckpt_dir.name + ".damaged"), 2
    while aside.exists():
        aside, n = ckpt_dir.with_name(f"{ckpt_dir.name}.damaged-{n}"), n + 1
    aside.mkdir()
    for entry in ckpt_dir.iterdir():
        if entry.name != LOCK_FILE:
            entry.rename(aside / entry.name)
    return aside


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


EXPORT_FORMAT = 2          # 2: the checkpoint's parameter digest and the export's own files' digests are recorded


def params_digest(checkpoint_dir: str | os.PathLike) -> str:
    """A digest of the checkpoint's saved parameters (every file of its newest step's ``params``, path and
    bytes): two checkpoints share it only if their weights were saved alike, whatever their folders' names."""
    ckpt = Path(checkpoint_dir)
    step = latest_step(ckpt)
    root = ckpt / STATE_DIR / str(step) / "params"
    if step is None or not root.is_dir():
        raise DamagedCheckpoint(ckpt, "it has no saved parameters")
    return digest_files(root, sorted(p for p in root.rglob("*") if p.is_file()))


def export_stamp(checkpoint_dir: str | os.PathLike, quantization: str, **extra: Any) -> dict:
    """What an export of this checkpoint records in its folder's ``narbench.json`` (``models/ct2.py``,
    ``models/ort.py``): the checkpoint folder's name, its steps and its parameters' digest, the quantization,
    the export format and the exporter's ``extra`` keys (the export's ``files`` are added when written). A
    checkpoint without a record is ``load``'s one-line error."""
    meta = read_meta(checkpoint_dir) or load(checkpoint_dir)[2]
    return {"checkpoint": Path(checkpoint_dir).resolve().name, "steps_done": meta.get("steps_done"),
            "params_digest": params_digest(checkpoint_dir), "quantization": quantization,
            "format": EXPORT_FORMAT, **extra}


def export_damage(folder: str | os.PathLike) -> str | None:
    """What is wrong with an export's files against the digests its ``narbench.json`` recorded (None: whole)."""
    record = read_export_stamp(folder)
    if record is None or not isinstance(record.get("files"), dict) or not record["files"]:
        return "its narbench.json records no files (not a whole export of this narbench)"
    have = file_digests(folder)
    for name, (size, digest) in sorted(record["files"].items()):
        if name not in have:
            return f"{name} is missing"
        if have[name][0] != size:
            return f"{name} has {have[name][0]:,} bytes, not the {size:,} written (truncated or replaced)"
        if have[name][1] != digest:
            return f"{name} changed since it was written (its digest differs)"
    return None


def check_export(folder: str | os.PathLike, engine: str, command: str) -> None:
    """Refuse, in one line, an export whose files differ from the digests it recorded (truncated, replaced); an
    export that recorded none (written before narbench recorded them) is not checked."""
    if not isinstance((read_export_stamp(folder) or {}).get("files"), dict):
        return
    damage = export_damage(folder)
    if damage:
        raise UserError(f"the {engine} export {folder} does not load: {damage}; re-export it with `{command} "
                        "--force` (a suite run re-exports its own)")


def export_is(folder: str | os.PathLike, stamp: dict) -> bool:
    """``folder`` holds the export ``stamp`` describes, whole (its files as recorded)."""
    record = read_export_stamp(folder)
    if record is None or {k: v for k, v in record.items() if k != "files"} != stamp:
        return False
    return export_damage(folder) is None


def read_export_stamp(folder: str | os.PathLike) -> dict | None:
    """The ``narbench.json`` an export left in ``folder``, or None (none, unreadable, not JSON: damaged)."""
    try:
        record = json.loads((Path(folder) / META_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None
