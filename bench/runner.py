"""The runner: train a plan's cells (``bench.plan``), then time, score and save its evaluation cells.

Training cells are unique; a distilled cell's teacher is trained first. Evaluation cells are
(system, test set); the systems of one test set are
warmed up and then timed interleaved in one ``bench.measure.timing.measure`` call, scored, and saved
together; while it times, the process is registered as busy (``narbench_core.lock.busy``) and the other
busy narbench processes of the machine go to env.json's ``concurrent_narbench`` with a warning line. Rows are keyed by ``(system, test_set)``: a re-run skips the cells whose rows exist.

All model-specific work goes through :class:`Deps` (trainer, distiller, decoder factory, task text,
training records, learning curves and step costs), so tests inject fakes and ``bench`` never imports
a concrete model class. Each row carries its model's training budget; a ``match`` budget is resolved
from the baseline model's record before its cell trains; each trained model's learning curve is
copied into the run folder's ``curves.jsonl``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from bench import executors, families
from bench.executors.local import LocalExecutor
from bench.measure import learning, load
from bench.families import System, TrainCell
from bench.plan import Plan, expand, needed_cells
from bench.rows import SCHEMA_VERSION, Row, columns, compute_figures
from bench.store import RunStore
from narbench_core import defaults, lock
from narbench_core.errors import UserError
from suites.spec import SuiteSpec


# ------------------------------------------------------------------------------------ dependencies

@dataclass
class Deps:
    """Everything model- or data-specific the grid needs, injectable for tests."""

    train: Callable[..., Path]                       # (task, model_config, train_config, progress=) -> ckpt dir
    distill: Callable[..., tuple[str, dict]]         # (teacher_dir, task, decoder=, seed=) -> (task, distill.json)
    load_decoder: Callable[..., Any]                 # (family, ckpt_dir, spec, **options) -> Decoder
    load_text: Callable[[str, str], tuple]           # (task, split) -> (sources, reference streams)
    target_lang: Callable[[str], str]                # task -> target language code
    configs: Callable[[SuiteSpec, TrainCell], tuple[Any, Any]]  # -> (model_config, train_config)
    train_record: Callable[[Path], dict | None]      # ckpt dir -> its training record (narbench.json), None if none
    train_curve: Callable[[Path], list[dict]]        # ckpt dir -> its learning-curve points ([] if none)
    step_cost: Callable[..., float]                  # (match, task, model_config, train_config) -> flops | s per step
    costs: bool = True                               # XLA cost analysis per decoder (needs .lower)
    # The decoder factory a timing worker process calls, (family, ckpt dir, spec, **options) -> Decoder;
    # it must pickle by reference. None: systems are timed in this process (fakes holding state).
    worker_factory: Callable[..., Any] | None = None
    # (task, split) -> every correct output of each source (tasks that know them), or None
    valid_targets: Callable[[str, str], list[list[str]] | None] = lambda task, split: None
    # (spec, distilled: [(teacher dir, task, distill kwargs)]) -> None: make the suite's own-data tasks and
    # these distilled tasks known in this process (a Ray worker starts with the built-in tasks only)
    prepare: Callable[[SuiteSpec, list], None] = lambda spec, distilled: None


def real_configs(spec: SuiteSpec, cell: TrainCell) -> tuple[Any, Any]:
    """``ModelConfig`` and ``TrainConfig`` of a cell, built by its family."""
    from suites.catalog import task_info

    vocab_size = task_info(cell.task).vocabulary.vocab_size
    return families.get(cell.family).configs(spec.model.preset_of(cell), vocab_size, spec.model.override_dict(),
                                             {**spec.budget(cell.family).train_kwargs(), "seed": cell.seed},
                                             dict(cell.axes))


def real_deps(retrain_damaged: bool = defaults.RETRAIN_DAMAGED, wait_for_lease: bool = False) -> Deps:
    """The real trainer, distiller, decoder factory and tasks (imported on first use); a damaged cached
    checkpoint is retrained, or with ``retrain_damaged=False`` refused; a checkpoint folder another
    process trains is refused, or with ``wait_for_lease=True`` waited for (``models.train.train``)."""
    def train(task, model_config, train_config, progress=True, init_from=None):
        from models.train import train as _train
        return _train(task, model_config, train_config, progress=progress, init_from=init_from,
                      retrain_damaged=retrain_damaged, wait_for_lease=wait_for_lease)

    def distill(teacher_dir, task, **kwargs):
        from models.distill import distill as _distill
        done = _distill(teacher_dir, task, **kwargs)
        return done.task, done.record

    def load_text(task, split):
        from suites.catalog import load_text as _load
        return _load(task, split)

    def target_lang(task):
        from suites.catalog import task_info
        return task_info(task).target_lang

    def train_record(checkpoint_dir):
        from models.checkpoint import read_meta
        return read_meta(Path(checkpoint_dir))

    def train_curve(checkpoint_dir):
        from models.curves import read_curve
        return read_curve(checkpoint_dir)

    def step_cost(match, task, model_config, train_config):
        from models import train as _train
        per_step = {"flops": _train.flops_per_step, "seconds": _train.seconds_per_step}[match]
        return per_step(task, model_config, train_config)

    def valid_targets(task, split):
        from suites.catalog import valid_targets as _valid
        return _valid(task, split)

    def prepare(spec, distilled):
        from suites.catalog import distilled_name, is_known

        families.register_file_tasks(spec)
        for teacher_dir, task, kwargs in distilled:
            if not is_known(distilled_name(task)):
                distill(teacher_dir, task, **kwargs, progress=False)     # cached: registers <task>_distilled

    return Deps(train, distill, families.load_decoder, load_text, target_lang, real_configs, train_record, train_curve,
                step_cost, worker_factory=families.load_decoder, valid_targets=valid_targets, prepare=prepare)


MATCHED = {"flops": "train_flops", "seconds": "train_seconds"}   # a budget's match -> the record it equals


# ------------------------------------------------------------------------------------------ test sets

@dataclass(frozen=True)
class TestData:
    """The sentences of one (task, split): timed once, scored for every test set reading them."""

    task: str                       # the task whose text it is (gives the target language)
    split: str
    indices: list[int]              # positions in the full split (after the cap)
    sources: list[str]
    references: list[list[str]]     # every reference stream, each aligned with sources
    valid: list[list[str]] | None = None   # every correct output of each source (tasks that know them)


def load_test_data(spec: SuiteSpec, deps: Deps, task: str, split: str, multi_ref: bool) -> TestData:
    """A split's text (all reference streams if ``multi_ref``), capped by a seeded subset of sentences."""
    sources, refs = deps.load_text(task, split)
    streams = [list(r) for r in refs]
    if not streams or any(len(s) != len(sources) for s in streams):
        raise UserError(f"task {task} split {split}: references are not aligned with the sources; "
                        "re-run `narbench data prepare`")
    if multi_ref and len(streams) < 2:
        raise UserError(f"{spec.source}: task {task} has no extra references; use {split!r} instead "
                        f"of '{split}+refs'")
    if not multi_ref:
        streams = streams[:1]
    n = len(sources)
    if n == 0:
        raise UserError(f"task {task} split {split} is empty; check the data with `narbench tasks`")
    idx = list(range(n))
    cap = spec.max_test_sentences
    if cap and cap < n:
        rng = np.random.default_rng(spec.seeds[0])
        idx = sorted(int(i) for i in rng.choice(n, size=cap, replace=False))
    valid = deps.valid_targets(task, split)
    return TestData(task, split, idx, [sources[i] for i in idx], [[s[i] for i in idx] for s in streams],
                    None if valid is None else [valid[i] for i in idx])


