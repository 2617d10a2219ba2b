"""The ``narbench`` command: a thin dispatcher.

Each command group lives in its own module with a ``register(subparsers)`` function that adds its
sub-commands; each sub-command sets ``func`` (called with the parsed args, returns an exit code).
"""
from __future__ import annotations

import argparse
import os
import sys

# TensorFlow (behind seqio) logs CUDA probing at import; keep the CLI's output for the user.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from narbench_core.errors import UserError

# Modules that add sub-commands, in the order they appear in --help.
COMMAND_MODULES = (
    "bench.cli.data",     # data prepare|stats|check|export, tasks
    "bench.cli.checkpoints",   # train, translate, export
    "bench.cli.run",      # run, eval, report, results, latency
    "bench.cli.theory",   # theory ising|samplers|attention
)


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = argparse.ArgumentParser(
        prog="narbench",
        description="Benchmark autoregressive vs non-autoregressive (iterative refinement) decoders: "
        "quality, latency (p50/p99) and cost, measured the same way for every decoder.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
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
