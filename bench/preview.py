"""``narbench plan``: what a suite expands to and what running it would take, without training or timing.

``preview(spec, locator, measured)`` walks the plan (``bench.plan.expand``) the way the runner would
train it, but only looks: each training cell is *cached* (its checkpoint folder holds a finished
``narbench.json``), *partial* (an unfinished one: the run resumes it; or none, but the same training under
another step cap or stopping rule beside it, which it starts from: ``models.train.seed_source``), *to train*
(its task's data or vocabulary not prepared yet: nothing can have trained on it), or *unknown* (its budget is matched to
the baseline's at run time, so its folder is not known before). A cell whose
teacher or warm-start source is not cached trains after it: its folder name depends on that source's
result. Distillations likewise (a ``distill/`` folder with ``train.tsv`` and ``distill.json``). Then the
systems of each test set (test sets reading the same split share one timed measurement) and the
estimate of ``bench.estimate`` for the missing work.

A ``Locator`` is where the runner's trainer and distiller would put a cell (the real one reads the data
root; tests pass fakes).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from bench import estimate as est
from bench import families
from narbench_core.errors import UserError
from bench.families import System, TrainCell
from bench.plan import Plan, expand
from narbench_core import defaults
from suites.spec import SuiteSpec

CACHED, PARTIAL, TO_TRAIN, UNKNOWN = "cached", "partial", "to train", "unknown"


@dataclass
class Locator:
    """Where a suite's results would be, found without training or downloading anything."""

    configs: Callable[[SuiteSpec, TrainCell], tuple]     # (spec, cell) -> (model_config, train_config)
    not_ready: Callable[[str], str | None]               # task -> why its data cannot name a model yet, or None
    checkpoint_dir: Callable[..., Path]                  # (task, model_config, train_config, init_from) -> folder
    record: Callable[[Path], dict | None]                # checkpoint folder -> its narbench.json
    distillation: Callable[..., tuple[Path, str | None]]  # (teacher_dir, task, **distill kwargs, seed) ->
    #                                                       (folder, the distilled task if it is cached, else None)
    split_size: Callable[[str, str], int | None]          # (task, split) -> sentences, None if unknown
    data_root: Path | None = None                         # where checkpoint and distillation records live
    curve: Callable[[Path], list[dict]] = lambda folder: _read_curve(folder)   # checkpoint folder -> dev curve
    seed_source: Callable[..., Any] = lambda *args: None  # (task, model_config, train_config, init_from) ->
    #                                                       models.train.SeedSource to start from, or None


def _read_curve(folder: Path) -> list[dict]:
    """A checkpoint folder's dev curve (``models.curves``: a file, so fakes' folders read the same way)."""
    from models.curves import read_curve

    return read_curve(folder)


def real_locator() -> Locator:
    """The data root's checkpoints and distillations, as ``models.train`` and ``models.distill`` name them."""
    from bench.runner import real_configs
    from narbench_core.paths import data_root

    def not_ready(task: str) -> str | None:
        from suites.catalog import task_info

        info = task_info(task)
        if info.splits.get("train") is None:
            return f"{task}'s data is not prepared (`narbench data prepare`)"
        if not info.vocabulary.is_built():
            return f"{task}'s vocabulary is not trained yet (the first training trains it)"
        return None

    def checkpoint_dir(task, model_config, train_config, init_from=None):
        from models.train import checkpoint_dir_for

        return checkpoint_dir_for(task, model_config, train_config, init_from)

    def seed_source(task, model_config, train_config, init_from=None):
        from models.batching import task_identity
        from models.train import seed_source

        folder = checkpoint_dir(task, model_config, train_config, init_from)
        return seed_source(folder, task, model_config, train_config, task_identity(task), init_from)

    def record(folder):
        from models.checkpoint import read_meta

        return read_meta(Path(folder))

    def distillation(teacher_dir, task, seed, **kwargs):
        from models import distill
        from suites.catalog import register_distilled_task

        folder = distill.distill_dir_for(teacher_dir, task, seed=seed, **kwargs)
        if (folder / distill.TSV_NAME).is_file() and (folder / distill.RECORD_NAME).is_file():
            return folder, register_distilled_task(task, folder / distill.TSV_NAME)
        return folder, None

    def split_size(task, split):
        from suites.catalog import task_info

        return task_info(task).splits.get(split)

    return Locator(real_configs, not_ready, checkpoint_dir, record, distillation, split_size, data_root(),
                   seed_source=seed_source)


# ----------------------------------------------------------------------------------------- the preview

