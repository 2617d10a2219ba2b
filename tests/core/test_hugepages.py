"""glibc's huge-page tunable for the commands that train (narbench_core.hugepages): the environment a command
starts again with, the user's own setting given back to the processes it starts, and the ``narbench`` program's
training recording what its process started with."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from narbench_core import hugepages
from narbench_core.hugepages import ENV, OFF, TUNABLE, give_back, restart_env

ROOT = Path(__file__).resolve().parents[2]
GLIBC = (2, 36)
needs_glibc = pytest.mark.skipif((hugepages.glibc_version() or (0, 0)) < hugepages.MIN_GLIBC,
                                 reason="the tunable needs glibc 2.35 or later")


@pytest.mark.parametrize("own", [None, "", "glibc.malloc.tcache_count=7"])
def test_the_tunable_is_added_and_the_users_own_setting_comes_back(own):
    user = {"HOME": "/home/u", **({} if own is None else {ENV: own})}
    started = restart_env(user, GLIBC)
    assert started[ENV] == (f"{own}:{TUNABLE}" if own else TUNABLE) and started["HOME"] == "/home/u"
    assert restart_env(started, GLIBC) is None                     # the restarted process never starts again
    assert give_back(started) and started == user                  # ... and its children get the user's own
    assert not give_back(started)


@pytest.mark.parametrize("environ, glibc", [
    ({OFF: "0"}, GLIBC),                                           # switched off
    ({ENV: "glibc.malloc.hugetlb=0"}, GLIBC),                      # the user's own choice
    ({ENV: "glibc.malloc.check=0:glibc.malloc.hugetlb=2"}, GLIBC),
    ({}, (2, 34)),                                                 # a glibc without the tunable
    ({}, None),                                                    # no glibc (macOS, musl)
])
def test_no_restart_where_it_is_off_chosen_or_unknown(environ, glibc):
    assert restart_env(environ, glibc) is None


PROBE = """
import os, subprocess, sys
from narbench_core.hugepages import restart, started_with
restart()
child = "from narbench_core.hugepages import started_with; print(started_with())"
print(started_with(), os.environ.get("GLIBC_TUNABLES"), sep="|")
print(subprocess.run([sys.executable, "-c", child], capture_output=True, text=True).stdout.strip())
"""


@needs_glibc
@pytest.mark.parametrize("own", [None, "glibc.malloc.tcache_count=7"])
def test_restart_starts_the_process_again_with_it_and_its_children_without(own):
    env = {k: v for k, v in os.environ.items() if k not in (ENV, OFF)}
    env["PYTHONPATH"] = str(ROOT)
    if own:
        env[ENV] = own
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    started, now, child = out.stdout.replace("|", "\n").split("\n")[:3]
    assert started == (f"{own}:{TUNABLE}" if own else TUNABLE)     # what glibc read in the restarted process
    assert now == str(own) and child == str(own)                   # given back: its children start as the user's


@needs_glibc
@pytest.mark.slow
def test_narbench_train_runs_with_huge_pages_and_records_it(tmp_path):
    """The ``narbench`` program (``bench.cli:main`` in a fresh interpreter) trains in a process that started with
    the tunable, and the checkpoint's record says so; with NARBENCH_HUGEPAGES=0 it does not restart."""
    env = {k: v for k, v in os.environ.items() if k not in (ENV, OFF)}
    env.update(PYTHONPATH=str(ROOT), NARBENCH_DATA=str(tmp_path / "data"))
    records = []
    for off in (False, True):
        out = tmp_path / f"ckpt-{off}"
        command = [sys.executable, "-c", "import sys; from bench.cli import main; sys.exit(main())", "train",
                   "--task", "synthetic_d0", "--model", "ar", "--preset", "tiny", "--steps", "2", "--quiet",
                   "--out", str(out)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600,
                              env={**env, **({OFF: "0"} if off else {})})
        assert done.returncode == 0, done.stderr
        records.append(json.loads((out / "narbench.json").read_text()))
    assert records[0]["glibc_tunables"] == TUNABLE and records[1]["glibc_tunables"] is None
