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
import hashlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from narbench_core.defaults import TRAIN_BUCKETS
from narbench_core.errors import UserError
from models import checkpoint, losses, sharding
from models.batching import BucketedBatches, TokenPairs
from models.config import ModelConfig


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
    optimizer: str = "adafactor"      # "adafactor" (paper, t5x defaults) or "adam" (clip 1.0, b2 0.98)

    def __post_init__(self):
        checks = {"steps": self.steps >= 1, "batch_tokens": self.batch_tokens >= self.max_length,
                  "learning_rate": self.learning_rate > 0, "warmup_steps": self.warmup_steps >= 0,
                  "min_learning_rate": 0 <= self.min_learning_rate <= self.learning_rate,
                  "unmask_rate": 0.0 <= self.unmask_rate <= 1.0, "stages": self.stages >= 1,
                  "length_loss_weight": self.length_loss_weight >= 0,
                  "label_smoothing": 0.0 <= self.label_smoothing < 1.0,
                  "max_length": self.max_length >= 2, "checkpoint_every": self.checkpoint_every >= 1,
                  "optimizer": self.optimizer in OPTIMIZERS}
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise UserError(f"invalid training config value(s) for {', '.join(bad)}: "
                            f"{ {name: getattr(self, name) for name in bad} }")
        object.__setattr__(self, "buckets", tuple(int(b) for b in self.buckets))

    def replace(self, **changes: Any) -> "TrainConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "buckets": list(self.buckets)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrainConfig":
        return cls(**{**data, "buckets": tuple(data.get("buckets", TRAIN_BUCKETS))})


OPTIMIZERS = ("adafactor", "adam")


class TrainState(NamedTuple):
    step: jax.Array      # [] int32, steps done
    params: Any
    opt_state: Any


# -- optimizer ----------------------------------------------------------------------------------
def learning_rate_schedule(cfg: TrainConfig) -> optax.Schedule:
    """Linear warm-up from ``min_learning_rate`` to the peak, then cosine decay back to it."""
    warmup = min(cfg.warmup_steps, cfg.steps - 1)
    return optax.warmup_cosine_decay_schedule(
        init_value=cfg.min_learning_rate, peak_value=cfg.learning_rate, warmup_steps=warmup,
        decay_steps=max(cfg.steps, warmup + 1), end_value=cfg.min_learning_rate)


