"""The run/eval/report/results/latency commands, driven with fake models (bench.runner.real_deps patched)."""
from __future__ import annotations

import io
import gzip
import json

import pandas as pd
import pytest

from bench import store as st
from bench.cli import main
from bench.rows import CORE
from bench.verify import verify_run
from grid_fakes import FakeFactory, fake_deps, fake_spec

SPEC = fake_spec("clitest", test=["test"], ar_decoders=["greedy", "beam:2"], padir_iterations=[1, 2],
                 max_test_sentences=15)


@pytest.fixture
def env(tmp_path, monkeypatch, fixed_peaks):
    """Fake models behind the CLI; returns (spec path, results root, holder of the current factory)."""
    holder = {"factory": FakeFactory()}
    monkeypatch.setattr("bench.runner.real_deps", lambda **_: fake_deps(tmp_path / "ckpt", holder["factory"]))
    spec = tmp_path / "clitest.toml"
    spec.write_text(SPEC)
    return spec, tmp_path / "results", holder


def run_cli(args, capsys):
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_help_everywhere(capsys):
    for cmd in ("run", "eval", "report", "results", "latency"):
        with pytest.raises(SystemExit) as exit_:
            main([cmd, "--help"])
        assert exit_.value.code == 0
        assert "usage: narbench " + cmd in capsys.readouterr().out


def test_run_report_results_end_to_end(env, capsys):
    spec, out, _ = env
    code, stdout, err = run_cli(["run", "--suite", str(spec), "--out", str(out), "--no-progress"], capsys)
    assert code == 0, err
    run_dir = st.resolve_run_dir(out / "clitest")
    assert (out / "clitest" / "latest").read_text().strip() == run_dir.name
    for name in ("spec.toml", "env.json", "rows.jsonl", "samples.jsonl.gz", "table.md", "leaderboard.md",
                 "pareto.png", "latency_cdf.png", "bleu_vs_iterations.png"):
        assert (run_dir / name).is_file(), name
    assert "recomputed from the run's samples: OK" in err
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "finished" and info["command"].startswith("narbench run --suite ")
    assert f"finished {info['finished']}\n" in (run_dir / "leaderboard.md").read_text()   # when, as run.json says
    assert verify_run(run_dir) == []

    code, stdout, _ = run_cli(["results", str(run_dir), "--format", "csv"], capsys)
    df = pd.read_csv(io.StringIO(stdout))
    assert code == 0 and len(df) == 6 and {c.name for c in CORE} <= set(df.columns)
    code, stdout, _ = run_cli(["results", str(out / "clitest"), "--format", "json"], capsys)
    assert len([json.loads(line) for line in stdout.splitlines()]) == 6
    code, stdout, _ = run_cli(["results", str(run_dir), "--format", "md"], capsys)
    assert stdout.startswith("| System | Test set | Family | T | BLEU |") and stdout.count("\n") == 8
    code, _, err = run_cli(["results", str(run_dir), "--test-set", "nope"], capsys)
    assert code == 2 and "no test set 'nope'" in err

    (run_dir / "table.md").unlink()
    code, stdout, _ = run_cli(["report", str(run_dir)], capsys)
    assert code == 0 and (run_dir / "table.md").is_file()

    # A finished run is never modified: the same command starts a new run folder.
    code, _, err = run_cli(["run", "--suite", str(spec), "--out", str(out), "--no-progress"], capsys)
    assert code == 0 and "starting" in err
    assert len([p for p in (out / "clitest").iterdir() if p.is_dir()]) == 2


def test_interrupt_then_resume_via_cli(env, capsys):
    spec, out, holder = env
    holder["factory"] = FakeFactory(interrupt_after_runs=6 + 10)
    code, _, err = run_cli(["run", "--suite", str(spec), "--out", str(out), "--no-progress"], capsys)
    assert code == 130 and "re-run the same command to resume" in err
    run_dir = next(p for p in (out / "clitest").iterdir() if p.is_dir())
    assert st.RunStore(run_dir).rows() == [] and not (out / "clitest" / "latest").exists()
    holder["factory"] = FakeFactory()
    code, _, err = run_cli(["run", "--suite", str(spec), "--out", str(out), "--no-progress"], capsys)
    assert code == 0 and "resuming" in err
    assert [p for p in (out / "clitest").iterdir() if p.is_dir()] == [run_dir]
    assert len(st.RunStore(run_dir).rows()) == 6


def test_force_starts_fresh(env, capsys):
    spec, out, holder = env
    holder["factory"] = FakeFactory(fail_after=0)
    with pytest.raises(RuntimeError):
        main(["run", "--suite", str(spec), "--out", str(out), "--no-progress"])
    holder["factory"] = FakeFactory()
    code, _, err = run_cli(["run", "--suite", str(spec), "--out", str(out), "--no-progress", "--force"], capsys)
    assert code == 0 and "starting" in err
    assert len([p for p in (out / "clitest").iterdir() if p.is_dir()]) == 2


