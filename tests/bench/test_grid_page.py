"""The grid page: each axis's effect on BLEU and latency against a hand computation, from rows and samples only."""
from __future__ import annotations

import numpy as np
import pytest
import sacrebleu

from bench import report, store as st
from bench.measure.quality import paired_tests
from bench.report import grid
from bench.rows import compute_figures
from fakes import saved_figures
from grid_fakes import fake_row, fake_text
from narbench_core import defaults as d

N, RESAMPLES, SEED = 30, 200, d.SIGNIFICANCE_SEED
SOURCES, (REFS, _) = fake_text(N, seed=3)
PADIR = dict(unmask_rate=d.UNMASK_RATE, length_hyps=1, length_bonus=0, remask=d.REMASK, start=d.START,
             positional_attention=True, stages=2, init=d.INIT, recipe=d.RECIPE, glancing=False,
             length_predictor=d.LENGTH_PREDICTOR)


def drop_last(every: int) -> list[str]:
    """The references with the last word dropped in every ``every``-th sentence (0: none)."""
    return [" ".join(r.split()[:-1]) if every and i % every == 0 else r for i, r in enumerate(REFS)]


# system -> (T, distilled, hypotheses, latency ms of every sentence)
SYSTEMS = {"padir-s1": (1, False, drop_last(3), 10.0), "padir-s4": (4, False, drop_last(5), 40.0),
           "padir-s1-distill": (1, True, drop_last(2), 10.0), "padir-s4-distill": (4, True, drop_last(0), 10.0)}


def bleu(hyps: list[str], idx=None) -> float:
    idx = range(N) if idx is None else idx
    return sacrebleu.corpus_bleu([hyps[i] for i in idx], [[REFS[i] for i in idx]]).score


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("grid")
    toml = f'name = "gridpage"\nseeds = [0]\nbootstrap_resamples = {RESAMPLES}\n'
    run, _ = st.open_run(tmp / "results", "gridpage", "ab" * 32, toml, "narbench run")
    rows, samples = [], []
    common = dict(suite="gridpage", task="toy", target_lang="en", batch_size=1, platform="cpu", phase="end_to_end",
                  baseline_system="ar-greedy", n_references=1)
    for system, (t, distill, hyps, ms) in {**SYSTEMS, "ar-greedy": (None, False, REFS, 30.0)}.items():
        padir = t is not None
        figures = compute_figures(hyps, [REFS], [ms] * N, [t or 9] * N, "en")
        rows.append(fake_row(system, "toy:test", family="padir" if padir else "ar", paradigm="nar" if padir else "ar",
                             decoder=f"refine:{t}" if padir else "greedy", distill=distill, hypotheses=1,
                             **({"iterations": t, "variant": system.replace(f"-s{t}", ""), **PADIR} if padir else {}),
                             **figures, **common))
        samples += [{"system": system, "test_set": "toy:test", "index": i, "source": SOURCES[i], "reference": REFS[i],
                     "hypothesis": hyps[i], "latency_ms": ms, "passes": t or 9} for i in range(N)]
    run.save_cells(rows, samples)
    st.finish_run(run)
    return run.path


