"""scripts/gpu-map.sh, the GPU page's one command: its steps are narbench commands the CLI accepts, in order of
value (paper at batch 1 and 32 first), each a map without a cost model under the one output folder."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from bench.cli import build_parser

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu-map.sh"


def steps(out: Path, **env) -> list[list[str]]:
    done = subprocess.run(["bash", str(SCRIPT), str(out), "600"], capture_output=True, text=True, check=True,
                          env={**os.environ, "DRY_RUN": "1", **env})
    return [shlex.split(line) for line in done.stdout.splitlines() if line.startswith("latency --map")]


@pytest.mark.parametrize("rehearse", ["0", "1"])
def test_every_step_is_a_latency_map_the_cli_accepts(tmp_path, rehearse):
    commands = steps(tmp_path, REHEARSE=rehearse)
    assert len(commands) == 3
    parsed = [build_parser().parse_args(c) for c in commands]
    for args in parsed:
        assert args.map and args.no_cost_model and args.calibrate is None and args.no_progress
        assert Path(args.out) == tmp_path.resolve() / "results"
    if rehearse == "0":
        assert [(a.sizes, a.batches) for a in parsed] == [(["paper"], [1, 32]), (["small"], [1, 8, 32]),
                                                          (["paper"], [8])]
        assert all(a.lengths == [16, 32, 64, 128, 256] and a.iterations == [1, 2, 4, 10] and a.length_hyps == [1, 5]
                   for a in parsed)
    else:
        assert {tuple(a.sizes) for a in parsed} == {("tiny",)}


def test_the_script_is_valid_bash():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0


def test_resume_goes_to_step_one_only(tmp_path):
    """RESUME (a committed, unfinished step-1 map) is handed to step 1 as --resume-from; the others start anew."""
    run = tmp_path / "committed-run"
    run.mkdir()
    commands = steps(tmp_path / "out", RESUME=str(run))
    parsed = [build_parser().parse_args(c) for c in commands]
    assert [a.resume_from for a in parsed] == [str(run.resolve()), None, None]


def test_an_interpreter_without_jax_is_refused_in_one_line(tmp_path):
    """Before the device is recorded or anything timed: one line naming PYTHON, exit 2, no map folder."""
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')     # no site-packages: no JAX
    fake.chmod(0o755)
    done = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out"), "600"], capture_output=True, text=True,
                          env={**os.environ, "PYTHON": str(fake)})
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "PYTHON=" in done.stderr
    assert not (tmp_path / "out" / "device.json").exists() and not any((tmp_path / "out" / "results").iterdir())
