"""``narbench train`` and ``narbench translate``: parse, call an importable function, print."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Iterable, Optional, TextIO

from narbench_core.errors import UserError

TRAIN_HELP = """Train an AR T5 or a PaDIR model on a task's training split. Checkpoints default to
<data root>/checkpoints/<task>-<kind>-<hash of task, configs, vocabulary and data>; an unfinished
run resumes from its last checkpoint when the same command runs again; a finished one is skipped.
--distill trains on <task>_distilled: the AR teacher (--teacher DIR, else the AR checkpoint that the
same command with --model ar would produce, trained first if it does not exist yet) beam-decodes the
training sources (cached under <data root>/distill/)."""


def register(sub) -> None:
    """Add ``train`` and ``translate`` to ``sub`` (argparse subparsers)."""
    p = sub.add_parser("train", help="train an AR or PaDIR model on a task", description=TRAIN_HELP)
    p.add_argument("--task", required=True, help="task name (see `narbench tasks`)")
    p.add_argument("--model", required=True, choices=("ar", "padir"))
    p.add_argument("--preset", default="small", help="model size: tiny | small | paper (default small)")
    p.add_argument("--steps", type=int, help="optimizer steps (default: TrainConfig's)")
    p.add_argument("--batch-tokens", type=int, help="padded target tokens per batch")
    p.add_argument("--learning-rate", type=float, help="peak learning rate")
    p.add_argument("--warmup-steps", type=int)
    p.add_argument("--optimizer", choices=("adafactor", "adam"), help="adafactor (paper, default) or adam")
    p.add_argument("--unmask-rate", type=float, help="PaDIR: share of target tokens kept correct (0.15)")
    p.add_argument("--stages", type=int, help="PaDIR: training stages (2)")
    p.add_argument("--seed", type=int)
    p.add_argument("--checkpoint-every", type=int)
    p.add_argument("--distill", action="store_true", help="train on <task>_distilled (see above)")
    p.add_argument("--teacher", type=Path, help="AR checkpoint folder used as the distillation teacher")
    p.add_argument("--out", type=Path, help="checkpoint folder (default: hash-keyed under the data root)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_train_command)

    t = sub.add_parser("translate", help="translate sentences with a trained checkpoint",
                       description="Sources one per line (stdin by default); hypotheses one per line on "
                       "stdout, same count and order.")
    t.add_argument("--checkpoint", required=True, type=Path, help="folder written by `narbench train`")
    t.add_argument("--decoder", required=True, help="greedy | beam:K (AR) | refine:T (PaDIR)")
    t.add_argument("--length-hyps", type=int, help="PaDIR: length hypotheses decoded in parallel (5)")
    t.add_argument("--remask", choices=("none", "stutter", "mask-predict"), help="PaDIR re-masking (stutter)")
    t.add_argument("--batch-size", type=int, default=32)
    t.add_argument("--source-file", type=Path, help="default: stdin")
    t.set_defaults(func=_translate_command)


# -- importable logic -----------------------------------------------------------------------------
def train_configs(task: str, kind: str, preset_name: str = "small", **overrides):
    """``(model_config, train_config)`` for a task: the preset sized to the task's vocabulary and
    TrainConfig defaults with the non-None ``overrides`` applied."""
    from models.config import preset
    from models.train import TrainConfig
    from suites.tasks import get_vocabulary

    model_config = preset(preset_name, kind=kind, vocab_size=get_vocabulary(task).vocab_size)
    train_config = TrainConfig(**{k: v for k, v in overrides.items() if v is not None})
    return model_config, train_config


def train_model(task: str, kind: str, preset_name: str = "small", *, distill: bool = False,
                teacher: Optional[Path] = None, out: Optional[Path] = None, progress: bool = True,
                **overrides) -> Path:
    """Train (or resume, or find finished) one model; with ``distill`` on the teacher's outputs."""
    from models.distill import distill_task
    from models.train import train

    if teacher is not None and not distill:
        raise UserError("--teacher only applies with --distill")
    train_task = task
    if distill:
        if teacher is None:
            ar_overrides = {k: v for k, v in overrides.items() if k not in ("unmask_rate", "stages")}
            teacher = train_model(task, "ar", preset_name, progress=progress, **ar_overrides)
        train_task = distill_task(teacher, task, progress=progress)
    model_config, train_config = train_configs(train_task, kind, preset_name, **overrides)
    return train(train_task, model_config, train_config, out_dir=out, progress=progress)


def translate_lines(checkpoint: Path, decoder_spec: str, lines: Iterable[str], batch_size: int = 32,
                    **options) -> Iterable[str]:
    """Hypotheses for ``lines`` (one per line, same order), decoded in batches."""
    from models.decoders import load_decoder

    if batch_size < 1:
        raise UserError("--batch-size must be >= 1")
    decoder = load_decoder(checkpoint, decoder_spec, **{k: v for k, v in options.items() if v is not None})
    decoder.warmup_inputs(batch_size)        # fixes the batch size: the last batch pads up to it
    sources = [line.rstrip("\n") for line in lines]
    for start in range(0, len(sources), batch_size):
        batch = sources[start:start + batch_size]
        prepared = decoder.prepare(batch)
        yield from decoder.finish(decoder.run(prepared), prepared).hypotheses


# -- commands -------------------------------------------------------------------------------------
def _train_command(args: argparse.Namespace) -> int:
    from narbench_core.paths import enable_compilation_cache

    enable_compilation_cache()
    out = train_model(args.task, args.model, args.preset, distill=args.distill, teacher=args.teacher,
                      out=args.out, progress=not args.quiet, steps=args.steps,
                      batch_tokens=args.batch_tokens, learning_rate=args.learning_rate,
                      warmup_steps=args.warmup_steps, unmask_rate=args.unmask_rate,
                      stages=args.stages, seed=args.seed, checkpoint_every=args.checkpoint_every,
                      optimizer=args.optimizer)
    print(out)
    return 0


def _translate_command(args: argparse.Namespace, stdin: TextIO = None, stdout: TextIO = None) -> int:
    from narbench_core.paths import enable_compilation_cache

    enable_compilation_cache()
    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    if args.source_file is not None and not args.source_file.is_file():
        raise UserError(f"source file {args.source_file} not found; pass an existing file or use stdin")
    source = open(args.source_file, encoding="utf-8") if args.source_file else stdin
    try:
        lines = list(source)
    finally:
        if args.source_file:
            source.close()
    if not lines:
        return 0
    for hyp in translate_lines(args.checkpoint, args.decoder, lines, args.batch_size,
                               length_hyps=args.length_hyps, remask=args.remask):
        stdout.write(hyp.replace("\n", " ") + "\n")
    stdout.flush()
    return 0
