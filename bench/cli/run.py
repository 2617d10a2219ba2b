"""Sub-commands ``run``, ``plan``, ``eval``, ``report``, ``results`` and ``latency`` (thin: parse, call, print)."""
from __future__ import annotations

import argparse
import functools
import shlex
import sys
import time
import unicodedata
from pathlib import Path

from bench import families
from bench.cli.checkpoints import REFUSE_DAMAGED_HELP
from bench.executors.base import EXECUTORS
from narbench_core import defaults
from narbench_core.errors import UserError
from narbench_core.io import read_lines, write_jsonl
from narbench_core.runs import utc_now
from suites.spec import builtin_specs

SUITE_HELP = f"built-in suite name ({', '.join(builtin_specs())}) or a path to a .toml spec"


SIZES_HELP = ("only these model sizes of a suite with a size axis (its [model] preset list), in a run of their own: "
              "each size trained and timed on one machine, the scale page drawn across such runs by `narbench "
              "scale` (default: every size)")


def register(sub) -> None:
    """Add this module's sub-commands to ``sub`` (argparse subparsers)."""
    p = sub.add_parser("run", help="train (cached) and benchmark every system of a suite",
                       description="Expand a suite into training and evaluation cells, run the missing ones "
                       "into results/<suite>/<run_id>/ (re-running the same command resumes), then write "
                       "table.md, leaderboard.md and plots.")
    p.add_argument("--suite", default="default", help=SUITE_HELP + " (default: default)")
    p.add_argument("--sizes", dest="suite_sizes", nargs="+", metavar="SIZE", help=SIZES_HELP)
    p.add_argument("--out", default="results", help="results root folder (default: results)")
    _timing_args(p)
    p.add_argument("--refuse-damaged", action="store_true", help=REFUSE_DAMAGED_HELP)
    p.add_argument("--force", action="store_true", help="start a fresh run folder instead of resuming")
    p.add_argument("--train-only", action="store_true",
                   help="train and distil every model the suite needs, then stop before timing: the run folder stays "
                   "open, and the same command without --train-only times it (on a machine doing nothing else)")
    p.add_argument("--bleurt-checkpoint", help="BLEURT checkpoint folder (default: $NARBENCH_BLEURT; none: no BLEURT)")
    p.add_argument("--executor", choices=EXECUTORS, help=f"where the trainings run: local (in this process, one "
                   f"after another) or ray (on a Ray cluster; pip install 'narbench[ray]'); timing always runs "
                   f"here (default: {defaults.EXECUTOR})")
    p.add_argument("--address", help="with --executor ray: the Ray cluster to join (HOST:PORT of `ray start --head`; "
                   "default: start Ray on this machine)")
    p.set_defaults(func=cmd_run, trains=True)

    p = sub.add_parser("status", help="print the jobs of a run and their state (trained, running where, failed)",
                       description="Read a run folder's cells.json, written by the `narbench run` that drives it: "
                       "every training, distillation and evaluation job of its last session, its state, host, "
                       "attempt and time, and whether a process still drives the run.")
    p.add_argument("run_dir", help="run folder (results/<suite>/<run_id>) or suite folder (its newest run, "
                   "finished or not)")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("plan", help="print what a suite expands to, what is cached and an estimate of its time",
                       description="Expand a suite without training or timing anything: its training cells (and "
                       "which are cached under the data root), distillations, systems per test set, and an "
                       "estimate of the training and timing still to do from costs measured on this machine "
                       "(the runs under --results, the data root's checkpoint records). Spec errors surface "
                       "here as in `narbench run`.")
    p.add_argument("--suite", default="default", help=SUITE_HELP + " (default: default)")
    p.add_argument("--sizes", dest="suite_sizes", nargs="+", metavar="SIZE", help=SIZES_HELP)
    p.add_argument("--results", default="results", help="results root whose runs give the measured costs "
                   "(default: results)")
    p.add_argument("--batch-size", type=int, help="sentences per decoder call (default: the suite's, 1)")
    p.add_argument("--max-test-sentences", type=int, help="cap on test sentences (default: the suite's)")
    p.add_argument("--leave-out", action="append", default=[], metavar="SUITE/RUN_ID",
                   help="estimate as if this run (under --results) had not been measured, to compare the "
                        "estimate with its real time (repeatable)")
    p.add_argument("--probe", action="store_true",
                   help="first time a train step of each model still to train, on this machine (compiling each "
                        "batch shape: minutes a model), keep it under the data root and estimate from it; refused "
                        "while another narbench process trains or times here (pause it with kill -STOP)")
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format (default: text)")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("eval", help="score every system of a finished run on your own parallel text",
                       description="Add a test set to a run: time and score every system on SOURCE/REFERENCE "
                       "files (one sentence per line, aligned), then rewrite the run's report.")
    p.add_argument("--run", required=True, help="run folder (results/<suite>/<run_id>) or suite folder (latest)")
    p.add_argument("--source-file", required=True, help="source sentences, one per line")
    p.add_argument("--reference-file", required=True, action="append",
                   help="reference translations, one per line (repeat for multi-reference BLEU)")
    p.add_argument("--name", help="test set name (default: the source file's stem)")
    p.add_argument("--task", help="which trained task's systems to use when the run has several")
    p.add_argument("--force", action="store_true", help="replace a test set of the same name")
    p.add_argument("--platform", help="JAX platform to time on (cpu, gpu, tpu); default: JAX's default")
    p.add_argument("--bleurt-checkpoint", help="BLEURT checkpoint folder (default: $NARBENCH_BLEURT)")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("report", help="(re)write table.md, leaderboard.md and plots of a run",
                       description="Render a run folder's rows into table.md, leaderboard.md, pareto.png, "
                       "latency_cdf.png and bleu_vs_iterations.png, and check every figure against the run's samples.")
    p.add_argument("run_dir", help="run folder (results/<suite>/<run_id>) or suite folder (latest)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("gap", help="where a run's AR-PaDIR gap goes: its PaDIR models decoded again with one "
                       "change at a time (oracle length, repeats kept, k, T) and their training-set BLEU",
                       description="Decode-time diagnostics of a finished run (bench/gap.py): each chosen PaDIR "
                       "system's model decodes the run's test sentences again at the reference length, without the "
                       "repeat-dropping step, with k = 1/3/5/10 length hypotheses and T = 4/10/20 iterations, and "
                       "its training sentences (so is the AR baseline's). Writes gap.jsonl (diagnostics, never "
                       "result rows) and gap.md into the run folder, and resumes where it stopped.")
    p.add_argument("run_dir", help="run folder (results/<suite>/<run_id>) or suite folder (latest)")
    p.add_argument("--system", action="append", default=[], metavar="ID",
                   help="a PaDIR system id of the run to diagnose (repeatable; default: every JAX PaDIR system at "
                        "T = 4 and k = 1)")
    p.set_defaults(func=cmd_gap)

    p = sub.add_parser("scale", help="the scale page (the AR-PaDIR gap against model size) across runs of one "
                       "sized suite, each of some of its sizes",
                       description="Draw scale.md and scale.png from several runs of one suite with a size axis, "
                       "each run of some of its sizes (`narbench run --suite S --sizes SIZE`: a size trained and "
                       "timed on one machine and committed before the next trains). Gaps and speedups pair the "
                       "systems of one size within its own run; the page names each run's date, commit and machine, "
                       "and includes each run's `narbench gap` tables where it has them.")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                   help="run folders (results/<suite>/<run_id>), one or more sizes each, no size in two")
    p.add_argument("--out", help="folder to write into (default: results/<suite>/sizes-<sizes> beside the runs)")
    p.set_defaults(func=cmd_scale)

    p = sub.add_parser("results", help="print a run's rows as csv, json or markdown",
                       description="Print rows.jsonl of a run for pandas and other tools; with --columns, what "
                       "each column of rows.jsonl means.")
    p.add_argument("run", nargs="?", help="run folder (results/<suite>/<run_id>) or suite folder (latest)")
    p.add_argument("--columns", action="store_true",
                   help="print the reference of every rows.jsonl column (markdown; docs/results_format.md) instead")
    p.add_argument("--format", choices=("csv", "json", "md"), default="md", help="output format (default: md)")
    p.add_argument("--test-set", help="only rows of this test set")
    p.set_defaults(func=cmd_results)

    p = sub.add_parser("latency", help="timing only: p50/p90/p99 and speedups of a suite's systems, or "
                       "the AR-vs-PaDIR latency map (--map)",
                       description="Time every system of a suite on its test sets (training any missing "
                       "checkpoint first) without scoring quality; prints a latency table. With --map: time "
                       "AR greedy against PaDIR refine:T (k length hypotheses) on random-weight models over "
                       "model sizes, forced target lengths and batch sizes into results/speedmap/<run_id>/ "
                       "(rows.jsonl, speedmap.md, crossover.png; re-running the same command resumes), with "
                       "a cost model fitted on --calibrate sizes that predicts the others.")
    p.add_argument("--suite", default="default", help=SUITE_HELP + " (default: default)")
    _timing_args(p)
    p.add_argument("--refuse-damaged", action="store_true", help=REFUSE_DAMAGED_HELP)
    p.add_argument("--json", dest="json_out", help="also write the rows as JSON lines to this file")
    m = p.add_argument_group("latency map (--map)")
    m.add_argument("--map", action="store_true", help="time the latency map instead of a suite")
    for name, default, kind, text in _MAP_ARGS:
        flags = ["--" + name.replace("_", "-"), *_MAP_ALIASES.get(name, ())]
        m.add_argument(*flags, dest=name, type=kind, nargs="+" if isinstance(default, tuple) else None,
                       help=f"{text} (default: {' '.join(map(str, default)) if isinstance(default, tuple) else default})")
    m.add_argument("--out", default="results", help="results root folder of the map (default: results)")
    m.add_argument("--force", action="store_true", help="start a fresh map folder instead of resuming")
    m.add_argument("--resume-from", metavar="RUN_DIR", help="go on with an unfinished map timed elsewhere on "
                   "this kind of machine (a committed GPU run): it is copied under --out and only its missing "
                   "cells are timed; the same settings as it, not with --force")
    m.add_argument("--cost-model", metavar="FILE", help="score this map with the cost model of another map (its "
                   "cost_model.json) instead of fitting one: every row is then a prediction (not with --calibrate)")
    m.add_argument("--no-cost-model", action="store_true", help="measure no machine rates and fit no cost model "
                   "(not with --calibrate or --cost-model): every minute goes to the cells, as on a GPU host's "
                   "short lease; the roofline and projection columns stay")
    p.set_defaults(func=cmd_latency)


