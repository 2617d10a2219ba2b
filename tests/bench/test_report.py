"""Reports: table.md in the paper's layout, leaderboard.md, the three plots, the Pareto front."""
from __future__ import annotations

import json
import shutil

import pytest

from bench import report, store as st
from bench.report import pages, plots, tables
from bench.costs import MachinePeaks
from bench.runner import Runner
from bench.families import load_suite as load_spec
from bench.verify import verify_run
from fakes import saved_figures
from grid_fakes import fake_deps, fake_row
from narbench_core import defaults as d


FIGURES: dict = {}        # file name -> the matplotlib figure saved there (filled by run_dir)
AR_TRIALS = 200           # sacrebleu's approximate randomization with few trials: a light test
PAIRED_TESTS = ("bleu_p_ar", "bleu_p_bs", "bleu_bs_mean", "bleu_bs_ci", "bleu_ar_signature", "bleu_bs_signature")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    import bench.costs

    tmp = tmp_path_factory.mktemp("report")
    saved = bench.costs.machine_peaks
    bench.costs.machine_peaks = lambda: MachinePeaks("test", 1e11, 1e10, "x", 8, 8)
    trials = pytest.MonkeyPatch()
    trials.setattr(d, "AR_TRIALS", AR_TRIALS, raising=False)
    try:
        spec = load_spec("default").replace(max_test_sentences=30)
        run, _ = st.open_run(tmp / "results", spec.name, spec.spec_hash(), spec.to_toml(),
                             "narbench run --suite default")
        run.write_env({"platform": "cpu", "cpu_model": "Test CPU", "threads": 2, "versions": {"jax": "0"},
                       "git": {"commit": "abc123", "dirty": False}, "seeds": {"train": 0}})
        Runner(spec, fake_deps(tmp / "ckpt", n_sentences=80), run, progress=False).run()
        st.finish_run(run)
        theory = tmp / "results" / "theory" / "ising" / "20240101T000000Z-aaaa"
        theory.mkdir(parents=True)
        (theory / "ising.md").write_text("# Ising\n")
        (theory.parent / "latest").write_text(theory.name + "\n")
        with saved_figures() as figures:
            report.write_report(run.path)
        FIGURES.update(figures)
    finally:
        bench.costs.machine_peaks = saved
        trials.undo()
    return run.path


