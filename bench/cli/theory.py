"""``narbench theory ising|samplers|attention``: the paper's theory experiments, one command each.

Each writes ``<results>/theory/<name>/<run_id>/`` (table.md, plots, rows.jsonl, env.json,
config.json) and points ``<results>/theory/<name>/latest`` at it. The logic lives in the ``theory``
package; this module parses flags, finds what a run recorded (``job_from_run``: ``theory`` never
reads the results store), calls it and prints where the page is.
"""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from narbench_core.errors import UserError

if TYPE_CHECKING:
    from theory.attention_model import AttentionJob


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def register(sub) -> None:
    """Add ``theory`` and its three sub-commands to ``sub`` (argparse subparsers)."""
    theory = sub.add_parser("theory", help="theory suites: Ising k-pseudolikelihood, k-Gibbs vs parallel "
                            "sampling, attention-dependency analysis (paper Sections 2.4, 3.1, 3.4)")
    tsub = theory.add_subparsers(dest="theory_command", metavar="EXPERIMENT")
    tsub.required = True

    p = tsub.add_parser("ising", help="masking more is better: k-MPLE parameter error vs training size "
                        "(Figures 1-2)")
    p.add_argument("--n", type=int, default=4, help="variables N = |C_G| (default 4)")
    p.add_argument("--couplings", type=_floats, default=(0.05, 0.3), help="J values (default 0.05,0.3)")
    p.add_argument("--field", type=float, default=0.0, help="h_i (default 0)")
    p.add_argument("--ks", type=_ints, default=(), help="k values (default 1..N)")
    p.add_argument("--sizes", type=_ints, default=(250, 500, 1000, 2000, 4000, 8000, 16000),
                   help="training-set sizes")
    p.add_argument("--reps", type=int, default=10, help="repetitions per cell (default 10)")
    p.add_argument("--masks", choices=("sampled", "all"), default="sampled",
                   help="one random size-k mask per sample (Definition 2, default) or all masks averaged")
    p.add_argument("--tol", type=float, default=1e-6, help="gradient-norm tolerance (convergence check)")
    p.add_argument("--max-steps", type=int, default=3000, help="gradient-descent step cap")
    _common(p)
    p.set_defaults(func=cmd_ising)

    p = tsub.add_parser("samplers", help="k-Gibbs vs independent parallel sampling from the small mode "
                        "(Figure 3)")
    p.add_argument("--n", type=int, default=10, help="variables N (default 10)")
    p.add_argument("--clique", type=int, default=4, help="clique size |C_G| (default 4)")
    p.add_argument("--field", type=float, default=5.0, help="h_i for every vertex (default 5.0)")
    p.add_argument("--couplings", type=_floats, default=(0.5, 1.0, 1.5, 2.0, 3.0, 5.0), help="J values")
    p.add_argument("--ks", type=_ints, default=(1, 2, 3, 4, 6, 8, 10), help="k-Gibbs block sizes")
    p.add_argument("--seeds", type=int, default=10, help="chains per cell (default 10)")
    p.add_argument("--budget", type=int, default=1000, help="step budget per chain (default 1000)")
    _common(p)
    p.set_defaults(func=cmd_samplers)

    p = tsub.add_parser("attention", help="stutter vs non-stutter adjacent pairs: last-layer self- and "
                        "cross-attention statistics of a PaDIR model (Tables 4-5)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--run", help="a `narbench run` folder (or its suite folder): its PaDIR system's checkpoint "
                     "and test sources")
    src.add_argument("--checkpoint", help="a trained PaDIR checkpoint folder")
    p.add_argument("--system", help="with --run: which NAR system (default: the one with the most refinement iterations, then the best BLEU)")
    p.add_argument("--test-set", help="with --run: which test set (default: the first)")
    p.add_argument("--task", help="with --checkpoint: task whose split to decode (default: the checkpoint's)")
    p.add_argument("--split", default="test", help="with --checkpoint: split to decode (default test)")
    p.add_argument("--iterations", "--steps", type=int, dest="iterations",
                   help="refinement iterations T (default: the run's, else 4)")
    p.add_argument("--length-hyps", type=int, help="length hypotheses (default: the run's, else 5)")
    p.add_argument("--remask", help="none|stutter|mask-predict (default: the run's, else stutter)")
    p.add_argument("--max-sentences", type=int, default=300, help="sentences to analyse (default 300)")
    p.add_argument("--batch-size", type=int, default=16)
    _common(p)
    p.set_defaults(func=cmd_attention)


def _common(p) -> None:
    p.add_argument("--seed", type=int, default=0, help="PRNG seed (default 0)")
    p.add_argument("--results-dir", default="results", help="results root (default ./results)")


