"""The ``narbench`` command is quiet by default: its stderr has no TensorFlow, absl, oneDNN, CUDA or
SentencePiece log line, only narbench's own; ``narbench -v`` shows the libraries' lines again.

Each command runs as the installed ``narbench`` script does (``bench.cli:main`` in a fresh interpreter)
on an empty data root, without the test session's ``TF_CPP_MIN_LOG_LEVEL``.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from suites.spec import builtin_specs

ROOT = Path(__file__).resolve().parents[2]
CONSOLE = "import sys; from bench.cli import main; sys.exit(main())"       # pyproject's [project.scripts]

# Any line a library's logging would print: absl/glog's prefix, SentencePiece's, or the words themselves.
LIBRARY = re.compile(r"^[IWEF]\d{4} |\.cc\(\d+\) LOG\(|absl|InitializeLog|oneDNN|onednn|cuda|CUDA|TensorFlow"
                     r"|tensorflow|Warning:|WARNING")


@pytest.fixture(scope="module")
def narbench(tmp_path_factory):
    root = tmp_path_factory.mktemp("quiet")
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "PYTHONWARNINGS")}
    # An old version of WMT14 de-en "built": `narbench tasks` then imports TensorFlow to ask TFDS about it.
    (root / "tfds" / "wmt14_translate" / "de-en" / "0.0.1").mkdir(parents=True)
    (root / "tfds" / "wmt14_translate" / "de-en" / "0.0.1" / "dataset_info.json").write_text("{}")
    env.update(NARBENCH_DATA=str(root / "data"), PYTHONPATH=str(ROOT), TFDS_DATA_DIR=str(root / "tfds"))

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", CONSOLE, *args], capture_output=True, text=True,
                              cwd=root, env=env, timeout=600)
    run.root = root
    return run


def library_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if LIBRARY.search(line)]


def test_tasks_prints_its_table_and_no_library_line(narbench):
    done = narbench("tasks")                                   # imports TensorFlow (the fixture's WMT)
    assert done.returncode == 0 and "synthetic_d0" in done.stdout
    assert library_lines(done.stderr) == [] and done.stderr == ""


def test_run_help_and_a_bad_spec_print_only_narbench(narbench):
    done = narbench("run", "--suite", "smoke", "--help")
    assert done.returncode == 0 and "--suite" in done.stdout and done.stderr == ""
    listed = " ".join(done.stdout.split()).replace("- ", "-")                  # argparse wraps at hyphens too
    assert all(re.search(rf"[ (]{re.escape(name)}[,)]", listed) for name in builtin_specs())   # every built-in suite

    bad = narbench.root / "bad.toml"
    bad.write_text('name = "bad"\n[[[\n')
    done = narbench("run", "--suite", str(bad))
    assert done.returncode == 2
    assert done.stderr.splitlines() == [done.stderr.strip()]                      # exactly one line
    assert done.stderr.startswith(f"narbench: error: {bad}: malformed TOML") and library_lines(done.stderr) == []


def test_verbose_shows_the_library_lines_again(narbench):
    done = narbench("-v", "tasks")
    assert done.returncode == 0 and "synthetic_d0" in done.stdout
    assert library_lines(done.stderr) != []          # TensorFlow 2.21: absl's pre-init warning, oneDNN, CUDA stub
