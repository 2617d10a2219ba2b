"""Training for the AR T5 and PaDIR: config, optimizer, the pure train step and the resumable loop.

Recipe (paper, Appendix L.2): Adafactor with t5x defaults, linear warm-up then cosine decay to a
minimum learning rate, dropout from the model config. AR: teacher-forced cross-entropy. PaDIR: the
decoder refines a noisy hypothesis (``unmask_rate`` of the target tokens correct, the rest random
ids >= 4); stage s > 1 refines stage s-1's argmax (no gradient through it); token losses are
averaged over the ``stages``; plus ``length_loss_weight`` x the length predictor's cross-entropy.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from narbench_core.digest import json_digest
from narbench_core import defaults, hugepages, lock, probe, stopped
from narbench_core.defaults import TRAIN_BUCKETS
from narbench_core.errors import UserError
from models import checkpoint, losses, refine, sharding
from models import schedule as schedules
from narbench_core.tokens import EOS_ID
from models.batching import BucketedBatches, TokenPairs
from models.config import ModelConfig, unhashed_at_default, identity_dict, setting_field


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 3000
    batch_tokens: int = 4096          # padded target tokens per batch (rows = batch_tokens // length)
    learning_rate: float = 3e-3       # peak (paper: 3e-3)
    warmup_steps: int = 200           # linear ramp from min_learning_rate to the peak
    min_learning_rate: float = 1e-5   # cosine decays to this (paper: 1e-5)
    seed: int = 0
    unmask_rate: float = 0.15         # PaDIR: share of target tokens kept correct in the input
    stages: int = 2                   # PaDIR: training stages (stage s refines stage s-1's argmax)
    length_loss_weight: float = 0.1   # PaDIR: weight of the length predictor's cross-entropy
    label_smoothing: float = 0.1
    max_length: int = 128             # longer examples are truncated (counted in narbench.json)
    buckets: tuple[int, ...] = TRAIN_BUCKETS
    checkpoint_every: int = 500
    eval_every: int = setting_field(0, "steps between learning-curve points (dev NLL and BLEU, "
                                     "models/curves.py); 0: none")
    optimizer: str = "adafactor"      # "adafactor" (paper, t5x defaults) or "adam" (clip 1.0, b2 0.98)
    # PaDIR recipe detail of the reference implementation (google-research padir/), off by default only
    # because checkpoints trained before it existed had it off (see also ModelConfig.fixed_eos):
    stage_remask: bool = unhashed_at_default(False, "PaDIR: stage s > 1 sees stage s-1's argmax with stutter "
                                             "re-masked, as refinement iteration t + 1 does at inference")
    glancing: bool = unhashed_at_default(False, "PaDIR: glancing training (GLAT): stage 1's correct tokens are "
                                         "the glancing ratio x the errors of a no-gradient pass from pure noise, "
                                         "instead of unmask_rate of all tokens (unmask_rate then acts nowhere)")
    glance_start: float = unhashed_at_default(defaults.GLANCE_START, "PaDIR with glancing: the glancing ratio at "
                                              "step 0, annealed linearly to glance_end at `steps`")
    glance_end: float = unhashed_at_default(defaults.GLANCE_END, "PaDIR with glancing: the glancing ratio at `steps`")
    # When to stop and the learning rate on the way (models/schedule.py):
    until: str = unhashed_at_default("steps", "steps: train `steps` steps; plateau: stop when the dev signal "
                                              "(signal) stops improving (patience, min_delta), `steps` a cap")
    patience: int = unhashed_at_default(3, "plateau: evaluations in a row without progress past min_delta")
    signal: str = unhashed_at_default("dev_bleu", "plateau: the curve value the rule reads: dev_bleu (a rise is "
                                                 "progress) or dev_nll (a fall is progress)")
    min_delta: float = unhashed_at_default(0.2, "plateau: the progress over the best that counts (the signal's "
                                                "units: BLEU points or nats per token)")
    smooth: int = unhashed_at_default(1, "plateau: the rule reads the mean of its signal's last `smooth` points "
                                         "(1: each point as measured)")
    patience_share: float = unhashed_at_default(0.0, "plateau: the patience grows with the training: at least this "
                                                     "share of the evaluations so far (0: `patience` alone)")
    min_steps: int = unhashed_at_default(0, "plateau: the rule does not fire before this step")
    dev_sentences: int = setting_field(defaults.CURVE_SENTENCES, "dev sentences each curve point decodes (a seeded "
                                       "sample of the dev split; 0: the whole split)")
    schedule: str = unhashed_at_default("cosine", "after warm-up: cosine to min_learning_rate at `steps`, or "
                                                  "wsd (constant, then a linear decay, then stop)")
    decay_share: float = unhashed_at_default(0.2, "wsd: decay steps per step run before the decay")

    def __post_init__(self):
        checks = {"steps": self.steps >= 1, "batch_tokens": self.batch_tokens >= self.max_length,
                  "learning_rate": self.learning_rate > 0, "warmup_steps": self.warmup_steps >= 0,
                  "min_learning_rate": 0 <= self.min_learning_rate <= self.learning_rate,
                  "unmask_rate": 0.0 <= self.unmask_rate <= 1.0, "stages": self.stages >= 1,
                  "glance_start": 0.0 <= self.glance_start <= 1.0, "glance_end": 0.0 <= self.glance_end <= 1.0,
                  "length_loss_weight": self.length_loss_weight >= 0,
                  "label_smoothing": 0.0 <= self.label_smoothing < 1.0,
                  "max_length": self.max_length >= 2, "checkpoint_every": self.checkpoint_every >= 1,
                  "eval_every": self.eval_every >= 0,
                  "optimizer": self.optimizer in OPTIMIZERS, "until": self.until in defaults.TRAIN_UNTIL,
                  "signal": self.signal in defaults.PLATEAU_SIGNALS, "patience": self.patience >= 1,
                  "min_delta": self.min_delta >= 0, "smooth": self.smooth >= 1,
                  "patience_share": 0.0 <= self.patience_share < 1.0, "min_steps": self.min_steps >= 0,
                  "dev_sentences": self.dev_sentences >= 0,
                  "schedule": self.schedule in defaults.LR_SCHEDULES, "decay_share": 0 <= self.decay_share < 1}
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise UserError(f"invalid training config value(s) for {', '.join(bad)}: "
                            f"{ {name: getattr(self, name) for name in bad} }")
        if self.until == "plateau" and not self.eval_every:
            raise UserError("until = \"plateau\" needs eval_every: the steps between dev evaluations")
        if self.until == "plateau" and self.schedule == "cosine":
            raise UserError("until = \"plateau\" needs schedule = \"wsd\": a cosine schedule needs the total "
                            "number of steps in advance")
        object.__setattr__(self, "buckets", tuple(int(b) for b in self.buckets))

    def replace(self, **changes: Any) -> "TrainConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The training's identity (part of the checkpoint's hash): every field but settings, and the
        evaluation interval only where it decides when the training stops."""
        out = {**identity_dict(self), "buckets": list(self.buckets)}
        if self.until == "plateau":
            out["eval_every"] = self.eval_every
            if self.dev_sentences != defaults.CURVE_SENTENCES:      # the rule's signal: hashed where it is not the default
                out["dev_sentences"] = self.dev_sentences
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrainConfig":
        return cls(**{**data, "buckets": tuple(data.get("buckets", TRAIN_BUCKETS))})