@dataclass
class CellPreview:
    cell: TrainCell
    state: str
    folder: str | None = None        # the checkpoint folder (when its name is known)
    note: str = ""
    estimate: est.Estimate | None = None     # the training still to do (None: cached)
    systems: list[str] = field(default_factory=list)


@dataclass
class DistillPreview:
    teacher: TrainCell
    task: str
    seed: int
    state: str
    folder: str | None = None
    note: str = ""
    estimate: est.Estimate | None = None
    distilled: str | None = None     # the distilled task, when cached


@dataclass
class SplitPreview:
    task: str
    split: str
    test_sets: list[str]
    systems: list[str]
    processes: int                   # timing worker processes (bench.families.worker_processes)
    sentences: int | None
    seconds: float | None
    costs: dict[str, tuple[est.SystemCost, float | None]]      # system -> (cost, its seconds)
    served: list[str] = field(default_factory=list)             # [serving]: the systems served under load
    serving_seconds: float | None = 0.0                        # their LoadGen tests (bench.serving.measure)


@dataclass
class Preview:
    spec: SuiteSpec
    plan: Plan
    cells: list[CellPreview]
    distillations: list[DistillPreview]
    splits: list[SplitPreview]
    measured: est.Measured
    data_root: Path | None = None

    def totals(self) -> dict[str, float | None]:
        """Seconds of training, distillation and timing still to do (None where a part is unknown)."""
        def total(parts: list[float | None]) -> float | None:
            return None if any(p is None for p in parts) else float(sum(parts))

        out = {"training": total([c.estimate.seconds for c in self.cells if c.estimate is not None]),
               "distillation": total([d.estimate.seconds for d in self.distillations if d.estimate is not None]),
               "timing": total([s.seconds for s in self.splits]),
               "serving": total([s.serving_seconds for s in self.splits])}
        out["total"] = total(list(out.values()))
        return out


def preview(spec: SuiteSpec, locator: Locator, measured: est.Measured) -> Preview:
    """What ``narbench run`` would do with ``spec`` (see the module docstring)."""
    plan = expand(spec)
    folders: dict[TrainCell, Path] = {}           # cached cells' checkpoint folders
    states: dict[TrainCell, CellPreview] = {}
    distills: dict[tuple, DistillPreview] = {}

    def train(cell: TrainCell, note: str, state: str = TO_TRAIN, folder: str | None = None,
              resumed_at: tuple[int, list[dict]] | None = None, rate_from: str | None = None) -> CellPreview:
        budget = spec.budget(cell.family)
        axes = dict(cell.axes)
        estimate = est.train_estimate(measured, cell.family, cell.task, cell_shape(spec, cell), cell.label, budget,
                                      axes, resumed_at, rate_from or folder, _vocab_size(cell))
        return CellPreview(cell, state, folder, note, estimate)

    def _vocab_size(cell: TrainCell) -> int | None:
        """The cell's vocabulary size where its task's data can name it (a size's work per token needs it)."""
        if locator.not_ready(cell.task) is not None:
            return None
        try:
            model_config = locator.configs(spec, cell)[0]
        except UserError:
            return None
        return getattr(model_config, "vocab_size", None)              # fakes' configs are dicts: none

    def distillation(cell: TrainCell, teacher_dir: Path | None) -> tuple[DistillPreview, str | None]:
        key = (cell.teacher, cell.task, cell.seed)
        if key not in distills:
            kwargs = spec.distill.kwargs()
            size, cap = locator.split_size(cell.task, "train"), kwargs["max_examples"]
            rest = None if size is None else max(size - defaults.DISTILL_HELDOUT, 0)
            sentences = rest if cap is None else cap if rest is None else min(cap, rest)
            cost = est.distill_estimate(measured, cell_shape(spec, cell.teacher), cell.task, kwargs["decoder"],
                                        kwargs["engine"], sentences)
            if teacher_dir is None:
                distills[key] = DistillPreview(cell.teacher, cell.task, cell.seed, TO_TRAIN,
                                               note="after its teacher trains", estimate=cost)
            else:
                folder, task = locator.distillation(teacher_dir, cell.task, seed=cell.seed, **kwargs)
                distills[key] = DistillPreview(cell.teacher, cell.task, cell.seed, CACHED if task else TO_TRAIN,
                                               _portable(folder), "", None if task else cost, task)
        return distills[key], distills[key].distilled

    def visit(cell: TrainCell) -> CellPreview:
        if cell in states:
            return states[cell]
        why = locator.not_ready(cell.task)
        budget = spec.budget(cell.family) if families.get(cell.family).trains else None
        task, init_from, waits = cell.task, None, []
        if cell.teacher is not None:
            teacher = visit(cell.teacher)
            _, distilled = distillation(cell, folders.get(cell.teacher))
            if teacher.state != CACHED or distilled is None:
                waits.append("its distillation")
            task = distilled or task
        if cell.warm_start is not None:
            if visit(cell.warm_start).state != CACHED:
                waits.append("its warm-start source")
            init_from = folders.get(cell.warm_start)
        if why:                                    # nothing can have been trained on it here yet
            states[cell] = train(cell, why)
        elif budget is not None and budget.match is not None:
            states[cell] = train(cell, f"its budget matches the baseline's {budget.match} at run time", UNKNOWN)
        elif waits:
            states[cell] = train(cell, f"after {' and '.join(waits)}")
        else:
            model_config, train_config = locator.configs(spec, cell)
            folder = Path(locator.checkpoint_dir(task, model_config, train_config, init_from))
            record = locator.record(folder) or {}
            if record.get("complete"):
                folders[cell] = folder
                states[cell] = CellPreview(cell, CACHED, _portable(folder))
            elif record:
                done, curve = int(record.get("steps_done") or 0), locator.curve(folder)
                states[cell] = train(cell, f"resumes at step {done:,}{_last_point(curve)}", PARTIAL,
                                     _portable(folder), (done, curve))
            elif (source := locator.seed_source(task, model_config, train_config, init_from)) is not None:
                curve = [p for p in locator.curve(source.folder) if p["step"] <= source.step]
                start = "all of" if source.whole else f"step {source.step:,} of"
                states[cell] = train(cell, f"starts from {start} {_portable(source.folder)}, {source.how()}",
                                     PARTIAL, _portable(folder),
                                     (source.step, curve), _portable(source.folder))
            else:
                states[cell] = train(cell, "", TO_TRAIN, _portable(folder))
        return states[cell]

    for cell in plan.train_cells:
        visit(cell)
    for system in plan.systems:
        states[system.cell].systems.append(system.name)
    splits = _splits(spec, plan, locator, measured)
    return Preview(spec, plan, [states[c] for c in plan.train_cells], list(distills.values()), splits, measured,
                   locator.data_root)


