"""What a suite's missing work will take on this machine, from what the same kind of work took here before.

``Measured.collect(results_root, data_root)`` gathers the costs narbench recorded on this machine (run
folders whose ``env.json`` names this CPU, by its signature where both have one (``same_cpu``), and thread
count; checkpoint and distillation records under the data root, which only this machine writes):

- per trained model (``TrainedModel``): seconds per train step, from a committed run's rows
  (``train_seconds / train_steps``, seconds in train steps only) or a checkpoint's ``narbench.json``;
  seconds per dev evaluation point from the points' ``eval_seconds`` (a checkpoint's ``curve.jsonl``;
  a run's ``curves.jsonl`` since it copies them); a checkpoint record also gives the rest of its wall
  time (compiling, checkpoints), which committed runs do not keep;
- per probed train step (``Probe``, from the data root's ``probes/``, made on this machine): seconds per step;
- per distillation (``Distillation``, from ``distill.json``): seconds per distilled sentence;
- per timed system (``TimedSystem``, committed rows): mean latency per sentence, mean decoder passes
  and warm-up (compile) seconds.

The estimator is deliberately simple:

- training a cell: its steps (``until = "plateau"``: the median stop of the family's models its plateau
  rule stopped (``plateau_rule``: the same signal, smoothing, patience and thresholds), of the same task and
  model shape (size and layers), else the same task and the nearest model shape, else the same shape; else
  other rules' stops, said so; stops at another peak learning rate only where none at its own, scaled by the
  ratio of the two peaks' stops at a shape that has both (else as they are), said so;
  else the cap) x the median seconds per step of the nearest measured models (same family and
  model shape; preferring the same checkpoint, then training cell, task, batch tokens and work per step),
  each scaled linearly by batch tokens and by its family's work per step (``Family.train_work``); a size
  never measured here takes the measured size of its family nearest it in work per token, scaled by the
  ratio of their work per token (``token_work``: its layers' matrices and the output layer); a probe of
  the same family, shape, batch tokens and work (``Probe``: ``narbench plan --probe`` timed that step here)
  replaces all of these (not a partial training's own rate, below); plus its dev points x seconds per
  point (scaled by the dev sentences each point decodes: ``dev_point_sentences``)
  and the fixed overhead, where a checkpoint record measured them. A
  partial training counts only its rest: to where its rule stops it, from its dev curve so far
  (``progress``: exact once the plateau rule fired; before, the earliest it can fire, unless the
  measured stop is later), at its own seconds per step so far (its checkpoint's record: the nearest
  measure of all);
- a distillation: its sentences x the nearest measured seconds per sentence (same task, teacher
  search and engine preferred);
- timing one split: each system on its sentences (x repeats) and on the solo check's, at the measured
  mean latency of the same system (its id or its axis values; same task, model shape and batch size),
  else at a per-pass model fitted on its family's rows of the task and shape (latency = a + b x passes
  + c x passes x hypotheses, least squares; passes: the median of rows with the same decoder, else the
  iterations), plus its warm-up seconds (the median of the family's rows with as many hypotheses).

Scoring (BLEU and its bootstrap), the report and process start-up are not counted.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from bench import families
from bench.measure.env import same_cpu
from narbench_core import defaults
from bench.rows import Row
from narbench_core.errors import UserError
from narbench_core.io import read_jsonl
from narbench_core.paths import portable

SHAPE_KEYS = ("d_model", "num_heads", "head_dim", "d_ff", "num_encoder_layers", "num_decoder_layers")


def model_shape(preset: str, overrides: Mapping[str, Any] | None = None) -> tuple:
    """What sets a model's cost per token: its dimensions (a preset with overrides), as sorted pairs."""
    from models.config import PRESETS

    merged = {**PRESETS.get(preset, {}), **dict(overrides or {})}
    return tuple((k, merged.get(k)) for k in SHAPE_KEYS)


def _one_preset(model: Mapping[str, Any]) -> str:
    """A run's spec's model preset where it has one; "" on a size axis (each row names its own ``size``)."""
    preset = model.get("preset", "")
    return preset if isinstance(preset, str) else ""


def this_machine() -> dict[str, Any]:
    """What a run's env.json must name to count as measured here: the CPU (``bench.measure.env.same_cpu``) and
    thread count."""
    from bench.measure.env import cpu_model, cpu_signature, thread_count

    return {"cpu_model": cpu_model(), "cpu_signature": cpu_signature(), "threads": thread_count()}


# ------------------------------------------------------------------------------------- measurements

