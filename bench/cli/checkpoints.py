"""``narbench train``, ``narbench continue``, ``narbench replay``, ``narbench translate`` and ``narbench export``:
parse, call an importable function, print."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Iterable, Optional, TextIO

from bench import families
from models.config import PRESETS
from narbench_core import defaults
from narbench_core.errors import UserError
from narbench_core.io import split_lines

TRAIN_HELP = f"""Train an AR T5 or a PaDIR model on a task's training split. Checkpoints default to
<data root>/checkpoints/<task>-<kind>-<hash of task, configs, vocabulary and data>; an unfinished
run resumes from its last checkpoint when the same command runs again; a finished one is skipped.
--distill trains on the task distilled by an AR teacher (--teacher DIR, else the AR checkpoint that the
same command with --model ar would produce, trained first if it does not exist yet), which decodes the
training sources with the distillation settings a suite uses: its [distill] section with --suite,
else the defaults, each overridable by a flag. The teacher decodes a sample of the training split
drawn with --seed (the seed a suite's cell has), holding {defaults.DISTILL_HELDOUT} pairs aside to score
its BLEU (cached under <data root>/distill/ with distill.json)."""


REFUSE_DAMAGED_HELP = ("stop with one line at a damaged cached checkpoint (truncated or missing files) instead of "
                       "moving it aside to <folder>.damaged and retraining it (the default)")


def register(sub) -> None:
    """Add ``train``, ``continue``, ``translate`` and ``export`` to ``sub`` (argparse subparsers)."""
    p = sub.add_parser("train", help="train an AR or PaDIR model on a task", description=TRAIN_HELP)
    p.add_argument("--task", required=True, help="task name (see `narbench tasks`)")
    p.add_argument("--model", required=True, choices=[f.name for f in families.all_families() if f.trains],
                   help="system family whose model to train")
    p.add_argument("--preset", default="small", choices=list(PRESETS),
                   help="model size (models/config.py's PRESETS; default small)")
    p.add_argument("--steps", type=int, help="optimizer steps (with --until plateau: the cap; default: TrainConfig's)")
    p.add_argument("--batch-tokens", type=int, help="padded target tokens per batch")
    p.add_argument("--learning-rate", type=float, help="peak learning rate")
    p.add_argument("--warmup-steps", type=int)
    p.add_argument("--optimizer", choices=("adafactor", "adam"), help="adafactor (paper, default) or adam")
    p.add_argument("--unmask-rate", type=float, help="PaDIR: share of target tokens kept correct (0.15)")
    p.add_argument("--stages", type=int, help="PaDIR: training stages (2)")
    p.add_argument("--recipe", choices=defaults.RECIPES,
                   help="PaDIR: reference (fixed EOS, [LENGTH] query, stage-2 remasking) or plain "
                        f"(default {defaults.RECIPE})")
    p.add_argument("--glancing", action="store_true", default=None,
                   help=f"PaDIR: glancing training (GLAT; ratio {defaults.GLANCE_START:g} -> {defaults.GLANCE_END:g}; "
                        "--unmask-rate then has no effect and is refused)")
    p.add_argument("--glance-start", type=float,
                   help=f"PaDIR with --glancing: the glancing ratio at the first step ({defaults.GLANCE_START:g})")
    p.add_argument("--glance-end", type=float,
                   help=f"PaDIR with --glancing: the glancing ratio at the last step ({defaults.GLANCE_END:g})")
    p.add_argument("--length-predictor", choices=defaults.LENGTH_PREDICTORS,
                   help=f"PaDIR: length classes: absolute lengths or offsets from the source length "
                        f"(default {defaults.LENGTH_PREDICTOR})")
    p.add_argument("--init", choices=defaults.INIT_MODES, default=defaults.INIT,
                   help="PaDIR parameters: random, or ar: warm-started from an AR checkpoint (--init-from DIR, else "
                        "the one `--model ar` with the same flags gives, trained first if needed)")
    p.add_argument("--init-from", type=Path, help="AR checkpoint folder to warm-start from (with --init ar)")
    p.add_argument("--seed", type=int)
    p.add_argument("--checkpoint-every", type=int)
    p.add_argument("--eval-every", type=int,
                   help="steps between learning-curve points (dev NLL and BLEU in curve.jsonl; default: none)")
    p.add_argument("--until", choices=defaults.TRAIN_UNTIL,
                   help="steps: train --steps steps (default); plateau: until dev BLEU (or --signal) has not "
                        "progressed by more than --min-delta for --patience evaluations (needs --eval-every; "
                        "--steps is the cap)")
    p.add_argument("--signal", choices=tuple(defaults.PLATEAU_SIGNALS),
                   help="plateau: the curve value the rule reads: dev_bleu (a rise is progress; default) or dev_nll "
                        "(a fall is progress; --min-delta in nats per token)")
    p.add_argument("--patience", type=int, help="plateau: evaluations without progress (default 3)")
    p.add_argument("--min-delta", type=float, help="plateau: the progress that counts (default 0.2)")
    p.add_argument("--smooth", type=int, help="plateau: the rule reads the mean of the last N points (default 1)")
    p.add_argument("--patience-share", type=float,
                   help="plateau: the patience grows to this share of the evaluations so far (default 0: fixed)")
    p.add_argument("--min-steps", type=int, help="plateau: the rule does not fire before this step (default 0)")
    p.add_argument("--dev-sentences", type=int,
                   help=f"dev sentences per curve point (default {defaults.CURVE_SENTENCES}; 0: the whole dev split)")
    p.add_argument("--schedule", choices=defaults.LR_SCHEDULES,
                   help="learning rate after warm-up: cosine (default with --until steps) or wsd (constant, then a "
                        "linear decay; the only one with --until plateau)")
    p.add_argument("--decay-share", type=float, help="wsd: decay steps per step run before the decay (default 0.2)")
    p.add_argument("--distill", action="store_true", help="train on <task>_distilled (see above)")
    p.add_argument("--teacher", type=Path, help="AR checkpoint folder used as the distillation teacher")
    p.add_argument("--suite", help="take the distillation settings from this suite's [distill] section")
    p.add_argument("--distill-decoder", help="teacher search: greedy | beam:K (default: the suite's, else "
                   f"{defaults.DISTILL_DECODER})")
    p.add_argument("--distill-max-examples", type=int,
                   help="size of the seeded sample of training sources the teacher decodes (default: all)")
    p.add_argument("--distill-engine", choices=defaults.DISTILL_ENGINES,
                   help="where the teacher decodes: narbench's JAX decoder or CTranslate2 (the ct2 extra) "
                        f"(default: the suite's, else {defaults.DISTILL_ENGINE})")
    p.add_argument("--out", type=Path, help="checkpoint folder (default: hash-keyed under the data root)")
    p.add_argument("--refuse-damaged", action="store_true", help=REFUSE_DAMAGED_HELP)
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_train_command, trains=True)

    c = sub.add_parser("continue", help="continue a training past its plateau: did the rule stop it early?",
                       description="Train a checkpoint that the plateau rule stopped once more, from the state "
                       "where the rule fired (step S, kept in <checkpoint>/kept/S/) at the peak learning rate until "
                       "FACTOR x S at least, then by the same rule and decay: the same as that training from scratch "
                       "with --min-steps FACTOR x S. At the end it prints both final dev BLEUs and NLLs, how much the "
                       "stopped training's dev BLEU swung at the peak rate, and the verdict: both final models decode "
                       "the dev sentences again and their BLEU difference is tested by sacrebleu's paired bootstrap; "
                       "the rule stopped the training early where its whole 95% interval is above 0. Resumes when "
                       "run again.")
    c.add_argument("checkpoint", type=Path, help="checkpoint folder whose training the plateau rule stopped")
    c.add_argument("--factor", type=float, default=2.0,
                   help="train at the peak rate until FACTOR x the plateau's step at least (default 2: as long again)")
    c.add_argument("--out", type=Path, help="folder to train into (default <checkpoint>.past-plateau-<FACTOR>x)")
    c.add_argument("--quiet", action="store_true", help="no progress bars")
    c.set_defaults(func=_continue_command, trains=True)

    r = sub.add_parser("replay", help="replay plateau rules on a checkpoint's dev curve: where would each stop it?",
                       description="Read a checkpoint's dev curve (curve.jsonl) at the peak learning rate (up to "
                       "where its decay began, or --until) and print where each plateau rule of a grid would have "
                       "fired and stopped its training (models.schedule.stop_state); nothing is trained or decoded. "
                       "Each rule option takes several values (the grid is every combination) and defaults to the "
                       "checkpoint's own rule, whose row is marked. On a curve trained on past its plateau (narbench "
                       "continue) it shows which rules fire too early, and which too late.")
    r.add_argument("checkpoint", type=Path, help="checkpoint folder with a dev curve (a training until the plateau)")
    r.add_argument("--signal", choices=sorted(defaults.PLATEAU_SIGNALS), help="the curve value the rules read")
    r.add_argument("--smooth", type=int, nargs="+", metavar="N", help="means of the last N points")
    r.add_argument("--min-delta", type=float, nargs="+", metavar="D", help="progress over the best that counts")
    r.add_argument("--patience", type=int, nargs="+", metavar="E", help="evaluations without progress")
    r.add_argument("--patience-share", type=float, nargs="+", metavar="S",
                   help="the patience is at least this share of the evaluations so far")
    r.add_argument("--min-steps", type=int, nargs="+", metavar="STEP", help="no plateau before this step")
    r.add_argument("--until", type=int, metavar="STEP",
                   help="read the curve up to this step (default: where its decay began; all of it before then)")
    r.add_argument("--format", choices=("csv", "json", "md"), default="md", help="output format (default: md)")
    r.set_defaults(func=_replay_command)

    t = sub.add_parser("translate", help="translate sentences with a trained checkpoint",
                       description="Sources one per line (stdin by default); hypotheses one per line on "
                       "stdout, same count and order.")
    t.add_argument("--checkpoint", required=True, type=Path, help="folder written by `narbench train`")
    t.add_argument("--decoder", required=True, help="greedy | beam:K (AR) | refine:T (PaDIR)")
    t.add_argument("--length-hyps", type=int,
                   help=f"PaDIR: length hypotheses decoded in parallel (default {defaults.LENGTH_HYPS})")
    t.add_argument("--length-bonus", type=int,
                   help=f"PaDIR: tokens added to every predicted length (default {defaults.LENGTH_BONUS})")
    t.add_argument("--remask", choices=defaults.REMASK_MODES, help=f"PaDIR re-masking (default {defaults.REMASK})")
    t.add_argument("--batch-size", type=int, default=32)
    t.add_argument("--source-file", type=Path, help="default: stdin")
    t.set_defaults(func=_translate_command)

    e = sub.add_parser("export", help="export a checkpoint to another inference engine (AR: ct2, PaDIR: onnx)",
                       description="Export a trained checkpoint for another inference engine: an AR checkpoint to "
                       "CTranslate2 (ct2), a PaDIR checkpoint to ONNX Runtime (onnx).")
    esub = e.add_subparsers(dest="export_command", metavar="ENGINE")
    esub.required = True
    c = esub.add_parser("ct2", help="CTranslate2 (needs the extra: pip install -e \".[ct2]\")",
                        description="Write a CTranslate2 model folder built straight from the Flax parameters "
                        "(numpy only; no torch or transformers): T5.1.1 layout, shared SentencePiece vocabulary. "
                        "Translate with ctranslate2.Translator(OUT); sources are SentencePiece pieces plus </s>.")
    _export_arguments(c, "AR")
    c.set_defaults(func=_export_ct2_command)
    o = esub.add_parser("onnx", help="ONNX Runtime, PaDIR checkpoints (needs the extra: pip install -e \".[ort]\")",
                        description="Write a PaDIR checkpoint as two ONNX graphs built straight from the Flax "
                        "parameters: encoder.onnx (ids -> length logits and every decoder layer's cross-attention "
                        "keys and values) and refine.onnx (one refinement pass -> each position's argmax token and "
                        "its log-prob). `narbench run` drives them with the suite's [ort] section; int8 is ONNX "
                        "Runtime's dynamic quantization of the weight matrices (no calibration data).")
    _export_arguments(o, "PaDIR")
    o.add_argument("--max-source-tokens", type=int, default=max(defaults.DECODE_BUCKETS),
                   help=f"longest source the encoder graph takes, EOS included "
                        f"(default {max(defaults.DECODE_BUCKETS)})")
    o.set_defaults(func=_export_onnx_command)


def _export_arguments(p: argparse.ArgumentParser, kind: str) -> None:
    """The arguments every ``narbench export ENGINE`` takes."""
    p.add_argument("--checkpoint", required=True, type=Path,
                   help=f"{kind} checkpoint folder written by `narbench train`")
    p.add_argument("--out", required=True, type=Path, help="model folder to write")
    p.add_argument("--quantization", choices=("float32", "int8"), default="float32",
                   help="weights in float32 (default) or int8")
    p.add_argument("--force", action="store_true",
                   help="rewrite what --out holds if narbench wrote it (its .narbench stamp, or an earlier export); "
                        "any other folder or file is refused")


# -- importable logic -----------------------------------------------------------------------------
def train_configs(task: str, family: str, preset_name: str = "small", axes: Optional[dict] = None, **overrides):
    """``(model_config, train_config)`` for a task, built by the family: the preset sized to the task's
    vocabulary, TrainConfig defaults with the non-None ``overrides`` and the family's training ``axes``."""
    from suites.catalog import get_vocabulary

    axes = {k: v for k, v in (axes or {}).items() if v is not None}
    return families.get(family).configs(preset_name, get_vocabulary(task).vocab_size, {},
                                        {k: v for k, v in overrides.items() if v is not None}, axes)


def distill_settings(suite: Optional[str] = None, **flags):
    """The suite's ``[distill]`` section (default settings without one), with the non-None flags."""
    import dataclasses

    from suites.spec import TEACHER_DECODER_RE, DistillSpec

    decoder = flags.get("decoder")
    if decoder is not None and not TEACHER_DECODER_RE.match(decoder):
        raise UserError(f"--distill-decoder must be greedy or beam:K (e.g. beam:5), got {decoder!r}")
    base = families.load_suite(suite).distill if suite else DistillSpec()
    return dataclasses.replace(base, **{k: v for k, v in flags.items() if v is not None})


def train_model(task: str, family: str, preset_name: str = "small", *, distill=None, teacher: Optional[Path] = None,
                out: Optional[Path] = None, progress: bool = True, axes: Optional[dict] = None,
                init: str = defaults.INIT, init_from: Optional[Path] = None,
                retrain_damaged: bool = defaults.RETRAIN_DAMAGED, **overrides) -> Path:
    """Train (or resume, or find finished) one model; with ``distill`` (a ``DistillSpec``) on the
    outputs of the AR teacher; with ``init="ar"`` warm-started from an AR checkpoint. A damaged
    checkpoint on the way is retrained, or with ``retrain_damaged=False`` refused (``models.train.train``)."""
    from models.distill import distill_task
    from models.train import TrainConfig, train

    if teacher is not None and distill is None:
        raise UserError("--teacher only applies with --distill")
    if init_from is not None and init != "ar":
        raise UserError("--init-from only applies with --init ar")
    if init == "ar" and init_from is None:
        init_from = train_model(task, families.BASELINE, preset_name, progress=progress,
                                retrain_damaged=retrain_damaged, **overrides)
    train_task = task
    if distill is not None:
        if teacher is None:
            teacher = train_model(task, families.BASELINE, preset_name, progress=progress,
                                  retrain_damaged=retrain_damaged, **overrides)
        seed = overrides.get("seed")          # the teacher's seed draws the sample, as in a suite's cell
        train_task = distill_task(teacher, task, **distill.kwargs(), seed=TrainConfig.seed if seed is None else seed,
                                  progress=progress)
    model_config, train_config = train_configs(train_task, family, preset_name, axes, **overrides)
    return train(train_task, model_config, train_config, out_dir=out, progress=progress, init_from=init_from,
                 retrain_damaged=retrain_damaged)


def translate_lines(checkpoint: Path, decoder_spec: str, lines: Iterable[str], batch_size: int = 32,
                    note: Optional[Callable[[str], None]] = None, **options) -> Iterable[str]:
    """Hypotheses for ``lines`` (one source each, a trailing newline dropped; same order), decoded in
    batches. ``note`` gets a one-line message when sources are longer than the model's maximum and cut."""
    from bench.measure.decoder import truncated_sources, truncation_note
    from models.decoders import load_decoder

    if batch_size < 1:
        raise UserError("--batch-size must be >= 1")
    decoder = load_decoder(checkpoint, decoder_spec, **{k: v for k, v in options.items() if v is not None})
    decoder.warmup_inputs(batch_size)        # fixes the batch size: the last batch pads up to it
    sources = [line.rstrip("\n") for line in lines]
    cut = truncated_sources(decoder, sources) if note is not None else None
    if cut:
        note(truncation_note(cut, len(sources), getattr(decoder, "max_source_tokens", None)))
    for start in range(0, len(sources), batch_size):
        batch = sources[start:start + batch_size]
        prepared = decoder.prepare(batch)
        yield from decoder.finish(decoder.run(prepared), prepared).hypotheses


# -- commands -------------------------------------------------------------------------------------
def _train_command(args: argparse.Namespace) -> int:
    from narbench_core.paths import enable_compilation_cache

    enable_compilation_cache()
    distill = None
    if args.distill:
        distill = distill_settings(args.suite, decoder=args.distill_decoder, max_examples=args.distill_max_examples,
                                   engine=args.distill_engine)
    elif args.suite or args.distill_decoder or args.distill_max_examples or args.distill_engine:
        raise UserError("--suite, --distill-decoder, --distill-max-examples and --distill-engine only apply with "
                        "--distill")
    out = train_model(args.task, args.model, args.preset, distill=distill, teacher=args.teacher,
                      out=args.out, progress=not args.quiet, init=args.init, init_from=args.init_from,
                      retrain_damaged=not args.refuse_damaged,
                      axes={"unmask_rate": args.unmask_rate, "stages": args.stages, "recipe": args.recipe,
                            "glancing": args.glancing, "glance_start": args.glance_start,
                            "glance_end": args.glance_end, "length_predictor": args.length_predictor},
                      steps=args.steps, batch_tokens=args.batch_tokens, learning_rate=args.learning_rate,
                      warmup_steps=args.warmup_steps, seed=args.seed, checkpoint_every=args.checkpoint_every,
                      eval_every=args.eval_every, optimizer=args.optimizer, until=args.until,
                      signal=args.signal, patience=args.patience, min_delta=args.min_delta, smooth=args.smooth,
                      patience_share=args.patience_share, min_steps=args.min_steps, dev_sentences=args.dev_sentences,
                      schedule=args.schedule or ("wsd" if args.until == "plateau" else None),
                      decay_share=args.decay_share)
    print(out)
    return 0


def _continue_command(args: argparse.Namespace) -> int:
    from models.train import continue_past_plateau
    from narbench_core.paths import enable_compilation_cache

    enable_compilation_cache()
    out = continue_past_plateau(args.checkpoint, args.out, args.factor, progress=not args.quiet)
    print(out)
    print(f"narbench continue: {_past_plateau_line(args.checkpoint, out, final_dev_difference(args.checkpoint, out))}")
    return 0


REPLAY_COLUMNS = ("signal", "smooth", "min_delta", "patience", "patience_share", "min_steps", "fires", "stops",
                  "best", "best_step", "own")


def replay_rules(checkpoint_dir: Path, grid: dict, until: int | None = None) -> tuple[list[dict], str]:
    """Plateau rules (``grid``: ``RULE_FIELDS`` names -> values) replayed on a checkpoint's dev curve at the peak
    rate (``models.schedule.replay``; up to ``until``, default where its decay began): one row per rule with
    ``REPLAY_COLUMNS`` (``own``: the checkpoint's own rule), and a line saying what was read."""
    import dataclasses

    from models import checkpoint, curves
    from models.schedule import RULE_FIELDS, replay
    from models.train import TrainConfig

    meta = checkpoint.read_meta(checkpoint_dir)
    if not meta or not meta.get("train_config"):
        raise UserError(f"{checkpoint_dir} has no narbench.json: pass a checkpoint folder "
                        f"(under <data root>/checkpoints)")
    cfg = TrainConfig.from_dict(meta["train_config"])
    if cfg.schedule != "wsd":
        raise UserError(f"{checkpoint_dir} trained on a {cfg.schedule} schedule, whose dev points are not at one "
                        f"learning rate: replay a training with schedule = \"wsd\" (until = \"plateau\")")
    decay = meta.get("decay_start") if meta.get("stopped_by") == "plateau" else None
    last = until if until is not None else decay
    points = [p for p in curves.read_curve(checkpoint_dir) if last is None or p["step"] <= last]
    if not points:
        raise UserError(f"{checkpoint_dir} has no dev curve points{f' up to step {last:,}' if last else ''} "
                        f"(curve.jsonl): replay a training until the plateau, or a later --until")
    for signal in grid.get("signal", [cfg.signal]):
        if any(p.get(signal) is None for p in points):
            raise UserError(f"{checkpoint_dir}'s dev curve has no {signal} at every point: replay another --signal")
    own = dataclasses.replace(cfg, until="plateau")
    rows = replay(own, points, grid)
    for row in rows:
        row["own"] = all(row[k] == getattr(own, k) for k in RULE_FIELDS)
    if decay is not None:
        fired = f"its own rule fired at {decay:,}"
    elif meta.get("complete") is False:
        fired = "its own rule has not fired (still training)"
    else:
        fired = f"its own rule had not fired (stopped_by: {meta.get('stopped_by')})"
    return rows, (f"{len(points)} dev points, steps {points[0]['step']:,} to {points[-1]['step']:,}"
                  f"{' (the peak rate)' if until is None else ''}; {fired}")


def _replay_command(args: argparse.Namespace) -> int:
    grid = {k: v for k, v in (("signal", [args.signal] if args.signal else None), ("smooth", args.smooth),
                              ("min_delta", args.min_delta), ("patience", args.patience),
                              ("patience_share", args.patience_share), ("min_steps", args.min_steps)) if v}
    rows, read = replay_rules(args.checkpoint, grid, args.until)
    if args.format == "md":
        from narbench_core import markdown

        print(f"narbench replay: {args.checkpoint}: {read}", file=sys.stderr)
        print("\n".join(markdown.table(REPLAY_COLUMNS, ([_cell(row[c]) for c in REPLAY_COLUMNS] for row in rows),
                                        align="l")))
        return 0
    import pandas as pd

    df = pd.DataFrame([{c: row[c] for c in REPLAY_COLUMNS} for row in rows]).astype({"fires": "Int64",
                                                                                  "stops": "Int64"})
    sys.stdout.write(df.to_csv(index=False) if args.format == "csv" else
                     df.to_json(orient="records", lines=True, force_ascii=False))
    return 0


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "*" if value else ""
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".")
    return f"{value:,}" if isinstance(value, int) else str(value)