OPTIMIZERS = ("adafactor", "adam")


class TrainState(NamedTuple):
    step: jax.Array      # [] int32, steps done
    params: Any
    opt_state: Any


# -- optimizer ----------------------------------------------------------------------------------
def make_optimizer(cfg: TrainConfig, decay_start: int | None = None) -> optax.GradientTransformation:
    """``adafactor``: optax Adafactor with t5x's defaults (factored second moments, decay 0.8, update
    clipping 1.0, steps scaled by the parameter RMS, no momentum): the paper's recipe.
    ``adam``: Adam (b2 0.98) after global-norm clipping at 1.0, the calibration reference recipe, for
    comparison (on this machine Adafactor reached the lower loss in 150 steps; see suites/specs/default.toml)."""
    rate = schedules.learning_rate_schedule(cfg, decay_start)
    if cfg.optimizer == "adam":
        return optax.chain(optax.clip_by_global_norm(1.0), optax.adam(rate, b1=0.9, b2=0.98, eps=1e-9))
    return optax.adafactor(rate, decay_rate=0.8, clipping_threshold=1.0,
                           multiply_by_parameter_scale=True, momentum=None, factored=True)


# -- model glue -----------------------------------------------------------------------------------
def build_model(model_config: ModelConfig):
    from models import t5

    return t5.make_model(model_config)


def effective_config(model_config: ModelConfig, train_config: TrainConfig) -> TrainConfig:
    """``train_config`` with ``max_length`` capped at the model's ``max_target_length``."""
    if train_config.max_length > model_config.max_target_length:
        return train_config.replace(max_length=model_config.max_target_length)
    return train_config


def _ar_loss(params, batch, rng, step=None, *, model, cfg: TrainConfig):
    """Teacher-forced cross-entropy; decoder inputs = targets shifted right (0 first)."""
    inputs, targets = batch["inputs"], batch["targets"]                  # [B, Ls], [B, L]
    logits = model.apply({"params": params}, inputs, losses.shift_right(targets),
                         enable_dropout=True, rngs={"dropout": rng})     # [B, L, V]
    ce = losses.token_cross_entropy(logits, targets, targets != 0, cfg.label_smoothing)
    denom = jnp.maximum(ce["weight_sum"], 1.0)
    loss = ce["loss_sum"] / denom
    return loss, {"loss": loss, "nll": ce["nll_sum"] / denom,
                  "accuracy": ce["correct_sum"] / denom, "target_tokens": ce["weight_sum"]}


def _padir_loss(params, batch, rng, step=None, *, model, model_config: ModelConfig, cfg: TrainConfig):
    """Multi-stage refinement loss (averaged over stages) + weighted length cross-entropy. With
    ``cfg.glancing`` (and the optimizer ``step``, which ``train_step`` always passes) stage 1's input
    keeps a glanced number of reference tokens (``losses.glancing_counts`` at the ratio annealed from
    ``glance_start`` to ``glance_end``) instead of ``unmask_rate`` of them: ``padir_noise`` reads the
    rate only when it gets no ``n_keep``, so with glancing ``unmask_rate`` changes no training step
    (only the noise of a dev NLL, which ``models.curves`` scores without a step)."""
    inputs, targets = batch["inputs"], batch["targets"]                  # [B, Ls], [B, L]
    variables = {"params": params}
    enc_rng, noise_rng, stage_rng = jax.random.split(rng, 3)
    encoded = model.apply(variables, inputs, enable_dropout=True, rngs={"dropout": enc_rng},
                          method="encode")                               # [B, Ls, d]
    length_logits = model.apply(variables, encoded, inputs, method="predict_length")  # [B, C]
    num_classes = length_logits.shape[-1]
    lengths = losses.target_lengths(targets, num_classes)                # [B]
    row = (targets != 0).any(axis=-1)                                    # [B] real (non-filler) rows
    length_lp = jax.nn.log_softmax(length_logits.astype(jnp.float32))
    length_nll = -jnp.take_along_axis(length_lp, lengths[:, None], axis=-1)[:, 0]
    rows = jnp.maximum(row.sum(), 1)
    length_loss = (length_nll * row).sum() / rows
    length_err = jnp.abs(jnp.argmax(length_logits, -1) - lengths)       # [B] |predicted - true|
    length_acc = ((length_err == 0) * row).sum() / rows
    length_within2 = ((length_err <= 2) * row).sum() / rows

    real = targets != 0                                                  # [B, L]
    n_keep = None
    if cfg.glancing and step is not None:
        glance_rng, noise_rng = jax.random.split(noise_rng)
        pure = losses.padir_noise(glance_rng, targets, 0.0, model_config.vocab_size, model_config.fixed_eos)
        glance = model.apply(variables, encoded, inputs, pure, real, method="refine")   # [B, L, V], no dropout
        predicted = jax.lax.stop_gradient(jnp.argmax(glance, axis=-1))
        ratio = losses.glancing_ratio(step, cfg.steps, cfg.glance_start, cfg.glance_end)
        n_keep = losses.glancing_counts(predicted, targets, ratio, model_config.fixed_eos)   # [B]
    hyp = losses.padir_noise(noise_rng, targets, cfg.unmask_rate, model_config.vocab_size,
                              model_config.fixed_eos, n_keep)
    token_loss, metrics = 0.0, {}
    for s, srng in enumerate(jax.random.split(stage_rng, cfg.stages)):
        logits = model.apply(variables, encoded, inputs, hyp, real, enable_dropout=True,
                             rngs={"dropout": srng}, method="refine")    # [B, L, V]
        ce = losses.token_cross_entropy(logits, targets, real, cfg.label_smoothing)
        denom = jnp.maximum(ce["weight_sum"], 1.0)
        token_loss = token_loss + ce["loss_sum"] / denom / cfg.stages
        metrics[f"accuracy_stage{s + 1}"] = ce["correct_sum"] / denom
        metrics[f"nll_stage{s + 1}"] = ce["nll_sum"] / denom
        # Next stage's hypothesis: this stage's argmax, as refinement step t + 1 sees it at inference
        # (the mask stays the target mask; with stage_remask, stutter re-masked with random tokens;
        # with fixed_eos, EOS stays where it is); no gradient through the choice.
        best = jax.lax.stop_gradient(jnp.argmax(logits, axis=-1)).astype(jnp.int32)
        if cfg.stage_remask:
            replacement = losses.random_tokens(jax.random.fold_in(srng, 1), best.shape, model_config.vocab_size)
            best = refine.remask_stutter(best, real, replacement)
        if model_config.fixed_eos:
            best = jnp.where(targets == EOS_ID, EOS_ID, best)
        hyp = jnp.where(real, best, 0).astype(jnp.int32)
    loss = token_loss + cfg.length_loss_weight * length_loss
    metrics.update(loss=loss, token_loss=token_loss, length_loss=length_loss,
                   length_accuracy=length_acc, length_within2=length_within2, sentences=rows.astype(jnp.float32),
                   nll=metrics[f"nll_stage{cfg.stages}"],
                   accuracy=metrics[f"accuracy_stage{cfg.stages}"],
                   target_tokens=real.sum().astype(jnp.float32))
    return loss, metrics


