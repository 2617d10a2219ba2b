"""Results store: atomic files (even under SIGKILL), run folders, resume rules, latest, loaders."""
from __future__ import annotations

import gzip
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


def finish(run):
    """What `narbench run` does at the end: the report is written, then the run is marked finished."""
    (run.path / st.REPORT).write_text("# report\n")
    st.finish_run(run)


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
    finish(forced)
    assert (tmp_path / "suite" / "latest").read_text() == forced.run_id + "\n"
    with pytest.raises(UserError, match="finished"):
        forced.save_cells([fake_row("a")], [])
    again, _ = open_(tmp_path)
    assert again.path == first.path  # the older unfinished run resumes; finished runs stay as they are
    finish(first)
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


def test_rows_from_before_sacrebleus_tests_load_without_narbenchs_own_bootstrap(tmp_path):
    """Rows written when narbench ran its own paired bootstrap (``bleu_delta_ci``, ``bleu_delta_p_value``)
    load without those columns and with sacrebleu's tests' columns empty (the report fills them)."""
    run, _ = open_(tmp_path)
    tests = ("bleu_p_ar", "bleu_p_bs", "bleu_bs_mean", "bleu_bs_ci", "bleu_ar_signature", "bleu_bs_signature")
    old = {k: v for k, v in dict(fake_row("a", bleu=20.0, bleu_delta_vs_ar=-1.5)).items() if k not in tests}
    (run.path / "rows.jsonl").write_text(json.dumps({**old, "bleu_delta_ci": [-2.0, -1.0],
                                                     "bleu_delta_p_value": 0.001}) + "\n")
    (row,) = run.rows()
    assert row.bleu_delta_vs_ar == -1.5 and all(row[name] is None for name in tests)
    assert "bleu_delta_ci" not in row and "bleu_delta_p_value" not in row
    assert "bleu_delta_p_value" not in st.load_rows(run.path).columns


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
            raw = (run.path / name).read_bytes() if (run.path / name).is_file() else b""
            text = (gzip.decompress(raw) if name.endswith(".gz") and raw else raw).decode()
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


def test_a_run_folder_another_process_holds_is_refused_and_its_temp_files_kept(tmp_path, second_process):
    """Two `narbench run --out X` at once: the second gets one line naming the first instead of resuming
    its folder and deleting its in-flight temp files."""
    from narbench_core import lock

    run, _ = open_(tmp_path)
    run.release()
    other = second_process("hold", run.path)
    inflight = run.path / ".rows.jsonl.abc123.tmp"        # the other process's write, not yet renamed
    inflight.write_text("{}")
    with pytest.raises(lock.Locked) as err:
        open_(tmp_path)
    assert f"pid {other.pid} on " in str(err.value) and "\n" not in str(err.value)
    assert inflight.exists()
    assert len(list((tmp_path / "suite").iterdir())) == 1           # and no second folder either
    other.stop()
    again, resumed = open_(tmp_path)
    assert resumed and again.path == run.path and not inflight.exists()   # now stale: removed


def test_a_run_folder_whose_holder_was_killed_resumes(tmp_path, second_process):
    from narbench_core import lock

    run, _ = open_(tmp_path)
    run.release()
    dead = second_process("die", run.path)
    assert lock.read_holder(run.path).pid == dead.pid
    again, resumed = open_(tmp_path)
    assert resumed and again.path == run.path and lock.read_holder(run.path).pid == os.getpid()
    again.release()
    assert lock.read_holder(run.path) is None


@pytest.mark.parametrize("name", ["..", ".", "", ".hidden", "a/b", "../x"])
def test_a_suite_name_that_is_not_a_plain_name_is_refused(tmp_path, name):
    with pytest.raises(UserError, match="is not a plain name: use letters, digits, _ . - and do not start with a dot"):
        st.open_run(tmp_path / "out", name, HASH, "", "cmd")
    assert not tmp_path.joinpath("out").exists() and [p.name for p in tmp_path.iterdir()] == []