@dataclass(frozen=True)
class TrainedModel:
    source: str                   # the run folder or checkpoint folder (``portable``) it was read from
    family: str
    task: str                     # the task trained on, before distillation
    shape: tuple
    batch_tokens: int
    work: float                   # the family's work per step (Family.train_work)
    label: str | None             # its training cell's label (committed runs), None for a checkpoint record
    steps: int
    seconds_per_step: float
    stopped_by: str | None = None
    eval_seconds_per_point: float | None = None
    overhead_seconds: float | None = None   # wall time neither in train steps nor in dev evaluation
    rule: tuple = ()                        # its plateau rule (``plateau_rule``; () where nothing says)
    complete: bool = True                   # False: a checkpoint folder whose training is still under way
    learning_rate: float | None = None      # its peak learning rate (None where nothing says)

    @property
    def signal(self) -> str:
        """What its plateau rule read (``TrainConfig.signal``)."""
        return dict(self.rule).get("signal") or "dev_bleu"


@dataclass(frozen=True)
class Progress:
    """Where a partial training stands: its steps done and the step it stops at, from its stopping rule
    and its dev curve so far (``models.schedule``)."""

    steps_done: int
    stop: int                     # exact, or (``exact`` False) the earliest step the plateau rule can stop it at
    exact: bool                   # the plateau rule fired (or the training has no rule, or cannot fire before the cap)
    threshold: float | None       # not exact: the value of the rule's signal (dev BLEU, or dev NLL) a point must
                                  # pass (rise over, or fall under) to put the plateau off


def progress(cfg: Any, steps_done: int, points: Iterable[Mapping[str, Any]]) -> Progress:
    """The ``Progress`` of a training of ``cfg`` (a ``TrainConfig``) resumed at ``steps_done`` with dev
    curve ``points``: where the rule stops it if it fired; otherwise the earliest it can
    (``models.schedule.earliest_stop``: its signal never progresses again, then the wsd decay)."""
    from models.schedule import earliest_stop, stop_state

    points = list(points)
    state = stop_state(cfg, points)
    if cfg.until != "plateau" or state.stopped_by == "plateau":
        return Progress(steps_done, state.stop, True, None)
    stop = earliest_stop(cfg, points)
    if stop is None:
        return Progress(steps_done, cfg.steps, True, None)                   # no plateau before the cap
    return Progress(steps_done, stop, False, _threshold(cfg, points, state))


def _threshold(cfg: Any, points: list, state) -> float | None:
    """The value of the rule's signal the next point must pass to put the plateau off: its signal (the mean of
    the last ``smooth`` points, it included) must pass the best by ``min_delta`` (rise over it for dev BLEU,
    fall under it for dev NLL)."""
    from models.schedule import progress_sign

    if state.best is None:
        return None
    ordered = [float(p[cfg.signal]) for p in sorted(points, key=lambda p: int(p["step"]))]
    recent = ordered[max(0, len(ordered) - (cfg.smooth - 1)):] if cfg.smooth > 1 else []
    return (len(recent) + 1) * (state.best + progress_sign(cfg) * cfg.min_delta) - sum(recent)


@dataclass(frozen=True)
class Distillation:
    source: str
    shape: tuple                  # the teacher's model shape
    task: str
    decoder: str
    engine: str
    seconds_per_sentence: float


@dataclass(frozen=True)
class TimedSystem:
    source: str
    family: str
    system: str
    axes: tuple                   # its family's live axis values (Family.grid_axes), as sorted pairs
    task: str
    shape: tuple
    batch_size: int
    decoder: str
    hypotheses: int | None
    latency_mean_ms: float
    passes_mean: float
    compile_s: float | None


PROBES_DIR = "probes"          # under the data root: ``narbench plan --probe``'s records, one per key


@dataclass(frozen=True)
class Probe:
    """A train step timed by ``narbench plan --probe`` (``bench.step_probe``) on one machine."""

    family: str
    task: str                  # the data it stepped on (a distilled cell's source task)
    label: str                 # the training cell that asked for it (the first, where several share it)
    shape: tuple               # ``model_shape``
    batch_tokens: int
    work: float                # ``Family.train_work`` of the cell's axes
    seconds_per_step: float
    measured_at: str           # UTC, ISO 8601
    machine: dict              # ``this_machine()`` where it ran
    others_cpu_share: float | None = None   # of the machine's CPU, by processes other than the probe's

    @property
    def key(self) -> tuple:
        return probe_key(self.family, self.task, self.shape, self.batch_tokens, self.work)

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "shape": [list(p) for p in self.shape]}

    @classmethod
    def from_json(cls, data: dict) -> "Probe":
        return cls(**{**data, "shape": tuple(tuple(p) for p in data["shape"])})


def probe_key(family: str, task: str, shape: tuple, batch_tokens: int, work: float) -> tuple:
    """What one probe stands for: models of one family, task, shape, batch tokens and work per step train at one rate
    (a distilled model and its raw twin)."""
    return (family, task, shape, batch_tokens, work)


def probe_file(data_root: Path, key: tuple) -> Path:
    """Where the probe of ``key`` (``Probe.key``) is kept: a newer probe of the key replaces it."""
    digest = hashlib.sha256(json.dumps(key).encode()).hexdigest()[:12]
    return Path(data_root) / PROBES_DIR / f"{key[0]}-{digest}.json"