def loss_fn(model_config: ModelConfig, cfg: TrainConfig, model) -> Callable:
    if model_config.kind == "ar":
        return functools.partial(_ar_loss, model=model, cfg=cfg)
    return functools.partial(_padir_loss, model=model, model_config=model_config, cfg=cfg)


def train_step(state: TrainState, batch: dict, rng: jax.Array, *, loss: Callable,
               tx: optax.GradientTransformation) -> tuple[TrainState, dict]:
    """One optimizer update. Pure; bind ``loss``/``tx`` with functools.partial, then jit."""
    step_rng = jax.random.fold_in(rng, state.step)
    (_, metrics), grads = jax.value_and_grad(loss, has_aux=True)(state.params, batch, step_rng, state.step)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = dict(metrics, grad_norm=optax.tree.norm(grads))
    return TrainState(state.step + 1, params, opt_state), metrics


def make_train_step(model_config: ModelConfig, cfg: TrainConfig, model=None, decay_start: int | None = None):
    """The jitted step (state donated) and the optimizer it uses (``decay_start``: where a wsd
    schedule's decay starts; its optimizer state is the same at any start)."""
    model = build_model(model_config) if model is None else model
    tx = make_optimizer(cfg, decay_start)
    step = functools.partial(train_step, loss=loss_fn(model_config, cfg, model), tx=tx)
    return jax.jit(step, donate_argnums=(0,)), tx


WARM_START_FRESH = ("decoder/relpos_bias/",)   # the AR decoder's relative bias is causal: PaDIR's starts fresh


def warm_start_params(params: Any, source: Any, fresh: tuple[str, ...] = WARM_START_FRESH) -> tuple[Any, dict]:
    """``params`` with every leaf that ``source`` has at the same path and shape copied over, except
    paths starting with one of ``fresh``. For PaDIR from an AR checkpoint: the token embeddings, the
    encoder and each decoder layer's self- and cross-attention, MLP and norms are copied; positional
    attention, position embeddings, the length predictor and the decoder's relative bias start fresh.
    Returns the params and ``{"copied": [...], "fresh": [...]}`` (paths)."""
    flat_source = {_path(p): x for p, x in jax.tree_util.tree_flatten_with_path(source)[0]}
    copied, kept = [], []

    def pick(path, leaf):
        name = _path(path)
        other = flat_source.get(name)
        if other is not None and other.shape == leaf.shape and not name.startswith(fresh):
            copied.append(name)
            return jnp.asarray(other, leaf.dtype)
        kept.append(name)
        return leaf

    return jax.tree_util.tree_map_with_path(pick, params), {"copied": sorted(copied), "fresh": sorted(kept)}


def _path(path) -> str:
    return "/".join(str(getattr(k, "key", k)) for k in path)


def seeded_params(model_config: ModelConfig, cfg: TrainConfig, init_from: Path | None = None
                  ) -> tuple[Any, dict | None]:
    """Fresh seeded params, warm-started from the checkpoint ``init_from`` if given; and the warm
    start's report (None without one)."""
    from models import t5

    params = t5.init_params(model_config, jax.random.PRNGKey(cfg.seed))
    if init_from is None:
        return params, None
    _, source, meta = checkpoint.load(init_from)
    params, report = warm_start_params(params, source)
    return params, {"from": checkpoint.identity(meta), "copied": len(report["copied"]), "fresh": report["fresh"],
                    "source_train_seconds": meta.get("train_seconds"), "source_train_flops": meta.get("train_flops")}


def init_state(model_config: ModelConfig, cfg: TrainConfig, tx, mesh, params: Any = None) -> TrainState:
    """Params (default: fresh, seeded) + optimizer state, replicated over the mesh."""
    params = seeded_params(model_config, cfg)[0] if params is None else params
    state = TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))
    return sharding.replicate(state, mesh)


# -- where and what -------------------------------------------------------------------------------
def _digest(obj: Any) -> str:
    return json_digest(obj, 12, default=str)


def checkpoint_dir_for(task: str, model_config: ModelConfig, train_config: TrainConfig,
                       init_from: Path | None = None) -> Path:
    """``checkpoints/<task>-<kind>-<hash>``; the hash covers the task, both configs, the vocabulary,
    the training data's identity (so two distillation teachers never share a folder) and, for a warm
    start, the source checkpoint's identity."""
    from models.batching import task_identity
    from narbench_core.paths import resolve, subdir

    train_config = effective_config(model_config, train_config)
    key = {"task": task, "model": model_config.to_dict(), "train": train_config.to_dict(),
           **task_identity(task)}
    if init_from is not None:
        key["init_from"] = _source_identity(init_from)
    folder = subdir("checkpoints") / f"{task}-{model_config.kind}-{_digest(key)}"
    if not folder.exists() and key.get("vocab_path") and not Path(key["vocab_path"]).is_absolute():
        _adopt_legacy(folder, subdir("checkpoints") / (
            f"{task}-{model_config.kind}-{_digest({**key, 'vocab_path': str(resolve(key['vocab_path']))})}"))
    return folder


def _adopt_legacy(folder: Path, legacy: Path) -> None:
    """A checkpoint keyed before vocabulary paths were relative to the data root (2026-11-28: its key held the
    absolute path under this data root) moves to its new name, and its old name becomes a link to it, so the
    records that name it still find it."""
    if legacy.is_symlink() or not legacy.is_dir():
        return
    try:
        legacy.rename(folder)
        legacy.symlink_to(folder.name)
    except OSError:                               # another process adopted it meanwhile, or the root is read-only
        pass


def _source_identity(init_from: Path) -> dict:
    meta = checkpoint.read_meta(Path(init_from))
    if meta is None or not meta.get("complete"):
        raise UserError(f"no finished checkpoint in {init_from} to warm-start from; train it first "
                        "(`narbench train --model ar`)")
    return checkpoint.identity(meta)


def _diverged(step: int, reason: str, out_dir: Path) -> UserError:
    last = checkpoint.latest_step(out_dir)
    kept = (f"the last good checkpoint (step {last}) is kept in {out_dir}" if last
            else f"no checkpoint was saved yet in {out_dir}")
    return UserError(f"training diverged at step {step}: {reason}; {kept}; "
                     "lower the learning rate or change the seed and re-run")


def _check_finite(metrics: dict, step: int, out_dir: Path) -> None:
    bad = {k: metrics[k] for k in ("loss", "grad_norm") if not math.isfinite(metrics[k])}
    if bad:
        raise _diverged(step, ", ".join(f"{k}={v}" for k, v in bad.items()), out_dir)


@jax.jit
def _all_finite(tree) -> jax.Array:
    leaves = jax.tree_util.tree_leaves(tree)
    return jnp.all(jnp.array([jnp.all(jnp.isfinite(x)) for x in leaves]))