@pytest.mark.parametrize("kind", ["gzip", "gzip cut off", "plain"])
def test_a_cut_off_last_line_is_dropped_on_resume_and_its_cell_computed_again(tmp_path, kind):
    """The last line cut inside its last character: in the gzip's content, in a gzip file itself cut off (its
    readable content ends there), and in an older run's plain samples.jsonl."""
    run, _ = open_(tmp_path)
    samples = lambda system, n: [{"system": system, "test_set": "t", "index": i, "hypothesis": "é" * 5}  # noqa: E731
                                 for i in range(n)]
    run.save_cells([fake_row("a", n_sentences=3)], samples("a", 3))
    run.save_cells([fake_row("b", n_sentences=3)], samples("b", 3))
    (run.path / st.REPORT).write_text("# report\n")
    st.finish_run(run)
    run.release()
    content = gzip.decompress((run.path / st.SAMPLES).read_bytes())
    if kind == "gzip":
        (run.path / st.SAMPLES).write_bytes(gzip.compress(content[:-9], mtime=0))
    elif kind == "gzip cut off":                  # a stored (uncompressed) block, cut: its content is the prefix
        whole = gzip.compress(content, compresslevel=0, mtime=0)
        (run.path / st.SAMPLES).write_bytes(whole[:len(whole) - 8 - 9])   # no trailer, 9 bytes of content less
    else:
        (run.path / st.SAMPLES).unlink()
        (run.path / st.PLAIN_SAMPLES).write_bytes(content[:-9])     # cut inside the last line, mid-character
    with pytest.raises(UserError) as err:
        run.samples()
    text = str(err.value)
    assert "cut off" in text and "re-run `narbench run --suite suite`" in text and "delete" not in text
    again, resumed = open_(tmp_path)
    assert resumed and again.path == run.path and again.info["status"] == "running"
    assert [r.system for r in again.rows()] == ["a"]                 # b lost a sample: its cell is redone
    assert [(s["system"], s["index"]) for s in again.samples()] == [("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1)]
    assert again.done_keys() == {("a", "t")}
    assert again.samples_name == (st.PLAIN_SAMPLES if kind == "plain" else st.SAMPLES)
    again.save_cells([fake_row("b", n_sentences=3)], samples("b", 3))   # the resumed run writes gzip from now on
    assert again.samples_name == st.SAMPLES and not (again.path / st.PLAIN_SAMPLES).exists()
    assert gzip.decompress((again.path / st.SAMPLES).read_bytes()) == content


def test_samples_are_gzip_reproducible_and_read_by_pandas(tmp_path):
    """samples.jsonl.gz: the same records give the same bytes (no name, time 0 in the header), pandas reads it by
    its suffix, and an older run's plain samples.jsonl reads alike."""
    import pandas as pd

    run, _ = open_(tmp_path)
    samples = [{"system": "a", "test_set": "t", "index": i, "hypothesis": f"h{i} ü"} for i in range(50)]
    run.save_cells([fake_row("a", n_sentences=50)], samples)
    first = (run.path / st.SAMPLES).read_bytes()
    assert first[:2] == b"\x1f\x8b" and first[4:8] == b"\x00\x00\x00\x00"        # gzip, mtime 0
    run.save_cells([fake_row("a", n_sentences=50)], samples)
    assert (run.path / st.SAMPLES).read_bytes() == first
    frame = pd.read_json(run.path / st.SAMPLES, lines=True)
    assert list(frame["hypothesis"]) == [s["hypothesis"] for s in samples]
    assert st.load_samples(run.path).equals(pd.DataFrame(samples))
    (run.path / st.PLAIN_SAMPLES).write_bytes(gzip.decompress(first))
    (run.path / st.SAMPLES).unlink()
    assert run.samples_name == st.PLAIN_SAMPLES and run.samples() == samples


@pytest.mark.parametrize("damage", [
    lambda data: os.urandom(4096),                                   # not ours at all (random bytes, no newline)
    lambda data: data + b"\x00garbage",                              # a damaged tail that is no record's start
])
def test_a_damaged_rows_file_is_not_valid_json_not_a_line_cut_off(tmp_path, damage):
    """Random bytes in rows.jsonl said "its last line was cut off mid-write" (issue 53): only a record's start after
    whole JSON lines is a cut-off line; anything else is named as not valid JSON, with its line."""
    run, _ = open_(tmp_path)
    run.save_cells([fake_row("a", n_sentences=3)], [{"system": "a", "test_set": "t", "index": i, "hypothesis": "x"}
                                                    for i in range(3)])
    path = run.path / st.ROWS
    path.write_bytes(damage(path.read_bytes()))
    assert st.torn_tail(path) is None
    with pytest.raises(UserError, match=r"rows.jsonl:\d+: not valid JSON") as err:
        run.rows()
    assert "cut off" not in str(err.value)


def test_a_finished_run_without_its_report_resumes_to_write_it(tmp_path):
    run, _ = open_(tmp_path)
    st.finish_run(run)                    # killed before the report was written (narbench before issue 35)
    again, resumed = open_(tmp_path)
    assert resumed and again.path == run.path
    finish(again)
    fresh, resumed = open_(tmp_path)
    assert not resumed and fresh.path != run.path                    # a whole finished run is never reopened


def test_own_data_paths_in_the_run_folder_spec_are_relative_to_it(tmp_path):
    import tomllib

    from bench.families import all_families
    from suites.spec import load_spec, parse_spec

    sections = {f.name: f for f in all_families()}

    data = tmp_path / "project" / "data"
    data.mkdir(parents=True)
    for split in ("train", "dev", "test"):
        (data / f"{split}.tsv").write_text("ein Haus\ta house\nzwei Hunde\ttwo dogs\n")
    (data / "test.de").write_text("ein Haus\n")
    (data / "test.en").write_text("a house\n")
    spec_file = tmp_path / "project" / "suite.toml"
    spec_file.write_text('name = "own"\n[[tasks]]\nname = "own_de_en"\nsource_lang = "de"\ntarget_lang = "en"\n'
                         'files = { train = "data/train.tsv", dev = "data/dev.tsv", test = ["data/test.de", '
                         '"data/test.en"] }\ntest = ["test"]\n[model]\npreset = "tiny"\n'
                         + "".join(f"[train.{f}]\nsteps = 2\nbatch_tokens = 64\nlearning_rate = 1e-3\nwarmup_steps = 1\n"
                                   for f in ("ar",)))
    spec = load_spec(spec_file, sections)
    run, _ = st.open_run(tmp_path / "project" / "results", spec.name, spec.spec_hash(), spec.to_toml, "cmd")
    text = run.spec_text()
    assert str(tmp_path) not in text and '"../../../data/train.tsv"' in text
    again = parse_spec(tomllib.loads(text), str(run.path / st.SPEC), sections, base_dir=run.path)
    assert again.spec_hash() == spec.spec_hash() and again.tasks == spec.tasks


def test_a_row_pickles_whole(tmp_path):
    """A Ray timing node sends its rows to the driver pickled: a row comes back equal, still immutable."""
    import pickle

    row = fake_row("ar-greedy", bleu=12.5)
    back = pickle.loads(pickle.dumps(row))
    assert dict(back) == dict(row) and back.bleu == 12.5 and back.key == ("ar-greedy", "t")
    with pytest.raises(AttributeError):
        back.bleu = 1.0