def test_eval_adds_a_test_set(env, capsys, tmp_path):
    spec, out, _ = env
    assert main(["run", "--suite", str(spec), "--out", str(out), "--no-progress"]) == 0
    capsys.readouterr()
    src, ref = tmp_path / "mine.src", tmp_path / "mine.ref"
    src.write_text("alpha beta gamma\ndelta delta\nzeta eta theta iota kappa lambda\n")
    ref.write_text("ALPHA BETA GAMMA\nDELTA DELTA\nZETA ETA THETA IOTA KAPPA LAMBDA\n")
    code, _, err = run_cli(["eval", "--run", str(out / "clitest"), "--source-file", str(src),
                            "--reference-file", str(ref)], capsys)
    assert code == 0, err
    rows = st.RunStore(st.resolve_run_dir(out / "clitest")).rows()
    mine = [r for r in rows if r["test_set"] == "mine"]
    assert len(mine) == 6 and all(r["n_sentences"] == 3 for r in mine)
    assert next(r for r in mine if r["system"] == "ar-beam2")["bleu"] == pytest.approx(100.0)
    assert "mine" in (st.resolve_run_dir(out / "clitest") / "table.md").read_text()
    # Same name again without --force, and mismatched files: one-line errors, exit 2.
    code, _, err = run_cli(["eval", "--run", str(out / "clitest"), "--source-file", str(src),
                            "--reference-file", str(ref)], capsys)
    assert code == 2 and "already has a test set 'mine'" in err
    ref.write_text("ONE\nTWO\n")
    code, _, err = run_cli(["eval", "--run", str(out / "clitest"), "--source-file", str(src),
                            "--reference-file", str(ref), "--name", "other"], capsys)
    assert code == 2 and "has 2 lines but" in err and len(err.strip().splitlines()) == 1