def train(task: str, model_config: ModelConfig, train_config: TrainConfig, out_dir: Path | None = None,
          progress: bool = True, *, data: TokenPairs | None = None, mesh=None,
          on_step: Callable[[int, dict], None] | None = None, init_from: Path | None = None,
          dev=None, retrain_damaged: bool = defaults.RETRAIN_DAMAGED, wait_for_lease: bool = False) -> Path:
    """Train ``model_config`` on ``task``'s train split; returns the checkpoint folder.

    Skips when the folder holds a finished run, resumes an interrupted one from its last checkpoint
    (same batch order and dropout keys as an uninterrupted run), raises ``UserError`` on a NaN/inf
    loss or gradient keeping the last good checkpoint. ``data`` trains on in-memory token pairs
    instead of the task's split (``task`` is then only a label; pass ``out_dir``). ``on_step(step,
    metrics)`` is called after every step (host floats). ``mesh``: default all devices. ``init_from``:
    warm-start from that checkpoint (``warm_start_params``). With ``eval_every``, every that many
    steps and at the last one, a learning-curve point goes to ``curve.jsonl`` (``models.curves``;
    ``dev``: a ``curves.DevSet``, default the task's dev sample; evaluation time is not training
    time); the step where the plateau rule fires is saved and kept past later saves
    (``checkpoint.keep_step``), for a training continued past its plateau. ``narbench.json`` records
    ``train_flops``: per step, XLA's cost analysis of the compiled step of that step's batch shape
    (``step_flops``), summed. One process at a time trains into a folder
    (``narbench_core.lock``: another gets a one-line refusal naming it, or with ``wait_for_lease`` waits
    until the folder is released or its lock stale, and returns without training if the folder was
    finished meanwhile) and it is registered as busy while it trains, so a run timing meanwhile on this
    machine says so. A folder whose files cannot be read whole (``checkpoint.DamagedCheckpoint``) has its
    contents moved aside and is trained afresh, or with ``retrain_damaged=False`` is refused
    (``_whole_record``). An empty folder starts from the same training under another step cap or stopping rule in
    a sibling folder where there is one (``seed_source``).
    """
    cfg = effective_config(model_config, train_config)
    data, identity = _training_data(task, data, out_dir)
    out_dir = Path(out_dir) if out_dir is not None else checkpoint_dir_for(task, model_config, train_config, init_from)
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        if _finished(out_dir, model_config, cfg):
            return out_dir
    except checkpoint.DamagedCheckpoint:
        pass                                           # moved aside (or refused) below, holding the folder
    what = f"training {out_dir.name}"
    with lock.hold(out_dir, what, wait=wait_for_lease), lock.busy(what):
        meta = _whole_record(out_dir, model_config, cfg, retrain_damaged)
        if meta is None:                               # nothing here yet: the same training under another cap?
            meta = _seed_from_sibling(out_dir, task, model_config, cfg, identity, init_from, data)
        if meta and meta.get("complete"):             # by the process that held the folder a moment ago
            return out_dir
        return _train_held(task, model_config, cfg, data, identity, out_dir, meta,
                           progress=progress, mesh=mesh, on_step=on_step, init_from=init_from, dev=dev)


def continue_past_plateau(ckpt_dir: Path, out_dir: Path | None = None, factor: float = 2.0,
                          progress: bool = True, **train_kwargs: Any) -> Path:
    """The check that a plateau rule did not stop early (issue 52): ``ckpt_dir``'s training run on from the
    state where its rule fired (step S, kept there by ``train``) at the peak rate until ``factor`` x S at
    least (``min_steps``), then by the same rule and decay. Up to S it is the training with that
    ``min_steps`` from scratch: same batches, same dropout keys. Into ``out_dir`` (default
    ``<ckpt_dir>.past-plateau-<factor>x``), which resumes like any training; its ``narbench.json`` names
    where it continued from (``continued_from``) and counts time and tokens from there only. ``train_kwargs``
    go to ``train`` (``data`` and ``dev`` for a training on in-memory pairs)."""
    import shutil

    from models import curves
    from narbench_core.io import new_folder

    ckpt_dir = Path(ckpt_dir)
    meta = checkpoint.read_meta(ckpt_dir)
    if not (meta and meta.get("complete")):
        raise UserError(f"{ckpt_dir} holds no finished training to continue; train it first (`narbench train`)")
    if meta.get("stopped_by") != "plateau":
        raise UserError(f"{ckpt_dir} was not stopped by the plateau rule (stopped_by = {meta.get('stopped_by')}): "
                        "there is no plateau to continue past; train with --until plateau")
    if not factor > 1.0:
        raise UserError(f"--factor must be over 1 (the continuation's steps per step before the plateau), not {factor}")
    start = int(meta["decay_start"])
    if start not in checkpoint.kept_steps(ckpt_dir):
        raise UserError(f"{ckpt_dir} kept no state at its plateau (step {start}; trainings keep it since "
                        "2026-12-03): train it again to continue it")
    if "data" not in train_kwargs:                     # a distilled task this process has not registered
        from models.distill import register_trained_task

        register_trained_task(meta)
    model_config = ModelConfig.from_dict(meta["model_config"])
    cfg = TrainConfig.from_dict(meta["train_config"]).replace(min_steps=math.ceil(factor * start))
    out = Path(out_dir) if out_dir is not None else ckpt_dir.with_name(f"{ckpt_dir.name}.past-plateau-{factor:g}x")
    def seed(folder: Path) -> None:         # the kept step, the curve up to it and a record of the continuation
        shutil.copytree(ckpt_dir / checkpoint.KEPT_DIR / str(start), folder / checkpoint.STATE_DIR / str(start))
        curves.write_curve(folder, [p for p in curves.read_curve(ckpt_dir) if p["step"] <= start])
        checkpoint.write_meta(folder, {
            "task": meta["task"], "kind": meta["kind"], "model_config": model_config.to_dict(),
            "train_config": effective_config(model_config, cfg).to_dict(), "complete": False, "steps_done": start,
            "continued_from": {"checkpoint": ckpt_dir.name, "step": start, "factor": factor}})

    if not out.exists():
        new_folder(out, seed)
    return train(meta["task"], model_config, cfg, out, progress=progress, **train_kwargs)


# -- the same training under another step cap or stopping rule --------------------------------------
RULE_FIELDS = ("steps", "signal", "min_delta", "patience", "patience_share", "smooth", "min_steps", "decay_share")
"""The training settings that decide only where a plateau training's peak rate ends and how it decays: two
trainings that differ in these alone run the same steps up to the first decay start of either."""


@dataclass(frozen=True)
class SeedSource:
    """A folder beside a training's own holding the same training under another step cap or stopping rule
    (``RULE_FIELDS``), whose saved state at ``step`` is this training's own state there: up to ``step`` both ran at
    the peak rate, and this one's rule had not fired before it."""

    folder: Path
    step: int
    cap: int           # its ``steps``
    whole: bool        # all of it is this training: its rule fired where this one's does, with the same decay
    kept: bool = False # the state is the one it kept where its rule fired (``kept/<step>``), not its newest
    rule: bool = False # its stopping rule differs (not only its cap)

    def how(self) -> str:
        """The source in words, for stderr and ``narbench plan``."""
        what = "stopping rule" if self.rule else "cap"
        return f"the same training under another {what} ({self.cap:,} steps)"


