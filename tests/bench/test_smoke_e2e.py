"""`narbench run --suite smoke` end to end with the real tasks, trainer, distiller and decoders."""
from __future__ import annotations

import json

import pytest

import models.distill  # noqa: F401  (the real distiller: an import error fails this test, never skips it)
import suites.tasks  # noqa: F401
from bench import store as st
from bench.report import PLOTS
from bench.rows import CORE
from bench.verify import verify_run
from bench.families import load_suite as load_spec


@pytest.mark.slow
def test_smoke_suite_end_to_end(smoke_run):
    code, err, out = smoke_run
    assert code == 0, err
    run_dir = st.resolve_run_dir(out / "smoke")
    for name in ("spec.toml", "env.json", "rows.jsonl", "samples.jsonl.gz", "table.md", "leaderboard.md", *PLOTS):
        assert (run_dir / name).is_file(), name
    assert verify_run(run_dir) == []

    spec = load_spec("smoke")
    rows = st.RunStore(run_dir).rows()
    assert {r["system"] for r in rows} == {"ar-greedy", "ar-beam2", "padir-s1-u0.15-k2", "padir-s2-u0.15-k2",
                                          "padir-s1-u0.15-distill-k2", "padir-s2-u0.15-distill-k2"}
    for row in rows:
        assert {c.name for c in CORE} <= set(row)
        assert row["n_sentences"] == spec.max_test_sentences and row["latency_p50_ms"] > 0
        assert row["bleurt"] is None and row["platform"] == "cpu"
        assert row.checkpoint.startswith("checkpoints/")   # named under the data root: no machine path
        if row.paradigm == "nar":
            assert 1 <= row["passes_mean"] <= row["iterations"]
        # synthetic_d0 knows every valid target of a source (one): exact match is scored, no mode can mix
        assert 0.0 <= row.exact_match <= 1.0 and row.mode_mixing == 0.0
        # each system timed in its own worker process, then alone (the solo check)
        assert row.isolated and row.worker_peak_rss_mb > 0 and row.engine_threads >= 1
        assert row.solo_p50_ms > 0 and row.interference > 0
    env = json.loads((run_dir / "env.json").read_text())
    assert env["platform"] == "cpu" and env["versions"]["jax"]
    assert set(env["workers"]) == {r.system for r in rows}



@pytest.mark.slow
def test_a_copied_data_root_keeps_every_cache_hit_with_the_old_one_gone(smoke_run, tmp_path, monkeypatch, capsys):
    """Checkpoint keys and records held the vocabulary's absolute path (issue 53): a copied or re-mounted data root
    retrained everything, and `translate` refused a checkpoint whose vocabulary sat beside it in the new root."""
    import shutil

    from bench.cli import main
    from narbench_core.paths import data_root

    code, err, out = smoke_run
    assert code == 0, err
    rows = st.RunStore(st.resolve_run_dir(out / "smoke")).rows()
    old = data_root()
    new = tmp_path / "another" / "mount"
    shutil.copytree(old, new, symlinks=True, ignore=shutil.ignore_patterns("jax_cache", "locks", ".narbench.lock"))
    gone = old.with_name(old.name + ".gone")
    old.rename(gone)                                                 # the old root is gone meanwhile
    try:
        monkeypatch.setenv("NARBENCH_DATA", str(new))
        capsys.readouterr()
        assert main(["plan", "--suite", "smoke", "--format", "json"]) == 0
        plan = json.loads(capsys.readouterr().out)
        assert plan["cells"] and {c["state"] for c in plan["cells"]} == {"cached"}           # 0 to train
        assert all(not c["folder"].startswith("/") for c in plan["cells"])
        ar = next(r for r in rows if r.system == "ar-greedy")
        source = tmp_path / "source.txt"
        source.write_text("a b c\n")
        assert main(["translate", "--checkpoint", str(new / ar.checkpoint), "--decoder", "greedy",
                     "--source-file", str(source)]) == 0
        assert len(capsys.readouterr().out.splitlines()) == 1
    finally:
        gone.rename(old)