@dataclass(frozen=True)
class Target:
    """One test set scored from a shared measurement: its name, how many reference streams, which systems."""

    name: str
    n_refs: int
    systems: frozenset[str]


# -------------------------------------------------------------------------------------------- runner

@dataclass
class Runner:
    """Runs a plan's missing cells into a store (or, with ``store=None``, returns rows only)."""

    spec: SuiteSpec
    deps: Deps
    store: RunStore | None = None
    env: dict = field(default_factory=dict)
    platform: str | None = None
    bleurt: Any = None                  # bench.measure.bleurt.BleurtScorer or None
    score: bool = True                  # False: timing only (`narbench latency`)
    progress: bool = True
    checkpoints: dict = field(default_factory=dict)   # TrainCell -> checkpoint dir
    trained: dict = field(default_factory=dict)       # TrainCell -> the training columns of its systems' rows
    executor: Any = field(default_factory=LocalExecutor)   # where training jobs run (bench.executors)
    timed_env: dict | None = None       # the env.json of a run with timed cells: resuming must time on its CPU
    train_only: bool = False            # train and distil every model the plan needs, time nothing (yet)
    _matched: dict = field(default_factory=dict)      # resolved match budgets when there is no store

    def run(self, plan: Plan | None = None) -> list[dict]:
        from tqdm.auto import tqdm

        from bench.measure import env as benv

        plan = plan or expand(self.spec)
        done = self.store.done_keys() if self.store is not None else set()
        todo = [c for c in plan.eval_cells if c.key not in done]
        serve = self._to_serve(plan)
        jobs = self.training_jobs(needed_cells(plan, todo + serve))
        # Test sets reading the same (task, split) share one timed measurement.
        splits = list(dict.fromkeys((ts.task, ts.split) for ts in self.spec.test_sets()))
        groups = [((task, split), [c for c in todo if (c.test_set.task, c.test_set.split) == (task, split)])
                  for task, split in splits]
        groups = [(f"time+score {task}:{split}", group) for (task, split), group in groups if group]
        bar = tqdm(total=len(jobs) + len(todo), unit="cell", desc=self.spec.name,
                   disable=not self.progress, dynamic_ncols=True)

        def trained(summary: str) -> None:
            bar.n = sum(c.state == executors.DONE for c in board.cells.values() if c.kind != "evaluate")
            bar.set_postfix_str(f"train: {summary}")

        board = executors.Board(self.executor.name, save=self.store.save_board if self.store is not None else
                                (lambda cells: None), on_change=trained)
        board.add(jobs)
        for key, _ in groups:
            board.add_cell(key, "evaluate")
        rows: list[dict] = []
        try:
            self.executor.run(jobs, board)
            board.on_change = lambda summary: None
            bar.n = len(jobs)
            if self.train_only:
                return rows
            with self.executor.quiet_host() as host:
                if not host.remote:
                    benv.check_same_machine(self.timed_env or {}, self.env, timed=self.timed_env is not None)
                    self._record_env(**self.env, executor=host.info)
                elif self.bleurt is not None:
                    raise UserError("BLEURT is scored where the systems are timed, and this run times them on "
                                    "the cluster's narbench_timing node; drop --bleurt-checkpoint")
                for key, group in groups:
                    task, split = group[0].test_set.task, group[0].test_set.split
                    bar.set_postfix_str(f"time+score {task}:{split} ({len(group)} cells)")
                    board.set(key, executors.RUNNING, host=host.name, attempt=1)
                    sets = list(dict.fromkeys(c.test_set for c in group))
                    data = load_test_data(self.spec, self.deps, task, split, any(ts.multi_ref for ts in sets))
                    targets = [Target(ts.name, len(data.references) if ts.multi_ref else 1,
                                      frozenset(c.system.name for c in group if c.test_set == ts)) for ts in sets]
                    systems = [(s, self.checkpoints[s.cell]) for s in dict.fromkeys(c.system for c in group)]
                    if host.remote:             # on the cluster's timing node, which checks its CPU itself
                        measured = host.run(key, functools.partial(
                            _measure_call, self.spec, self.deps, self.env.get("seeds", {}), self.platform,
                            self.score, self.trained, self.timed_env, systems, data, targets,
                            self._stored_for(systems, data, targets)))
                        self.timed_env = measured.env
                        self._record_env(**{k: v for k, v in measured.env.items() if k != benv.CONCURRENT},
                                         executor=host.info)
                        rows.extend(self.save(measured))
                    else:
                        rows.extend(self.evaluate(systems, data, targets))
                    board.set(key, executors.DONE)
                    bar.update(len(group))
                if serve and not host.remote:
                    bar.set_postfix_str("serve under load")
                    self._serve(serve)
                elif serve:
                    import sys

                    print("narbench: [serving] serves from the machine that drives the run, and this run times on the "
                          "cluster's timing node: nothing was served; run the suite without --executor ray to serve",
                          file=sys.stderr)
        finally:
            bar.close()
        return rows

    # ---------------------------------------------------------------------------------------- serving

    def _to_serve(self, plan: Plan) -> list:
        """The evaluation cells whose systems ``[serving]`` still has to serve (on the first test set of each
        split), after their batch-1 timing; none without a store (`narbench latency`)."""
        if self.spec.serving is None or self.store is None:
            return []
        from bench.serving.run import chosen

        served = self.store.served_keys()
        names = {s.name for s in chosen(self.spec, list(dict.fromkeys(c.system for c in plan.eval_cells)))}
        first = {}
        for ts in self.spec.test_sets():
            first.setdefault((ts.task, ts.split), ts)
        return [c for c in plan.eval_cells if c.system.name in names and c.test_set in first.values()
                and c.key not in served]

    def _serve(self, cells: list) -> None:
        """Serve ``cells``' systems under LoadGen (``bench.serving.run``), one split at a time."""
        from bench.serving.loadgen import require_loadgen
        from bench.serving.run import plan_served, serve_all

        require_loadgen()
        for ts in dict.fromkeys(c.test_set for c in cells):
            systems = [(c.system, self.checkpoints[c.system.cell]) for c in cells if c.test_set == ts]
            data = load_test_data(self.spec, self.deps, ts.task, ts.split, False)
            factory = self.deps.worker_factory
            if factory is None:
                raise UserError("serving needs the systems in worker processes; drop `isolate = false` from [timing]")
            served = plan_served(self.spec, self.store, systems, ts.name, data.sources, factory, self.platform)
            serve_all(self.spec, self.store, served, data.sources, data.references[0],
                      self.deps.target_lang(data.task), _env_fields(self.env), self.progress)

    # ---------------------------------------------------------------------------------- training jobs

    def training_jobs(self, cells: list[TrainCell]) -> list[executors.Job]:
        """The jobs that train ``cells`` (and their sources: teachers, distillations, warm-start models, and
        a ``match`` budget's baseline when its resolution is not yet in ``run.json``), in dependency order."""
        jobs: dict[str, executors.Job] = {}
        progress = self.progress and self.executor.shows_progress

        def visit(cell: TrainCell) -> str:
            key = cell.job
            if key in jobs:
                return key
            needs = []
            distilled = None
            if cell.teacher is not None:
                teacher = visit(cell.teacher)
                distilled = f"distill {cell.teacher.label}"
                if distilled not in jobs:
                    jobs[distilled] = executors.Job(
                        distilled, "distill", needs=(teacher,),
                        build=lambda results, c=cell: functools.partial(
                            _distill_call, self.deps.distill, self.deps.prepare, self.spec, c.task,
                            {**self.spec.distill.kwargs(), "seed": c.seed}, progress),
                        done=lambda result, results, c=cell: self._save_distillation(c, result[1]))
                needs.append(distilled)
            if cell.warm_start is not None:
                needs.append(visit(cell.warm_start))
            after = (*needs, visit(self._baseline(cell))) if self._unresolved_match(cell) else ()

            def build(results, cell=cell, distilled=distilled) -> Callable:
                task = results[distilled][0] if distilled in results else cell.task   # a match budget waits for it
                model_config, train_config = self.deps.configs(self._budgeted(cell, task), cell)
                return _TrainCall(self.deps.train, self.deps.prepare, self.spec, cell.task, model_config, train_config,
                                  progress, {**self.spec.distill.kwargs(), "seed": cell.seed} if distilled else None,
                                  cell.warm_start is not None)

            def done(path, results, cell=cell, distilled=distilled) -> None:
                self.checkpoints[cell] = Path(path)
                self.trained[cell] = self._training_columns(cell, Path(path), results[distilled][1] if distilled else None)

            jobs[key] = executors.Job(key, "train", build, needs=tuple(needs), after=after, done=done)
            return key

        for cell in cells:
            visit(cell)
        return list(jobs.values())

    @staticmethod
    def _baseline(cell: TrainCell) -> TrainCell:
        return TrainCell(cell.task, families.BASELINE, cell.seed, preset=cell.preset)   # the same size's

    def _match_budget(self, cell: TrainCell):
        budget = self.spec.budget(cell.family) if families.get(cell.family).trains else None
        return budget if budget is not None and budget.match is not None else None

    def _resolution(self, cell: TrainCell) -> dict | None:
        """A ``match`` budget's resolution kept for ``cell`` (``run.json``), if it is still this budget's."""
        budget = self._match_budget(cell)
        resolved = self._matched_budgets().get(cell.label)
        if budget is None or resolved is None or resolved["match"] != budget.match or resolved["cap"] != budget.steps:
            return None
        return resolved

    def _matched_budgets(self) -> dict:
        """The resolved ``match`` budgets by cell label: ``run.json``'s, or this runner's without a store."""
        return dict(self.store.info.get("matched_budgets", {})) if self.store is not None else dict(self._matched)

    def _unresolved_match(self, cell: TrainCell) -> bool:
        return self._match_budget(cell) is not None and self._resolution(cell) is None

    def _budgeted(self, cell: TrainCell, task: str) -> SuiteSpec:
        """The spec with ``cell``'s budget resolved: a ``match`` budget trains as many steps (at most its
        ``steps``) as the baseline model's FLOPs or seconds buy at the cell's own mean cost per step (on
        ``task``, its training data). The resolution is kept in ``run.json`` so a resumed run (and a
        measured seconds-per-step) trains the same model. An unresolved budget's job runs after the
        baseline's (``training_jobs``)."""
        budget = self._match_budget(cell)
        if budget is None:
            return self.spec
        resolved = self._resolution(cell)
        if resolved is None:
            base = self._baseline(cell)
            have = (self.deps.train_record(self.checkpoints[base]) or {}).get(MATCHED[budget.match])
            if not have:
                raise UserError(f"the {base.label} checkpoint records no {MATCHED[budget.match]} (trained before "
                                f"narbench recorded it); delete {self.checkpoints[base]} to retrain it, or drop "
                                f"match from [train.{cell.family}]")
            per_step = float(self.deps.step_cost(budget.match, task, *self.deps.configs(self.spec, cell)))
            steps = min(budget.steps, math.floor(have / per_step))
            if steps < 1:
                raise UserError(f"{cell.label}: one training step costs {per_step:.3g} {budget.match}, more than "
                                f"the {have:.3g} of {base.label}; train the baseline longer")
            resolved = {"match": budget.match, "cap": budget.steps, "baseline": float(have), "per_step": per_step,
                        "steps": steps}
            matched = {**self._matched_budgets(), cell.label: resolved}
            if self.store is not None:
                self.store.update_info(matched_budgets=matched)
            else:
                self._matched = matched
        budgets = tuple((f, dataclasses.replace(b, steps=resolved["steps"]) if f == cell.family else b)
                        for f, b in self.spec.budgets)
        return self.spec.replace(budgets=budgets)

    def _training_columns(self, cell: TrainCell, path: Path, distilled: dict | None, save: bool = True) -> dict:
        """A trained cell's row columns (its budget, from the checkpoint's record; whether its dev BLEU
        was still rising) and, with ``save``, its learning curve copied into ``curves.jsonl``."""
        if not families.get(cell.family).trains:
            return {}
        record = self.deps.train_record(path) or {}
        points = self.deps.train_curve(path)
        decay = learning.decay_started(record)
        if save and points and self.store is not None:
            self.store.save_curve(cell.label, learning.records(cell.label, cell.family, points, decay))
        return {"model": cell.label, "model_params": record.get("num_params"), "train_steps": record.get("steps_done"),
                "train_tokens": record.get("target_tokens"), "train_seconds": record.get("train_seconds"),
                "train_flops": record.get("train_flops"),
                "warm_start_seconds": (record.get("init") or {}).get("source_train_seconds"),
                "distill_seconds": None if distilled is None else distilled.get("seconds"),
                "stopped_by": record.get("stopped_by"), "decay_start": decay,
                "plateau_dev_bleu": learning.plateau_bleu(points, decay), "best_dev_bleu": record.get("best_dev_bleu"),
                "dev_bleu_swing": learning.dev_swing(points, decay),
                "best_dev_nll": record.get("best_dev_nll"),
                "dev_nll_swing": (learning.dev_swing(points, decay, key="dev_nll")
                                  if points and all("dev_nll" in p for p in points) else None),
                "still_improving": learning.still_improving(points, record.get("stopped_by")),
                "dev_length_exact": points[-1].get("dev_length_exact") if points else None,
                "dev_length_within2": points[-1].get("dev_length_within2") if points else None}

    def _save_distillation(self, cell: TrainCell, record: dict) -> None:
        """Copy the distillation's record into the run folder (``distill.json``), keyed by task (plus
        ``-<size>`` on a size axis and ``-seed{N}`` when the suite has several seeds) if the run distils more than
        one."""
        if self.store is None:
            return
        teachers = {c.teacher for c in expand(self.spec).train_cells if c.teacher is not None}
        key = (cell.task + (f"-{cell.preset}" if cell.preset else "")
               + (f"-seed{cell.seed}" if len(self.spec.seeds) > 1 else ""))
        self.store.save_distill(key, record, keyed=len(teachers) > 1)

    def evaluate(self, systems: list[tuple[System, Path]], data: TestData, targets: list[Target]) -> list[Row]:
        """Warm up and time the systems interleaved on ``data`` once (each in its own worker process
        unless the spec says ``isolate = false``), with the solo check's rounds, then score and save every
        target."""
        return self.save(self.measure(systems, data, targets, self._stored_for(systems, data, targets)))

    def measure(self, systems: list[tuple[System, Path]], data: TestData, targets: list[Target],
                stored: dict[str, dict[str, tuple]]) -> "Measured":
        """Time and score (writing nothing): every target's rows and samples, where each system ran and
        which other narbench processes competed. ``stored``: per test set, the baselines timed earlier
        (``_stored_for``)."""
        timed = self._time(systems, data)
        target_lang = self.deps.target_lang(data.task)
        rows, samples = [], []
        for target in targets:
            chosen = [(s, ckpt) for s, ckpt in systems if s.name in target.systems]
            for system, ckpt in chosen:
                rows.append(self._row(system, ckpt, target, data, timed, stored.get(target.name, {}), target_lang))
                samples.extend(_samples(system.name, target, data, timed.m))
        return Measured(rows, samples, timed.where, timed.seen, self.env, timed.machine)

    def save(self, measured: "Measured") -> list[Row]:
        """Record where the systems ran and who competed (env.json), and save the rows and samples."""
        self._record_workers(measured.where)
        self._record_concurrent(measured.seen)
        self._record_load(measured.machine)
        if self.store is not None:
            self.store.save_cells(measured.rows, measured.samples)
        return measured.rows

    def _stored_for(self, systems: list[tuple[System, Path]], data: TestData,
                    targets: list[Target]) -> dict[str, dict[str, tuple]]:
        """Per test set, the baselines of its systems that are not timed now (finished in an earlier session)."""
        timed = {s.name for s, _ in systems}
        return {t.name: self._stored_baselines(t.name, data, {s.baseline for s, _ in systems
                                                              if s.name in t.systems} - timed) for t in targets}

    def _time(self, systems: list[tuple[System, Path]], data: TestData) -> "_Timed":
        """Start, warm up and time the systems (one schedule, with the solo check); their costs and where
        each ran (env.json's ``workers``)."""
        from tqdm.auto import tqdm

        from bench.measure import timing

        spec = self.spec
        solo = timing.solo_sample(len(data.sources), spec.batch_size, spec.timing.solo_sentences, spec.seeds[0])
        bar = tqdm(total=len(data.sources) * spec.timing.repeats, unit="sent", leave=False, dynamic_ncols=True,
                   desc=f"start {len(systems)} systems", disable=not self.progress)
        try:
            with lock.busy(f"timing {spec.name}"), self._timed_systems(systems) as timed:
                seen = lock.others()            # other narbench processes competing for the machine
                pids = [os.getpid(), *(t.pid for t in timed if hasattr(t, "pid"))]
                before = load.sample(pids, spec.timing.load_sample_s)   # the machine, this run's processes idle
                bar.set_description(f"warm up {len(timed)} systems")
                compile_s = timing.warm_up(timed, spec.batch_size, platform=self.platform)
                bar.set_description(f"time {len(timed)} systems interleaved, {spec.timing.turn} batches a turn"
                                    + (f", solo check on {len(solo)}" if solo else ""))
                start = load.snapshot(pids)
                m = timing.measure_systems(timed, data.sources, batch_size=spec.batch_size, phase=spec.timing.phase,
                                           repeats=spec.timing.repeats, rotate=spec.timing.rotate,
                                           platform=self.platform, on_batch=lambda done, _: bar.update(done - bar.n),
                                           solo_batches=solo, turn=spec.timing.turn)
                machine = {"split": f"{data.task}:{data.split}", "before": before,
                           "during": load.share(start, load.snapshot(pids))}
                costs = self._costs(timed, data, m) if spec.timing.costs and self.deps.costs else {}
                where = {t.name: {**t.info, "peak_rss_mb": t.peak_rss_mb(), "isolated": self._isolated}
                         for t in timed}
                truncated = {t.name: t.truncated(data.sources) for t in timed}
                seen += lock.others()
        finally:
            bar.close()
        return _Timed(m, compile_s, costs, where, truncated, seen, machine)

    def _row(self, system: System, ckpt: Path, target: "Target", data: TestData, timed: "_Timed",
             stored: dict[str, tuple], target_lang: str) -> Row:
        """One system's row on one test set: its figures against the references and its baseline, how and
        where it was timed, its training budget, costs and the environment."""
        from narbench_core.paths import portable

        spec, m = self.spec, timed.m
        refs = data.references[:target.n_refs]
        t = m.systems[system.name]
        base = m.systems.get(system.baseline)
        base_lat, base_hyp = (base.latencies_ms, base.hypotheses) if base else stored.get(system.baseline, (None, None))
        where = timed.where[system.name]
        return Row({
            **{c.name: None for c in columns()},          # the columns no family fills for this system
            "schema_version": SCHEMA_VERSION, "suite": spec.name, "task": system.cell.task,
            "test_set": target.name, "system": system.name, "family": system.family,
            "paradigm": families.get(system.family).paradigm, "distill": system.cell.teacher is not None,
            **dict(system.info), "batch_size": spec.batch_size,
            **compute_figures(t.hypotheses, refs, t.latencies_ms, t.passes, target_lang, base_lat, base_hyp,
                              spec.bootstrap_resamples, self.score, t.phase_ms or None,
                              None if t.host_syncs is None else list(t.host_syncs), _solo(t), data.valid),
            "bleurt": self._bleurt(refs[0], t.hypotheses) if self.score else None,
            "reproduced_agreement": _agreement(t.hypotheses, m.systems.get(dict(system.info).get("reproduces"))),
            "compile_s": timed.compile_s[system.name], "platform": m.platform, "phase": m.phase,
            "repeats": m.repeats, "turn": m.turn, "target_lang": target_lang, "n_references": len(refs),
            "truncated_sources": timed.truncated[system.name],
            "others_cpu_share": (timed.machine.get("during") or {}).get("others"),
            "steal_share": (timed.machine.get("during") or {}).get("steal"),
            "baseline_system": system.baseline, "baseline_timed_together": base is not None,
            "checkpoint": portable(ckpt), "decoder_options": dict(system.options),
            "isolated": where["isolated"], "engine_threads": where["threads"],
            "worker_peak_rss_mb": where["peak_rss_mb"] if self._isolated else None,
            "worker_systems": where.get("systems") if self._isolated else None,
            **self._training(system.cell, ckpt),
            **timed.costs.get(system.name, {}), **_env_fields(self.env),
        })

    @property
    def _isolated(self) -> bool:
        return self.spec.timing.isolate and self.deps.worker_factory is not None

    @contextlib.contextmanager
    def _timed_systems(self, systems: list[tuple[System, Path]]):
        """The systems as ``bench.measure.timing.TimedSystem``s in worker processes (``bench.measure.workers``: one
        per system, or per family where the family shares one), or
        decoders of this process when the spec says ``isolate = false`` or the deps have no worker factory."""
        from bench.measure import workers

        if self._isolated:
            specs = [workers.WorkerSpec(s.name, self.deps.worker_factory, (s.family, str(ckpt), s.decoder),
                                        {"name": s.name, **dict(s.options)},
                                        families.get(s.family).worker_env(dict(s.options)), self.platform,
                                        group=families.worker_group(s.family))
                     for s, ckpt in systems]
            with workers.WorkerPool(specs) as pool:
                yield pool.workers
        else:
            yield [workers.Local(self.deps.load_decoder(s.family, ckpt, s.decoder, name=s.name, **dict(s.options)))
                   for s, ckpt in systems]

    def _record_env(self, **fields: Any) -> None:
        """Add ``fields`` to the run's environment (``env.json``), e.g. where and how it timed."""
        self.env = {**self.env, **fields}
        if self.store is not None:
            self.store.write_env({**self.store.env(), **fields})

    def _record_workers(self, where: dict[str, dict]) -> None:
        """env.json's ``workers``: per system, its process's threads, environment and peak memory."""
        if self.store is None:
            return
        env = self.store.env()
        self.store.write_env({**env, "workers": {**env.get("workers", {}),
                                                  **{n: {k: v for k, v in w.items() if k != "pid"}
                                                     for n, w in where.items()}}})

    def _record_concurrent(self, seen: list) -> None:
        """env.json's ``concurrent_narbench``: the other narbench processes (timing, training) busy on this
        machine while this run timed; a new one is also one warning line."""
        from bench.measure import env as benv

        self.env = benv.record_concurrent(self.env, benv.concurrent(seen), self.spec.name)
        if self.store is not None:
            self.store.write_env({**self.store.env(), benv.CONCURRENT: self.env[benv.CONCURRENT]})

    def _record_load(self, machine: dict | None) -> None:
        """env.json's ``machine_load``: per timed split, the machine's load before and during the measurement
        (``bench.measure.load``); one warning line when other processes took more than ``defaults.BUSY_SHARE``."""
        from bench.measure import env as benv

        if not machine:
            return
        self.env = benv.record_load(self.env, machine, self.spec.name)
        if self.store is not None:
            self.store.write_env({**self.store.env(), benv.LOAD: self.env[benv.LOAD]})

    def _training(self, cell: TrainCell, path: Path) -> dict:
        if cell not in self.trained:       # evaluate() alone (`narbench eval`): no distillation record at hand
            self.trained[cell] = self._training_columns(cell, path, None, save=False)
        return self.trained[cell]

    def _bleurt(self, references: list[str], hypotheses: list[str]) -> float | None:
        from bench.measure.bleurt import corpus_bleurt

        return corpus_bleurt(self.bleurt, references, hypotheses) if self.bleurt else None

    def _stored_baselines(self, test_set: str, data: TestData, names: set[str]) -> dict[str, tuple]:
        """Baseline latencies/hypotheses of cells finished earlier (resumed runs), by sentence index."""
        if not names or self.store is None:
            return {}
        out = {}
        for name in names:
            by_index = {s["index"]: s for s in self.store.samples()
                        if s["system"] == name and s["test_set"] == test_set}
            if all(i in by_index for i in data.indices):
                out[name] = ([by_index[i]["latency_ms"] for i in data.indices],
                             [by_index[i]["hypothesis"] for i in data.indices])
        return out

    def _costs(self, timed, data: TestData, m) -> dict[str, dict]:
        """Each system's XLA cost (computed where the system runs) against this machine's peaks."""
        from bench import costs

        peaks = costs.machine_peaks()
        out = {}
        for system in timed:
            t = m.systems[system.name]
            c = system.cost(data.sources, t.passes, self.spec.batch_size)
            if c is None:                                  # runs outside XLA (CTranslate2): nothing to cost
                continue
            share = costs.roofline_share(c, t.latencies_ms, peaks)
            bound = c.bound_ms(peaks.peak_flops, peaks.bandwidth)
            out[system.name] = {
                "flops_per_sentence": float(c.flops.mean()), "bytes_per_sentence": float(c.bytes_accessed.mean()),
                "roofline_p50_ms": float(np.percentile(bound, 50)), "roofline_share_p50": float(np.median(share)),
                "peak_flops": peaks.peak_flops, "bandwidth_bytes_s": peaks.bandwidth,
                "tpu_v4_projection_p50_ms": costs.project(c, "tpu-v4").p50_bound_ms,
            }
        return out


