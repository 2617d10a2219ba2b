"""When a training stops, and the learning rate it follows on the way.

Two stopping rules (``TrainConfig.until``), the same for every family:

- ``"steps"``: train exactly ``steps`` steps.
- ``"plateau"``: evaluate on dev every ``eval_every`` steps (``models.curves``, ``dev_sentences`` of the
  dev split) and stop once the rule's signal has not progressed by more than ``min_delta`` past its best
  for ``patience`` evaluations in a row (at least ``patience_share`` of the evaluations so far, and not
  before ``min_steps``); ``steps`` is a cap. The signal is the mean of the last ``smooth`` points (1: each
  point as measured) of the curve value ``signal`` names: dev BLEU (progress is a rise), or dev NLL
  (progress is a fall; ``min_delta`` then in nats per token).

Two learning-rate schedules after the linear warm-up (``TrainConfig.schedule``):

- ``"cosine"``: cosine decay to ``min_learning_rate`` at ``steps`` (it needs the total in advance, so
  it serves ``until = "steps"`` only);
- ``"wsd"`` (warmup-stable-decay): the peak rate held constant, then a linear decay to
  ``min_learning_rate`` over ``decay_share`` x the steps run before it, then the training stops. The
  decay starts where the plateau rule fires, or at the latest where the decay ends at the cap.

Everything here is a function of the config and the dev curve so far, so a training killed at any
moment and resumed from its last checkpoint (whose curve points it keeps, re-evaluating the later
ones on the same parameters) reaches the same decisions at the same steps.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import jax.numpy as jnp
import optax

from narbench_core.defaults import PLATEAU_SIGNALS


@dataclass(frozen=True)
class StopState:
    """Where a training stands against its stopping rule, from its dev curve so far."""

    decay_start: int | None        # step the learning rate starts to decay (wsd; None: cosine)
    stop: int                      # the step the training ends at
    stopped_by: str                # "plateau" (the rule fired), "cap" (no plateau by ``steps``), "steps"
    best: float | None             # best of the rule's signal so far (its curve value, smoothed over ``smooth``
                                   # points: dev BLEU or dev NLL, in the curve's own units)
    best_step: int | None          # ... and its step
    evals_since_best: int          # evaluations since the signal last progressed by more than min_delta


# What decides where a plateau rule stops a training (``stop_state``): two trainings whose values of these
# fields agree stop alike on the same curve.
RULE_FIELDS = ("signal", "smooth", "min_delta", "patience", "patience_share", "min_steps", "dev_sentences",
               "eval_every")


def latest_decay_start(cfg: Any) -> int:
    """The last step a wsd decay may start at and still end at the cap: ``steps / (1 + decay_share)``."""
    return max(1, math.floor(cfg.steps / (1.0 + cfg.decay_share)))


def decay_steps(cfg: Any, decay_start: int) -> int:
    """Steps of the wsd decay that starts at ``decay_start`` (at least one, at most up to the cap)."""
    return max(1, min(round(cfg.decay_share * decay_start), cfg.steps - decay_start))


def signal(cfg: Any, points: Iterable[Mapping[str, Any]]) -> list[tuple[int, float]]:
    """The rule's signal at each curve point, by step: the curve value ``cfg.signal`` names (dev BLEU or dev NLL)
    averaged over the last ``cfg.smooth`` points (fewer at the start), in the curve's own units."""
    pts = sorted((int(p["step"]), float(p[cfg.signal])) for p in points)
    window = cfg.smooth
    out = []
    for i, (step, _) in enumerate(pts):
        recent = [value for _, value in pts[max(0, i + 1 - window):i + 1]]
        out.append((step, sum(recent) / len(recent)))
    return out


def progress_sign(cfg: Any) -> int:
    """+1 where a rise of the rule's signal is progress (dev BLEU), -1 where a fall is (dev NLL)."""
    return PLATEAU_SIGNALS[cfg.signal]


def patience_at(cfg: Any, evals: int) -> int:
    """Evaluations without progress that fire the rule after ``evals`` evaluations: ``patience``, or
    ``patience_share`` of the evaluations so far where that is more."""
    return max(cfg.patience, math.ceil(cfg.patience_share * evals))


