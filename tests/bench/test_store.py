"""Results store: atomic files (even under SIGKILL), run folders, resume rules, latest, loaders."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from bench import store as st
from grid_fakes import fake_row
from narbench_core.errors import UserError

HASH = "0123456789abcdef" * 4


def open_(tmp_path, **kw):
    return st.open_run(tmp_path, "suite", HASH, 'name = "suite"\n', "narbench run --suite suite", **kw)


def test_run_id_and_folder_layout(tmp_path):
    now = datetime(2024, 5, 6, 7, 8, 9, tzinfo=timezone.utc)
    assert st.make_run_id(HASH, now) == "20240506T070809Z-01234567"
    run, resumed = open_(tmp_path, now=now)
    assert not resumed and run.path == tmp_path / "suite" / "20240506T070809Z-01234567"
    assert (run.path / "spec.toml").read_text() == 'name = "suite"\n'
    assert run.info["status"] == "running" and run.info["spec_hash"] == HASH
    assert not (tmp_path / "suite" / "latest").exists()


def test_resume_latest_unfinished_and_never_touch_finished(tmp_path):
    first, _ = open_(tmp_path, now=datetime(2024, 1, 1, tzinfo=timezone.utc))
    again, resumed = open_(tmp_path)
    assert resumed and again.path == first.path
    forced, resumed = open_(tmp_path, force=True, now=datetime(2024, 1, 2, tzinfo=timezone.utc))
    assert not resumed and forced.path != first.path
    again, _ = open_(tmp_path)
    assert again.path == forced.path  # the newest unfinished one
    st.finish_run(forced)
    assert (tmp_path / "suite" / "latest").read_text() == forced.run_id + "\n"
    with pytest.raises(UserError, match="finished"):
        forced.save_cells([fake_row("a")], [])
    again, _ = open_(tmp_path)
    assert again.path == first.path  # the older unfinished run resumes; finished runs stay as they are
    st.finish_run(first)
    fresh, resumed = open_(tmp_path, now=datetime(2024, 1, 3, tzinfo=timezone.utc))
    assert not resumed and fresh.path not in (first.path, forced.path)


def test_other_spec_hash_starts_a_new_run(tmp_path):
    a, _ = open_(tmp_path)
    b, resumed = st.open_run(tmp_path, "suite", "f" * 64, "", "cmd")
    assert not resumed and b.path != a.path


def test_save_cells_replaces_by_key(tmp_path):
    run, _ = open_(tmp_path)
    run.save_cells([fake_row("a", bleu=1.0)], [{"system": "a", "test_set": "t", "index": 0}])
    run.save_cells([fake_row("b", bleu=2.0)], [{"system": "b", "test_set": "t", "index": 0}])
    run.save_cells([fake_row("a", bleu=3.0)], [{"system": "a", "test_set": "t", "index": 5}])
    assert sorted((r.system, r.bleu) for r in run.rows()) == [("a", 3.0), ("b", 2.0)]
    assert sorted((s["system"], s["index"]) for s in run.samples()) == [("a", 5), ("b", 0)]
    assert run.done_keys() == {("a", "t"), ("b", "t")}


def test_rows_written_before_a_column_rename_load_under_the_new_name(tmp_path):
    """Rows of schema 2 written before `steps` became `iterations` (refinement iterations T) read as new."""
    run, _ = open_(tmp_path)
    old = {k: v for k, v in dict(fake_row("padir-s4", iterations=4, bleu=1.0)).items() if k != "iterations"}
    (run.path / "rows.jsonl").write_text(json.dumps({**old, "steps": 4}) + "\n")
    (row,) = run.rows()
    assert row.iterations == 4 and "steps" not in row


def test_rows_written_before_truncated_sources_load_without_it(tmp_path):
    """`truncated_sources` (sources cut to the maximum length) is newer than schema 2: older rows read as None."""
    run, _ = open_(tmp_path)
    old = {k: v for k, v in dict(fake_row("ar-greedy", bleu=1.0)).items() if k != "truncated_sources"}
    (run.path / "rows.jsonl").write_text(json.dumps(old) + "\n")
    (row,) = run.rows()
    assert row.truncated_sources is None and row.bleu == 1.0
    run.save_cells([fake_row("padir", truncated_sources=3)], [])
    assert {r.system: r.truncated_sources for r in run.rows()} == {"ar-greedy": None, "padir": 3}


def test_resolve_run_dir_and_loaders(tmp_path):
    run, _ = open_(tmp_path)
    run.save_cells([fake_row("a", bleu=1.5)], [{"system": "a", "test_set": "t", "index": 0}])
    st.finish_run(run)
    for arg in (run.path, tmp_path / "suite", tmp_path / "suite" / "latest"):
        assert st.resolve_run_dir(arg) == run.path
    assert st.load_rows(tmp_path / "suite")["bleu"].tolist() == [1.5]
    assert len(st.load_samples(run.path)) == 1
    with pytest.raises(UserError, match="not a run folder"):
        st.resolve_run_dir(tmp_path / "nothing")


WRITER = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from bench.store import RunStore
from grid_fakes import fake_row
run = RunStore(Path(sys.argv[1]))
i = 0
while True:
    rows = [fake_row(f"s{i}", checkpoint="x" * 20000)]
    samples = [{"system": f"s{i}", "test_set": "t", "index": k, "pad": "y" * 500} for k in range(200)]
    run.save_cells(rows, samples)
    if i == 0:
        print("ready", flush=True)   # the files exist; the kill lands in a later write, however slow the machine
    i += 1
"""


def test_sigkill_at_any_moment_leaves_whole_files(tmp_path):
    run, _ = open_(tmp_path)
    for attempt in range(4):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(run.path), str(Path(__file__).parent)],
                                stdout=subprocess.PIPE,
                                cwd=os.getcwd())
        assert proc.stdout.readline().strip() == b"ready"
        time.sleep(0.15 + 0.1 * attempt)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        for name in (st.ROWS, st.SAMPLES):
            text = (run.path / name).read_text()
            assert text == "" or text.endswith("\n")
            records = [json.loads(line) for line in text.splitlines()]
            if name == st.SAMPLES:
                assert len(records) % 200 == 0  # only whole cells
        # Every row's cell has all its samples (samples are written before rows).
        per_system = {}
        for s in run.samples():
            per_system[s["system"]] = per_system.get(s["system"], 0) + 1
        assert all(per_system.get(r["system"]) == 200 for r in run.rows())
    assert run.rows(), "the writer never finished a cell; the test did not exercise anything"
    resumed, was_resumed = open_(tmp_path)
    assert was_resumed and not list(resumed.path.glob(".*.tmp"))  # killed writes' temp files are removed
