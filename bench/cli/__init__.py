"""The ``narbench`` command: a thin dispatcher.

Each command group lives in its own module with a ``register(subparsers)`` function that adds its
sub-commands; each sub-command sets ``func`` (called with the parsed args, returns an exit code).
A ``UserError`` is printed as its one line (exit 2); so is an ``OSError`` that the user's files or disk
cause wherever it arises (``os_error_line``: no permission, a file where a folder should be or the
reverse, a full disk), naming the path. Any other exception keeps its traceback.
"""
from __future__ import annotations

import argparse
import errno
import os
import sys
from pathlib import Path

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
    parser.add_argument("--pack", action="append", default=[], metavar="DIR",
                        help="read a task from this pack (`narbench data pack`) instead of its seqio task: training, "
                        "distillation and timing then import no TensorFlow (repeatable; also NARBENCH_PACKS, "
                        "folders separated by ':')")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def _file_on_the_way(path: Path) -> Path:
    """The first part of ``path`` that exists and is not a folder (``path`` itself if none is)."""
    for part in [*reversed(path.parents), path]:
        if os.path.exists(part) and not os.path.isdir(part):      # os.path: False, not an error, if unreadable
            return part
    return path


def os_error_line(err: OSError) -> str | None:
    """The one line (what is wrong with which path, and the fix) for an ``OSError`` the user's files or
    disk cause; None for any other (a bug: it keeps its traceback)."""
    if not isinstance(err.filename, (str, bytes, os.PathLike)):     # no path to name (or a descriptor)
        if err.errno in (errno.ENOSPC, errno.EDQUOT):               # a write into an open file: no name
            return (f"no space left on the device ({err.strerror or 'disk full'}); free some space (`df -h`) and "
                    "re-run the same command (finished work is kept)")
        return None
    path = Path(os.fsdecode(err.filename))
    if err.errno == errno.EEXIST and os.path.lexists(path) and not os.path.isdir(path):
        return f"{path} is a file, not a folder; move it or choose another path"
    if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        what = f"cannot use {path}" if os.path.exists(path) else f"cannot write in {path.parent}"   # new: its folder
        return f"{what}: {err.strerror}; make it writable (and readable) or choose another location"
    if err.errno == errno.ENOTDIR:
        return f"{_file_on_the_way(path)} is a file, not a folder; move it or choose another path"
    if err.errno == errno.EISDIR:
        return f"{path} is a folder, not a file; pass a file"
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return (f"no space left for {path} ({err.strerror}); free some space and re-run the same command "
                "(finished work is kept)")
    return None


def main(argv: list[str] | None = None) -> int:
    """Run one command. Without ``argv`` this is the ``narbench`` program: a command that trains starts
    itself again with glibc's huge-page tunable (``narbench_core.hugepages``), and the process is made quiet
    (``narbench_core.quiet``) unless ``-v``, before any command imports TensorFlow or JAX. With ``argv`` (a
    caller's own process, e.g. tests) the process is left as it is."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if argv is None and getattr(args, "trains", False):      # huge pages for the train step's buffers (may exec)
        from narbench_core.hugepages import restart

        restart()
    if argv is None and not args.verbose:
        from narbench_core.quiet import quiet_process

        quiet_process()
    try:
        if args.pack:
            from suites.catalog import use_packs

            use_packs(args.pack)
        code = args.func(args)
    except UserError as err:
        print(f"narbench: error: {err}", file=sys.stderr)
        return err.exit_code
    except BrokenPipeError:              # the reader of stdout left (`narbench tasks | head -3`): not an error,
        _drop_stdout()                   # but a verdict the command reached before it printed keeps its exit
        return int(getattr(args, "exit_on_closed_pipe", 0))
    except OSError as err:
        line = os_error_line(err)
        if line is None:
            raise
        print(f"narbench: error: {line}", file=sys.stderr)
        return UserError.exit_code
    except KeyboardInterrupt:
        print("narbench: interrupted; finished cells are kept, re-run the same command to resume",
              file=sys.stderr)
        return 130
    return int(code or 0)


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's final flush does not fail again."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):     # no real stdout (a test's capture): nothing to flush
        pass


if __name__ == "__main__":
    sys.exit(main())
