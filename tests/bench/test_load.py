"""The machine's load around timing (bench.measure.load): from the kernel's counters, any process counts, not only
narbench's of the same data root (issue 53: a training under another NARBENCH_DATA, or any other program, loading
the machine during timing was neither warned about nor recorded)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bench.measure import env as benv
from bench.measure import load
from bench.report import tables
from grid_fakes import fake_row
from narbench_core import defaults

linux = pytest.mark.skipif(not os.path.exists(load.STAT), reason="the kernel's counters are Linux's /proc")


def test_share_is_the_arithmetic_of_two_snapshots():
    before = load.Snapshot(total=1000, idle=600, steal=10, ours=100, at=0.0)
    after = load.Snapshot(total=2000, idle=1000, steal=60, ours=400, at=5.0)
    s = load.share(before, after)           # 1000 ticks: 400 idle, 300 ours, so 300 someone else's, 50 stolen
    assert (s["busy"], s["narbench"], s["others"], s["steal"], s["seconds"]) == (0.6, 0.3, 0.3, 0.05, 5.0)
    assert load.share(None, after) is None and load.share(after, after) is None


@linux
def test_a_process_that_is_not_narbench_is_seen_as_others():
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(max(1, (os.cpu_count() or 2) // 2))]
    try:
        busy = load.sample([os.getpid()], 1.0)
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    # half the cores spin at full speed outside the sampled pids: at least a quarter of the capacity is others'
    assert busy["others"] > 0.25 > busy["narbench"]
    assert busy["others"] > defaults.BUSY_SHARE


def test_a_busy_machine_is_one_warning_and_recorded_per_split(capsys):
    calm = {"seconds": 1.0, "busy": 0.02, "narbench": 0.01, "others": 0.01, "steal": 0.0, "load_avg_1m": 0.1}
    hot = {**calm, "busy": 0.9, "others": 0.4, "load_avg_1m": 2.5}
    env = benv.record_load({}, {"split": "t:test", "before": calm, "during": calm}, "suite")
    assert capsys.readouterr().err == ""
    env = benv.record_load(env, {"split": "t:dev", "before": calm, "during": hot}, "suite")
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("narbench: warning: the machine was busy while timing suite on t:dev") and "40%" in line
    env = benv.record_load(env, {"split": "t:test", "before": hot, "during": hot}, "suite")    # the split again
    assert [m["split"] for m in env[benv.LOAD]] == ["t:dev", "t:test"] and env[benv.LOAD][1]["before"] == hot


def test_the_isolation_note_says_when_a_run_was_timed_on_a_busy_machine():
    rows = [fake_row("ar-greedy", "t", interference=1.0, isolated=True, turn=10, others_cpu_share=0.01),
            fake_row("padir", "t", interference=1.0, isolated=True, turn=10, others_cpu_share=0.01)]
    calm = tables.isolation_note(rows)[0]
    assert "at most 1% of the CPU" in calm and "busy machine" not in calm
    rows.append(fake_row("ar-greedy", "dev", interference=1.0, isolated=True, turn=10, others_cpu_share=0.35))
    assert "**Timed on a busy machine:** processes not of this run took 35% of the CPU while dev was timed" in \
        tables.isolation_note(rows)[0]
