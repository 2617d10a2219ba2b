"""What a system family is: the cells and systems it expands to, and the base class families share.

A *family* (AR T5, PaDIR, ...) owns one section of a suite spec (``[ar]``, ``[padir]``) and its
training budget (``[train.ar]`` ...). It expands that section into *systems* (a named decoder on a
trained model, one row per test set), builds the model and training configs of its *training cells*,
loads their decoders, and tells the report how to label, sort and draw its rows. The harness asks the
family and never branches on which family it is.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from bench.columns import Column
from narbench_core import defaults
from narbench_core.errors import UserError


@dataclass(frozen=True)
class TrainCell:
    """One model to train (the trainer caches checkpoints by config hash, so equal cells train once)."""

    task: str                                  # the task named in the spec (before distillation)
    family: str                                # the family that builds its configs
    seed: int
    axes: tuple[tuple[str, Any], ...] = ()     # the family's training axes, e.g. (("unmask_rate", 0.15),)
    teacher: "TrainCell | None" = None         # distillation teacher: its outputs replace the references
    warm_start: "TrainCell | None" = None      # the cell whose checkpoint initialises this one's parameters
    preset: str | None = None                  # its size on a suite's size axis (None: the suite's one preset)

    @property
    def label(self) -> str:
        axes = "".join(f" {k} {v:g}" if isinstance(v, float) else f" {k} {v}" for k, v in self.axes)
        return (f"{self.family} {self.task}{' size ' + self.preset if self.preset else ''}{axes}"
                f"{' distill' if self.teacher else ''}"
                f"{' init ' + self.warm_start.family if self.warm_start else ''} seed {self.seed}")

    @property
    def job(self) -> str:
        """The name of the job that trains it (the runner's key, ``cells.json``'s ``cell``)."""
        return f"train {self.label}"

    def sized(self, preset: str) -> "TrainCell":
        """This cell, its teacher and its warm-start source at the size ``preset``."""
        return dataclasses.replace(self, preset=preset,
                                   teacher=self.teacher.sized(preset) if self.teacher else None,
                                   warm_start=self.warm_start.sized(preset) if self.warm_start else None)

    @property
    def sources(self) -> tuple["TrainCell", ...]:
        """The cells this one needs trained first (teacher, warm-start source)."""
        return tuple(c for c in (self.teacher, self.warm_start) if c is not None)


@dataclass(frozen=True)
class System:
    """One compared system: a decoder spec with options on the model of a training cell."""

    name: str                                  # row id: ar-greedy, ar-beam5, padir-s4-u0.15-distill
    family: str
    decoder: str                               # decoder spec: greedy | beam:K | refine:T
    cell: TrainCell
    options: tuple[tuple[str, Any], ...]       # decoder keyword options (shapes, seeds, k ...)
    info: tuple[tuple[str, Any], ...]          # the row's descriptive columns (the family's and core ones)
    baseline: str = ""                         # the AR greedy system every speedup is paired with


@dataclass(frozen=True)
class Context:
    """What a family needs from the grid to expand one (task, seed)."""

    task: str
    seed: int
    teacher: TrainCell                         # the baseline family's cell: distillation teacher
    shapes: Mapping[str, Any]                  # decoder shape options every system shares
    earlier: tuple["System", ...] = ()         # the systems the families before this one expanded (same task
                                               # and seed): a family that runs another's models picks from them


def thread_counts(value) -> tuple[int, ...]:
    """A section's ``threads``: one count (0 = every core) or a list of distinct counts."""
    from suites.spec import integer, list_of

    return (integer(0)(value),) if not isinstance(value, list) else list_of(integer(0), "thread counts >= 0")(value)


def search_words(decoder: str) -> str:
    """``greedy`` -> "greedy", ``beam:5`` -> "beam 5" (an AR search spec in words, for display names)."""
    return decoder.replace(":", " ")