def _map_defaults():
    from bench.latency_map import MapSpec

    return MapSpec()


# Options of `narbench latency --map`: (MapSpec field, default, type, help); defaults live in MapSpec.
_MAP_ALIASES = {"iterations": ("--steps",), "length_hyps": ("--hyps",)}   # names the options had before
_MAP_ARGS = tuple((name, getattr(_map_defaults(), name), kind, text) for name, kind, text in (
    ("sizes", str, "model presets to map"),
    ("lengths", int, "forced target lengths (tokens; the source has as many)"),
    ("batches", int, "batch sizes"),
    ("iterations", int, "PaDIR refinement iterations T (--steps is an alias)"),
    ("length_hyps", int, "PaDIR length hypotheses k (--hyps is an alias)"),
    ("calibrate", str, "sizes the cost model is fitted on (it predicts the others)"),
    ("cell_seconds", float, "timed seconds per cell, all systems"),
    ("min_calls", int, "fewest timed calls per system and cell"),
    ("max_calls", int, "most timed calls per system and cell"),
))


def _timing_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch-size", type=int, help="sentences per decoder call (default: the suite's, 1)")
    p.add_argument("--max-test-sentences", type=int, help="cap on test sentences (default: the suite's)")
    p.add_argument("--platform", help="JAX platform to time on (cpu, gpu, tpu); default: JAX's default")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def _setup(platform: str | None) -> str:
    from bench.measure.timing import resolve_platform
    from narbench_core.paths import enable_compilation_cache

    enable_compilation_cache()
    return resolve_platform(platform)


def _spec(args):
    from bench.families import load_suite

    spec = load_suite(args.suite)
    if getattr(args, "suite_sizes", None):        # `latency --map` has a --sizes of its own (its models' presets)
        spec = spec.replace(model=spec.model.only(args.suite_sizes))
    if args.batch_size is not None:
        if args.batch_size < 1:
            raise UserError(f"--batch-size must be >= 1, got {args.batch_size}")
        spec = spec.replace(batch_size=args.batch_size)
    if args.max_test_sentences is not None:
        if args.max_test_sentences < 1:
            raise UserError(f"--max-test-sentences must be >= 1, got {args.max_test_sentences}")
        spec = spec.replace(max_test_sentences=args.max_test_sentences)
    return spec


def _command(args, names: tuple[str, ...]) -> str:
    """The canonical command line that reproduces this run."""
    parts = ["narbench", args.command]
    for name in names:
        value = getattr(args, name, None)
        flag = {"suite_sizes": "--sizes"}.get(name, "--" + name.replace("_", "-"))
        if value is True:
            parts.append(flag)
        elif isinstance(value, (list, tuple)):
            parts.extend([flag, *map(str, value)])
        elif value not in (None, False):
            parts.extend([flag, str(value)])
    return " ".join(shlex.quote(p) for p in parts)


def _seeds(spec) -> dict[str, int]:
    many = len(spec.seeds) > 1
    return {**{("train" + (f"_{i}" if many else "")): s for i, s in enumerate(spec.seeds)},
            "test_subset": spec.seeds[0], "significance": defaults.SIGNIFICANCE_SEED, "decoder": spec.seeds[0]}


def cmd_run(args) -> int:
    from bench.measure import env as benv
    from bench import runner, store
    from bench.measure.bleurt import load_scorer
    from bench.cli.data import refuse_bad_data

    spec = _spec(args)
    families.check_installed(spec)  # an engine's missing extra: one line now, not after the trainings
    platform = _setup(args.platform)
    refuse_bad_data(spec)          # the suite's own data files, checked before any result is written
    from bench import executors

    executor_name = args.executor or defaults.EXECUTOR
    if args.address and executor_name != "ray":
        raise UserError("--address joins a Ray cluster; add --executor ray")
    command = _command(args, ("suite", "suite_sizes", "out", "batch_size", "max_test_sentences", "platform",
                              "bleurt_checkpoint", "executor", "address"))
    run, resumed = store.open_run(Path(args.out), spec.name, spec.spec_hash(), spec.to_toml, command,
                                  force=args.force, doing=command + " --train-only" if args.train_only else None)
    try:
        print(f"narbench: {'resuming' if resumed else 'starting'} {spec.name} in {run.path}", file=sys.stderr)
        done = [] if resumed or args.force else store.finished_runs(Path(args.out), spec.name, spec.spec_hash())
        if done:
            print(f"narbench: run {done[-1].name} of this spec has finished (its results: {done[-1] / store.REPORT}); "
                  "a finished run is never changed, so this one times every cell again (trained models are "
                  "reused); stop it (Ctrl-C) if you wanted those results", file=sys.stderr)
        env = {**benv.capture(seeds=_seeds(spec), platform=platform),
               **{k: v for k, v in run.env().items() if k == benv.CONCURRENT}}
        timed_env = run.env() if run.rows() else None      # it has timed cells: it must time on their CPU
        if executor_name == "local":                        # this machine will time: refuse before training
            benv.check_same_machine(timed_env or {}, env, timed=timed_env is not None)
        if timed_env is None:
            run.write_env(env)
        start = time.perf_counter()
        options = {"address": args.address, "run_id": run.run_id, "logs_to": run.path / store.LOGS} \
            if executor_name == "ray" else {}
        executor = executors.make(executor_name, **options)
        deps = runner.real_deps(retrain_damaged=not args.refuse_damaged, wait_for_lease=executor_name == "ray")
        suite = runner.Runner(spec, deps, run, env, platform, load_scorer(args.bleurt_checkpoint),
                              progress=not args.no_progress, executor=executor, timed_env=timed_env,
                              train_only=args.train_only)
        suite.run()
        run.update_info(last_session_s=round(time.perf_counter() - start, 1))
        if args.train_only:
            print(f"narbench: every model of {spec.name} is trained; time them with the same command without "
                  f"--train-only (it resumes {run.path})", file=sys.stderr)
            return 0
        finished = utc_now().isoformat()                  # the time the report states and run.json records
        return _finish(run.path, lambda: store.finish_run(run, finished), finished)   # once its report is written
    finally:
        run.release()


def _finish(run_dir: Path, done=None, finished: str | None = None) -> int:
    """Write the run's report (saying it ``finished`` then, if given), then call ``done`` (``finish_run``), then
    check every figure."""
    from bench import report
    from bench.verify import verify_run

    files = report.write_report(run_dir, finished)
    if done is not None:
        done()
    problems = verify_run(run_dir)
    for f in files:
        print(f)
    if problems:
        print(f"narbench: {len(problems)} figure(s) do not match the run's samples:", file=sys.stderr)
        for p in problems[:20]:
            print(f"  {p}", file=sys.stderr)
        return 1
    print(f"narbench: every figure in rows.jsonl recomputed from the run's samples: OK ({run_dir})", file=sys.stderr)
    return 0


def _read_lines(path: str) -> list[str]:
    try:
        return read_lines(path)
    except FileNotFoundError:
        raise UserError(f"{path} does not exist; pass a text file with one sentence per line") from None
    except UnicodeDecodeError:
        raise UserError(f"{path} is not UTF-8 text; convert it with iconv") from None


def _holding(arg: str, what: str):
    """Run the command holding the run folder named by ``args.<arg>`` (``narbench_core.lock``): one process
    at a time writes a run folder."""
    def wrap(cmd):
        @functools.wraps(cmd)
        def held(args) -> int:
            from bench.store import resolve_run_dir
            from narbench_core import lock

            with lock.hold(resolve_run_dir(getattr(args, arg), writes=True), what):
                return cmd(args)
        return held
    return wrap


@_holding("run", "narbench eval")
def cmd_eval(args) -> int:
    import tomllib

    from bench.measure import env as benv

    from bench import plan, runner, store
    from bench.measure.bleurt import load_scorer
    from bench.families import parse_suite
    from narbench_core.paths import resolve

    run = store.RunStore(store.resolve_run_dir(args.run, writes=True), allow_finished=True)
    sources = _read_lines(args.source_file)
    refs = [_read_lines(f) for f in args.reference_file]
    for f, r in zip(args.reference_file, refs):
        if len(r) != len(sources):
            raise UserError(f"{f} has {len(r)} lines but {args.source_file} has {len(sources)}; "
                            "give aligned files with one sentence per line")
    if not sources:
        raise UserError(f"{args.source_file} is empty; give at least one sentence")
    name = args.name or Path(args.source_file).stem
    if any(unicodedata.category(c) in ("Cc", "Cs") for c in name):   # a tab or line break breaks the tables
        raise UserError(f"test set name {name!r} holds a control character (a tab or line break) or bytes that "
                        "are not UTF-8; pass --name with a plain name")
    rows = run.rows()
    if not rows:
        raise UserError(f"{run.path} has no finished systems; run `narbench run` first")
    if any(r.test_set == name for r in rows) and not args.force:
        raise UserError(f"{run.path} already has a test set {name!r}; pass --name NEW or --force to replace it")
    platform = _setup(args.platform)
    spec = parse_suite(tomllib.loads(run.spec_text()), str(run.path / store.SPEC), base_dir=run.path)
    tasks = sorted({r.task for r in rows})
    task = args.task or (tasks[0] if len(tasks) == 1 else None)
    if task not in tasks:
        raise UserError(f"pass --task with one of the run's tasks: {', '.join(tasks)}")
    ckpts = {r.system: r.checkpoint for r in rows if r.task == task}
    systems = [(s, resolve(ckpts[s.name])) for s in plan.expand(spec).systems
               if s.cell.task == task and s.name in ckpts]
    data = runner.TestData(task, name, list(range(len(sources))), sources, refs)
    target = runner.Target(name, len(refs), frozenset(s.name for s, _ in systems))
    env = benv.capture(seeds=_seeds(spec), platform=platform)
    suite = runner.Runner(spec, runner.real_deps(), run, env, platform, load_scorer(args.bleurt_checkpoint))
    done = suite.evaluate(systems, data, [target])
    cut = max((r.truncated_sources or 0 for r in done), default=0)
    if cut:
        from bench.measure.decoder import truncation_note

        print(truncation_note(cut, len(sources), None, f" of test set {name!r} (per system: rows.jsonl's "
                              "truncated_sources)"), file=sys.stderr)
    return _finish(run.path)


def cmd_status(args) -> int:
    from bench import store
    from narbench_core import lock
    from narbench_core.markdown import table

    run = store.RunStore(store.resolve_run_dir(args.run_dir, newest=True), allow_finished=True)
    info, board = run.info, run.board()
    run.env(), run.spec_table()              # a damaged file of the run is named in one line
    holder = lock.read_holder(run.path)
    stopped = False
    if info.get("status") == "finished":
        state = f"finished {info.get('finished', '')}".strip()
    elif holder is not None and holder.alive() is not False:
        state = f"running: {holder.describe()}"
    else:
        stopped = True
        state = "stopped before it finished; re-run its command to resume: " + str(info.get("command", "narbench run"))
    lines = [f"{run.path}: {state}", f"rows: {len(run.rows())} (system, test set) cells timed and scored"]
    if board is None:
        lines.append("no cells.json: this run was started before narbench recorded its jobs")
    else:
        # A job the board last saw running, in a run no process drives, was stopped with it.
        cells = [dict(c, state="stopped") if stopped and c["state"] == "running" else c for c in board["cells"]]
        counts = {s: sum(c["state"] == s for c in cells) for s in ("done", "running", "stopped", "pending", "failed")}
        lines.append(f"jobs ({board['executor']} executor, updated {board['updated']}): "
                     + ", ".join(f"{n} {s}" for s, n in counts.items() if n))
        lines.append("")
        lines += table(("job", "kind", "state", "host", "attempt", "seconds", "error"),
                       [(c["cell"], c["kind"], c["state"], c.get("host") or "", c.get("attempt") or "",
                         "" if c.get("seconds") is None else f"{c['seconds']:g}", c.get("error") or "")
                        for c in cells], "llllrrl")
        job_kinds = {c["cell"]: c["kind"] for c in cells if c["state"] == "running"}
        training = {job for job, what in job_kinds.items() if what == "train"}
        if training:
            lines += ["", "Trainings under way (as `narbench plan` sees their checkpoints on this machine):",
                      *_trainings(run, training)]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def _trainings(run, jobs: set[str]) -> list[str]:
    """The plan's lines (``bench.preview.cell_lines``) of the run's training cells whose jobs are ``jobs``: where
    each stands and its time left, its rates read from the run's results folder and the data root's records."""
    import tomllib

    from bench import estimate, preview, store
    from bench.families import parse_suite

    try:
        spec = parse_suite(tomllib.loads(run.spec_text()), str(run.path / store.SPEC), base_dir=run.path)
        locator = preview.real_locator()
        shown = preview.preview(spec, locator, estimate.Measured.collect(run.path.parent.parent, locator.data_root))
    except UserError as err:                  # the jobs table stands without them
        return [f"  unknown here: {err}"]
    return [line for c in shown.cells if c.cell.job in jobs for line in preview.cell_lines(c)]


def cmd_plan(args) -> int:
    import json

    from bench import estimate, preview

    spec = _spec(args)
    locator = preview.real_locator()
    measured = estimate.Measured.collect(Path(args.results), locator.data_root, exclude=args.leave_out)
    shown = preview.preview(spec, locator, measured)
    if args.probe:
        from bench import step_probe

        _setup(None)
        kept = step_probe.probe_plan(shown, locator)
        if kept:                                     # each replaces the record of its key, as on disk
            new = {p.key for p in kept}
            measured.probes = [p for p in measured.probes if p.key not in new] + kept
            shown = preview.preview(spec, locator, measured)
    sys.stdout.write(json.dumps(preview.to_json(shown), indent=1) + "\n" if args.format == "json"
                     else preview.render_text(shown))
    return 0


@_holding("run_dir", "narbench report")
def cmd_report(args) -> int:
    from bench.store import resolve_run_dir

    return _finish(resolve_run_dir(args.run_dir, writes=True))


def cmd_gap(args) -> int:
    from bench.gap import run_gap

    _setup(None)
    path = run_gap(args.run_dir, args.system)
    print(f"narbench: {path / 'gap.md'}")
    return 0


def cmd_scale(args) -> int:
    import matplotlib

    from bench.report.scale import write_across

    matplotlib.use("Agg")
    written = write_across(args.run_dirs, args.out)
    print(f"narbench: {written[0]}")
    return 0


def cmd_results(args) -> int:
    from bench import report, rows as brows, store

    if args.columns:
        sys.stdout.write(brows.columns_markdown())
        return 0
    if args.run is None:
        raise UserError("narbench results needs a run folder (results/<suite>/<run_id>), or --columns")
    run = store.RunStore(store.resolve_run_dir(args.run))
    rows = run.rows()
    if args.test_set:
        known = sorted({r.test_set for r in rows})
        if args.test_set not in known:
            raise UserError(f"no test set {args.test_set!r} in this run; known: {', '.join(known)}")
        rows = [r for r in rows if r.test_set == args.test_set]
    if args.format == "md":
        sys.stdout.write("\n".join(report.markdown_table(rows, report.RESULTS)) + "\n")
        return 0
    import pandas as pd

    df = pd.DataFrame([dict(r) for r in rows])
    if args.format == "csv":
        sys.stdout.write(df.to_csv(index=False))
    else:
        sys.stdout.write(df.to_json(orient="records", lines=True, force_ascii=False))
    return 0


LATENCY_COLUMNS = ("system", "test_set", "n_sentences", "latency_p50_ms", "latency_p90_ms", "latency_p99_ms",
                   "latency_mean_ms", "speedup_p50_vs_ar", "solo_p50_ms", "interference", "engine_threads",
                   "passes_mean", "compile_s")


def cmd_latency(args) -> int:
    from bench.measure import env as benv
    from bench import report, runner

    if args.map:
        return _cmd_map(args)
    given = [f"--{n.replace('_', '-')}" for n, *_ in _MAP_ARGS if getattr(args, n) is not None]
    given += ["--resume-from"] if args.resume_from else []
    if given:
        raise UserError(f"{' '.join(given)} only apply to the latency map; add --map")
    spec = _spec(args)
    families.check_installed(spec)
    platform = _setup(args.platform)
    env = benv.capture(seeds=_seeds(spec), platform=platform)
    deps = runner.real_deps(retrain_damaged=not args.refuse_damaged)
    rows = runner.Runner(spec, deps, None, env, platform, score=False, progress=not args.no_progress).run()
    if args.json_out:
        write_jsonl(Path(args.json_out), [dict(r) for r in rows])
    sys.stdout.write("\n".join(report.markdown_table(rows, LATENCY_COLUMNS)) + "\n")
    return 0


def _cmd_map(args) -> int:
    from bench.measure import env as benv
    from bench import latency_map

    if args.suite != "default" or args.batch_size is not None or args.max_test_sentences is not None:
        raise UserError("--suite, --batch-size and --max-test-sentences do not apply to --map; use --batches "
                        "and --lengths")
    changes = {n: (tuple(v) if isinstance(v, list) else v) for n, *_ in _MAP_ARGS
               if (v := getattr(args, n)) is not None}
    if args.cost_model and args.no_cost_model:
        raise UserError("--cost-model and --no-cost-model contradict each other; keep one")
    if args.cost_model or args.no_cost_model:    # scored by another map's model, or by none: this one fits nothing
        if args.calibrate is not None:
            flag = "--cost-model scores the map with a model fitted in another map" if args.cost_model else \
                "--no-cost-model fits no model"
            raise UserError(f"{flag}; drop --calibrate")
        changes["calibrate"] = ()
    spec = latency_map.MapSpec(**{**latency_map.MapSpec().to_dict(), **changes})
    platform = _setup(args.platform)
    env = benv.capture(seeds={"weights": spec.seed, "source": spec.seed, "decoder": spec.seed}, platform=platform)
    command = _command(args, ("map", *(n for n, *_ in _MAP_ARGS), "out", "cost_model", "no_cost_model", "platform",
                              "no_progress"))
    model = latency_map.CostModel.load(Path(args.cost_model)) if args.cost_model else None
    run_dir = latency_map.run_map(spec, Path(args.out), command, env=env, platform=platform,
                               progress=not args.no_progress, force=args.force, model=model,
                               cost_model=not args.no_cost_model, resume_from=args.resume_from)
    sys.stdout.write(f"latency map: {run_dir / latency_map.TABLE}\n")
    return 0
