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
from bench.report.scale import (FIT_ALPHA, SCALE_PAGE, SCALE_PLOT, Z95, Point, plot_scale, points,
                                render_scale_page, trends)
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
    # one size after another (each can be timed and committed as it finishes), its teacher before its students
    assert [(c.family, c.preset, c.teacher is not None) for c in plan.train_cells] == [
        ("ar", "tiny", False), ("padir", "tiny", True), ("padir", "tiny", False),
        ("ar", "mini", False), ("padir", "mini", True), ("padir", "mini", False)]
    assert all(c.teacher.preset == c.preset for c in plan.train_cells if c.teacher)
    assert " size mini " in plan.train_cells[3].label
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


def _point(size: str, params: int | None, gap: float, half: float = 1.0, variant: str = "padir-s4") -> Point:
    return Point("t:test", size, params, variant, f"PaDIR {variant}", 30.0, 30.0 + gap,
                 Effect(gap, (gap - half, gap + half)), (2.0, (1.9, 2.1)), "CTranslate2 greedy, int8", (1.0, (0.9, 1.1)))


def _sizes(*gaps: float, halves=(1.0, 1.0, 1.0), variant: str = "padir-s4") -> list[Point]:
    """Three sizes 4x apart in parameters (log4 x = 0, 1, 2 above 10**6) with these gaps and CI half-widths."""
    return [_point(s, 4 ** i * 10 ** 6, g, h, variant) for i, (s, g, h) in enumerate(zip("abc", gaps, halves))]


def test_a_trend_is_a_weighted_line_through_three_sizes_given_only_where_it_fits_them():
    sigma = 1.0 / Z95                                   # a CI half-width of 1 read as a normal 95% interval
    exact = trends(_sizes(-10.0, -8.0, -6.0))
    assert [(t.variant, t.points) for t in exact] == [("padir-s4", 3)]
    # on a line: no scatter, so the slope's error is the CIs' alone: sigma / sqrt(sum (x - mean x)^2)
    assert exact[0].slope == pytest.approx(2.0) and exact[0].chi2 == pytest.approx(0.0, abs=1e-12)
    assert exact[0].stderr == pytest.approx(sigma / 2 ** 0.5) and exact[0].fits
    # residuals -1/3, 2/3, -1/3: chi2 = (2/3) / sigma^2 on 1 dof, p = 0.110; the scatter is over the CIs', so the
    # error is scaled by sqrt(chi2): with equal weights that is ordinary least squares' (sqrt(2/3 / 1 / 2))
    noisy = trends(_sizes(-10.0, -7.0, -6.0))[0]
    assert noisy.slope == pytest.approx(2.0) and noisy.chi2 == pytest.approx(2 / 3 / sigma ** 2)
    assert noisy.p_fit == pytest.approx(0.10953, abs=1e-4) and noisy.stderr == pytest.approx((2 / 3 / 2) ** 0.5)
    # weights: a size with a CI 20x wider barely counts; the line follows the other two (ordinary: 1.5)
    weighted = trends(_sizes(-10.0, -8.0, -7.0, halves=(10.0, 0.5, 0.5)))[0]
    assert weighted.slope == pytest.approx(1.0, abs=0.01) and weighted.fits
    # not on a line within the CIs: no slope on the page
    bent = trends(_sizes(-10.0, -4.0, -6.0))[0]
    assert bent.p_fit < FIT_ALPHA and not bent.fits
    page = render_scale_page([*_sizes(-10.0, -8.0, -6.0), *_sizes(-10.0, -4.0, -6.0, variant="padir-s10")],
                             {"suite": "scale", "run_id": "r"}, 100, 1)
    trend_rows = page.split("## Trend")[1].split("![")[0]
    assert "| t:test | PaDIR padir-s4 | +2.00 ± 0.36 | 0.00 (1), p = 1.000 | 3 |" in trend_rows
    assert "| t:test | PaDIR padir-s10 | none: the sizes are not on a line | 40.98 (1), p = 0.000 | 3 |" in trend_rows
    assert "one seed" in trend_rows
    # too few sizes, or one without a parameter count or a CI: no trend
    assert trends(_sizes(-10.0, -7.0, -6.0)[:2]) == []
    assert trends([_point("a", 10 ** 6, -10.0), _point("b", None, -7.0), _point("c", 16 * 10 ** 6, -6.0)]) == []
    assert trends(_sizes(-10.0, -7.0, -6.0, halves=(1.0, 0.0, 1.0))) == []