def make_optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
    """``adafactor``: optax Adafactor with t5x's defaults (factored second moments, decay 0.8, update
    clipping 1.0, steps scaled by the parameter RMS, no momentum): the paper's recipe.
    ``adam``: Adam (b2 0.98) after global-norm clipping at 1.0, the calibration reference recipe, for
    comparison (on this machine Adafactor reached the lower loss in 150 steps; see suites/specs/default.toml)."""
    if cfg.optimizer == "adam":
        return optax.chain(optax.clip_by_global_norm(1.0),
                           optax.adam(learning_rate_schedule(cfg), b1=0.9, b2=0.98, eps=1e-9))
    return optax.adafactor(learning_rate_schedule(cfg), decay_rate=0.8, clipping_threshold=1.0,
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


def _ar_loss(params, batch, rng, *, model, cfg: TrainConfig):
    """Teacher-forced cross-entropy; decoder inputs = targets shifted right (0 first)."""
    inputs, targets = batch["inputs"], batch["targets"]                  # [B, Ls], [B, L]
    logits = model.apply({"params": params}, inputs, losses.shift_right(targets),
                         enable_dropout=True, rngs={"dropout": rng})     # [B, L, V]
    ce = losses.token_cross_entropy(logits, targets, targets != 0, cfg.label_smoothing)
    denom = jnp.maximum(ce["weight_sum"], 1.0)
    loss = ce["loss_sum"] / denom
    return loss, {"loss": loss, "nll": ce["nll_sum"] / denom,
                  "accuracy": ce["correct_sum"] / denom, "target_tokens": ce["weight_sum"]}


def _padir_loss(params, batch, rng, *, model, model_config: ModelConfig, cfg: TrainConfig):
    """Multi-stage refinement loss (averaged over stages) + weighted length cross-entropy."""
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
    length_acc = ((jnp.argmax(length_logits, -1) == lengths) * row).sum() / rows

    real = targets != 0                                                  # [B, L]
    hyp = losses.padir_noise(noise_rng, targets, cfg.unmask_rate, model_config.vocab_size)
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
        # (the mask stays the target mask); no gradient through the choice.
        best = jax.lax.stop_gradient(jnp.argmax(logits, axis=-1))
        hyp = jnp.where(real, best, 0).astype(jnp.int32)
    loss = token_loss + cfg.length_loss_weight * length_loss
    metrics.update(loss=loss, token_loss=token_loss, length_loss=length_loss,
                   length_accuracy=length_acc, nll=metrics[f"nll_stage{cfg.stages}"],
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
    (_, metrics), grads = jax.value_and_grad(loss, has_aux=True)(state.params, batch, step_rng)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = dict(metrics, grad_norm=optax.tree.norm(grads))
    return TrainState(state.step + 1, params, opt_state), metrics


def make_train_step(model_config: ModelConfig, cfg: TrainConfig, model=None):
    """The jitted step (state donated) and the optimizer it uses."""
    model = build_model(model_config) if model is None else model
    tx = make_optimizer(cfg)
    step = functools.partial(train_step, loss=loss_fn(model_config, cfg, model), tx=tx)
    return jax.jit(step, donate_argnums=(0,)), tx


def init_state(model_config: ModelConfig, cfg: TrainConfig, tx, mesh) -> TrainState:
    """Seeded params + optimizer state, replicated over the mesh."""
    from models import t5

    params = t5.init_params(model_config, jax.random.PRNGKey(cfg.seed))
    state = TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))
    return sharding.replicate(state, mesh)


# -- where and what -------------------------------------------------------------------------------
def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:12]