def _setup() -> None:
    from narbench_core.paths import enable_compilation_cache

    enable_compilation_cache()


def _env(seed: int) -> dict:
    """The run's env.json: the same object as ``narbench run`` writes."""
    from bench.measure.env import capture

    return capture(seeds={"seed": seed})


def cmd_ising(args) -> int:
    from theory import ising, plots, writer

    _setup()
    cfg = ising.IsingConfig(n=args.n, couplings=args.couplings, field=args.field, ks=args.ks,
                            sizes=args.sizes, reps=args.reps, masks=args.masks, tol=args.tol,
                            max_steps=args.max_steps, seed=args.seed)
    rows = ising.run_ising(cfg)
    figures = {f"ising_J{J:g}.png": plots.ising_figure(rows, J) for J in cfg.couplings}
    out = writer.write_run(Path(args.results_dir), "ising", dataclasses.asdict(cfg), rows,
                           ising.markdown_table(rows), figures, _env(cfg.seed))
    print(ising.markdown_table(rows))
    print(f"wrote {out}")
    return 0


def cmd_samplers(args) -> int:
    from theory import plots, samplers, writer

    _setup()
    cfg = samplers.SamplerConfig(n=args.n, clique=args.clique, field=args.field, couplings=args.couplings,
                                 ks=args.ks, seeds=args.seeds, budget=args.budget, seed=args.seed)
    rows = samplers.run_samplers(cfg)
    out = writer.write_run(Path(args.results_dir), "samplers", dataclasses.asdict(cfg), rows,
                           samplers.markdown_table(rows), {"samplers.png": plots.samplers_figure(rows)},
                           _env(cfg.seed))
    print(samplers.markdown_table(rows))
    print(f"wrote {out}")
    return 0


def job_from_run(run_dir: str, system: str | None = None, test_set: str | None = None) -> "AttentionJob":
    """A non-autoregressive system's checkpoint, decoder options and test sources recorded by `narbench run`."""
    from bench.store import RunStore, resolve_run_dir
    from narbench_core import defaults
    from narbench_core.paths import resolve
    from theory.attention_model import AttentionJob

    run = RunStore(resolve_run_dir(run_dir))
    nar = [r for r in run.rows() if r.decoder.startswith("refine:")]          # iterative refinement only
    if system:
        nar = [r for r in nar if r.system == system]
    if test_set:
        nar = [r for r in nar if r.test_set == test_set]
    elif nar:
        nar = [r for r in nar if r.test_set == nar[0].test_set]   # the run's first test set
    if not nar:
        raise UserError(f"{run.path} has no refine:T row{' for ' + system if system else ''}"
                        f"{' on ' + test_set if test_set else ''}; run a suite with a PaDIR system or pass --checkpoint")
    # The most refinement iterations; among those, the best BLEU (e.g. the distilled model), then the first row.
    row = max(nar, key=lambda r: (r.iterations, r.bleu if r.bleu is not None else 0.0))
    picked = sorted((s for s in run.samples() if s["system"] == row.system and s["test_set"] == row.test_set),
                    key=lambda s: s["index"])
    if not picked:
        raise UserError(f"{run.path} has no samples for {row.system} on {row.test_set}; use --checkpoint")
    opts = row.decoder_options
    return AttentionJob(checkpoint=str(resolve(row.checkpoint)), sources=tuple(s["source"] for s in picked),
                        origin=f"run {run.path.name}, system {row.system}, test set {row.test_set}",
                        iterations=row.iterations, length_hyps=opts["length_hyps"], remask=opts["remask"],
                        start=opts.get("start", defaults.START),      # runs before the option existed: the default
                        seed=opts["seed"])


def cmd_attention(args) -> int:
    from theory import attention, attention_model, writer

    _setup()
    if args.max_sentences < 1 or args.batch_size < 1:
        raise UserError("--max-sentences and --batch-size must be >= 1")
    if args.run:
        job = job_from_run(args.run, system=args.system, test_set=args.test_set)
    else:
        job = attention_model.job_from_checkpoint(args.checkpoint, task=args.task, split=args.split)
    job = job.with_overrides(iterations=args.iterations, length_hyps=args.length_hyps, remask=args.remask,
                             max_sentences=args.max_sentences, seed=args.seed)
    stats, info = attention_model.analyse(job, batch_size=args.batch_size)
    rows = [{**info, **r} for r in attention.summarize(stats)]
    page = attention_model.describe(info) + "\n" + attention.markdown_tables(rows)
    out = writer.write_run(Path(args.results_dir), "attention", {**job.config(), "batch_size": args.batch_size},
                           rows, page, {}, _env(args.seed))
    print(page)
    print(f"wrote {out}")
    return 0
