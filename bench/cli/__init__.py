"""The ``narbench`` command: a thin dispatcher.

Each command group lives in its own module with a ``register(subparsers)`` function that adds its
sub-commands; each sub-command sets ``func`` (called with the parsed args, returns an exit code).
"""
from __future__ import annotations

import argparse
import sys

from narbench_core.errors import UserError

# Modules that add sub-commands, in the order they appear in --help.
COMMAND_MODULES = (
    "bench.cli.data",     # data prepare|stats|check|export, tasks
    "bench.cli.checkpoints",   # train, translate, export
    "bench.cli.run",      # run, plan, eval, report, results, latency
    "bench.cli.theory",   # theory ising|samplers|attention
)


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = argparse.ArgumentParser(
        prog="narbench",
        description="Benchmark autoregressive vs non-autoregressive (iterative refinement) decoders: "
        "quality, latency (p50/p99) and cost, measured the same way for every decoder.",
    )
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="also show the libraries' own log lines and warnings (TensorFlow, absl, JAX, "
                        "SentencePiece), which are hidden by default")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command. Without ``argv`` this is the ``narbench`` program: its process is made quiet
    (``narbench_core.quiet``) unless ``-v``, before any command imports TensorFlow or JAX. With
    ``argv`` (a caller's own process, e.g. tests) the process is left as it is."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if argv is None and not args.verbose:
        from narbench_core.quiet import quiet_process

        quiet_process()
    try:
        code = args.func(args)
    except UserError as err:
        print(f"narbench: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("narbench: interrupted; finished cells are kept, re-run the same command to resume",
              file=sys.stderr)
        return 130
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