def read_probes(data_root: Path, machine: Mapping[str, Any]) -> list[Probe]:
    """The probe records under ``data_root`` made on ``machine`` (its CPU and thread count); unreadable ones are
    left out."""
    out = []
    for path in sorted((Path(data_root) / PROBES_DIR).glob("*.json")):
        try:
            probe = Probe.from_json(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError, KeyError):
            continue
        if same_cpu(probe.machine, machine) and probe.machine.get("threads") == machine.get("threads"):
            out.append(probe)
    return out


@dataclass
class Measured:
    """Costs measured on this machine (see the module docstring)."""

    trained: list[TrainedModel] = field(default_factory=list)
    distillations: list[Distillation] = field(default_factory=list)
    timed: list[TimedSystem] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)        # run folders read
    skipped: list[str] = field(default_factory=list)     # run folders measured on another machine
    elsewhere: list[TrainedModel] = field(default_factory=list)   # their models a plateau rule stopped: the step
                                                                  # counts only (``_plateau_steps``), never seconds
    probes: list[Probe] = field(default_factory=list)             # train steps ``narbench plan --probe`` timed here
    damaged: list[str] = field(default_factory=list)     # run folders whose files cannot be read (left out)
    checkpoints: int = 0                                  # checkpoint records read
    served: dict[tuple, float] = field(default_factory=dict)   # (serving settings_key, system) -> serve seconds
    _seen_models: set = field(default_factory=set, repr=False)   # (checkpoint, steps, seconds) already read

    @classmethod
    def collect(cls, results_root: Path | None, data_root: Path | None, machine: Mapping[str, Any] | None = None,
                exclude: Iterable[str] = ()) -> "Measured":
        """Every run folder under ``results_root`` measured on ``machine`` (default: this one) except
        those named in ``exclude`` (``<suite>/<run_id>``), and every checkpoint and distillation record
        under ``data_root``."""
        out = cls()
        machine = dict(machine or this_machine())
        skip = set(exclude)
        if results_root is not None and Path(results_root).is_dir():
            for run in sorted(Path(results_root).glob("*/*/rows.jsonl")):
                folder = run.parent
                name = f"{folder.parent.name}/{folder.name}"
                if name in skip:
                    continue
                env = _json(folder / "env.json") if (folder / "env.json").exists() else {}
                if not isinstance(env, dict):                # damaged: a measurement of no known machine
                    out.damaged.append(name)
                    continue
                if not same_cpu(env, machine) or env.get("threads") != machine["threads"]:
                    out.skipped.append(name)
                    out._read_stops(folder, name)
                    continue
                try:
                    out._read_run(folder, name)
                except (UserError, ValueError, OSError):     # a damaged spec.toml, rows.jsonl or curves.jsonl
                    out.damaged.append(name)
                    continue
                out.runs.append(name)
        if data_root is not None:
            out._read_data_root(Path(data_root))
            out.probes = read_probes(Path(data_root), machine)
        return out

    def _read_stops(self, folder: Path, name: str) -> None:
        """A run measured on another machine: where its plateau rules stopped its models. A step count does not
        depend on the machine (beyond rounding), so it serves the plateau estimate; its seconds serve nothing."""
        other = Measured()
        try:
            other._read_run(folder, name)
        except (UserError, ValueError, OSError):
            return
        self.elsewhere.extend(m for m in other.trained if m.stopped_by == "plateau")

    def _read_run(self, folder: Path, name: str) -> None:
        spec = tomllib.loads((folder / "spec.toml").read_text(encoding="utf-8"))
        model = spec.get("model", {})
        rows = []
        for record in read_jsonl(folder / "rows.jsonl"):
            try:
                rows.append(Row.load(record))
            except UserError:                                 # written by a narbench too old to read
                continue
        evals: dict[str, list[float]] = {}
        for point in read_jsonl(folder / "curves.jsonl") if (folder / "curves.jsonl").is_file() else []:
            if point.get("eval_seconds") is not None:
                evals.setdefault(point["model"], []).append(float(point["eval_seconds"]))
        seen: set[tuple] = set()
        timed: set[tuple] = set()
        for r in rows:
            family = r.family
            try:
                fam = families.get(family)
                extra, _ = fam.axes_configs(fam.model_axes(r))
            except UserError:                                 # a family (or axis) this narbench does not know
                continue
            shape = model_shape(r.size or _one_preset(model), {**(model.get("overrides") or {}), **extra})
            label, steps, seconds = r.model, r.train_steps, r.train_seconds
            known = (r.checkpoint, steps, seconds) in self._seen_models
            if label and (label, r.checkpoint) not in seen and steps and seconds and not known:
                seen.add((label, r.checkpoint))
                self._seen_models.add((r.checkpoint, steps, seconds))      # one training, read from several runs
                budget = spec.get("train", {}).get(family, {})
                self.trained.append(TrainedModel(
                    name, family, r.task, shape, int(budget.get("batch_tokens") or 0), fam.train_work(r),
                    label, int(steps), float(seconds) / int(steps), r.stopped_by,
                    _median(evals[label]) if evals.get(label) else None,
                    rule=plateau_rule(budget, fam.eval_every(budget)), learning_rate=_peak(budget)))
            split = (r.system, r.test_set.removesuffix("+refs"))     # test sets of one split: one measurement
            if r.latency_mean_ms and r.passes_mean is not None and split not in timed:
                timed.add(split)
                self.timed.append(TimedSystem(
                    name, family, r.system, tuple(sorted(fam.grid_axes(r).items())), r.task, shape,
                    int(r.batch_size or 1), r.decoder or "", r.hypotheses, float(r.latency_mean_ms),
                    float(r.passes_mean), r.compile_s))
        if _one_preset(model):                                # the teacher: the suite's own AR model (one size)
            self._read_distill(_json(folder / "distill.json"), name,
                               model_shape(_one_preset(model), model.get("overrides")))
        if isinstance(spec.get("serving"), dict) and (folder / "serving.jsonl").is_file():
            self._read_served(folder, spec["serving"], name)

    def _read_served(self, folder: Path, table: dict, source: str) -> None:
        """How long each system of a serving run took to serve (``serve_seconds``), under its settings; runs
        read later (newer, in name order) replace older figures."""
        from suites.spec import serving_spec

        key = serving_spec(table, f"{source}/spec.toml").settings_key()
        for record in read_jsonl(folder / "serving.jsonl"):
            if record.get("serve_seconds"):
                self.served[(key, record["system"])] = float(record["serve_seconds"])

    def _read_distill(self, record: Any, source: str, shape: tuple) -> None:
        if not isinstance(record, dict):
            return
        if "seconds" not in record:                            # keyed by task (several distillations)
            for key, value in record.items():
                self._read_distill(value, f"{source}:{key}", shape)
            return
        if record.get("examples") and record.get("seconds"):
            self.distillations.append(Distillation(
                source, shape, record.get("task"), record.get("teacher_decoder"),
                record.get("teacher_engine") or defaults.DISTILL_ENGINE,
                float(record["seconds"]) / int(record["examples"])))

    def _read_data_root(self, root: Path) -> None:
        from suites.catalog import source_task

        kinds = {f.model_kind: f for f in families.all_families() if f.trains and f.model_kind}
        metas = {f: _json(f) or {} for f in sorted((root / "checkpoints").glob("*/narbench.json"))}
        seeded = {(m.get("seeded_from") or {}).get("checkpoint") for m in metas.values()}   # counted in their copy
        for meta_file, meta in metas.items():
            fam = kinds.get(meta.get("kind"))
            if meta_file.parent.name in seeded:
                continue
            steps, seconds = meta.get("steps_done"), meta.get("train_seconds")
            if fam is None or not steps or not seconds:
                continue
            self.checkpoints += 1
            curve = meta_file.parent / "curve.jsonl"
            points = len(read_jsonl(curve)) if curve.is_file() else 0
            evals = float(meta.get("eval_seconds") or 0.0)
            train = meta.get("train_config") or {}
            self.trained.append(TrainedModel(
                portable(meta_file.parent), fam.name, source_task(meta.get("task") or ""),
                tuple((k, (meta.get("model_config") or {}).get(k)) for k in SHAPE_KEYS),
                int(train.get("batch_tokens") or 0), fam.train_work(train), None, int(steps),
                float(seconds) / int(steps), meta.get("stopped_by"),
                evals / points if points and evals else None,
                max(float(meta.get("wall_seconds") or 0.0) - float(seconds) - evals, 0.0) or None,
                rule=plateau_rule(train, train.get("eval_every")), complete=meta.get("complete", True) is not False,
                learning_rate=_peak(train)))
        for record in sorted((root / "distill").glob("*/distill.json")):
            data = _json(record) or {}
            teacher = _json(root / str(data.get("teacher")) / "narbench.json") or {}
            self._read_distill(data, str(record.parent),
                               tuple((k, (teacher.get("model_config") or {}).get(k)) for k in SHAPE_KEYS))


