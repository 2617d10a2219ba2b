"""How a training went, as a run folder keeps it: ``curves.jsonl`` and the "still improving" rule.

Every trained model's checkpoint folder holds its curve (``models.curves``: dev NLL and dev BLEU at
regular training steps); the grid copies it into the run folder's ``curves.jsonl``, one record per
point: ``model`` (the training cell's label, also the rows' ``model`` column), ``family``, ``step``,
``seconds`` (training seconds so far), ``dev_nll``, ``dev_bleu`` and, where the point recorded it,
``eval_seconds`` (the point's own evaluation time: ``narbench plan`` estimates dev points with it) and, for a
model whose learning-rate decay began (``models.schedule``: a wsd schedule whose plateau rule fired, or which
reached its latest decay start), ``decaying`` (the point was evaluated after the decay started).
``bench.report`` draws ``learning_curves.png`` from it, with a ring where each decay started.
"""
from __future__ import annotations

import statistics
from typing import Any, Iterable, Mapping

from narbench_core import defaults

FIELDS = ("model", "family", "step", "seconds", "dev_nll", "dev_bleu")


def decay_started(record: Mapping[str, Any]) -> int | None:
    """The step a trained model's learning-rate decay started at, from its checkpoint record, or None if it
    never started (a cosine schedule, or a wsd training stopped before its decay)."""
    start, done = record.get("decay_start"), record.get("steps_done")
    return int(start) if start is not None and done is not None and int(done) > int(start) else None


def plateau_bleu(points: Iterable[Mapping[str, Any]], decay_start: int | None) -> float | None:
    """The best dev BLEU of a curve's points up to ``decay_start`` (the step its decay began at): the
    plateau the stopping rule saw. None without a decay or such points."""
    if decay_start is None:
        return None
    before = [float(p["dev_bleu"]) for p in points if int(p["step"]) <= decay_start]
    return max(before) if before else None


def dev_swing(points: Iterable[Mapping[str, Any]], decay_start: int | None, key: str = "dev_bleu") -> float | None:
    """How much a curve's ``key`` (dev BLEU) swings between evaluations at the peak learning rate: the standard
    deviation (n - 1) of the successive differences of its points from half the peak-rate steps on (up to
    ``decay_start``, else the last point; the early climb is not noise, and a slow trend barely moves a difference).
    None with fewer than 3 such points."""
    pts = sorted((int(p["step"]), float(p[key])) for p in points)
    end = decay_start if decay_start is not None else (pts[-1][0] if pts else 0)
    values = [v for step, v in pts if end / 2 <= step <= end]
    diffs = [b - a for a, b in zip(values, values[1:])]
    return statistics.stdev(diffs) if len(diffs) >= 2 else None


def past_plateau(stopped: list[Mapping[str, Any]], stopped_decay: int, continued: list[Mapping[str, Any]],
                 final: tuple[int, float, tuple[float, float]] | None = None) -> str:
    """One line comparing a training the plateau rule stopped (its curve ``stopped`` and its decay start) with
    its continuation past the plateau (``narbench continue``): the last point's dev BLEU and NLL of each, the
    stopped training's dev BLEU swing at the peak rate (``dev_swing``), and, given ``final`` (the dev sentences,
    the continued minus the stopped final model's dev BLEU on them and its paired-bootstrap 95% interval), the
    verdict by the dev set's own noise: stopped early where the whole interval is above 0. Without ``final``, the
    peak-rate swing is the noise a rise must clear."""
    def last(points):
        p = max(points, key=lambda p: int(p["step"]))
        return int(p["step"]), float(p["dev_bleu"]), float(p["dev_nll"])

    (s_step, s_bleu, s_nll), (c_step, c_bleu, c_nll) = last(stopped), last(continued)
    swing = dev_swing(stopped, stopped_decay)
    noise = "an unknown swing (under 3 points at the peak rate)" if swing is None else \
        f"its dev BLEU swings by {swing:.2f} between evaluations at the peak rate"
    head = (f"dev BLEU {c_bleu:.2f} at step {c_step:,} continued, {s_bleu:.2f} at step {s_step:,} stopped "
            f"({c_bleu - s_bleu:+.2f}; dev NLL {c_nll:.3f} vs {s_nll:.3f}); {noise}")
    if final is None:
        return f"{head}: a rise beyond that means the rule stopped it early"
    n, diff, (low, high) = final
    verdict = ("the rule stopped it early" if low > 0 else
               "within the dev set's noise: the rule did not stop it early" if low <= 0 <= high else
               "the continued model is worse")
    return (f"{head}; the final models on the {n:,} dev sentences: {diff:+.2f} BLEU, 95% CI [{low:+.2f}, "
            f"{high:+.2f}] (paired bootstrap): {verdict}")


def records(model: str, family: str, points: Iterable[Mapping[str, Any]],
            decay_start: int | None = None) -> list[dict]:
    """The run-folder records of one model's curve points, by step (with ``decaying`` when ``decay_start``,
    the step its learning-rate decay started at, is given)."""
    return [{"model": model, "family": family, "step": int(p["step"]), "seconds": float(p["seconds"]),
             "dev_nll": float(p["dev_nll"]), "dev_bleu": float(p["dev_bleu"]),
             **({"eval_seconds": float(p["eval_seconds"])} if p.get("eval_seconds") is not None else {}),
             **({"decaying": int(p["step"]) > decay_start} if decay_start is not None else {})}
            for p in sorted(points, key=lambda p: p["step"])]


def still_improving(points: Iterable[Mapping[str, Any]], stopped_by: str | None = None,
                    rise: float = defaults.CURVE_RISE, tail: float = defaults.CURVE_TAIL) -> bool | None:
    """Was the model still learning when its training stopped? No if the plateau rule stopped it
    (``stopped_by == "plateau"``, ``models.schedule``); otherwise: did dev BLEU rise by more than
    ``rise`` over the last ``tail`` share of training (by steps)?

    The rise is the last point's BLEU minus the BLEU at step ``(1 - tail) x`` the last point's step
    (linearly interpolated between the points around it). None when the curve does not reach back
    that far (no point at or before that step), or has no points.
    """
    if stopped_by == "plateau":
        return False
    pts = sorted((int(p["step"]), float(p["dev_bleu"])) for p in points)
    if not pts:
        return None
    last_step, last_bleu = pts[-1]
    at = (1.0 - tail) * last_step
    if at < pts[0][0]:
        return None
    for (s0, b0), (s1, b1) in zip(pts, pts[1:]):
        if s0 <= at <= s1:
            start = b0 if s1 == s0 else b0 + (b1 - b0) * (at - s0) / (s1 - s0)
            return last_bleu - start > rise
    return False                       # one point (at == its step): no rise