def reads_cap(cfg: TrainConfig) -> bool:
    """Whether a training's steps depend on ``steps`` before its decay: PaDIR's glancing ratio anneals over it."""
    return cfg.glancing and cfg.glance_start != cfg.glance_end


def seed_source(out_dir: Path, task: str, model_config: ModelConfig, cfg: TrainConfig, identity: dict,
                init_from: Path | None = None) -> SeedSource | None:
    """Among ``out_dir``'s sibling folders, the same training (task, data, vocabulary, model, warm start and every
    training setting but ``RULE_FIELDS``; ``steps`` too where it is read before the decay, ``reads_cap``) from which
    this one can start, the one furthest on: all of one whose rule fired at the step this one's fires at on the same
    curve, with the same decay; or a state it saved at the peak rate (its newest, or the one kept where its rule
    fired) at or before this one's own rule fires and its latest decay start. A training by ``until = "plateau"``
    only (``steps`` is then a cap and the rule reads only the dev curve). Raising a cap, or changing the rule, thus
    keeps the steps run."""
    from models import curves

    cfg = effective_config(model_config, cfg)
    out_dir = Path(out_dir)
    if cfg.until != "plateau" or cfg.schedule != "wsd" or not out_dir.parent.is_dir():
        return None
    ignored = RULE_FIELDS if not reads_cap(cfg) else tuple(f for f in RULE_FIELDS if f != "steps")
    want = _same_training(task, model_config.to_dict(), cfg.to_dict(), identity,
                          None if init_from is None else _source_identity(init_from), ignored)
    latest = schedules.latest_decay_start(cfg)
    best = None
    for folder in sorted(out_dir.parent.iterdir()):
        if folder == out_dir or folder.is_symlink() or not folder.is_dir():
            continue
        try:
            meta = checkpoint.read_meta(folder)
            theirs = TrainConfig.from_dict((meta or {}).get("train_config") or {})
        except (checkpoint.DamagedCheckpoint, TypeError, ValueError, UserError):
            continue
        if not meta:
            continue
        if cfg.signal == "dev_nll" and meta.get("dev_nll_targets", curves.REFERENCES) != _nll_targets(task):
            continue                                 # its dev NLL was measured against other targets
        if theirs.to_dict() == cfg.to_dict():        # a copy of this very training (one set aside as damaged)
            continue
        if theirs.until != "plateau" or theirs.schedule != "wsd" or _same_training(
                meta.get("task"), meta.get("model_config"), meta.get("train_config"), meta,
                (meta.get("init") or {}).get("from"), ignored) != want:
            continue
        done = int(meta.get("steps_done") or 0)
        points = [p for p in curves.read_curve(folder) if p["step"] <= done]
        their_stop = schedules.stop_state(theirs, points)
        peak_end = their_stop.decay_start            # their steps up to here ran at the peak rate
        rule = {k: v for k, v in theirs.to_dict().items() if k != "steps"} != {
            k: v for k, v in cfg.to_dict().items() if k != "steps"}
        found = []
        if meta.get("complete") and their_stop.stopped_by == "plateau":
            mine = schedules.stop_state(cfg, [p for p in points if p["step"] <= peak_end])
            if (mine.stopped_by == "plateau" and mine.decay_start == peak_end
                    and schedules.decay_steps(cfg, peak_end) == schedules.decay_steps(theirs, peak_end)):
                found.append(SeedSource(folder, done, theirs.steps, True, False, rule))
        states = [(k, True) for k in checkpoint.kept_steps(folder)]
        if done and checkpoint.latest_step(folder) == done:
            states.append((done, False))
        for step, kept in states:
            if step > min(peak_end, latest):
                continue
            mine = schedules.stop_state(cfg, [p for p in points if p["step"] <= step])
            if mine.stopped_by != "plateau" or mine.decay_start == step:
                found.append(SeedSource(folder, step, theirs.steps, False, kept, rule))
        for source in found:
            if best is None or (source.step, source.whole) > (best.step, best.whole):
                best = source
    return best


def _nll_targets(task: str) -> str:
    """What a training on ``task`` measures its dev NLL against (``dev_nll_targets`` of its record)."""
    from models import curves
    from suites import catalog

    try:
        return curves.TEACHER_OUTPUTS if catalog.distilled_train(task) is not None else curves.REFERENCES
    except UserError:                                # a name for in-memory data
        return curves.REFERENCES


def _same_training(task, model: dict | None, train: dict | None, identity: dict, init: dict | None,
                   ignored: tuple[str, ...] = RULE_FIELDS) -> dict:
    """What two trainings that differ only in ``ignored`` settings share (the vocabulary by its hash: older records
    hold its path)."""
    return {"task": task, "model": model, "train": {k: v for k, v in (train or {}).items() if k not in ignored},
            "vocab_hash": identity.get("vocab_hash"), "data": identity.get("data"), "init": init}


def _seeded_totals(source: SeedSource, meta: dict, points: list[dict], data: TokenPairs, cfg: TrainConfig,
                   num_shards: int) -> dict:
    """The totals a training seeded from ``source``'s state at a step before its newest (or from a continuation
    past a plateau, whose record counts from where it continued) starts with: its training seconds at that step
    (its curve's there, or at its last point before; a continuation's counted from where it continued, plus its
    origin's up to there where that folder is still beside it), the evaluation seconds of the points kept, and the target tokens
    and XLA flops of the steps up to it, replayed from the same batches (each step once). The compile, checkpoint
    and wall seconds of those steps are not known: they count from the seed (``seeded_from`` says so)."""
    from models import curves

    offset = 0.0
    origin = meta.get("continued_from") or {}
    if origin:
        before = [p for p in curves.read_curve(source.folder.parent / origin["checkpoint"])
                  if p["step"] == origin["step"]]
        offset = float(before[0]["seconds"]) if before else 0.0
    upto = [p for p in points if p["step"] <= source.step]
    seconds = offset + (float(max(upto, key=lambda p: p["step"])["seconds"]) if upto else 0.0)
    batches = BucketedBatches(data, cfg.batch_tokens, cfg.max_length, cfg.buckets, cfg.seed, num_shards=num_shards)
    tokens, flops = 0, 0.0
    per_shape = meta.get("step_flops") or {}
    for step in range(source.step):
        targets = batches.batch(step)["targets"]
        tokens += int((targets != 0).sum())
        flops += float(per_shape.get("{}x{}".format(*targets.shape), 0.0))
    evals = sum(float(p.get("eval_seconds") or 0.0) for p in points)
    return {"train_seconds": seconds, "eval_seconds": evals, "target_tokens": tokens, "train_flops": flops,
            "compile_seconds": 0.0, "checkpoint_seconds": 0.0, "stopped_seconds": 0.0,
            "wall_seconds": seconds + evals}