def _past_plateau_line(stopped: Path, continued: Path, final: tuple | None = None) -> str:
    """The continuation's verdict line (``bench.measure.learning.past_plateau``) from the two folders (``final``:
    ``final_dev_difference``)."""
    from bench.measure import learning
    from models import checkpoint, curves

    decay = int(checkpoint.read_meta(stopped)["decay_start"])
    return learning.past_plateau(curves.read_curve(stopped), decay, curves.read_curve(continued), final)


def final_dev_difference(stopped: Path, continued: Path, n_resamples: int = 1000,
                         seed: int = defaults.SIGNIFICANCE_SEED) -> tuple[int, float, tuple[float, float]]:
    """``(dev sentences, BLEU difference, its 95% interval)``: the continued training's final model against the
    stopped one's, both decoding the training's dev sentences by its curve decoder (``models.curves``), the
    difference tested as sacrebleu's paired bootstrap (``bench.report.grid.bleu_difference``, ``n_resamples``)."""
    import numpy as np
    from sacrebleu.metrics import BLEU

    from bench.report.grid import bleu_difference
    from models import checkpoint
    from models.distill import register_trained_task
    from models.train import TrainConfig, dev_evaluator

    model_config, params, meta = checkpoint.load(stopped)
    _, continued_params, _ = checkpoint.load(continued)
    register_trained_task(meta)                      # a distilled model's task, where this process did not distill
    scorer = dev_evaluator(meta["task"], model_config, TrainConfig.from_dict(meta["train_config"]))
    dev = scorer.dev
    metric = BLEU(tokenize=dev.tokenize, references=[list(dev.references), *(list(r) for r in dev.others)])
    stats = [np.array(metric._extract_corpus_statistics(scorer.hypotheses(p), None), dtype="float32")
             for p in (continued_params, params)]
    effect = bleu_difference([(stats[0], stats[1], 1.0)], metric, n_resamples, seed)
    return len(dev.sources), effect.value, effect.ci