def _measure_call(spec: SuiteSpec, deps: Deps, seeds: dict, platform: str | None, score: bool, trained: dict,
                  timed_env: dict | None, systems: list[tuple[System, Path]], data: TestData, targets: list[Target],
                  stored: dict) -> "Measured":
    """An evaluation group timed on a cluster's timing host: this machine's environment (its CPU must be
    the one the run has timed on), then ``Runner.measure``."""
    from bench.measure import env as benv
    from bench.measure.timing import resolve_platform
    from narbench_core.paths import enable_compilation_cache

    enable_compilation_cache()
    deps.prepare(spec, [])                               # the suite's own-data tasks (their target language)
    platform = resolve_platform(platform)
    env = benv.capture(seeds=seeds, platform=platform)
    benv.check_same_machine(timed_env or {}, env, timed=timed_env is not None)
    runner = Runner(spec, deps, None, env, platform, None, score, progress=False, trained=dict(trained))
    return runner.measure(systems, data, targets, stored)


@dataclass(frozen=True)
class _TrainCall:
    """A training job's call (it pickles: Ray runs it in a worker). Its needs: the distillation job's
    result if ``distill`` is set (the distillation's settings), then the warm-start checkpoint if ``warm``."""

    train: Callable[..., Path]
    prepare: Callable[[SuiteSpec, list], None]
    spec: SuiteSpec
    task: str                                # the spec's task (its distilled one comes from the need)
    model_config: Any
    train_config: Any
    progress: bool
    distill: dict | None
    warm: bool

    def __call__(self, *needs: Any) -> Path:
        from narbench_core.paths import enable_compilation_cache

        enable_compilation_cache()                      # a worker process loads what another compiled before
        needs_left, task, distilled = list(needs), self.task, []
        if self.distill is not None:
            task, _, teacher_dir = needs_left.pop(0)
            distilled = [(teacher_dir, self.task, self.distill)]
        self.prepare(self.spec, distilled)              # the tasks it trains on, known in this process
        init_from = needs_left.pop(0) if self.warm else None
        return Path(self.train(task, self.model_config, self.train_config, progress=self.progress, init_from=init_from))