def _seed_from_sibling(out_dir: Path, task: str, model_config: ModelConfig, cfg: TrainConfig, identity: dict,
                       init_from: Path | None, data: TokenPairs) -> dict | None:
    """Start the empty folder ``out_dir`` (held) from ``seed_source``: its state at that step (into ``state/``), the
    steps it kept before it, its dev curve up to it and its record (totals carried over, or for an earlier state
    than its newest ``_seeded_totals``; ``seeded_from`` naming it); said on stderr; its stopping decision is this
    training's own. The record is written last: a kill before it leaves a folder that seeds again. Returns the
    record (None: no such source)."""
    import shutil
    import sys

    from models import curves
    from narbench_core.io import new_folder

    source = seed_source(out_dir, task, model_config, cfg, identity, init_from)
    if source is None:
        return None
    with lock.hold(source.folder, f"seeding {out_dir.name}"):
        meta = checkpoint.read_meta(source.folder)
        copies = [(checkpoint.KEPT_DIR if source.kept else checkpoint.STATE_DIR, checkpoint.STATE_DIR, source.step)]
        copies += [(checkpoint.KEPT_DIR, checkpoint.KEPT_DIR, k) for k in checkpoint.kept_steps(source.folder)
                   if k < source.step or (k == source.step and not source.kept)]
        for sub, into, step in copies:
            if not (out_dir / into / str(step)).is_dir():
                new_folder(out_dir / into / str(step), lambda tmp, sub=sub, step=step: shutil.copytree(
                    source.folder / sub / str(step), tmp, dirs_exist_ok=True))
        points = [p for p in curves.read_curve(source.folder) if p["step"] <= source.step]
        curves.write_curve(out_dir, points)
    # Its totals are this training's up to the seed where it ran all the steps to it itself, in one folder.
    replay = source.step != int(meta.get("steps_done") or 0) or "continued_from" in meta
    seeded = {"checkpoint": source.folder.name, "step": source.step, "steps": source.cap,
              **({"rule": True} if source.rule else {}),
              **({"totals": "replayed: compile, checkpoint and wall seconds before the seed not counted"}
                 if replay else {})}
    totals = _seeded_totals(source, meta, points, data, cfg, sharding.make_mesh().devices.size) if replay else {}
    meta = {**{k: v for k, v in meta.items() if k not in ("continued_from", "seeded_from")}, **totals,
            "steps_done": source.step}
    meta = {**meta, "train_config": cfg.to_dict(), "complete": source.whole and bool(meta.get("complete")),
            "seeded_from": seeded}
    _record_stop(meta, schedules.stop_state(cfg, points), cfg.signal)          # by this training's rule
    checkpoint.write_meta(out_dir, meta)
    how = "all of it" if source.whole else f"its step {source.step:,}" + (" (kept)" if source.kept else "")
    print(f"narbench: {out_dir.name} starts from {source.folder.name}, {how}: {source.how()}; this one's cap: "
          f"{cfg.steps:,}", file=sys.stderr)
    return meta


def _finished(out_dir: Path, model_config: ModelConfig, cfg: TrainConfig) -> bool:
    """Whether ``out_dir`` holds this training, finished and whole (its parameters read back; else
    ``checkpoint.DamagedCheckpoint``); a different training in it is a ``UserError``."""
    meta = checkpoint.read_meta(out_dir)
    if meta and (meta.get("model_config") != model_config.to_dict() or meta.get("train_config") != cfg.to_dict()):
        state = "finished" if meta.get("complete") else "unfinished"
        raise UserError(f"{out_dir} holds a different {state} training; choose another --out (or delete it)")
    if not (meta and meta.get("complete")):
        return False
    if checkpoint.verify(out_dir) is None:
        raise checkpoint.DamagedCheckpoint(out_dir, f"its saved steps ({checkpoint.STATE_DIR}/) are missing")
    return True


def _whole_record(out_dir: Path, model_config: ModelConfig, cfg: TrainConfig, retrain_damaged: bool) -> dict | None:
    """The record of the folder this process holds (None: nothing trained there yet), once what training
    takes from it reads whole: a finished checkpoint's parameters, an unfinished one's newest step. A
    damaged folder's contents are moved to ``<folder>.damaged`` (said on stderr) and None returned, or
    with ``retrain_damaged=False`` it is refused in one line."""
    import sys

    try:
        if _finished(out_dir, model_config, cfg):
            return checkpoint.read_meta(out_dir)
        meta = checkpoint.read_meta(out_dir)
        if meta is not None:
            checkpoint.verify(out_dir, opt_state=True)
        return meta
    except checkpoint.DamagedCheckpoint as err:
        if not retrain_damaged:
            raise UserError(f"checkpoint {out_dir} is damaged: {err.what}; delete it to retrain it (or drop "
                            "--refuse-damaged: the damaged files are then moved aside and retrained)") from None
        aside = checkpoint.set_aside(out_dir)
        print(f"narbench: checkpoint {out_dir} is damaged ({err.what}); moved its files to {aside.name} and "
              "retraining", file=sys.stderr)
        return None


def _train_held(task: str, model_config: ModelConfig, cfg: TrainConfig, data: TokenPairs, identity: dict,
                out_dir: Path, meta: dict | None, *, progress: bool, mesh, on_step, init_from: Path | None,
                dev) -> Path:
    """``train``'s loop, in the checkpoint folder this process holds (``narbench_core.lock``)."""
    from tqdm.auto import tqdm

    mesh = sharding.make_mesh() if mesh is None else mesh
    batches = BucketedBatches(data, cfg.batch_tokens, cfg.max_length, cfg.buckets, cfg.seed,
                              num_shards=mesh.devices.size)
    model = build_model(model_config)
    state, start, warm = _initial_state(model_config, cfg, make_optimizer(cfg), mesh, init_from, out_dir)
    record = _new_record(task, model_config, cfg, identity, state, mesh, batches, start, warm, meta or {})
    rng = sharding.replicate(jax.random.PRNGKey(cfg.seed), mesh)
    evaluate, curve = _curve_setup(task, model_config, cfg, out_dir, start, dev, in_memory=identity["vocab_path"] is None)
    if getattr(evaluate, "dev", None) is not None:                # what its dev NLL is measured against
        record["dev_nll_targets"] = evaluate.dev.targets_kind
    stop = schedules.stop_state(cfg, curve)                  # where the training ends, from the curve so far
    _record_stop(record, stop, cfg.signal)
    if stop.stopped_by == "plateau" and stop.decay_start == start:      # killed between saving and keeping it
        checkpoint.keep_step(out_dir, start)
    steps = _CompiledSteps(lambda decay_start: make_train_step(model_config, cfg, model, decay_start)[0],
                           stop.decay_start, record)
    clock = _SessionClock(record["wall_seconds"], record["stopped_seconds"])
    bar = tqdm(total=stop.stop, initial=start, disable=not progress, unit="step",
               desc=f"train {task} {model_config.kind}", dynamic_ncols=True)
    dev_note = _dev_note(cfg, stop, curve)
    try:
        done = start
        while done < stop.stop:
            state, metrics, flops = steps(state, sharding.shard_batch(batches.batch(done), mesh), rng)
            done += 1
            _check_finite(metrics, done, out_dir)
            record["target_tokens"] += int(metrics["target_tokens"])
            record["train_flops"] += flops
            if on_step is not None:
                on_step(done - 1, metrics)
            fired = False                      # the plateau rule fired at this step's evaluation
            if evaluate is not None and (done % cfg.eval_every == 0 or done == stop.stop):
                _dev_point(evaluate, state, done, record, curve, out_dir)
                stop = schedules.stop_state(cfg, curve)
                fired = stop.stopped_by == "plateau" and stop.decay_start == done
                steps.decay_from(stop.decay_start)
                bar.total = stop.stop
                dev_note = _dev_note(cfg, stop, curve)
                _record_stop(record, stop, cfg.signal)
            if done % cfg.checkpoint_every == 0 or done == stop.stop or fired:
                _save_checkpoint(out_dir, state, done, done == stop.stop, metrics, record, clock)
            if fired:                          # the state before the decay, for a training continued past it
                checkpoint.keep_step(out_dir, done)
            tps = record["target_tokens"] / max(record["train_seconds"], 1e-9)
            bar.set_postfix(loss=f"{metrics['loss']:.3f}", tok_s=f"{tps:,.0f}",
                            **({"dev": dev_note} if dev_note else {}))
            bar.update(1)
    finally:
        bar.close()
        if record["steps_done"] < stop.stop:           # interrupted or diverged: keep timings honest
            _write_record(out_dir, record, clock)
    return out_dir