def cell_shape(spec: SuiteSpec, cell: TrainCell) -> tuple:
    """The model shape (``bench.estimate.model_shape``) a training cell trains: its size with the suite's overrides
    and its family's model axes."""
    model_extra, _ = families.get(cell.family).axes_configs(dict(cell.axes))
    return est.model_shape(spec.model.preset_of(cell), {**spec.model.override_dict(), **model_extra})


def _last_point(curve: list[dict]) -> str:
    """``"; its last dev point: step 27,500, dev BLEU 29.79, dev NLL 2.268"``, what of it the curve has ("" if no
    point)."""
    if not curve:
        return ""
    last = curve[-1]
    found = [f"{name} {last[key]:.{digits}f}" for key, name, digits in (("dev_bleu", "dev BLEU", 2),
                                                                         ("dev_nll", "dev NLL", 3))
             if isinstance(last.get(key), (int, float))]
    return f"; its last dev point: step {last['step']:,}" + "".join(", " + f for f in found)


def _portable(folder: Path) -> str:
    from narbench_core.paths import portable

    return portable(folder)


def _splits(spec: SuiteSpec, plan: Plan, locator: Locator, measured: est.Measured) -> list[SplitPreview]:
    """One timed measurement per (task, split): its systems, sentences and seconds."""
    out = []
    for task, split in dict.fromkeys((ts.task, ts.split) for ts in spec.test_sets()):
        cells = [c for c in plan.eval_cells if (c.test_set.task, c.test_set.split) == (task, split)]
        systems: list[System] = list(dict.fromkeys(c.system for c in cells))
        size = locator.split_size(task, split)
        cap = spec.max_test_sentences
        n = (min(cap, size) if size is not None and cap else size if size is not None else cap)
        solo = min(spec.timing.solo_sentences, n) if n is not None else None
        costs = {}
        for s in systems:
            info = dict(s.info)
            axes = families.get(s.family).grid_axes({**info, "distill": s.cell.teacher is not None})
            cost = est.system_cost(measured, s.family, s.name, tuple(sorted(axes.items())), s.cell.task,
                                   cell_shape(spec, s.cell), spec.batch_size, s.decoder, info.get("hypotheses"),
                                   info.get("iterations"))
            seconds = None if n is None else est.timing_seconds(cost, n, spec.timing.repeats, solo)
            costs[s.name] = (cost, seconds)
        parts = [sec for _, sec in costs.values()]
        served, serving_seconds = _serving(spec, systems, costs, n, measured)
        out.append(SplitPreview(task, split, list(dict.fromkeys(c.test_set.name for c in cells)),
                                [s.name for s in systems], families.worker_processes(systems), n,
                                None if any(p is None for p in parts) else float(sum(parts)), costs,
                                served, serving_seconds))
    return out


