"""The ONNX Runtime family: it picks [padir]'s systems, runs their models (nothing more to train), and its
rows name the runtime, the quantization and the threads, and how often they reproduce their JAX system."""
from __future__ import annotations

import re

import pytest

from bench import report, store as st
from bench.cli import main
from bench.families import load_suite
from bench.plan import expand
from bench.report.names import display_names
from bench.runner import Runner
from bench.verify import verify_run
from grid_fakes import fake_deps, fake_spec
from narbench_core.errors import UserError

pytestmark = pytest.mark.usefixtures("fixed_peaks")     # tests/bench/conftest.py

SPEC = fake_spec("orttest", test=["test"], ar_decoders=["greedy"], padir_iterations=[1, 4], max_test_sentences=12,
                 length_hyps=[1, 3]) + ('\n[ort]\niterations = [4]\ndistill = [true]\nquantization = ["float32", "int8"]\n'
                                        "threads = [1, 2]\n")


def _spec(tmp_path, text=SPEC):
    path = tmp_path / "orttest.toml"
    path.write_text(text)
    return load_suite(path)


def test_the_section_picks_padir_systems_and_trains_nothing_more(tmp_path):
    plan = expand(_spec(tmp_path))
    padir = {s.name: s for s in plan.systems if s.family == "padir"}
    ours = [s for s in plan.systems if s.family == "ort"]
    picked = sorted(n for n, s in padir.items() if dict(s.info)["iterations"] == 4 and s.cell.teacher is not None)
    assert len(picked) == 2 and len(ours) == 2 * 2 * 2                        # k = 1, 3 x quantization x threads
    assert {s.cell for s in ours} <= {s.cell for s in padir.values()}       # the PaDIR models, no new cell
    for s in ours:
        info, options = dict(s.info), dict(s.options)
        source = padir[info["reproduces"]]
        assert s.name == (f"{source.name}-ort-{options['quantization']}-t{options['threads']}")
        assert s.decoder == source.decoder and s.cell == source.cell and s.baseline == "ar-greedy"
        assert {k: v for k, v in options.items() if k not in ("quantization", "threads", "spinning")} == dict(source.options)
        assert options.get("spinning", True) is (options["threads"] == 1)       # a pool of several: no spinning
        assert info["variant"] != dict(source.info)["variant"]                # its own line in T plots


@pytest.mark.parametrize("section, message", [
    ('quantization = ["int4"]', r"ort\.quantization.*one of float32, int8"),
    ("exclude = [{unmask_rate = 0.3}]", r"ort\.exclude: 'unmask_rate' cannot be excluded here; use iterations or "
                                        "length_hyps"),
    ("exclude = [{iterations = 0}]", r"ort\.exclude: iterations = 0: expected a positive integer"),
    ("threads = [-1]", r"ort\.threads"),
    ("runtime = 1", r"ort\.runtime: unknown key \(known keys here: distill, exclude, iterations"),
])
def test_a_bad_section_is_one_line(tmp_path, section, message):
    with pytest.raises(UserError, match=message):
        _spec(tmp_path, fake_spec("orttest", test=["test"], ar_decoders=["greedy"], padir_iterations=[1],
                                  max_test_sentences=5) + f"\n[ort]\n{section}\n")


def test_rows_name_runtime_quantization_threads_and_agreement(tmp_path):
    """Through the runner with fake decoders (the fake translates by decoder spec, so an ORT system says
    what its JAX system says): the rows, the names tables show, and the report."""
    spec = _spec(tmp_path)
    run, _ = st.open_run(tmp_path / "results", spec.name, spec.spec_hash(), spec.to_toml(), "narbench run")
    Runner(spec, fake_deps(tmp_path / "ckpt"), run, progress=False).run()
    rows = {r.system: r for r in run.rows()}
    ours = [r for r in rows.values() if r.family == "ort"]
    assert len(ours) == 8 and all(r.paradigm == "nar" and r.reproduced_agreement == 1.0 for r in ours)
    assert all(r.reproduced_agreement is None for r in rows.values() if r.family != "ort")
    assert {r.quantization for r in ours} == {"float32", "int8"}
    assert verify_run(run.path) == []
    shown = display_names(list(rows.values()))
    name = next(n for n, r in rows.items() if r.family == "ort" and r.quantization == "int8" and r.length_hyps == 1
                and "-t1" in n)
    assert shown[name] == "PaDIR ORT T=4 k=1, distilled, int8, 1 thread"
    report.write_report(run.path)
    assert shown[name] in (run.path / "leaderboard.md").read_text()


def test_plan_lists_the_default_suites_runtime_systems(tmp_path, monkeypatch, capsys):
    """README's main job times the distilled PaDIR systems on ONNX Runtime too (k = 1, and k = 5 at T = 4: its
    exclude), on one thread; `anchors` all of them on two threads as well, with the pool's spinning off."""
    monkeypatch.setenv("NARBENCH_DATA", str(tmp_path / "data"))
    assert main(["plan", "--results", str(tmp_path / "results")]) == 0
    out = capsys.readouterr().out
    assert "PaDIR ORT 10" in out
    for t in (1, 2, 4, 10):
        for q in ("float32", "int8"):
            assert re.search(rf"padir-s{t}-distill-k1-lb1-init-ar-glat-lenoff-ort-{q}[,\n]", out)
            assert (f"padir-s{t}-distill-lb1-init-ar-glat-lenoff-ort-{q}" in out) is (t == 4)     # k = 5: T = 4 only
    anchors = {s.name: dict(s.options) for s in expand(load_suite("anchors")).systems if s.family == "ort"}
    assert len(anchors) == 24
    assert anchors["padir-s4-distill-lb1-init-ar-glat-lenoff-ort-int8-t2"]["spinning"] is False      # k = 5
    assert "spinning" not in anchors["padir-s4-distill-lb1-init-ar-glat-lenoff-ort-int8-t1"]
    assert not [s for s in expand(load_suite("grid-de-en")).systems if s.family == "ort"]


def test_a_missing_runtime_stops_a_run_before_it_trains(tmp_path, monkeypatch, capsys):
    import sys

    path = tmp_path / "orttest.toml"
    path.write_text(SPEC)
    monkeypatch.setitem(sys.modules, "onnxruntime", None)                    # import now raises ImportError
    assert main(["run", "--suite", str(path), "--out", str(tmp_path / "results")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        'narbench: error: ONNX Runtime is not installed; install the extra: pip install -e ".[ort]"']
    assert not (tmp_path / "results").exists()