def checkpoint_dir_for(task: str, model_config: ModelConfig, train_config: TrainConfig) -> Path:
    """``checkpoints/<task>-<kind>-<hash>``; the hash covers the task, both configs, the vocabulary
    and the training data's identity (so two distillation teachers never share a folder)."""
    from models.batching import task_identity
    from narbench_core.paths import subdir

    train_config = effective_config(model_config, train_config)
    key = {"task": task, "model": model_config.to_dict(), "train": train_config.to_dict(),
           **task_identity(task)}
    return subdir("checkpoints") / f"{task}-{model_config.kind}-{_digest(key)}"


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
          on_step: Callable[[int, dict], None] | None = None) -> Path:
    """Train ``model_config`` on ``task``'s train split; returns the checkpoint folder.

    Skips when the folder holds a finished run, resumes an interrupted one from its last checkpoint
    (same batch order and dropout keys as an uninterrupted run), raises ``UserError`` on a NaN/inf
    loss or gradient keeping the last good checkpoint. ``data`` trains on in-memory token pairs
    instead of the task's split (``task`` is then only a label; pass ``out_dir``). ``on_step(step,
    metrics)`` is called after every step (host floats). ``mesh``: default all devices.
    """
    from models.batching import load_task_tokens, task_identity
    from tqdm.auto import tqdm

    cfg = effective_config(model_config, train_config)
    if data is None:
        identity = task_identity(task)
        data = load_task_tokens(task, "train")
    else:
        identity = {"vocab_path": None, "vocab_hash": None, "data": data.fingerprint()}
        if out_dir is None:
            raise UserError("training on in-memory data needs an explicit out_dir")
    out_dir = Path(out_dir) if out_dir is not None else checkpoint_dir_for(task, model_config, train_config)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = checkpoint.read_meta(out_dir)
    if meta and meta.get("complete"):
        if meta.get("model_config") != model_config.to_dict() or meta.get("train_config") != cfg.to_dict():
            raise UserError(f"{out_dir} holds a different finished training; choose another --out")
        return out_dir

    mesh = sharding.make_mesh() if mesh is None else mesh
    batches = BucketedBatches(data, cfg.batch_tokens, cfg.max_length, cfg.buckets, cfg.seed,
                              num_shards=mesh.devices.size)
    model = build_model(model_config)
    step_fn, tx = make_train_step(model_config, cfg, model)
    state = init_state(model_config, cfg, tx, mesh)
    num_params = int(sum(x.size for x in jax.tree_util.tree_leaves(state.params)))
    start = checkpoint.latest_step(out_dir) or 0
    if start:
        params, opt_state, start = checkpoint.restore(out_dir, state.params, state.opt_state)
        state = TrainState(sharding.replicate(jnp.asarray(start, jnp.int32), mesh), params, opt_state)
    prev = meta or {}
    record = {
        "task": task, "kind": model_config.kind, "model_config": model_config.to_dict(),
        "train_config": cfg.to_dict(), **identity, "num_params": num_params,
        "devices": [str(d) for d in mesh.devices.flat], "batching": batches.stats(),
        "complete": False, "steps_done": start,
        "wall_seconds": prev.get("wall_seconds", 0.0), "compile_seconds": prev.get("compile_seconds", 0.0),
        "train_seconds": prev.get("train_seconds", 0.0), "target_tokens": prev.get("target_tokens", 0),
        "checkpoint_seconds": prev.get("checkpoint_seconds", 0.0),
    }
    rng = sharding.replicate(jax.random.PRNGKey(cfg.seed), mesh)
    compiled: dict[tuple, Any] = {}
    t_session = time.perf_counter()
    t_base = {k: record[k] for k in ("wall_seconds",)}
    metrics_host: dict = {}
    bar = tqdm(total=cfg.steps, initial=start, disable=not progress, unit="step",
               desc=f"train {task} {model_config.kind}", dynamic_ncols=True)
    try:
        for step in range(start, cfg.steps):
            batch = sharding.shard_batch(batches.batch(step), mesh)
            shape = batch["targets"].shape + batch["inputs"].shape
            if shape not in compiled:
                t0 = time.perf_counter()
                compiled[shape] = step_fn.lower(state, batch, rng).compile()
                record["compile_seconds"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            state, metrics = compiled[shape](state, batch, rng)
            metrics_host = {k: float(v) for k, v in metrics.items()}     # syncs: the step is done
            record["train_seconds"] += time.perf_counter() - t0
            _check_finite(metrics_host, step + 1, out_dir)
            record["target_tokens"] += int(metrics_host["target_tokens"])
            done = step + 1
            if on_step is not None:
                on_step(step, metrics_host)
            if done % cfg.checkpoint_every == 0 or done == cfg.steps:
                t0 = time.perf_counter()
                if not bool(_all_finite(state.params)):
                    raise _diverged(done, "non-finite parameters", out_dir)
                checkpoint.save(out_dir, done, state.params, state.opt_state)
                record["checkpoint_seconds"] += time.perf_counter() - t0
                record.update(steps_done=done, complete=done == cfg.steps,
                              final_loss=metrics_host["loss"], last_metrics=metrics_host)
                _write_record(out_dir, record, t_base, t_session)
            tps = record["target_tokens"] / max(record["train_seconds"], 1e-9)
            bar.set_postfix(loss=f"{metrics_host['loss']:.3f}", tok_s=f"{tps:,.0f}")
            bar.update(1)
    finally:
        bar.close()
        if record["steps_done"] < cfg.steps:           # interrupted or diverged: keep timings honest
            _write_record(out_dir, record, t_base, t_session)
    return out_dir


def _write_record(out_dir: Path, record: dict, t_base: dict, t_session: float) -> None:
    record["wall_seconds"] = t_base["wall_seconds"] + time.perf_counter() - t_session
    record["target_tokens_per_second"] = record["target_tokens"] / max(record["train_seconds"], 1e-9)
    record["padding_share"] = record["batching"]["target_padding_share"]
    checkpoint.write_meta(out_dir, record)