def test_files_and_plots_exist(run_dir):
    for name in ("table.md", "leaderboard.md", *report.PLOTS):
        path = run_dir / name
        assert path.is_file() and path.stat().st_size > 0, name
    for name in report.PLOTS:
        assert (run_dir / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plots_draw_every_system(run_dir):
    rows = st.RunStore(run_dir).rows()
    sets = sorted({r.test_set for r in rows})
    systems = {r.system for r in rows}
    pareto = [ax for ax in FIGURES["pareto.png"].axes if ax.get_ylabel() == "BLEU"]
    assert len(pareto) == len(sets)
    for ax in pareto:
        assert ax.get_xlabel().startswith("p50 latency per sentence, ms")
        points = sum(len(c.get_offsets()) for c in ax.collections if c.get_sizes()[0] == 46)
        assert points == len(systems)                              # one point per system with a BLEU
    cdf = [ax for ax in FIGURES["latency_cdf.png"].axes if ax.get_ylabel() == "share of sentences"]
    assert len(cdf) == len(sets)
    for ax in cdf:
        assert {line.get_label() for line in ax.get_lines() if not line.get_label().startswith("_")} == systems
    panels = [ax for ax in FIGURES["bleu_vs_iterations.png"].axes
              if ax.get_xlabel().startswith("refinement iterations")]
    assert len(panels) == len(sets)
    refine = {r.iterations for r in rows if r.variant is not None}
    for ax in panels:
        lines = [line for line in ax.get_lines() if len(line.get_xdata()) > 1 and line.get_marker() == "o"]
        assert lines and all(set(line.get_xdata()) <= refine for line in lines)


def test_table_has_paper_layout_and_latency_columns(run_dir):
    text = (run_dir / "table.md").read_text()
    assert "| System | Family | # Hyp. | T | bible_de_en:test | bible_de_en:test+refs |" in text
    assert "| ar-beam5 | AR | 5 | N | 100.00 | 100.00 |" in text
    assert "| padir-s4-distill-lb1-init-ar-glat-lenoff | PaDIR | 5 | 4 |" in text
    assert "| padir-s4-distill-k1-lb1-init-ar-glat-lenoff | PaDIR | 1 | 4 |" in text
    assert "n too small (30 < 459)" in text  # no p99 from 30 sentences
    assert "speedup p50 vs AR greedy" in text and "1.00x" in text
    assert "no BLEURT checkpoint" in text
    assert "**" in text  # the stuttering 1-step systems differ significantly from AR greedy
    lines = text.splitlines()
    # AR rows come first, then PaDIR by distillation and refinement iterations.
    order = [ln.split("|")[1].strip() for ln in lines if ln.startswith("| ar-") or ln.startswith("| padir-")][:10]
    assert order[:3] == ["ar-greedy", "ar-beam5", "padir-s1-k1-lb1-init-ar-glat-lenoff"]


def test_leaderboard_sorted_with_signature_env_command_and_links(run_dir):
    text = (run_dir / "leaderboard.md").read_text()
    section = text.split("## bible_de_en:test\n")[1].split("##")[0]
    lines = [ln for ln in section.splitlines() if ln.startswith("| ") and ln[2].isdigit()]
    bleus = [float(ln.split("|")[3].strip(" *")) for ln in lines]
    # 14 JAX, 6 CTranslate2 (3 x 1-2 threads), 10 PaDIR on ONNX Runtime (T = 1, 2, 4, 10 at k = 1 and T = 4 at k = 5,
    # x float32-int8)
    assert len(bleus) == 30 and bleus == sorted(bleus, reverse=True)
    # At most ~10 columns, systems by display names (the ids in the legend), a summary from the rows.
    header = next(ln for ln in section.splitlines() if ln.startswith("| # |"))
    assert header.count("|") - 1 <= 10 and "| len ratio |" not in header and "| Family |" not in header
    names = {ln.split("|")[2].strip() for ln in lines}
    assert {"AR greedy", "AR beam 5", "PaDIR T=4 k=3, distilled", "PaDIR T=1 k=1, raw"} <= names, names
    assert len(names) == 30 and any(n.startswith("CTranslate2 greedy, int8") for n in names), names
    assert "PaDIR ORT T=4 k=1, distilled, int8, 1 thread" in names, names
    assert "| PaDIR T=4 k=3, distilled | `padir-s4-distill-k3-lb1-init-ar-glat-lenoff` |" in text
    assert "**What this run says** on bible_de_en:test: the best BLEU is " in section
    assert "The best non-autoregressive system, PaDIR " in section and "against the fastest AR-side system" in section
    assert "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:" in text
    assert "narbench run --suite default" in text
    assert "Test CPU" in text and "abc123" in text
    assert "BLEURT: no BLEURT checkpoint" in text
    assert "**Stutter** (the paper: 2x or more the AR's): the claim holds for" in text
    assert "**Speed at equal quality** (the paper's abstract: 2-3x faster than AR" in text
    assert "| len ratio |" in (run_dir / "table.md").read_text()         # the full columns: table.md
    assert "![pareto.png](pareto.png)" in text
    assert "(../../theory/ising/20240101T000000Z-aaaa/ising.md)" in text


def test_leaderboard_states_sacrebleus_test_and_its_signature(run_dir, monkeypatch):
    text = (run_dir / "leaderboard.md").read_text()
    assert "* p < 0.05, ** p < 0.01 in sacrebleu's paired approximate randomization test" in text
    assert f"`sacrebleu --paired-ar`, {AR_TRIALS} trials, seed 12345" in text
    assert f"`nrefs:1|ar:{AR_TRIALS}|seed:12345|case:mixed|eff:no|tok:13a|smooth:exp|version:" in text
    assert "`nrefs:1|bs:1000|seed:12345|case:mixed|eff:no|tok:13a|smooth:exp|version:" in text
    assert (f"SACREBLEU_SEED=12345 sacrebleu REFS -i ar-greedy.txt SYSTEM.txt --tokenize 13a --paired-ar "
            f"--paired-ar-n {AR_TRIALS}") in text
    table = (run_dir / "table.md").read_text()
    assert "## bible_de_en:test: BLEU against AR greedy, sacrebleu's paired tests" in table
    assert "| BLEU (bootstrap mean ± 95% CI) | ΔBLEU vs AR greedy | p (AR) | p (bootstrap) |" in table
    monkeypatch.setattr(d, "AR_TRIALS", AR_TRIALS)
    assert verify_run(run_dir) == []                  # the rows' tests are sacrebleu's on samples.jsonl


def test_report_gives_rows_from_before_sacrebleus_tests_the_same_tests(run_dir, tmp_path, monkeypatch):
    """Rows written with narbench's own bootstrap get sacrebleu's tests in the report, computed from
    samples.jsonl, equal to those of rows that carry them; rows.jsonl stays as it was."""
    monkeypatch.setattr(d, "AR_TRIALS", AR_TRIALS, raising=False)
    old = tmp_path / run_dir.name
    shutil.copytree(run_dir, old)
    records = [json.loads(line) for line in (old / "rows.jsonl").read_text().splitlines()]
    (old / "rows.jsonl").write_text("".join(
        json.dumps({**{k: v for k, v in r.items() if k not in PAIRED_TESTS}, "bleu_delta_ci": [0.0, 0.0],
                    "bleu_delta_p_value": 0.5}) + "\n" for r in records))
    written = (old / "rows.jsonl").read_bytes()
    report.write_report(old)
    assert (old / "rows.jsonl").read_bytes() == written
    assert (old / "table.md").read_text() == (run_dir / "table.md").read_text()
    assert "in sacrebleu's paired approximate randomization test" in (old / "leaderboard.md").read_text()
    assert verify_run(old) == []


def test_pareto_front():
    pts = [(10.0, 20.0), (5.0, 15.0), (20.0, 25.0), (12.0, 18.0), (5.0, 10.0), (30.0, 24.0)]
    assert plots.pareto_front(pts) == [1, 0, 2]


def test_report_of_an_empty_run_is_a_user_error(tmp_path):
    from narbench_core.errors import UserError

    run, _ = st.open_run(tmp_path, "s", "f" * 64, "", "cmd")
    with pytest.raises(UserError, match="no finished cells"):
        report.write_report(run.path)


def test_stutter_verdict_compares_each_nar_row_with_its_baseline():
    from types import SimpleNamespace as R

    def row(system, paradigm, stutter, test_set="t"):
        return R(test_set=test_set, system=system, baseline_system="ar-greedy", paradigm=paradigm,
                 stutter_per_1k_words=stutter)

    ar = row("ar-greedy", "ar", 2.0)
    assert pages.stutter_verdict([ar, row("ar-beam5", "ar", 9.0)]) is None
    line = pages.stutter_verdict([ar, row("p1", "nar", 8.0), row("p4", "nar", 3.0)])
    assert "holds for 1 of 2" in line and "1.5x to 4.0x" in line and "(2.00 per 1k words)" in line
    assert "holds for all 1 " in pages.stutter_verdict([ar, row("p1", "nar", 4.0)])
    assert "holds for none of the 1 " in pages.stutter_verdict([ar, row("p1", "nar", 3.9)])
    assert "AR greedy has none" in pages.stutter_verdict([row("ar-greedy", "ar", 0.0), row("p1", "nar", 1.0)])


def test_speed_verdict_takes_the_fastest_nar_row_within_a_bleu_of_ar_greedy():
    def row(system, paradigm, delta, speedup, test_set="t"):
        return fake_row(system, test_set, baseline_system="ar-greedy", paradigm=paradigm, bleu=20.0 + delta,
                        bleu_delta_vs_ar=delta, latency_p50_ms=10.0 / speedup, speedup_p50_vs_ar=speedup,
                        speedup_p50_ci=[speedup - 0.1, speedup + 0.1])

    ids = {name: name for name in ("ar-greedy", "ar-beam5", "padir-a", "padir-b", "padir-c", "padir-d")}
    ar = row("ar-greedy", "ar", 0.0, 1.0)
    assert pages.speed_verdict([ar, row("ar-beam5", "ar", 1.0, 0.3)], ids) is None
    # padir-b is faster but 1.5 BLEU behind: padir-a (-1.0, 1.8x) decides, and 1.8x < 2x.
    line = pages.speed_verdict([ar, row("padir-a", "nar", -1.0, 1.8), row("padir-b", "nar", -1.5, 3.0)], ids)
    assert "on t it does not hold: the fastest non-autoregressive row within 1 BLEU of AR greedy, padir-a (-1.00 BLEU), " \
           "runs at 1.80x [1.70, 1.90] AR greedy's speed." in line
    line = pages.speed_verdict([ar, row("padir-a", "nar", -0.5, 2.0), row("padir-c", "nar", 0.5, 1.2)], ids)
    assert "on t it holds: the fastest non-autoregressive row within 1 BLEU of AR greedy, padir-a (-0.50 BLEU)" in line
    line = pages.speed_verdict([ar, row("padir-b", "nar", -1.5, 3.0), row("padir-d", "nar", -9.0, 4.0),
                                row("ar-greedy", "ar", 0.0, 1.0, "u"), row("padir-a", "nar", 0.0, 2.5, "u")], ids)
    assert ("on t it does not hold: no non-autoregressive row is within 1 BLEU of AR greedy (the closest, padir-b, is "
            "1.50 behind); on u it holds") in line
    unlearned = [type(r)({**r, "bleu": r.bleu - 18.0}) for r in (ar, row("padir-a", "nar", -0.5, 2.0))]
    assert pages.speed_verdict(unlearned, ids) is None                 # AR greedy at 2 BLEU: nothing to judge


def test_fastest_ar_and_speedups_at_equal_or_better_bleu():
    rows = [fake_row("ar-greedy", "t", paradigm="ar", latency_p50_ms=10.0, bleu=20.0),
            fake_row("ar-beam5", "t", paradigm="ar", latency_p50_ms=40.0, bleu=22.0),
            fake_row("ct2-greedy", "t", paradigm="ar", latency_p50_ms=5.0, bleu=20.0),
            fake_row("padir-a", "t", paradigm="nar", latency_p50_ms=8.0, bleu=21.0, speedup_p50_vs_ar=1.25),
            fake_row("padir-b", "t", paradigm="nar", latency_p50_ms=4.0, bleu=10.0, speedup_p50_vs_ar=2.5),
            fake_row("padir-c", "t", paradigm="nar", latency_p50_ms=4.0, bleu=30.0, speedup_p50_vs_ar=2.5)]
    per_sentence = {"ar-greedy": 10.0, "ar-beam5": 40.0, "ct2-greedy": 5.0, "padir-a": 8.0, "padir-b": 4.0,
                    "padir-c": 4.0}
    samples = [{"system": name, "test_set": "t", "index": i, "latency_ms": ms}
               for name, ms in per_sentence.items() for i in range(3)]
    ids = {r.system: r.system for r in rows}
    text = "\n".join(tables.fastest_ar(rows, samples, ids))
    assert "**Fastest AR** on t: ct2-greedy (p50 5.0 ms, BLEU 20.00)" in text
    assert "| padir-a | 21.00 | 1.25x | ar-beam5 | 22.00 | 40.0 | 5.00x |" in text      # beam is the AR that good
    assert "| padir-b | 10.00 | 2.50x | ct2-greedy | 20.00 | 5.0 | 1.25x |" in text
    assert "| padir-c | 30.00 | 2.50x | none: better than every AR |" in text
    assert tables.fastest_ar([r for r in rows if r.paradigm == "ar"], samples, ids) == []
    # The summary: the best BLEU, the fastest within 1 BLEU of it, the best NAR's paired speedups.
    base = [type(r)({**r, "baseline_system": "ar-greedy"}) for r in rows]
    says = "\n".join(tables.run_says(base, samples, "t", ids))
    assert "the best BLEU is padir-c's 30.00; the fastest system within 1 BLEU of it is that one, at p50 4.0 ms" in says
    assert ("The best non-autoregressive system, padir-c (30.00 BLEU), has a p50 speedup of 2.50x against ar-greedy "
            "(10.0 ms) and 1.25x against the fastest AR-side system, ct2-greedy (5.0 ms, 20.00 BLEU)") in says
    # ... and the fastest NAR at most 1 BLEU below AR greedy (padir-a at 21.00 is slower than padir-c), or
    # how far behind the closest is when none is that close.
    assert ("The fastest non-autoregressive system within 1 BLEU of ar-greedy is padir-c (30.00 BLEU, p50 4.0 ms): "
            "2.50x against ar-greedy and 1.25x against ct2-greedy, paired per sentence.") in says
    near = [type(r)({**r, "bleu": 19.0}) if r.system == "padir-c" else r for r in base if r.system != "padir-a"]
    says = "\n".join(tables.run_says(near, samples, "t", ids))
    assert "The fastest non-autoregressive system within 1 BLEU of ar-greedy is padir-c (19.00 BLEU" in says
    far = [r for r in base if r.system not in ("padir-a", "padir-c")]
    says = "\n".join(tables.run_says(far, samples, "t", ids))
    assert "No non-autoregressive system is within 1 BLEU of ar-greedy: the closest, padir-b, is 10.00 behind." in says
    assert tables.run_says(base, samples, "other", ids) == []


def test_display_names_say_the_axes_that_vary_and_stay_unique():
    from bench.report.names import display_names

    padir = dict(family="padir", paradigm="nar", **PADIR_DEFAULTS)
    rows = [fake_row("ar-greedy", family="ar", decoder="greedy"), fake_row("ar-beam5", family="ar", decoder="beam:5"),
            fake_row("ar-6x1-greedy", family="ar", decoder="greedy", layers="6-1"),
            fake_row("ct2-int8-greedy", family="ct2", decoder="int8:greedy", engine_threads=1),
            fake_row("ct2-greedy", family="ct2", decoder="greedy", engine_threads=1),
            fake_row("p4", iterations=4, distill=False, **padir),
            fake_row("p4d", iterations=4, distill=True, **padir),
            fake_row("p4d-k1", iterations=4, distill=True, **{**padir, "length_hyps": 1}),
            fake_row("p1d-u3", iterations=1, distill=True, **{**padir, "unmask_rate": 0.3})]
    shown = display_names(rows)
    assert shown == {"ar-greedy": "AR greedy", "ar-beam5": "AR beam 5", "ar-6x1-greedy": "AR greedy, 6-1 layers",
                     "ct2-int8-greedy": "CTranslate2 greedy, int8", "ct2-greedy": "CTranslate2 greedy, float32",
                     "p4": f"PaDIR T=4 k={d.LENGTH_HYPS} u={d.UNMASK_RATE:g}, raw",
                     "p4d": f"PaDIR T=4 k={d.LENGTH_HYPS} u={d.UNMASK_RATE:g}, distilled",
                     "p4d-k1": f"PaDIR T=4 k=1 u={d.UNMASK_RATE:g}, distilled",
                     "p1d-u3": f"PaDIR T=1 k={d.LENGTH_HYPS} u=0.3, distilled"}
    # Two systems an axis the family does not describe tells apart keep their ids.
    twins = display_names([fake_row("ar-a", family="ar", decoder="greedy"), fake_row("ar-b", family="ar", decoder="greedy")])
    assert twins == {"ar-a": "AR greedy (ar-a)", "ar-b": "AR greedy (ar-b)"}


def test_leaderboard_flags_rows_whose_speed_the_other_systems_changed():
    rows = [fake_row("ar-greedy", interference=1.04, isolated=True), fake_row("ct2-greedy", interference=1.35,
                                                                               isolated=True),
            fake_row("padir-s4", interference=0.82, isolated=True)]
    note = tables.isolation_note(rows)[0]
    assert note.startswith("Each system was timed in a worker process of its own")
    flagged = note.split("Flagged")[1]
    assert "ct2-greedy on t (1.35x)" in flagged and "padir-s4 on t (0.82x)" in flagged and "ar-greedy" not in flagged
    calm = tables.isolation_note(rows[:1])[0]
    assert "Flagged" not in calm and "Every row is within 0.9-1.1" in calm
    assert "one batch a turn" in calm                              # rows from before turns: every call cold
    turned = tables.isolation_note([fake_row("ar-greedy", interference=1.0, isolated=True, turn=10)])[0]
    assert "each decoding 10 batches back to back when its turn came" in turned
    assert tables.isolation_note([fake_row("x")]) == []          # no solo check: nothing to say
    shared = tables.isolation_note([fake_row("ar-greedy", interference=1.0, isolated=True, worker_systems=2),
                                    fake_row("ar-beam5", interference=1.0, isolated=True, worker_systems=2),
                                    fake_row("ct2-greedy", interference=1.0, isolated=True, worker_systems=1)])[0]
    assert "a family's systems shared one where the family allows it (2 of 3 systems)" in shared


PADIR_DEFAULTS = dict(unmask_rate=d.UNMASK_RATE, length_hyps=d.LENGTH_HYPS, remask=d.REMASK, start=d.START,
                      positional_attention=d.POSITIONAL_ATTENTION, stages=d.STAGES, init=d.INIT, recipe=d.RECIPE,
                      glancing=d.GLANCING, length_predictor=d.LENGTH_PREDICTOR, length_bonus=d.LENGTH_BONUS)


def _dial_rows():
    """AR greedy and PaDIR at T = 1 and 4, raw and distilled, on three test sets of 1, 2 and 3 modes."""
    rows, samples = [], []
    for modes, ts in ((1, "d0:test"), (2, "d50:test"), (3, "d100:test")):
        for system, family, paradigm, distill, t in (("ar-greedy", "ar", "ar", False, None),
                                                     ("padir-s1", "padir", "nar", False, 1),
                                                     ("padir-s4", "padir", "nar", False, 4),
                                                     ("padir-s4-distill", "padir", "nar", True, 4)):
            loss = 0.0 if family == "ar" else (modes - 1) * (0.3 if distill else 0.6) / (t or 1)
            padir = {} if family == "ar" else PADIR_DEFAULTS
            rows.append(fake_row(system, ts, family=family, paradigm=paradigm, distill=distill, iterations=t, **padir,
                                 bleu=90 - 30 * loss, exact_match=0.95 - loss, mode_mixing=loss / 2,
                                 stutter_per_1k_words=10 * loss, baseline_system="ar-greedy", variant=None))
        samples += [{"system": "ar-greedy", "test_set": ts, "index": i, "valid_targets": ["x"] * modes}
                    for i in range(3)]
    return rows, samples


def test_the_dial_section_and_plot_read_each_system_by_its_number_of_modes(tmp_path):
    rows, samples = _dial_rows()
    assert tables.valid_target_counts(samples) == {"d0:test": 1, "d50:test": 2, "d100:test": 3}
    text = "\n".join(tables.render_modes(rows, samples))
    assert "## By number of valid targets" in text and "| system | 1 mode | 2 modes | 3 modes |" in text
    assert "| padir-s1 | 0.950 | 0.350 | -0.250 |" in text              # exact match, by modes
    assert tables.render_modes(rows, samples[:3]) == []                    # one number of modes: no dial
    with saved_figures() as figures:
        plots.plot_dial(rows, tables.valid_target_counts(samples), tmp_path / plots.DIAL_PLOT)
    fig = figures[plots.DIAL_PLOT]
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert len(panels) == 2 * len(tables.MODES_METRICS)
    raw, distilled = panels[0], panels[1]                                  # exact match: raw | distilled
    labels = lambda ax: {line.get_label() for line in ax.get_lines()}     # noqa: E731
    assert labels(raw) == {"T=1", "T=4", "ar-greedy"} and labels(distilled) == {"T=4", "ar-greedy"}
    assert all(list(line.get_xdata()) == [1, 2, 3] for line in raw.get_lines())


def test_a_baseline_that_has_not_learned_gets_one_line_and_no_speedups(tmp_path):
    def rows(ar_bleu):
        common = dict(baseline_system="ar-greedy", phase="end_to_end", batch_size=1, platform="cpu", n_sentences=500,
                      speedup_p50_vs_ar=4.0, suite="quick")
        return [fake_row("ar-greedy", "t", family="ar", bleu=ar_bleu, **{**common, "speedup_p50_vs_ar": 1.0}),
                fake_row("padir-s1", "t", family="padir", bleu=0.1, **common)]

    info, env = {"suite": "quick", "run_id": "r"}, {}
    unlearned = pages.render_leaderboard(rows(0.9), info, env, tmp_path)
    assert "**Not learned:** ar-greedy scores 0.90 BLEU here, below 5" in unlearned
    assert "speedup p50" not in unlearned.split("## Reproduce")[0]
    learned = pages.render_leaderboard(rows(20.0), info, env, tmp_path)
    assert "Not learned" not in learned and "speedup p50" in learned