def _distill_call(distill: Callable[..., tuple[str, dict]], prepare: Callable[[SuiteSpec, list], None],
                  spec: SuiteSpec, task: str, kwargs: dict, progress: bool, teacher_dir: Path) -> tuple[str, dict, Path]:
    """A distillation job's call: the teacher's outputs on ``task``'s training sources, as a new task;
    returns (that task, the distillation's record, the teacher's checkpoint)."""
    from narbench_core.paths import enable_compilation_cache

    enable_compilation_cache()
    prepare(spec, [])
    distilled, record = distill(teacher_dir, task, **kwargs, progress=progress)
    return distilled, record, teacher_dir


@dataclass(frozen=True)
class _Timed:
    """What timing one group of systems gave the rows."""
    m: Any                                   # bench.measure.timing.Measurement
    compile_s: dict[str, float]
    costs: dict[str, dict]                   # system -> cost-model columns
    where: dict[str, dict]                   # system -> its process: threads, env, peak RSS, isolated
    truncated: dict[str, int | None]         # system -> test sources it cut to its maximum source length
    seen: list                               # other narbench processes busy on this machine meanwhile
    machine: dict                            # the machine's load before and during (bench.measure.load)


@dataclass(frozen=True)
class Measured:
    """What timing and scoring one group of systems gave, before anything is saved (it may come from the
    timing host of a Ray cluster)."""
    rows: list[Row]
    samples: list[dict]
    where: dict[str, dict]                   # system -> its process (env.json's workers)
    seen: list                               # other narbench processes busy on the timing machine meanwhile
    env: dict                                # the timing machine's environment
    machine: dict | None = None              # its load before and during the measurement (bench.measure.load)