def _export_ct2_command(args: argparse.Namespace) -> int:
    from models import ct2

    out = ct2.export(args.checkpoint, args.out, args.quantization, force=args.force)
    print(out)
    return 0


def _export_onnx_command(args: argparse.Namespace) -> int:
    from models import ort

    if args.max_source_tokens < 1:
        raise UserError("--max-source-tokens must be >= 1")
    print(ort.export(args.checkpoint, args.out, args.quantization, force=args.force,
                     max_source_tokens=args.max_source_tokens))
    return 0


def _source_lines(source_file: Optional[Path], stdin: TextIO) -> list[str]:
    """The sources of ``--source-file`` or stdin by the one line rule (lines end at "\n" only); a line
    that is not UTF-8 is a one-line ``UserError`` naming it (stdin is read as bytes when it has them)."""
    name = source_file or "stdin"
    raw = (source_file.read_bytes() if source_file else
           stdin.buffer.read() if hasattr(stdin, "buffer") else stdin.read())
    lines = []
    for n, line in enumerate(split_lines(raw), 1):
        try:         # bytes decode strictly; text must hold no surrogate standing in for an undecodable byte
            lines.append(line.decode("utf-8") if isinstance(line, bytes) else line.encode("utf-8").decode("utf-8"))
        except UnicodeError:
            raise UserError(f"{name}: line {n} is not UTF-8 text; convert it (e.g. iconv -f latin1 -t utf-8)") from None
    return lines


def _translate_command(args: argparse.Namespace, stdin: TextIO = None, stdout: TextIO = None) -> int:
    from narbench_core.paths import enable_compilation_cache

    enable_compilation_cache()
    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    if args.source_file is not None and not args.source_file.is_file():
        state = "is a folder" if args.source_file.is_dir() else "not found"
        raise UserError(f"source file {args.source_file} {state}; pass an existing file or use stdin")
    lines = _source_lines(args.source_file, stdin)
    if not lines:
        return 0
    for hyp in translate_lines(args.checkpoint, args.decoder, lines, args.batch_size,
                               note=lambda line: print(line, file=sys.stderr),
                               length_hyps=args.length_hyps, remask=args.remask,
                               length_bonus=args.length_bonus):
        stdout.write(hyp.replace("\n", " ") + "\n")
    stdout.flush()
    return 0