def plateau_rule(train: Mapping[str, Any], eval_every: int | None) -> tuple:
    """The plateau rule a training ran (or runs) under: the ``models.schedule.RULE_FIELDS`` of its train config
    or budget (a checkpoint record's, a run's spec, a suite's), ``TrainConfig``'s defaults where one is absent (a
    record leaves out fields at their defaults), with ``eval_every`` steps between its curve points."""
    from models.schedule import RULE_FIELDS
    from models.train import TrainConfig

    values = {f.name: f.default for f in dataclasses.fields(TrainConfig) if f.name in RULE_FIELDS}
    values.update({k: v for k, v in train.items() if k in RULE_FIELDS and v is not None})
    if values["dev_sentences"] == "all":                # a spec's word for the whole split (suites.spec)
        values["dev_sentences"] = 0
    values["eval_every"] = eval_every
    return tuple((k, values[k]) for k in RULE_FIELDS)


def _peak(train: Mapping[str, Any]) -> float | None:
    """The peak learning rate of a train config or budget (None where it does not say)."""
    value = train.get("learning_rate")
    return float(value) if isinstance(value, (int, float)) else None


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


# ------------------------------------------------------------------------------------------ training

@dataclass(frozen=True)
class Estimate:
    seconds: float | None          # None: nothing comparable was measured
    how: str                       # one line: the arithmetic and where its numbers come from