def _samples(system: str, target: "Target", data: TestData, m: Any) -> list[dict]:
    """One sample per sentence: the system's output and timings on it (what ``verify_run`` recomputes from)."""
    t, refs = m.systems[system], data.references[:target.n_refs]
    out = []
    for j, i in enumerate(data.indices):
        sample = {"system": system, "test_set": target.name, "index": i,
                  "source": data.sources[j], "reference": refs[0][j], "hypothesis": t.hypotheses[j],
                  "latency_ms": float(t.latencies_ms[j]), "passes": int(t.passes[j])}
        if t.phase_ms:
            sample["phase_ms"], sample["host_syncs"] = t.phase_ms[j], int(t.host_syncs[j])
        if len(refs) > 1:
            sample["references"] = [r[j] for r in refs]
        if data.valid is not None:
            sample["valid_targets"] = data.valid[j]
        if m.repeats > 1:
            sample["latency_raw_ms"] = [float(x) for x in t.raw_ms[:, j]]
        if t.solo_ms is not None and not np.isnan(t.solo_ms[j]):
            sample["solo_latency_ms"] = float(t.solo_ms[j])
        out.append(sample)
    return out


def _agreement(hypotheses: list[str], other) -> float | None:
    """The share of sentences where ``hypotheses`` equal the timed system ``other``'s (None without it)."""
    if other is None or not hypotheses:
        return None
    return float(np.mean([a == b for a, b in zip(hypotheses, other.hypotheses)]))


def _solo(t) -> list[float | None] | None:
    """A system's solo-check latencies aligned with its sentences (None outside the sample)."""
    if t.solo_ms is None:
        return None
    return [None if np.isnan(x) else float(x) for x in t.solo_ms]


def _env_fields(env: dict) -> dict:
    versions = env.get("versions", {})
    git = env.get("git", {})
    return {"device_kind": env.get("device_kind"), "device_driver": env.get("device_driver"),
            "cpu_model": env.get("cpu_model"),
            "threads": env.get("threads"), "jax_version": versions.get("jax"),
            "flax_version": versions.get("flax"), "git_commit": git.get("commit"), "git_dirty": git.get("dirty"),
            "date_utc": env.get("date_utc")}
