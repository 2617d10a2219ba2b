"""The size axis (issue 52): a suite with several model presets trains, times and reports each size, and the scale
page shows the AR-NAR gap against the parameter count."""
from __future__ import annotations

import json

import pytest

from bench import store as st
from bench.families import load_suite as load_spec
from bench.plan import expand
from bench.report import write_report
from bench.report.names import display_names
from bench.report.scale import SCALE_PAGE, SCALE_PLOT, Point, points, trends
from bench.report.grid import Effect
from bench.runner import Runner
from grid_fakes import FAKE_PARAMS, fake_deps, fake_spec

pytestmark = pytest.mark.usefixtures("fixed_peaks")     # tests/bench/conftest.py

SPEC = fake_spec("sizetest", test=["test", "test+refs"], ar_decoders=["greedy", "beam:3"], padir_iterations=[1, 4],
                 max_test_sentences=20, length_hyps=[3])


def new_store(tmp_path, spec):
    return st.open_run(tmp_path / "results", spec.name, spec.spec_hash(), spec.to_toml(), "narbench run")[0]


def test_a_size_axis_trains_every_model_at_each_size_and_pairs_each_size_with_its_own_ar(tmp_path):
    """Several presets: every cell once per size (each distilled cell's teacher is its own size's AR model), system
    ids end in the size, each size's speedups and BLEU differences are against its own AR greedy, rows carry the
    size and display names show it; one preset leaves cells, ids and names as they were."""
    path = tmp_path / "sizes.toml"
    path.write_text(SPEC.replace('preset = "tiny"', 'preset = ["tiny", "mini"]'))
    spec = load_spec(path)
    plan = expand(spec)
    assert [(c.family, c.preset, c.teacher is not None) for c in plan.train_cells] == [
        ("ar", "tiny", False), ("ar", "mini", False), ("padir", "tiny", True), ("padir", "mini", True),
        ("padir", "tiny", False), ("padir", "mini", False)]
    assert all(c.teacher.preset == c.preset for c in plan.train_cells if c.teacher)
    assert " size mini " in plan.train_cells[1].label
    names = [s.name for s in plan.systems]
    assert names[:2] == ["ar-greedy-tiny", "ar-beam3-tiny"] and len(names) == 12
    assert all(s.baseline == f"ar-greedy-{s.cell.preset}" and s.name.endswith(f"-{s.cell.preset}")
               for s in plan.systems)
    deps = fake_deps(tmp_path / "ckpt")
    run = new_store(tmp_path, spec)
    Runner(spec, deps, run, progress=False).run()
    assert len(deps.train.calls) == 6 and len(deps.distill.calls) == 2
    assert sorted(json.loads((run.path / st.DISTILL).read_text())) == ["fake_task-mini", "fake_task-tiny"]
    rows = [r for r in run.rows() if r.test_set == "fake_task:test"]
    by = {r.system: r for r in rows}
    assert {r.size for r in rows} == {"tiny", "mini"} and by["ar-greedy-mini"].bleu_delta_vs_ar == 0.0
    assert by["padir-s4-u0.15-distill-k3-mini"].baseline_system == "ar-greedy-mini"
    assert len({r.checkpoint for r in rows if r.family == "ar"}) == 2               # one AR model per size
    assert by["ar-greedy-mini"].model_params == FAKE_PARAMS["mini"]
    shown = display_names(rows)
    assert shown["ar-greedy-tiny"] == "AR greedy, tiny" and shown["ar-greedy-mini"] == "AR greedy, mini"
    # the report: scale.md per test set, every NAR system at both sizes, no trend from two sizes; the grid page
    # compares distillation within a size only
    written = write_report(run.path)
    assert run.path / SCALE_PAGE in written and (run.path / SCALE_PLOT).is_file()
    page = (run.path / SCALE_PAGE).read_text()
    assert "## fake_task:test" in page and "## fake_task:test+refs" in page and "No trend is fitted" in page
    assert f"[{SCALE_PAGE}]({SCALE_PAGE})" in (run.path / "leaderboard.md").read_text()
    found = points(run.rows(), run.samples(), 50, 1)
    assert {(p.size, p.params) for p in found} == {("tiny", FAKE_PARAMS["tiny"]), ("mini", FAKE_PARAMS["mini"])}
    for p in found:
        ar = by[f"ar-greedy-{p.size}"] if p.test_set == "fake_task:test" else None
        if ar is not None:
            # the gap is the paired bootstrap's statistic over float32 per-sentence counts (grid.bleu_difference)
            assert p.ar_bleu == ar.bleu and p.gap.value == pytest.approx(p.bleu - ar.bleu, abs=1e-3)
        assert ", tiny" not in p.name and ", mini" not in p.name
    grid = (run.path / "grid.md").read_text()
    assert "tiny" in grid and "mini" in grid                       # each cell names its size
    plain = tmp_path / "plain.toml"
    plain.write_text(SPEC)
    one = expand(load_spec(plain))
    assert all(c.preset is None for c in one.train_cells) and one.systems[0].name == "ar-greedy"


def _point(size: str, params: int, gap: float) -> Point:
    return Point("t:test", size, params, "padir-s4", "PaDIR T=4", 30.0, 30.0 + gap, Effect(gap, (gap - 1, gap + 1)),
                 (2.0, (1.9, 2.1)), "CTranslate2 greedy, int8", (1.0, (0.9, 1.1)))


def test_a_trend_is_fitted_from_three_sizes_with_its_standard_error():
    exact = trends([_point("a", 10 ** 6, -10.0), _point("b", 4 * 10 ** 6, -8.0), _point("c", 16 * 10 ** 6, -6.0)])
    assert [(t.variant, t.points) for t in exact] == [("padir-s4", 3)]
    assert exact[0].slope == pytest.approx(2.0) and exact[0].stderr == pytest.approx(0.0, abs=1e-9)
    noisy = trends([_point("a", 10 ** 6, -10.0), _point("b", 4 * 10 ** 6, -7.0), _point("c", 16 * 10 ** 6, -6.0)])
    assert noisy[0].slope == pytest.approx(2.0) and noisy[0].stderr == pytest.approx((2 / 3 / 2) ** 0.5)
    assert trends([_point("a", 10 ** 6, -10.0), _point("b", 4 * 10 ** 6, -7.0)]) == []       # two points: no trend
    assert trends([_point("a", 10 ** 6, -10.0), _point("b", None, -7.0), _point("c", 16 * 10 ** 6, -6.0)]) == []