def hand_bootstrap(terms: list[tuple[list[str], list[str], float]]) -> tuple[float, tuple[float, float]]:
    """sum(w * (BLEU(a) - BLEU(b))) and its 95% interval, resampling sentences as sacrebleu's paired bootstrap
    does (its generator, seed and index draws; the 1/40-th smallest and largest of the resampled values)."""
    observed = sum(w * (bleu(a) - bleu(b)) for a, b, w in terms)
    idxs = np.random.default_rng(SEED).choice(N, size=(RESAMPLES, N), replace=True)
    deltas = sorted(sum(w * (bleu(a, idx) - bleu(b, idx)) for a, b, w in terms) for idx in idxs)
    return observed, (deltas[RESAMPLES // 40], deltas[RESAMPLES - RESAMPLES // 40 - 1])


def hyps(system: str) -> list[str]:
    return SYSTEMS[system][2]


def test_each_effect_and_ci_matches_a_hand_computation(run_dir):
    rows, samples = st.RunStore(run_dir).rows(), st.RunStore(run_dir).samples()
    text, found = grid.render_grid_page(rows, samples, {"suite": "gridpage", "run_id": run_dir.name}, RESAMPLES, SEED)
    by = {(c.axis, c.value): c for c in found}
    assert set(by) == {("iterations", 4), ("distill", True)}          # the AR row has no axes; two axes vary
    t4 = by["iterations", 4]
    assert [(c.value.system, c.reference.system) for c in t4.cells] == [("padir-s4", "padir-s1"),
                                                                        ("padir-s4-distill", "padir-s1-distill")]
    for cell in t4.cells:       # one cell: sacrebleu's paired bootstrap of the pair, as the rows' tests run it
        value, ci = hand_bootstrap([(hyps(cell.value.system), hyps(cell.reference.system), 1.0)])
        assert cell.bleu.value == pytest.approx(value, abs=1e-9) and cell.bleu.ci == pytest.approx(ci, abs=1e-9)
        same = paired_tests(hyps(cell.value.system), hyps(cell.reference.system), [REFS], ar_trials=10,
                            bs_resamples=RESAMPLES, seed=SEED)
        assert cell.bleu.p_value == pytest.approx(same.p_bs)
    value, ci = hand_bootstrap([(hyps("padir-s4"), hyps("padir-s1"), 0.5),
                                (hyps("padir-s4-distill"), hyps("padir-s1-distill"), 0.5)])
    assert t4.bleu.value == pytest.approx(value, abs=1e-9) and t4.bleu.ci == pytest.approx(ci, abs=1e-9)
    # Latency: T=4 takes 4x the time raw (40 / 10 ms) and the same distilled (10 / 10): geometric mean 2.
    assert [c.latency.value for c in t4.cells] == [4.0, 1.0] and t4.latency.value == pytest.approx(2.0)
    assert t4.latency.ci == pytest.approx((2.0, 2.0))
    dist = by["distill", True]
    assert [c.context for c in dist.cells] == ["T=1", "T=4"]
    assert [c.latency.value for c in dist.cells] == [1.0, 0.25] and dist.latency.value == pytest.approx(0.5)
    value, ci = hand_bootstrap([(hyps("padir-s1-distill"), hyps("padir-s1"), 0.5),
                                (hyps("padir-s4-distill"), hyps("padir-s4"), 0.5)])
    assert dist.bleu.value == pytest.approx(value, abs=1e-9) and dist.bleu.ci == pytest.approx(ci, abs=1e-9)
    # The interaction: the distillation effect at T=4 minus the one at T=1, from the same resamples.
    [at1, at4] = grid.interactions(grid._Run(rows, samples, RESAMPLES, SEED), found)
    assert (at1.at, at4.at, at1.contrast) == (1, 4, None)
    value, ci = hand_bootstrap([(hyps("padir-s4-distill"), hyps("padir-s4"), 1.0),
                                (hyps("padir-s1-distill"), hyps("padir-s1"), -1.0)])
    assert at4.contrast.value == pytest.approx(value, abs=1e-9) and at4.contrast.ci == pytest.approx(ci, abs=1e-9)
    assert at4.bleu.value == pytest.approx(bleu(hyps("padir-s4-distill")) - bleu(hyps("padir-s4")), abs=1e-9)
    # The page shows the same numbers.
    assert "PaDIR axes: iterations 1, 4 (reference 1); distill false, true (reference false)." in text
    assert (f"| T=4 | T=1 | 2 | {grid._bleu_cell(t4.bleu)} | 2.00x [2.00, 2.00] |") in text
    assert f"| distilled | raw | T=4 | {grid._bleu_cell(dist.cells[1].bleu)} | 0.25x [0.25, 0.25] |" in text
    assert f"| 4 | 1 | {grid._bleu_cell(at4.bleu)} | {grid._bleu_cell(at4.contrast)} | 0.25x [0.25, 0.25] |" in text


def test_report_writes_the_grid_page_and_plot(run_dir):
    with saved_figures() as figures:
        files = report.write_report(run_dir)
    assert run_dir / "grid.md" in files and run_dir / "grid.png" in files
    assert (run_dir / "grid.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    panels = [ax for ax in figures["grid.png"].axes if ax.get_ylabel() == "BLEU"]
    assert [ax.get_title() for ax in panels] == ["toy:test: PaDIR by iterations", "toy:test: PaDIR by distill"]
    assert "- [grid.md](grid.md): what each ablation axis costs and buys" in (run_dir / "leaderboard.md").read_text()


def test_silenced_axes_match_any_value():
    glancing = {"glancing": True, "unmask_rate": None, "iterations": 4}
    assert grid._matches(glancing, {"glancing": False, "unmask_rate": 0.3, "iterations": 4}, "glancing")
    assert not grid._matches(glancing, {"glancing": False, "unmask_rate": 0.3, "iterations": 1}, "glancing")


def test_a_run_without_a_varying_axis_has_no_grid_page():
    rows = [fake_row("padir-s4", family="padir", iterations=4, distill=False, bleu=10.0, **PADIR)]
    assert grid.render_grid_page(rows, [], {}, 10, 0) is None