def test_the_scale_plot_draws_each_fitted_trend_and_no_other(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.axes import Axes

    drawn, plot = [], Axes.plot

    def record(self, *args, **kwargs):
        drawn.append((kwargs.get("ls"), len(args[0]) if args else 0))
        return plot(self, *args, **kwargs)

    monkeypatch.setattr(Axes, "plot", record)
    plot_scale([*_sizes(-10.0, -8.0, -6.0), *_sizes(-10.0, -4.0, -6.0, variant="padir-s10")], tmp_path / "s.png")
    assert [d for d in drawn if d[0] == ":"] == [(":", 32)]       # padir-s4's line; padir-s10's does not fit
    assert (tmp_path / "s.png").stat().st_size > 0


def test_a_run_per_size_gives_the_scale_page_of_the_run_of_every_size(tmp_path):
    """``narbench run --sizes``: a run of some sizes of a sized suite names its size like the whole suite's run;
    ``narbench scale`` draws the scale page across such runs with the gaps of the run of every size, and says
    which run (date, commit, machine) each size's figures come from."""
    from bench.report.scale import write_across
    from narbench_core.errors import UserError

    path = tmp_path / "sizes.toml"
    path.write_text(SPEC.replace('preset = "tiny"', 'preset = ["tiny", "mini"]'))
    whole = load_spec(path)
    deps = fake_deps(tmp_path / "ckpt")
    runs = {}
    for sizes in (("tiny", "mini"), ("tiny",), ("mini",)):
        spec = whole.replace(model=whole.model.only(sizes))
        assert spec.model.presets == sizes and spec.model.sized
        run = new_store(tmp_path, spec)
        Runner(spec, deps, run, progress=False).run()
        st.finish_run(run)
        runs[sizes] = run
    assert len({key for _, key in deps.train.calls}) == 6      # one size's runs ask for the whole run's models
    assert {r.system for r in runs[("tiny",)].rows()} == {r.system for r in runs[("tiny", "mini")].rows()
                                                          if r.size == "tiny"}
    written = write_across([runs[("mini",)].path, runs[("tiny",)].path])
    assert written[0] == runs[("tiny",)].path.parent / "sizes-tiny-mini" / SCALE_PAGE and written[1].is_file()
    page = written[0].read_text()
    whole_points = {(p.test_set, p.size, p.variant): p for p in points(runs[("tiny", "mini")].rows(),
                                                                        runs[("tiny", "mini")].samples(), 50, 1)}
    across = [*runs[("tiny",)].rows(), *runs[("mini",)].rows()]
    found = points(across, [*runs[("tiny",)].samples(), *runs[("mini",)].samples()], 50, 1)
    assert {(p.test_set, p.size, p.variant) for p in found} == set(whole_points)
    for p in found:
        assert (p.bleu, p.ar_bleu, p.gap.value) == pytest.approx(
            (whole_points[p.test_set, p.size, p.variant].bleu, whole_points[p.test_set, p.size, p.variant].ar_bleu,
             whole_points[p.test_set, p.size, p.variant].gap.value))
    for size in ("tiny", "mini"):                        # each size's run, linked from the page beside them
        assert f"| {size} | [{runs[(size,)].run_id}](../{runs[(size,)].run_id}) |" in page
    assert "never across runs" in page and "## fake_task:test+refs" in page
    # every size's models as trained, from both runs: one line each, with what stopped it
    budgets = page[page.index("## Training budgets"):].split("\n\n")[1].splitlines()
    assert budgets[0].startswith("| model | Family | train steps | train tokens | train s |")
    models = {r.model for r in across if r.model}
    assert len(models) == 6 and len(budgets) == 2 + len(models)
    assert all(any(line.startswith(f"| {m} |") for line in budgets) for m in models)
    assert "Curves: each run's learning_curves.png." in page
    with pytest.raises(UserError, match="size tiny is in two runs"):
        write_across([runs[("tiny",)].path, runs[("tiny", "mini")].path])
    with pytest.raises(UserError, match="is passed twice; pass each run once"):
        write_across([runs[("tiny",)].path, runs[("mini",)].path, runs[("tiny",)].path.parent / "latest"])
    with pytest.raises(UserError, match="two runs or more"):
        write_across([runs[("tiny",)].path])
    plain = tmp_path / "plain.toml"
    plain.write_text(SPEC)
    one = load_spec(plain)
    with pytest.raises(UserError, match="not a size axis"):
        one.model.only(["tiny"])
    with pytest.raises(UserError, match=r"--sizes small: not a size of the suite \(its sizes: tiny, mini\)"):
        whole.model.only(["tiny", "small"])
    unsized = new_store(tmp_path, one)
    Runner(one, deps, unsized, progress=False).run()
    with pytest.raises(UserError, match="its rows name no model size"):
        write_across([runs[("tiny",)].path, unsized.path])


def test_plan_and_scale_commands_take_sizes(tmp_path, monkeypatch, capsys):
    """`narbench plan --sizes` expands only those sizes (names as in the whole suite); a size the suite lacks is
    one line and exit 2; `narbench scale` writes the page across runs and prints where."""
    from bench import preview
    from bench.cli import main
    from grid_fakes import fake_locator

    path = tmp_path / "sizes.toml"
    path.write_text(SPEC.replace('preset = "tiny"', 'preset = ["tiny", "mini"]'))
    deps = fake_deps(tmp_path / "ckpt")
    monkeypatch.setattr(preview, "real_locator", lambda: fake_locator(deps))
    plan = ["plan", "--suite", str(path), "--results", str(tmp_path / "results"), "--format", "json"]
    assert main(plan + ["--sizes", "mini"]) == 0
    shown = json.loads(capsys.readouterr().out)
    systems = [s["system"] for ts in shown["test_sets"] for s in ts["systems"]]
    assert systems and all(s.endswith("-mini") for s in systems)
    assert main(plan + ["--sizes", "small"]) == 2
    assert capsys.readouterr().err.strip() == ("narbench: error: --sizes small: not a size of the suite (its sizes: "
                                               "tiny, mini)")
    whole = load_spec(path)
    runs = []
    for size in ("tiny", "mini"):
        spec = whole.replace(model=whole.model.only([size]))
        run = new_store(tmp_path, spec)
        Runner(spec, deps, run, progress=False).run()
        st.finish_run(run)
        runs.append(str(run.path))
    out = tmp_path / "page"
    assert main(["scale", *runs, "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"narbench: {out / SCALE_PAGE}"
    assert (out / SCALE_PLOT).is_file() and "runs " in (out / SCALE_PAGE).read_text().splitlines()[0]
    from argparse import Namespace

    from bench.cli.run import _command
    assert _command(Namespace(command="run", suite="scale", suite_sizes=["tiny", "mini"]), ("suite", "suite_sizes")) \
        == "narbench run --suite scale --sizes tiny mini"          # the run's recorded command says --sizes