def _median(values: list[float]) -> float:
    return float(np.median(values))


def train_estimate(measured: Measured, family: str, task: str, shape: tuple, label: str, budget,
                   axes: Mapping[str, Any], resumed_at: tuple[int, list[dict]] | None = None,
                   checkpoint: str | None = None, vocab_size: int | None = None) -> Estimate:
    """Seconds to train one cell (see the module docstring); ``budget`` is its ``TrainBudget``; a partial
    training's ``resumed_at`` (its steps done and dev curve) counts only the rest (``progress``), and the
    record in its ``checkpoint`` folder (``portable``) gives its own seconds per step so far. A model size never
    measured here takes the family's measured sizes' rate scaled by work per token (``token_work``; its
    ``vocab_size`` counts the output layer)."""
    fam = families.get(family)
    resumed = None if resumed_at is None else progress(fam.train_config(budget.train_kwargs(), axes), *resumed_at)
    if resumed is not None and resumed.exact and resumed.stop <= resumed.steps_done:
        return Estimate(0.0, f"nothing to train: it stopped at step {resumed.stop:,}")
    work = fam.train_work(axes)
    probed = _probed(measured, family, task, shape, budget.batch_tokens, work)
    pool = [m for m in measured.trained if m.family == family and m.shape == shape]
    ratio = 1.0                                       # this size's work per token over the measured size's
    if not pool:
        others = [m for m in measured.trained if m.family == family]
        if not others and probed is None:
            return Estimate(None, f"no {fam.label} model was measured on this machine")
        if others:
            near = _nearest_shape(others, shape, vocab_size or 0)
            ratio = token_work(shape, vocab_size or 0) / token_work(near, vocab_size or 0)
            pool = [m for m in others if m.shape == near]
    own = checkpoint is not None and ratio == 1.0 and any(m.source == checkpoint for m in pool)
    if probed is not None and not own:                # the probe timed this very step here: it beats any other model
        per_step = probed.seconds_per_step
        on = "" if probed.task == task else f", on {probed.task}'s data"
        rate = f"{per_step:.2f} s (probed here on {probed.measured_at[:10]}{on}: `narbench plan --probe`)"
    else:
        per_step, rate = _measured_rate(pool, checkpoint if ratio == 1.0 else None, label, task, budget.batch_tokens,
                                        work)
        if ratio != 1.0:
            per_step *= ratio
            rate = (f"{per_step:.2f} s (no model of this size measured here: {rate} at the nearest size"
                    f" x {ratio:.2f} work per token)")
    steps, stop, median = budget.steps, "", None
    if budget.until == "plateau":
        kwargs = budget.train_kwargs()
        median, stop = _plateau_steps(measured, family, task, shape, budget.steps,
                                      plateau_rule(kwargs, fam.eval_every(kwargs)), vocab_size or 0,
                                      budget.learning_rate)
        steps = budget.steps if median is None else median
    done = 0 if resumed is None else min(resumed.steps_done, budget.steps)
    if resumed is not None and (resumed.exact or median is None or resumed.stop > steps):
        steps, stop = resumed.stop, (f" (stops at step {resumed.stop:,})" if resumed.exact else
                                     f" (plateau: step {resumed.stop:,} at the earliest, if {_stays(budget, resumed)}"
                                     f"; cap {budget.steps:,})")
    steps = max(steps, done)
    every = fam.eval_every(budget.train_kwargs())
    points = (steps // every - done // every + (1 if steps % every else 0)) if every else 0
    sentences = dev_point_sentences(task, plateau_rule(budget.train_kwargs(), every))
    per_point = ([_point_seconds(m, sentences) for m in pool if m.eval_seconds_per_point and m.task == task]
                 or [_point_seconds(m, sentences) for m in pool if m.eval_seconds_per_point])
    fixed = [m.overhead_seconds for m in pool if m.overhead_seconds and m.task == task]
    evals = points * _median(per_point) * ratio if per_point else 0.0
    overhead = _median(fixed) if fixed else 0.0
    of = f" of {sentences:,} sentences" if sentences else ""
    how = (f"{steps - done:,} {'more ' if done else ''}steps{stop} x {rate}"
           + (f" + {points} dev points{of} x {_median(per_point) * ratio:.1f} s" if per_point else
              (f" + {points} dev points (not measured)" if points else ""))
           + (f" + {overhead:.0f} s compiling and checkpoints" if fixed else ""))
    return Estimate((steps - done) * per_step + evals + overhead, how)


def dev_point_sentences(task: str, rule: tuple) -> int | None:
    """The dev sentences each curve point of a training under ``rule`` (``plateau_rule``) decodes: its
    ``dev_sentences``, the whole dev split for 0 (its size from the task's catalog), at most the split; None where
    nothing says (no rule recorded, or the whole split of a task whose data is not prepared)."""
    from suites.taskinfo import source_task

    n = dict(rule).get("dev_sentences")
    if n is None:
        return None
    split = _dev_split_size(source_task(task))
    return (split or None) if n == 0 else (min(n, split) if split else n)


@functools.lru_cache(maxsize=32)
def _dev_split_size(task: str) -> int | None:
    from suites.catalog import task_info

    try:
        return task_info(task).splits.get("dev")
    except UserError:                                  # a task this checkout does not know
        return None


def _point_seconds(model: TrainedModel, sentences: int | None) -> float:
    """A dev point's seconds for a training whose points decode ``sentences``, from ``model``'s: scaled by the
    sentences each decodes where both counts are known (a 200-sentence point against the whole split's 1,007)."""
    own = dev_point_sentences(model.task, model.rule)
    return model.eval_seconds_per_point * (sentences / own if sentences and own else 1.0)


def token_work(shape: tuple, vocab_size: int = 0) -> float:
    """Multiply-adds per target token of a model ``shape`` (``model_shape``), as a relative measure of a train
    step's work between sizes: per encoder layer its attention projections (4 d x heads x head_dim) and gated
    feed-forward (3 d x d_ff), per decoder layer a second attention (cross) besides, and the output layer
    (d x ``vocab_size``). Family extras (PaDIR's positional attention) are left out: the ratio is between sizes
    of one family."""
    d = {k: v or 0 for k, v in dict(shape).items()}
    dm = d.get("d_model", 0)
    attn, ffn = 4 * dm * d.get("num_heads", 0) * d.get("head_dim", 0), 3 * dm * d.get("d_ff", 0)
    return (d.get("num_encoder_layers", 0) * (attn + ffn) + d.get("num_decoder_layers", 0) * (2 * attn + ffn)
            + dm * vocab_size) or 1.0


def _probed(measured: Measured, family: str, task: str, shape: tuple, batch_tokens: int, work: float) -> Probe | None:
    """The newest probe of this family, shape, batch tokens and work per step, of the same task if there is one."""
    found = [p for p in measured.probes
             if (p.family, p.shape, p.batch_tokens, p.work) == (family, shape, batch_tokens, work)]
    return max(found, key=lambda p: (p.task == task, p.measured_at), default=None)


def _nearest_shape(pool: list[TrainedModel], shape: tuple, vocab_size: int) -> tuple:
    """The measured model shape of ``pool`` nearest ``shape`` in work per token (by ratio, either way)."""
    target = token_work(shape, vocab_size)
    return min({m.shape for m in pool}, key=lambda s: abs(math.log(token_work(s, vocab_size) / target)))


def _stays(budget, resumed: Progress) -> str:
    """What keeps a partial training's plateau at its earliest step: its signal progressing no more, the next point
    not passing the threshold (each later point has its own, as the smoothing window moves on)."""
    if (budget.signal or "dev_bleu") == "dev_bleu":
        return f"dev BLEU rises no more: the next point under {resumed.threshold:.2f}"
    return f"dev NLL falls no more: the next point over {resumed.threshold:.3f}"


def _measured_rate(pool: list[TrainedModel], checkpoint: str | None, label: str, task: str, batch_tokens: int,
                   work: float) -> tuple[float, str]:
    """Seconds per step from the nearest measured models of ``pool`` (the same checkpoint: a partial
    training's own steps so far; then the same training cell, task, batch tokens and work per step), scaled
    to ``batch_tokens`` and ``work``; and how."""
    def score(m: TrainedModel) -> tuple:
        return (checkpoint is not None and m.source == checkpoint, m.label == label, m.task == task,
                m.batch_tokens == batch_tokens, m.work == work)

    best = max(map(score, pool))
    near = [m for m in pool if score(m) == best]
    scaled = [m.seconds_per_step * (batch_tokens / m.batch_tokens if m.batch_tokens else 1.0) * work / m.work
              for m in near]
    per_step = _median(scaled)
    spread = f"{min(scaled):.2f}-{max(scaled):.2f}" if max(scaled) - min(scaled) >= 0.005 else f"{per_step:.2f}"
    if best[0]:
        return per_step, f"{per_step:.2f} s (its own rate so far)"
    differ = [n for n, same in zip(("another task", "other batch tokens", "other work per step"), best[2:]) if not same]
    return per_step, (f"{per_step:.2f} s (median of {len(near)} measured: {spread} s a step"
                      + (f"; {', '.join(differ)}, scaled" if differ else "") + ")")


def _plateau_steps(measured: Measured, family: str, task: str, shape: tuple, cap: int,
                   rule: tuple, vocab_size: int = 0, peak: float | None = None) -> tuple[int | None, str]:
    """Where the plateau ``rule`` (``plateau_rule``) will stop a training at the ``peak`` learning rate: the median
    stop of the models of its family that rule stopped (on this machine or, from committed runs, another: steps do
    not depend on it), of the same task and model shape, else of the same task and the nearest model shape in work
    per token (a larger model may train longer to its plateau: the scale suite's mini AR ran past twice tiny's
    stop), else of the same shape; else the same from other rules on its signal, then from rules on another signal,
    said so (None when there are none: the cap is the bound); and how that was chosen, saying so where a training of
    the family under the rule on the same task, still under way, has already run past that stop. Past other rules'
    stops, its steps so far are the estimate (a floor: the rule has not stopped it yet). Where those models trained
    at another peak only (a lower peak stops later), their stops are scaled by the ratio of the stops at the two
    peaks at a shape where both were measured (``_peak_ratio``), else taken as they are; either said so."""
    signal = dict(rule).get("signal") or "dev_bleu"
    stopped = [m for m in (*measured.trained, *measured.elsewhere) if m.family == family and m.stopped_by == "plateau"]
    away = {id(m) for m in measured.elsewhere}
    running = max((m.steps for m in measured.trained if m.family == family and not m.complete and m.rule == rule
                   and m.task == task and _same_peak(m, peak)), default=0)
    tiers = ((lambda m: m.rule == rule, ""),
             (lambda m: m.rule != rule and m.signal == signal, " under another rule on its signal"),
             (lambda m: m.signal != signal, " under a rule on another signal"))
    for belongs, under in tiers:
        pool = [m for m in stopped if belongs(m)]
        for same, where in (((True, True), ""), ((True, False), " of another model shape"),
                            ((False, True), " on other tasks")):
            chosen = [m for m in pool if ((m.task == task) >= same[0]) and ((m.shape == shape) >= same[1])]
            if chosen and same == (True, False):
                near = _nearest_shape(chosen, shape, vocab_size)
                chosen = [m for m in chosen if m.shape == near]
            scale = 1.0
            if chosen and not any(_same_peak(m, peak) for m in chosen):
                other = min({m.learning_rate for m in chosen}, key=lambda r: abs(math.log(r / peak)))
                chosen = [m for m in chosen if m.learning_rate == other]
                ratio = _peak_ratio(pool, task, shape, peak, other, vocab_size)
                if ratio is None:
                    where += f" at another peak learning rate ({other:g})"
                else:
                    scale, at = ratio
                    where += (f" at peak learning rate {other:g}, x {scale:.2f}: the ratio of the stops at {peak:g}"
                              f" and {other:g} {at}")
            else:
                chosen = [m for m in chosen if _same_peak(m, peak)]
            stops = [m.steps for m in chosen]
            if elsewhere := sum(id(m) in away for m in chosen):
                where = f" ({elsewhere} on other machines){where}"
            if stops:
                median = min(cap, int(_median(stops) * scale))
                if running > median and under:               # other rules' stops are a floor this rule ran past
                    floor = min(cap, running)
                    return floor, (f" (plateau: at least {floor:,}, as far as a training of this family under this"
                                   f" rule has run and not stopped; the median stop of {len(stops)} measured{where}"
                                   f"{under} is {median:,}; cap {cap:,})")
                past = (f"; a training of this family under this rule has run {running:,} steps and not stopped"
                        if running > median else "")
                return median, f" (plateau: the median stop of {len(stops)} measured{where}{under}{past}, cap {cap:,})"
    return None, " (plateau: the cap, an upper bound)"


def _same_peak(model: TrainedModel, peak: float | None) -> bool:
    """Whether ``model`` trained at the ``peak`` learning rate (True where either is unknown)."""
    return peak is None or model.learning_rate is None or math.isclose(model.learning_rate, peak, rel_tol=1e-6)


def _peak_ratio(pool: list[TrainedModel], task: str, shape: tuple, peak: float, other: float,
                vocab_size: int) -> tuple[float, str] | None:
    """How much later a plateau rule stops a training at the ``peak`` learning rate than at ``other``: the ratio of
    the median stops of ``pool``'s models at the two peaks, at the model shape nearest ``shape`` where both were
    measured (on ``task`` first), and where it was measured; None where no shape has both."""
    for on_task in (True, False):
        groups: dict[tuple, list[TrainedModel]] = {}
        for m in pool:
            if m.learning_rate is not None and (m.task == task or not on_task):
                groups.setdefault((m.task, m.shape), []).append(m)
        both = [ms for ms in groups.values()
                if any(_same_peak(m, peak) for m in ms) and any(m.learning_rate == other for m in ms)]
        if both:
            near = _nearest_shape([m for ms in both for m in ms], shape, vocab_size)
            ms = next(ms for ms in both if ms[0].shape == near)
            ratio = (_median([m.steps for m in ms if _same_peak(m, peak)])
                     / _median([m.steps for m in ms if m.learning_rate == other]))
            return ratio, ("measured at another model shape" if near != shape else "measured at this shape") + (
                "" if on_task else f" on {ms[0].task}")
    return None


def distill_estimate(measured: Measured, shape: tuple, task: str, decoder: str, engine: str,
                     sentences: int | None) -> Estimate:
    """Seconds for a teacher of model ``shape`` to decode ``sentences`` training sources (None: unknown
    until the data is prepared)."""
    pool = measured.distillations
    if not pool:
        return Estimate(None, "no distillation was measured on this machine")
    if sentences is None:
        return Estimate(None, "the number of training sentences is unknown until the task's data is prepared")

    def score(m: Distillation) -> tuple:
        return (m.shape == shape, m.task == task, m.decoder == decoder, m.engine == engine)

    best = max(map(score, pool))
    near = [m.seconds_per_sentence for m in pool if score(m) == best]
    per = _median(near)
    differ = [n for n, same in zip(("another teacher size", "another task", "another search", "another engine"),
                                   best) if not same]
    return Estimate(sentences * per, f"{sentences:,} sentences x {1000 * per:.2f} ms (median of {len(near)} "
                                     f"measured{'; ' + ', '.join(differ) if differ else ''})")


# -------------------------------------------------------------------------------------------- timing

@dataclass(frozen=True)
class SystemCost:
    latency_ms: float | None
    compile_s: float
    how: str


def system_cost(measured: Measured, family: str, system: str, axes: tuple, task: str, shape: tuple, batch_size: int,
                decoder: str, hypotheses: int | None, iterations: int | None) -> SystemCost:
    """A system's mean latency per sentence and warm-up seconds (see the module docstring); ``axes``: its
    family's live axis values as sorted pairs (a system measured under another id with the same axes,
    as before a rename, is the same system)."""
    sized = [t for t in measured.timed if t.family == family and t.shape == shape and t.batch_size == batch_size]
    pool = [t for t in sized if t.task == task] or sized          # another task of the same size, if need be
    other = "" if not pool or pool[0].task == task else "; timed on another task"
    warm = [t.compile_s for t in pool if t.compile_s is not None and t.hypotheses == hypotheses] or \
           [t.compile_s for t in pool if t.compile_s is not None]
    compile_s = _median(warm) if warm else 0.0
    same = [t.latency_mean_ms for t in pool if t.system == system or (axes and t.axes == axes)]
    if same:
        return SystemCost(_median(same), compile_s, f"measured ({len(same)} run{'s' * (len(same) > 1)}{other})")
    if not pool:
        return SystemCost(None, compile_s, "no system of its family and size was timed on this machine")
    passes = [t.passes_mean for t in pool if t.decoder == decoder and t.hypotheses == hypotheses] or \
             [t.passes_mean for t in pool if t.decoder == decoder]
    p = _median(passes) if passes else float(iterations or 1)
    k = float(hypotheses or 1)
    coef = _pass_model(pool)
    if coef is None:
        per_pass = _median([t.latency_mean_ms / max(t.passes_mean * (t.hypotheses or 1), 1e-9) for t in pool])
        return SystemCost(per_pass * p * k, compile_s,
                          f"{p:.1f} passes x {k:g} hypotheses x {per_pass:.2f} ms{other}")
    a, b, c = coef
    return SystemCost(max(a + b * p + c * p * k, 0.0), compile_s,
                      f"pass model {a:.1f} + {b:.2f} x passes + {c:.2f} x passes x k ms at {p:.1f} passes, "
                      f"k = {k:g}{other}")


def _pass_model(pool: list[TimedSystem]) -> tuple[float, float, float] | None:
    """Least-squares ``latency = a + b passes + c passes hypotheses`` over ``pool`` (None when the rows
    cannot determine it: fewer than 3 distinct points, or one number of hypotheses)."""
    x = np.asarray([[1.0, t.passes_mean, t.passes_mean * (t.hypotheses or 1)] for t in pool])
    y = np.asarray([t.latency_mean_ms for t in pool])
    if len({(r[1], r[2]) for r in x}) < 3 or np.linalg.matrix_rank(x) < 3:
        return None
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    return float(coef[0]), float(coef[1]), float(coef[2])


def timing_seconds(cost: SystemCost, sentences: int, repeats: int, solo: int) -> float | None:
    """Seconds to warm up and time a system on ``sentences`` (x ``repeats``) plus ``solo`` solo-check sentences."""
    if cost.latency_ms is None:
        return None
    return cost.compile_s + (sentences * repeats + solo) * cost.latency_ms / 1000.0


def duration(seconds: float | None) -> str:
    """``1 h 05 min``, ``12 min``, ``40 s``; "unknown" for None."""
    if seconds is None or math.isnan(seconds):
        return "unknown"
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"