def _dev_note(cfg: TrainConfig, stop: "schedules.StopState", curve: list[dict]) -> str:
    """The progress bar's dev BLEU: the last point's, the rule's best so far (of its signal: dev NLL where it reads
    that), and the earliest step the plateau rule can stop the training at (the bar's total is the cap till it
    fires) or, once it fired, where the decay started (the bar's total is then the real last step)."""
    if not curve or stop.best is None:
        return ""
    last = max(curve, key=lambda p: p["step"])
    best = (f"best {stop.best:.2f} at {stop.best_step:,}" if cfg.signal == "dev_bleu" else
            f"nll {last['dev_nll']:.3f}, best {stop.best:.3f} at {stop.best_step:,}")
    note = f"{last['dev_bleu']:.2f} ({best})"
    if stop.stopped_by == "plateau":
        return note + f", plateau at {stop.decay_start:,}: decaying"
    earliest = schedules.earliest_stop(cfg, curve)
    return note + ("" if earliest is None else f", stops at {earliest:,} at the earliest")


def _record_stop(record: dict, stop: "schedules.StopState", signal: str) -> None:
    """The stopping decision so far, as ``narbench.json`` keeps it (changes only at a dev point): ``best_dev_bleu``,
    or ``best_dev_nll`` for a rule that reads dev NLL (the rule's best, smoothed)."""
    record.update(stopped_by=stop.stopped_by, best_step=stop.best_step, decay_start=stop.decay_start,
                  **{f"best_{signal}": stop.best})


def _training_data(task: str, data: TokenPairs | None, out_dir: Path | None) -> tuple[TokenPairs, dict]:
    """The token pairs to train on and what names them in the checkpoint's record (vocabulary, data hash)."""
    from models.batching import load_task_tokens, task_identity

    if data is None:
        return load_task_tokens(task, "train"), task_identity(task)
    if out_dir is None:
        raise UserError("training on in-memory data needs an explicit out_dir")
    return data, {"vocab_path": None, "vocab_hash": None, "data": data.fingerprint()}


def _initial_state(model_config: ModelConfig, cfg: TrainConfig, tx, mesh, init_from: Path | None,
                   out_dir: Path) -> tuple[TrainState, int, dict | None]:
    """The seeded (or warm-started) state, restored from the folder's last checkpoint if there is one;
    the step it starts at and the warm start's record."""
    params, warm = seeded_params(model_config, cfg, init_from)
    state = init_state(model_config, cfg, tx, mesh, params)
    start = checkpoint.latest_step(out_dir) or 0
    if start:
        params, opt_state, start = checkpoint.restore(out_dir, state.params, state.opt_state)
        state = TrainState(sharding.replicate(jnp.asarray(start, jnp.int32), mesh), params, opt_state)
    return state, start, warm


def _new_record(task: str, model_config: ModelConfig, cfg: TrainConfig, identity: dict, state: TrainState, mesh,
                batches: BucketedBatches, start: int, warm: dict | None, prev: dict) -> dict:
    """``narbench.json`` at the start of a session: what trains on what, and the totals carried over
    from an interrupted session."""
    carried = ("wall_seconds", "compile_seconds", "train_seconds", "checkpoint_seconds", "train_flops",
               "eval_seconds", "stopped_seconds")
    return {
        "task": task, "kind": model_config.kind, "model_config": model_config.to_dict(),
        "train_config": cfg.to_dict(), **identity,
        "num_params": int(sum(x.size for x in jax.tree_util.tree_leaves(state.params))),
        "devices": [str(d) for d in mesh.devices.flat], "batching": batches.stats(),
        "glibc_tunables": hugepages.started_with(),            # this session's; huge pages: narbench_core.hugepages
        "complete": False, "steps_done": start,
        **{k: prev.get(k, 0.0) for k in carried}, "target_tokens": prev.get("target_tokens", 0),
        "step_flops": dict(prev.get("step_flops", {})),
        "init": warm, **{k: prev[k] for k in ("continued_from", "seeded_from") if k in prev},
    }


class _CompiledSteps:
    """The train step, compiled once per batch shape (its compile time and XLA flops per step go to the
    record), run and timed: ``steps(state, batch, rng) -> (state, metrics as host floats, the step's flops)``.
    ``make_step(decay_start)`` builds the jitted step for a schedule whose decay starts there."""

    def __init__(self, make_step: Callable[[int | None], Any], decay_start: int | None, record: dict):
        self.make_step, self.decay_start, self.record = make_step, decay_start, record
        self.step_fn = make_step(decay_start)
        self.compiled: dict[tuple, Any] = {}
        self.flops: dict[tuple, float] = {}

    def decay_from(self, decay_start: int | None) -> None:
        """Follow a schedule whose decay starts at ``decay_start`` from now on (recompiles if it moved)."""
        if decay_start != self.decay_start:
            self.decay_start, self.step_fn, self.compiled = decay_start, self.make_step(decay_start), {}

    def __call__(self, state: TrainState, batch: dict, rng) -> tuple[TrainState, dict, float]:
        record = self.record
        shape = batch["targets"].shape + batch["inputs"].shape
        if shape not in self.compiled:
            t0 = stopped.running()
            self.compiled[shape] = self.step_fn.lower(state, batch, rng).compile()
            record["compile_seconds"] += stopped.running() - t0
            self.flops[shape] = cost_flops(self.compiled[shape])
            record["step_flops"][f"{shape[0]}x{shape[1]}"] = self.flops[shape]
        t0 = stopped.running()
        state, metrics = self.compiled[shape](state, batch, rng)
        metrics = {k: float(v) for k, v in metrics.items()}          # syncs: the step is done
        record["train_seconds"] += stopped.running() - t0
        return state, metrics, self.flops[shape]


def _dev_point(evaluate: Callable, state: TrainState, done: int, record: dict, curve: list[dict],
               out_dir: Path) -> None:
    """One learning-curve point (dev BLEU and NLL at ``done`` steps), appended to ``curve.jsonl``;
    its time is evaluation time, not training time."""
    t0 = stopped.running()
    point = {"step": done, "seconds": record["train_seconds"], **evaluate(state.params, done)}
    point["eval_seconds"] = stopped.running() - t0
    record["eval_seconds"] += point["eval_seconds"]
    curve.append(point)
    _write_curve(out_dir, curve)