def _serving(spec: SuiteSpec, systems: list[System], costs: dict, sentences: int | None,
             measured: est.Measured) -> tuple[list[str], float | None]:
    """The systems ``[serving]`` serves on a split of ``sentences`` and the seconds of their LoadGen tests (None if
    a system's batch-1 latency is unknown), the driver's empty system included: each system's own serving time in
    an earlier run on this machine with the same settings where there is one, else ``estimate_seconds``."""
    if spec.serving is None:
        return [], 0.0
    from bench.serving.measure import estimate_seconds
    from bench.serving.run import DRIVER, chosen

    names = [s.name for s in chosen(spec, systems)]
    key = spec.serving.settings_key()
    served = {n: measured.served.get((key, n)) for n in [DRIVER, *names]}
    if any(costs[n][0].latency_ms is None and served[n] is None for n in names):
        return names, None
    driver = served[DRIVER] or max(spec.serving.min_duration_s, spec.serving.min_queries * 1e-4)
    return names, driver + float(sum(served[n] or estimate_seconds(spec.serving, costs[n][0].latency_ms,
                                                                   costs[n][0].compile_s, sentences or 0)
                                     for n in names))


# ------------------------------------------------------------------------------------------- rendering

def cell_lines(c: CellPreview) -> list[str]:
    """A training cell as the plan shows it (``narbench status`` shows its trainings under way so): its state and
    label, then its checkpoint folder, note and estimate, each indented."""
    cost = "" if c.estimate is None else f"~{est.duration(c.estimate.seconds)}: {c.estimate.how}"
    return [f"  {c.state:9s} {c.cell.label}"] + [f"            {text}" for text in (c.folder, c.note, cost) if text]


def render_text(p: Preview) -> str:
    """The plan as a reader sees it: training cells, distillations, systems per test set, the estimate."""
    spec = p.spec
    lines = [f"narbench plan: {spec.name} ({spec.source}), spec hash {spec.spec_hash()[:8]}"
             + (f"; cached models and distillations looked up under {p.data_root}" if p.data_root else ""), ""]
    counts = {s: sum(c.state == s for c in p.cells) for s in (CACHED, PARTIAL, TO_TRAIN, UNKNOWN)}
    lines.append(f"Training cells ({len(p.cells)}: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n) + ")")
    for c in p.cells:
        lines.extend(cell_lines(c))
    if p.distillations:
        lines.extend(["", f"Distillations ({len(p.distillations)})"])
        for d in p.distillations:
            kw = spec.distill
            what = (f"{d.task} by {d.teacher.label} ({kw.decoder}, {kw.engine}, "
                    f"{'all' if kw.max_examples is None else f'{kw.max_examples:,}'} sources)")
            lines.append(f"  {d.state:9s} {what}")
            for text in (d.folder, d.note, None if d.estimate is None else
                         f"~{est.duration(d.estimate.seconds)}: {d.estimate.how}"):
                if text:
                    lines.append(f"            {text}")
    by_family: dict[str, int] = {}
    for s in p.plan.systems:
        by_family[s.family] = by_family.get(s.family, 0) + 1
    lines.extend(["", f"Systems ({len(p.plan.systems)}: "
                  + ", ".join(f"{families.get(f).label} {n}" for f, n in by_family.items()) + "), by model:"])
    for c in p.cells:
        lines.append(f"  {c.cell.label}: {', '.join(c.systems) if c.systems else '(a source of others only)'}")
    lines.extend(["", "Test sets (test sets reading one split share its timed measurement):"])
    for s in p.splits:
        n = "? sentences" if s.sentences is None else f"{s.sentences:,} sentences"
        lines.append(f"  {' and '.join(s.test_sets)}: {len(s.systems)} systems in {s.processes} worker "
                     f"process{'es' * (s.processes != 1)}, {n}, timed once: ~{est.duration(s.seconds)}")
        if s.served:
            sv = spec.serving
            lines.append(f"    served under load by MLPerf LoadGen (on {s.test_sets[0]}): {len(s.served)} systems and the "
                         f"driver's empty one, one at a time; {', '.join(sv.scenarios)}; bounds "
                         f"{', '.join(f'{b:g}' for b in sv.bounds_ms)} ms at p{sv.percentile * 100:g}; batches up to "
                         f"{' or '.join(map(str, sv.max_batch))}: ~{est.duration(s.serving_seconds)}")
    lines.extend(["", *render_estimate(p)])
    return "\n".join(lines) + "\n"