def stop_state(cfg: Any, points: Iterable[Mapping[str, Any]]) -> StopState:
    """The stopping decision of ``cfg`` (a ``TrainConfig``) given its curve points so far
    (``{"step", "dev_bleu", "dev_nll"}``, the one ``cfg.signal`` names at least; points after the decay started
    do not move it)."""
    best, best_step, since = None, None, 0
    fired = None
    latest = latest_decay_start(cfg) if cfg.schedule == "wsd" else cfg.steps
    pts = signal(cfg, points)
    sign = progress_sign(cfg)
    for n, (step, value) in enumerate(pts, 1):
        if best is None or sign * (value - best) > cfg.min_delta:
            best, best_step, since = value, step, 0
        else:
            since += 1
        if (fired is None and cfg.until == "plateau" and since >= patience_at(cfg, n)
                and step >= cfg.min_steps and step < latest):
            fired = step
    if fired is None:
        return StopState(latest if cfg.schedule == "wsd" else None, cfg.steps,
                         "cap" if cfg.until == "plateau" else "steps", best, best_step, since)
    if cfg.schedule == "wsd":
        return StopState(fired, fired + decay_steps(cfg, fired), "plateau", best, best_step, since)
    return StopState(None, fired, "plateau", best, best_step, since)


def earliest_stop(cfg: Any, points: Iterable[Mapping[str, Any]]) -> int | None:
    """The earliest step a plateau training of ``cfg`` with dev curve ``points`` so far can stop at, where its rule
    has not fired yet: the rule replayed on later points that each score worse than every point so far (the
    signal never progresses again; smoothing and a growing patience included), then the wsd decay. None where no
    plateau can fire before the cap (the latest decay start), the rule has fired (``stop_state``'s stop is then
    exact) or the training runs a set number of steps."""
    points = list(points)
    if cfg.until != "plateau" or stop_state(cfg, points).stopped_by == "plateau":
        return None
    cap = latest_decay_start(cfg) if cfg.schedule == "wsd" else cfg.steps
    sign = progress_sign(cfg)
    worst = sign * (min((sign * float(p[cfg.signal]) for p in points), default=0.0) - 1.0)
    step, future = max((int(p["step"]) for p in points), default=0), list(points)
    while True:
        step += cfg.eval_every
        if step >= cap:
            return None
        future.append({"step": step, cfg.signal: worst})
        if stop_state(cfg, future).stopped_by == "plateau":
            return step + decay_steps(cfg, step) if cfg.schedule == "wsd" else step


def replay(cfg: Any, points: Iterable[Mapping[str, Any]], grid: Mapping[str, Sequence[Any]]) -> list[dict]:
    """Every rule of ``grid`` (``RULE_FIELDS`` names -> the values to try; each other field as in ``cfg``, a
    ``TrainConfig``) read on one dev curve, in the grid's order: its fields, the step it fires at (``fires``, None
    where it does not by the last point), the step it would stop at with its decay (``stops``), and its best
    signal and that point's step (``stop_state``)."""
    pts = list(points)
    names = [k for k in RULE_FIELDS if k in grid]
    out = []
    for values in itertools.product(*(grid[k] for k in names)):
        rule = dataclasses.replace(cfg, **dict(zip(names, values)))
        state = stop_state(rule, pts)
        fired = state.stopped_by == "plateau"
        out.append({**{k: getattr(rule, k) for k in RULE_FIELDS},
                    "fires": (state.decay_start if rule.schedule == "wsd" else state.stop) if fired else None,
                    "stops": state.stop if fired else None, "best": state.best, "best_step": state.best_step})
    return out


def learning_rate_schedule(cfg: Any, decay_start: int | None = None) -> optax.Schedule:
    """Linear warm-up from ``min_learning_rate`` to the peak, then ``cfg.schedule``: cosine decay to
    ``min_learning_rate`` at ``steps``, or (wsd) the peak until ``decay_start`` (default: the latest,
    ``latest_decay_start``) and a linear decay to ``min_learning_rate`` over ``decay_steps``."""
    warmup = min(cfg.warmup_steps, cfg.steps - 1)
    if cfg.schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(
            init_value=cfg.min_learning_rate, peak_value=cfg.learning_rate, warmup_steps=warmup,
            decay_steps=max(cfg.steps, warmup + 1), end_value=cfg.min_learning_rate)
    start = latest_decay_start(cfg) if decay_start is None else decay_start
    length = decay_steps(cfg, start)
    peak, low = cfg.learning_rate, cfg.min_learning_rate

    def wsd(count):
        count = jnp.asarray(count, jnp.float32)
        ramp = low + (peak - low) * count / max(warmup, 1)
        decay = peak + (low - peak) * jnp.clip((count - start) / length, 0.0, 1.0)
        return jnp.where(count < warmup, ramp, jnp.where(count < start, peak, decay))

    return wsd