def _save_checkpoint(out_dir: Path, state: TrainState, done: int, complete: bool, metrics: dict, record: dict,
                     clock: "_SessionClock") -> None:
    """Parameters and optimiser state at ``done`` steps (refused if any parameter is not finite), and the record."""
    t0 = stopped.running()
    if not bool(_all_finite(state.params)):
        raise _diverged(done, "non-finite parameters", out_dir)
    checkpoint.save(out_dir, done, state.params, state.opt_state)
    record["checkpoint_seconds"] += stopped.running() - t0
    record.update(steps_done=done, complete=complete, final_loss=metrics["loss"], last_metrics=metrics)
    _write_record(out_dir, record, clock)


class _SessionClock:
    """Wall seconds over every session while the training ran (``narbench_core.stopped``: a SIGSTOP's pause is not
    in them, nor in any of the record's seconds): the earlier sessions' total plus this one's so far; and the seconds
    it was seen stopped, likewise."""

    def __init__(self, before: float, stopped_before: float):
        self.before, self.start = before, stopped.running()
        self.stopped_before, self.stopped_start = stopped_before, stopped.stopped_seconds()

    def total(self) -> float:
        return self.before + stopped.running() - self.start

    def stopped_total(self) -> float:
        return self.stopped_before + stopped.stopped_seconds() - self.stopped_start


def _write_record(out_dir: Path, record: dict, clock: _SessionClock) -> None:
    record["wall_seconds"], record["stopped_seconds"] = clock.total(), clock.stopped_total()
    record["target_tokens_per_second"] = record["target_tokens"] / max(record["train_seconds"], 1e-9)
    record["padding_share"] = record["batching"]["target_padding_share"]
    checkpoint.write_meta(out_dir, record)


# -- learning curves --------------------------------------------------------------------------------
def _curve_setup(task: str, model_config: ModelConfig, cfg: TrainConfig, out_dir: Path, start: int, dev,
                 in_memory: bool) -> tuple[Callable | None, list[dict]]:
    """The dev scorer (None without ``eval_every``) and the curve points kept from before ``start``.
    ``dev``: a ``curves.DevSet`` (default: the task's dev sample), or a scorer of its own,
    ``dev(params, step) -> {"dev_bleu": ..., "dev_nll": ...}``."""
    if not cfg.eval_every:
        return None, []
    from models import curves

    kept = [p for p in curves.read_curve(out_dir) if p["step"] <= start]
    if callable(dev):
        return dev, kept
    if dev is None and in_memory:
        raise UserError("training on in-memory data with eval_every needs a dev set (dev=curves.DevSet(...))")
    return dev_evaluator(task, model_config, cfg, dev), kept


def dev_evaluator(task: str, model_config: ModelConfig, cfg: TrainConfig, dev=None):
    """The ``curves.DevEvaluator`` of a training: ``model_config``'s models scored on ``dev`` (default: the task's
    dev sentences by ``cfg.dev_sentences``), dev NLL by the training loss without dropout or label smoothing."""
    from models import curves

    if dev is None:
        dev = curves.dev_set(task, cfg.dev_sentences,
                             needed_by=f'until = "{cfg.until}"' if cfg.until == "plateau" else None)
    quiet = model_config.replace(dropout_rate=0.0)          # the same parameters, scored without dropout
    loss = loss_fn(quiet, cfg.replace(label_smoothing=0.0), build_model(quiet))
    return curves.DevEvaluator(model_config, cfg, dev, loss)


def _write_curve(out_dir: Path, points: list[dict]) -> None:
    from models import curves

    curves.write_curve(out_dir, points)


# -- training budgets -------------------------------------------------------------------------------
def cost_flops(compiled) -> float:
    """FLOPs of one run of a compiled XLA computation (its cost analysis; 0 when the backend gives none)."""
    analysis = compiled.cost_analysis()
    if isinstance(analysis, (list, tuple)):          # older jax: one dict per device program
        analysis = analysis[0] if analysis else {}
    return float((analysis or {}).get("flops", 0.0))


def _compiled_shapes(task: str, model_config: ModelConfig, train_config: TrainConfig, data: TokenPairs | None,
                     mesh) -> tuple[TrainState, Any, list[tuple[Any, dict, int]]]:
    """Fresh state, the rng and, per batch shape of the training data, ``(compiled step, an example
    batch, batches of that shape per epoch)``, exactly as ``train`` compiles them."""
    from models.batching import load_task_tokens

    cfg = effective_config(model_config, train_config)
    data = load_task_tokens(task, "train") if data is None else data
    mesh = sharding.make_mesh() if mesh is None else mesh
    batches = BucketedBatches(data, cfg.batch_tokens, cfg.max_length, cfg.buckets, cfg.seed,
                              num_shards=mesh.devices.size)
    step_fn, tx = make_train_step(model_config, cfg)
    state = init_state(model_config, cfg, tx, mesh)
    rng = sharding.replicate(jax.random.PRNGKey(cfg.seed), mesh)
    out = []
    for (_, length), count in batches.batches_per_shape():
        batch = sharding.shard_batch(batches.example_batch(length), mesh)
        out.append((step_fn.lower(state, batch, rng).compile(), batch, count))
    return state, rng, out


def flops_per_step(task: str, model_config: ModelConfig, train_config: TrainConfig, *,
                   data: TokenPairs | None = None, mesh=None) -> float:
    """Mean training FLOPs per step: the compiled step's cost analysis for each batch shape, weighted
    by how many batches of that shape an epoch has (what ``train`` adds up in ``train_flops``)."""
    _, _, shapes = _compiled_shapes(task, model_config, train_config, data, mesh)
    flops = sum(cost_flops(c) * n for c, _, n in shapes) / sum(n for *_, n in shapes)
    if flops <= 0:
        raise UserError("XLA's cost analysis gives no FLOPs on this backend; match budgets by seconds instead")
    return flops


def seconds_per_step(task: str, model_config: ModelConfig, train_config: TrainConfig, *,
                     data: TokenPairs | None = None, mesh=None, sample_s: float = probe.SAMPLE_S,
                     rounds: int = 3) -> float:
    """Mean seconds per training step, measured by the machine probes' protocol
    (``narbench_core.probe``): per batch shape (compiled first), steps run back to back in runs sized
    to about ``sample_s`` (one step when a step takes longer), ``rounds`` rounds interleaving the
    shapes, the median round per shape; weighted by how many batches of that shape an epoch has."""
    state, rng, shapes = _compiled_shapes(task, model_config, train_config, data, mesh)
    held = {"state": state}

    def steps(compiled, batch):
        def run(n: int) -> float:
            t0 = time.perf_counter()
            for _ in range(n):
                held["state"], metrics = compiled(held["state"], batch, rng)
            float(metrics["loss"])            # syncs: the last step (each takes the one before's state) is done
            return time.perf_counter() - t0
        return run

    per_step = probe.seconds_per_iteration({i: steps(compiled, batch) for i, (compiled, batch, _) in enumerate(shapes)},
                                           sample_s, rounds)
    total = sum(per_step[i] * count for i, (*_, count) in enumerate(shapes))
    return total / sum(n for *_, n in shapes)