def render_estimate(p: Preview) -> list[str]:
    m, t = p.measured, p.totals()
    timed = sum(len(s.systems) for s in p.splits)
    costs = [cost for s in p.splits for cost, _ in s.costs.values()]
    unknown = sum(cost.latency_ms is None for cost in costs)
    new = sum(cost.latency_ms is not None and not cost.how.startswith("measured") for cost in costs)
    training = sum(c.state in (TO_TRAIN, PARTIAL, UNKNOWN) for c in p.cells)
    lines = ["Estimate of the work still to do, on this machine:",
             f"  training      {est.duration(t['training']):>12s}  "
             f"({training} model{'s' * (training != 1)}; per cell above)",
             f"  distillation  {est.duration(t['distillation']):>12s}",
             f"  timing        {est.duration(t['timing']):>12s}  ({timed} systems in {len(p.splits)} measurement"
             f"{'s' * (len(p.splits) != 1)}, each x (sentences x {p.spec.timing.repeats} repeat"
             f"{'s' * (p.spec.timing.repeats != 1)} + {p.spec.timing.solo_sentences} solo) at its mean latency, "
             f"plus warm-up; {timed - new - unknown} measured before, {new} from a per-pass model"
             + (f", {unknown} not estimated: nothing comparable was timed" if unknown else "") + ")",
             *([f"  serving       {est.duration(t['serving']):>12s}  (a system served here before with the same "
                f"settings: its own time then; else LoadGen's tests, each its minimum duration or its queries at the "
                f"rate it runs, whichever is longer, rates from the batch-1 latency: bench/serving/measure.py)"]
               if p.spec.serving is not None else []),
             f"  total         {est.duration(t['total']):>12s}  (scoring, the report and process start-up not counted)",
             f"  sources: {len(m.trained)} trained models, {len(m.distillations)} distillations and {len(m.timed)} "
             f"timed rows measured on this machine, from {len(m.runs)} runs under the results folder and "
             f"{m.checkpoints} checkpoint records under the data root"
             + (f", and {len(m.probes)} train steps probed here (`narbench plan --probe`)" if m.probes else "")
             + (f" ({len(m.skipped)} runs from other machines left out, but for where plateau rules stopped their "
                f"models)" if m.skipped else "")
             + (f" ({len(m.damaged)} damaged run folder(s) left out: {', '.join(m.damaged[:3])})" if m.damaged else "")
             + "; the arithmetic: bench/estimate.py"]
    return lines


def to_json(p: Preview) -> dict[str, Any]:
    """The preview for scripts (``narbench plan --format json``)."""
    def estimate(e: est.Estimate | None) -> dict | None:
        return None if e is None else {"seconds": e.seconds, "how": e.how}

    return {
        "suite": p.spec.name, "spec_hash": p.spec.spec_hash(),
        "cells": [{"label": c.cell.label, "family": c.cell.family, "task": c.cell.task, "state": c.state,
                   "folder": c.folder, "note": c.note, "estimate": estimate(c.estimate), "systems": c.systems}
                  for c in p.cells],
        "distillations": [{"task": d.task, "teacher": d.teacher.label, "seed": d.seed, "state": d.state,
                           "folder": d.folder, "note": d.note, "estimate": estimate(d.estimate)}
                          for d in p.distillations],
        "test_sets": [{"task": s.task, "split": s.split, "test_sets": s.test_sets, "sentences": s.sentences,
                       "seconds": s.seconds, "worker_processes": s.processes,
                       "systems": [{"system": name, "latency_ms": cost.latency_ms, "compile_s": cost.compile_s,
                                    "seconds": seconds, "how": cost.how}
                                   for name, (cost, seconds) in s.costs.items()],
                       "served": s.served, "serving_seconds": s.serving_seconds}
                      for s in p.splits],
        "estimate": {**{f"{k}_seconds": v for k, v in p.totals().items()},
                     "sources": {"runs": p.measured.runs, "skipped_runs": p.measured.skipped,
                                 "damaged_runs": p.measured.damaged,
                                 "checkpoint_records": p.measured.checkpoints,
                                 "trained_models": len(p.measured.trained),
                                 "distillations": len(p.measured.distillations),
                                 "timed_rows": len(p.measured.timed),
                                 "probes": len(p.measured.probes)}},
    }