def test_latency_prints_timing_only(env, capsys, tmp_path):
    spec, _, _ = env
    code, stdout, _ = run_cli(["latency", "--suite", str(spec), "--no-progress", "--json",
                               str(tmp_path / "lat.jsonl")], capsys)
    assert code == 0
    assert stdout.startswith("| System | Test set | n | p50 ms | p90 ms | p99 ms |")
    assert "n too small (15 < 459)" in stdout
    rows = [json.loads(line) for line in (tmp_path / "lat.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and all(r["bleu"] is None and r["latency_p50_ms"] > 0 for r in rows)


def test_bad_arguments(env, capsys, tmp_path):
    spec, out, _ = env
    code, _, err = run_cli(["run", "--suite", str(spec), "--out", str(out), "--batch-size", "0"], capsys)
    assert code == 2 and "--batch-size must be >= 1" in err
    code, _, err = run_cli(["report", str(tmp_path / "nowhere")], capsys)
    assert code == 2 and "is not a run folder" in err


def test_latency_map_options(env, capsys, tmp_path, monkeypatch):
    """--map builds its MapSpec from the options (defaults from MapSpec) and records the command line;
    map options without --map, or suite options with it, are one-line errors."""
    seen = {}

    def fake_run_map(spec, out_root, command, **kw):
        seen.update(spec=spec, out=out_root, command=command, cost_model=kw.get("cost_model"))
        return out_root / "speedmap" / "r"

    monkeypatch.setattr("bench.latency_map.run_map", fake_run_map)
    code, stdout, _ = run_cli(["latency", "--map", "--sizes", "tiny", "--lengths", "8", "16", "--calibrate", "tiny",
                               "--no-progress", "--out", str(tmp_path)], capsys)
    assert code == 0 and "speedmap.md" in stdout
    assert seen["spec"].sizes == ("tiny",) and seen["spec"].lengths == (8, 16)
    assert seen["spec"].batches == (1, 8, 32) and seen["spec"].length_hyps == (1, 5)
    assert "--map --sizes tiny --lengths 8 16 --calibrate tiny" in seen["command"]
    # The options' former names still work.
    code, _, _ = run_cli(["latency", "--map", "--sizes", "tiny", "--calibrate", "tiny", "--hyps", "3", "--steps", "2",
                          "--no-progress", "--out", str(tmp_path)], capsys)
    assert code == 0 and (seen["spec"].length_hyps, seen["spec"].iterations) == ((3,), (2,))
    code, _, err = run_cli(["latency", "--lengths", "8"], capsys)
    assert code == 2 and "--lengths only apply to the latency map; add --map" in err
    code, _, err = run_cli(["latency", "--map", "--batch-size", "4"], capsys)
    assert code == 2 and "do not apply to --map" in err
    code, _, err = run_cli(["latency", "--map", "--sizes", "tiny"], capsys)
    assert code == 2 and "calibration sizes ['small'] are not among" in err
    # Scored by another map's model: this map fits nothing.
    (tmp_path / "model.json").write_text(json.dumps({"coef": [0.0, 0.0, 0.0, 1.0], "calibrated_on": ["small"],
                                                     "cells_fitted": 9}))
    code, _, _ = run_cli(["latency", "--map", "--sizes", "paper", "--cost-model", str(tmp_path / "model.json"),
                          "--no-progress", "--out", str(tmp_path)], capsys)
    assert code == 0 and seen["spec"].calibrate == () and "--cost-model" in seen["command"]
    code, _, err = run_cli(["latency", "--map", "--sizes", "paper", "--calibrate", "paper", "--cost-model",
                            str(tmp_path / "model.json")], capsys)
    assert code == 2 and "drop --calibrate" in err
    # --no-cost-model: no calibration, no rates (the GPU script's maps).
    code, _, _ = run_cli(["latency", "--map", "--sizes", "paper", "--no-cost-model", "--no-progress", "--out",
                          str(tmp_path)], capsys)
    assert code == 0 and seen["spec"].calibrate == () and seen["cost_model"] is False
    assert "--no-cost-model" in seen["command"]
    code, _, err = run_cli(["latency", "--map", "--sizes", "paper", "--no-cost-model", "--calibrate", "paper"], capsys)
    assert code == 2 and "--no-cost-model fits no model; drop --calibrate" in err
    code, _, err = run_cli(["latency", "--map", "--no-cost-model", "--cost-model", str(tmp_path / "model.json")],
                           capsys)
    assert code == 2 and "contradict" in err


def test_a_second_run_of_a_folder_another_process_holds_is_refused_with_one_line(env, capsys, second_process):
    """Two `narbench run --out X` at once: the second names the first (host, pid, since when) and exits 2."""
    from bench.families import load_suite

    spec, out, _ = env
    suite = load_suite(spec)
    run, _ = st.open_run(out, suite.name, suite.spec_hash(), suite.to_toml, "narbench run")
    run.release()
    other = second_process("hold", run.path)
    code, _, err = run_cli(["run", "--suite", str(spec), "--out", str(out), "--no-progress"], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"narbench: error: {run.path} is in use by narbench pid {other.pid} on ")
    assert " since " in lines[0] and st.RunStore(run.path).rows() == []
    code, _, err = run_cli(["report", str(run.path)], capsys)             # nor may another command write it
    assert code == 2 and f"pid {other.pid}" in err
    other.stop()
    code, _, err = run_cli(["run", "--suite", str(spec), "--out", str(out), "--no-progress"], capsys)
    assert code == 0 and "resuming" in err
    assert [p for p in (out / "clitest").iterdir() if p.is_dir()] == [run.path]


def test_a_run_killed_before_its_report_is_finished_by_the_same_command(env, capsys, monkeypatch):
    spec, out, _ = env

    def killed(run_dir, finished=None):
        raise KeyboardInterrupt
    monkeypatch.setattr("bench.report.write_report", killed)
    code, _, _ = run_cli(["run", "--suite", str(spec), "--out", str(out), "--no-progress"], capsys)
    (run_dir,) = [p for p in (out / "clitest").iterdir() if p.is_dir()]
    assert code == 130 and len(st.RunStore(run_dir).rows()) == 6
    assert st.RunStore(run_dir).info["status"] == "running" and not (out / "clitest" / "latest").exists()
    monkeypatch.undo()
    code, _, err = run_cli(["run", "--suite", str(spec), "--out", str(out), "--no-progress"], capsys)
    assert code == 0 and "resuming" in err
    assert [p for p in (out / "clitest").iterdir() if p.is_dir()] == [run_dir]    # no new run
    assert (run_dir / "leaderboard.md").is_file() and st.RunStore(run_dir).finished
    assert (out / "clitest" / "latest").read_text().strip() == run_dir.name


def test_a_cut_off_last_sample_line_is_timed_again_by_the_same_command(env, capsys):
    spec, out, _ = env
    assert main(["run", "--suite", str(spec), "--out", str(out), "--no-progress"]) == 0
    run_dir = st.resolve_run_dir(out / "clitest")
    packed = (run_dir / st.SAMPLES).read_bytes()
    (run_dir / st.SAMPLES).write_bytes(packed[:-40])                  # a gzip cut off (mid-line, in its content)
    data = gzip.decompress(packed)
    last = json.loads(data.splitlines()[-1])
    capsys.readouterr()
    code, _, err = run_cli(["report", str(run_dir)], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "re-run `narbench run --suite" in lines[0]
    assert "delete" not in lines[0]
    code, _, err = run_cli(["run", "--suite", str(spec), "--out", str(out), "--no-progress"], capsys)
    assert code == 0 and "resuming" in err and "recomputed from the run's samples: OK" in err
    assert [p for p in (out / "clitest").iterdir() if p.is_dir()] == [run_dir]
    run = st.RunStore(run_dir)
    assert len(run.rows()) == 6 and len(run.samples()) == 6 * 15 and run.finished
    assert any(s["system"] == last["system"] and s["index"] == last["index"] for s in run.samples())