class Family:
    """Base class of a system family; subclasses set the class attributes and override ``parse``,
    ``expand`` and, for trained models, ``model_kind`` and ``axes_configs``."""

    name: str = ""                 # registry key, spec section, row field ``family``
    label: str = ""                # how tables name it: "AR", "PaDIR"
    paradigm: str = "ar"           # "ar" | "nar": which side of the comparison its rows are on
    trains: bool = True            # has a [train.<name>] budget and trains models
    required: bool = False         # every suite has it (an absent [name] table takes the defaults)
    model_kind: str = ""           # models.config.ModelConfig.kind of its models
    columns: tuple[Column, ...] = ()   # row columns only this family fills (others get None)
    shares_worker: bool = False    # its systems are timed in one worker process (bench.measure.workers)

    # -- the suite spec -------------------------------------------------------------------------------
    def parse(self, table) -> Any:
        """The family's ``[name]`` section (a ``suites.spec.Reader``) as a frozen dataclass."""
        raise NotImplementedError

    def expand(self, section: Any, ctx: Context) -> list[System]:
        """The family's systems for one task and seed (names without a seed suffix)."""
        raise NotImplementedError

    # -- training -------------------------------------------------------------------------------------
    def configs(self, preset: str, vocab_size: int, model_overrides: Mapping[str, Any],
                train_kwargs: Mapping[str, Any], axes: Mapping[str, Any]) -> tuple[Any, Any]:
        """``(ModelConfig, TrainConfig)`` of a cell: the preset sized to the vocabulary with the
        suite's overrides, and the budget with the cell's training axes; learning-curve points every
        ``steps // CURVE_POINTS`` steps unless the budget sets ``eval_every``."""
        from models.config import preset as make_preset

        model_extra, _ = self.axes_configs(dict(axes))
        model = make_preset(preset, kind=self.model_kind, vocab_size=vocab_size,
                            **{**dict(model_overrides), **model_extra})
        return model, self.train_config(train_kwargs, axes)

    def train_config(self, train_kwargs: Mapping[str, Any], axes: Mapping[str, Any]) -> Any:
        """The ``TrainConfig`` of a cell: the budget with the cell's training axes and the family's curve
        points (``eval_every``); it needs no data, so ``narbench plan`` builds it too."""
        from models.train import TrainConfig

        _, train_extra = self.axes_configs(dict(axes))
        kwargs = {**dict(train_kwargs), **train_extra}
        kwargs["eval_every"] = self.eval_every(kwargs)
        return TrainConfig(**kwargs)

    @staticmethod
    def eval_every(train_kwargs: Mapping[str, Any]) -> int:
        """Steps between learning-curve points: the budget's ``eval_every``, else ``steps // CURVE_POINTS``."""
        from models.train import TrainConfig

        if train_kwargs.get("eval_every") is not None:
            return int(train_kwargs["eval_every"])
        return max(1, int(train_kwargs.get("steps", TrainConfig.steps)) // defaults.CURVE_POINTS)

    def model_axes(self, row) -> dict[str, Any]:
        """The training axes of the model a result row's system ran, as far as they set the model's size
        (``axes_configs`` turns them into model config fields): ``narbench plan`` reads measured costs
        per model size with it. None by default."""
        return {}

    def train_work(self, values: Mapping[str, Any]) -> float:
        """A training step's work relative to the family's other models of the same size and batch tokens
        (``values``: a cell's training axes, a result row or a checkpoint's train config): ``narbench
        plan`` scales seconds per step measured on one model by it to estimate another. 1 unless the
        family's axes change the work."""
        return 1.0

    def axes_configs(self, axes: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """Split a cell's training axes into ModelConfig and TrainConfig fields."""
        if axes:
            raise UserError(f"{sorted(axes)} do not apply to {self.label} models; drop them")
        return {}, {}

    def load_decoder(self, checkpoint_dir, spec: str, **options: Any):
        """The decoder ``spec`` on a trained checkpoint (models pick the class by the model's kind)."""
        from models.decoders import load_decoder

        return load_decoder(checkpoint_dir, spec, **options)

    def diagnosed(self, row, iterations: int | None = None, length_hyps: int | None = None,
                  keep_repeats: bool = False) -> tuple[str, dict[str, Any]] | None:
        """The decoder spec and options that decode a result row's model with refinement iterations, length
        hypotheses or the repeat-dropping step changed (``bench.gap``: where the gap to AR goes), None when the
        family's decoders have none of them (its rows are not diagnosed). None by default."""
        return None

    def check_installed(self) -> None:
        """A one-line ``UserError`` naming the extra to install when the family's engine is missing (a suite
        with its section checks this before training). Nothing to check by default."""

    def worker_env(self, options: Mapping[str, Any]) -> dict[str, str]:
        """Environment variables of the worker process that times one of the family's systems (set
        before any library loads: thread pools, wait policies). Recorded in env.json."""
        return {}

    def serving_options(self, serving: Any) -> dict[str, Any]:
        """Decoder options the family's systems take when served under load (``bench.serving``; ``serving``: the
        suite's ``ServingSpec``): the engine's own batching settings, as its users would set them. None by
        default: the dynamic batcher's batches go to the decoder as they are."""
        return {}

    # -- the report ------------------------------------------------------------------------------------
    def sort_key(self, row) -> tuple:
        """Order of the family's rows in tables (families themselves sort in registry order)."""
        return (row.hypotheses, row.system)

    def point_label(self, row) -> str:
        """A short label for the row's point in plots."""
        return row.system

    def name_parts(self, row) -> list[tuple[str, str | None, bool]]:
        """The row's display name in parts, in order: ``(axis, text, always)``. Reports name a system by
        the family's label, the parts marked ``always`` and those whose text differs between the family's
        rows of the run (``bench.report.names``). A text starting with "," reads as a trailing clause
        ("T=4 k=3, distilled"); an empty text says nothing; None: the axis does not act in this row (a
        setting silences it, or the row predates it), so it neither shows nor makes the axis vary."""
        return [("system", row.system, True)]

    def style(self, row) -> dict[str, Any]:
        """Matplotlib colour and marker of the row's points, and its legend entry."""
        return {"color": "#1f4e79", "marker": "s", "label": self.label}

    # -- the grid page (bench.report.grid) --------------------------------------------------------------
    interaction: tuple[str, str] | None = None   # two axes whose interaction the grid page shows

    def grid_axes(self, row) -> dict[str, Any]:
        """The row's values of the family's ablation axes, None where an axis does not act in it (a
        setting silences it, or the row predates it). The grid page compares rows that differ in one
        axis; a family without axes ({}) has none."""
        return {}

    def grid_reference(self, axis: str, values: list) -> Any:
        """The value of ``axis`` the others are compared against (``values``: the run's, sorted)."""
        return values[0]
