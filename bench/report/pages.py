"""The report's pages, ``table.md`` and ``leaderboard.md``, and ``write_report``, which writes them and
the plots into a run folder.

Nothing here measures: every figure comes from ``rows.jsonl`` (and the per-sentence plots from
``samples.jsonl``; sacrebleu's paired tests from it too for rows written before narbench ran them,
``RunStore.report_rows``). The pages put prose around the tables of ``bench.report.tables`` and link the
plots of ``bench.report.plots``.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping, Sequence

from bench import store as st
from bench.report.grid import write_grid
from bench.report.plots import (BLEU_VS_ITERATIONS, CURVE_PLOT, DIAL_PLOT, GRID_PAGE, GRID_PLOT, LATENCY_CDF, PARETO,
                                PLOTS, plot_bleu_vs_iterations, plot_dial, plot_latency_cdf, plot_learning_curves,
                                plot_pareto)
from bench.report.names import display_names, render_legend
from bench.report.scale import SCALE_PAGE, write_scale
from bench.gap import GAP_PAGE, write_gap_page
from bench.report.tables import (LATENCY_TABLE, LEADERBOARD, fastest_ar, isolation_note, markdown_table,
                                 near_baseline, render_budgets, render_grid, render_isolation, render_modes,
                                 render_phases, render_significance, run_says, signature_fields, system_order,
                                 test_sets, tests_note, valid_target_counts)
from bench.rows import P99_MIN_N, Row, column
from narbench_core import defaults
from narbench_core.errors import UserError
from narbench_core.io import write_text

NO_BLEURT = "no BLEURT checkpoint"
STUTTER_CLAIM = 2.0        # the paper: non-autoregressive outputs stutter 2x or more as often as AR ones
SPEED_CLAIM = 2.0          # the paper's abstract: a 2-3x speedup over AR with minimal sacrifice in quality


# ------------------------------------------------------------------------------------------ table.md

def render_table(rows: list[Row], info: dict, env: dict) -> str:
    """The paper's Tables 1 and 3 (systems x test sets) plus per-test-set latency tables."""
    order = system_order(rows)
    sets = test_sets(rows)
    by = {r.key: r for r in rows}
    r0 = rows[0]
    lines = [f"# {info['suite']}: run {info['run_id']}", "",
             f"Platform **{r0.platform}** ({env.get('cpu_model') or env.get('device_kind', '?')}, "
             f"{env.get('threads', '?')} threads), batch size {r0.batch_size}, "
             f"{str(r0.phase).replace('_', '-')} latency. "
             "Steps 'N' = autoregressive; '# Hyp.' = beam size (AR) or length hypotheses (PaDIR).", ""]
    lines.extend(render_grid(rows, "Test BLEU (layout of the paper's Table 1)", "bleu"))
    lines.extend(render_budgets(rows))
    if any(r.bleurt is not None for r in rows):
        lines.extend(render_grid(rows, "Test BLEURT (layout of the paper's Table 3)", "bleurt"))
    else:
        lines.extend(["## Test BLEURT (paper's Table 3)", "", f"{NO_BLEURT}: pass `--bleurt-checkpoint DIR` "
                      "(or set NARBENCH_BLEURT) to fill this table.", ""])
    for ts in sets:
        ts_rows = [by[(n, ts)] for n in order if (n, ts) in by]
        lines.extend([f"## {ts}: latency and quality (n = {ts_rows[0].n_sentences} sentences)", "",
                      *markdown_table(ts_rows, LATENCY_TABLE), ""])
    lines.extend(render_significance(rows, order))
    lines.extend(render_phases(rows, order))
    lines.extend(render_isolation(rows, order))
    note = tests_note(rows)
    lines.extend([(note + " " if note else "") +
                  "Speedup: median of per-sentence ratios (AR greedy ms / system ms), sentences timed "
                  f"interleaved; CIs from order statistics. p99 needs n >= {P99_MIN_N} (MLPerf LoadGen rule). "
                  "Bold: the best value of a column.", ""])
    sigs = _signatures(rows, "bleu_signature")
    if sigs:
        lines.extend(["SacreBLEU: " + "; ".join(f"`{s}`" for s in sigs), ""])
    return "\n".join(lines)


def _signatures(rows: Sequence[Row], field: str) -> list[str]:
    return sorted({r[field] for r in rows if r[field]})


def _by_hand(rows: Sequence[Row]) -> list[str]:
    """How to run the paired tests by hand with sacrebleu (from the first row that carries them)."""
    row = next((r for r in rows if r.bleu_ar_signature and r.system != r.baseline_system), None)
    if row is None:
        return []
    ar, bs = signature_fields(row.bleu_ar_signature), signature_fields(row.bleu_bs_signature)
    head = f"sacrebleu REFS -i {row.baseline_system}.txt SYSTEM.txt --tokenize {ar.get('tok', '13a')}"
    return ["sacrebleu's paired tests by hand (one text file per system, its hypotheses from the run's samples in "
            "sentence order; REFS: one file per reference stream):", "", "```",
            f"SACREBLEU_SEED={ar.get('seed')} {head} --paired-ar --paired-ar-n {ar.get('ar')}",
            f"SACREBLEU_SEED={bs.get('seed')} {head} --paired-bs --paired-bs-n {bs.get('bs')}", "```", ""]


# ---------------------------------------------------------------------------------------- leaderboard.md

def stutter_verdict(rows: Sequence[Row]) -> str | None:
    """One line on the paper's claim that non-autoregressive outputs stutter ``STUTTER_CLAIM`` x or more
    as often as autoregressive ones: each row on the other side of the comparison from its baseline
    (AR greedy) against the baseline's stutter per 1k words on the same test set. None without such rows."""
    by_key = {(r.test_set, r.system): r for r in rows}
    ratios, base_values = [], set()
    for r in rows:
        base = by_key.get((r.test_set, r.baseline_system))
        if base is None or r.paradigm == base.paradigm or None in (r.stutter_per_1k_words, base.stutter_per_1k_words):
            continue
        base_values.add(round(base.stutter_per_1k_words, 2))
        ratios.append(math.inf if base.stutter_per_1k_words == 0 else r.stutter_per_1k_words / base.stutter_per_1k_words)
    if not ratios:
        return None
    held = sum(x >= STUTTER_CLAIM for x in ratios)
    n = len(ratios)
    verdict = (f"holds for all {n}" if held == n else f"holds for none of the {n}" if held == 0
               else f"holds for {held} of {n}")
    finite = [x for x in ratios if math.isfinite(x)]
    spread = (f"{min(finite):.1f}x to {max(finite):.1f}x" if finite else "AR greedy has none")
    base = ", ".join(f"{b:.2f}" for b in sorted(base_values))
    return (f"**Stutter** (the paper: {STUTTER_CLAIM:g}x or more the AR's): the claim {verdict} non-autoregressive "
            f"row{'s' if n > 1 else ''} here: {spread} AR greedy's stutter ({base} per 1k words).")


def speed_verdict(rows: Sequence[Row], shown: Mapping[str, str]) -> str | None:
    """One line on the paper's headline claim (its abstract: "2-3x speedup in machine translation with
    minimal sacrifice in quality compared with autoregressive models"), read as: a non-autoregressive row
    at most ``defaults.SAYS_BLEU_MARGIN`` BLEU below its baseline (AR greedy) with a paired p50 speedup of
    ``SPEED_CLAIM`` x or more against it. Per test set, the fastest such row decides (``near_baseline``, as
    in "What this run says"); systems by their display names (``shown``). Test sets whose models have not
    learned the task (``not_learned``) are left out. None when no test set has something to judge."""
    margin = defaults.SAYS_BLEU_MARGIN
    parts = []
    for ts in test_sets(rows):
        base, quick, close = near_baseline(rows, ts)
        if base is None or not_learned([r for r in rows if r.test_set == ts]):
            continue
        if quick is None:
            parts.append(f"on {ts} it does not hold: no non-autoregressive row is within {margin:g} BLEU of AR "
                         f"greedy (the closest, {shown[close.system]}, is {base.bleu - close.bleu:.2f} behind)")
            continue
        holds = quick.speedup_p50_vs_ar is not None and quick.speedup_p50_vs_ar >= SPEED_CLAIM
        parts.append(f"on {ts} it {'holds' if holds else 'does not hold'}: the fastest non-autoregressive row within "
                     f"{margin:g} BLEU of AR greedy, {shown[quick.system]} ({quick.bleu - base.bleu:+.2f} BLEU), runs "
                     f"at {column('speedup_p50_vs_ar').cell(quick)} AR greedy's speed")
    if not parts:
        return None
    return (f"**Speed at equal quality** (the paper's abstract: 2-3x faster than AR \"with minimal sacrifice in "
            f"quality\"; read here as a paired p50 speedup of {SPEED_CLAIM:g}x or more against AR greedy at most "
            f"{margin:g} BLEU below it): " + "; ".join(parts) + ".")


def _theory_links(run_dir: Path) -> list[str]:
    """Relative links to theory pages under ``<results>/theory`` (latest run of each, if any)."""
    theory = run_dir.parent.parent / "theory"
    if not theory.is_dir():
        return []
    links = []
    for sub in sorted(p for p in theory.iterdir() if p.is_dir()):
        latest = sub / st.LATEST
        base = sub / latest.read_text().strip() if latest.is_file() else sub
        for md in sorted(base.glob("*.md")) or sorted(base.rglob("*.md"))[:3]:
            links.append(f"- [{sub.name}: {md.stem}]({Path('..', '..', 'theory', md.relative_to(theory)).as_posix()})")
    return links


def _phase_words(phase: str) -> str:
    """How a row's timing phase reads in prose."""
    return "device-only (the jitted part and the wait)" if phase == "device" else "end-to-end (tokenize to detokenize)"


SPEEDUP_COLUMNS = ("speedup_p50_vs_ar", "bleu_delta_vs_ar")      # comparisons with the baseline


def not_learned(rows: Sequence[Row]) -> str | None:
    """The line a leaderboard prints when a test set's baseline (AR greedy) scores below
    ``defaults.LEARNED_BLEU``: its models have not learned the task, so no comparison is shown."""
    base = next((r for r in rows if r.system == r.baseline_system and r.bleu is not None), None)
    if base is None or base.bleu >= defaults.LEARNED_BLEU:
        return None
    return (f"**Not learned:** {base.system} scores {base.bleu:.2f} BLEU here, below {defaults.LEARNED_BLEU:g}: the "
            "models have not learned this task at this budget, so speedups and deltas against it are not shown "
            "(train longer, e.g. `until = \"plateau\"`).")


def render_leaderboard(rows: list[Row], info: dict, env: dict, run_dir: Path, samples: Sequence[dict] = ()) -> str:
    r0 = rows[0]
    lines = [f"# Leaderboard: {info['suite']} (run {info['run_id']})", "",
             f"Systems sorted by test BLEU. Latency is {_phase_words(r0.phase)} at batch size {r0.batch_size} "
             f"on **{r0.platform}**; speedups are against AR greedy, paired per sentence.", ""]
    apart = sorted({r.system for r in rows if r.baseline_timed_together is False})
    if apart:
        lines.extend([f"Resumed run: {', '.join(apart)} were timed in a later session than AR greedy, so "
                      "their speedups pair latencies measured apart (not interleaved).", ""])
    has_bleurt = any(r.bleurt is not None for r in rows)
    names = [n for n in LEADERBOARD if has_bleurt or n != "bleurt"]
    shown = display_names(rows)
    for ts in test_sets(rows):
        ts_rows = sorted((r for r in rows if r.test_set == ts), key=lambda r: -(r.bleu if r.bleu is not None else -1e9))
        unlearned = not_learned(ts_rows)
        columns = [n for n in names if not (unlearned and n in SPEEDUP_COLUMNS)]
        lines.extend([f"## {ts}", "", *([unlearned, ""] if unlearned else run_says(rows, samples, ts, shown)),
                      *markdown_table(ts_rows, columns, rank=True, shown=shown), ""])
    lines.extend(render_legend(rows, system_order(rows)))
    if not has_bleurt:
        lines.extend([f"BLEURT: {NO_BLEURT} (pass `--bleurt-checkpoint DIR` or set NARBENCH_BLEURT).", ""])
    for verdict in (speed_verdict(rows, shown), stutter_verdict(rows)):
        if verdict:
            lines.extend([verdict, ""])
    lines.extend(render_modes(rows, samples))
    if (run_dir / st.SERVING).is_file():
        from bench.serving.report import leaderboard_section

        lines.extend(leaderboard_section(st.RunStore(run_dir).serving(), shown))
    lines.extend(isolation_note(rows))
    lines.extend(fastest_ar(rows, samples, shown))
    note = tests_note(rows)
    lines.extend([(note + " " if note else "") + "Bold: the best value of a column. Speedup: the median of "
                  "per-sentence latency ratios against AR greedy, timed interleaved [95% CI]. Train steps and seconds: "
                  "the training budget of the system's model (seconds in train steps only); still improving: "
                  f"{column('still_improving').doc}; the curves are in learning_curves.png and curves.jsonl. chrF, "
                  "length ratio, stutter, passes, training FLOPs, where the time goes and both paired tests' "
                  "p-values with BLEU's bootstrap CI: [table.md](table.md).", ""])
    sigs = [s for name in ("bleu_signature", "chrf_signature", "bleu_ar_signature", "bleu_bs_signature")
            for s in _signatures(rows, name)]
    lines.extend(["## Reproduce", "", "```", info.get("command") or "narbench run", "```", "",
                  "SacreBLEU signatures: " + "; ".join(f"`{s}`" for s in sigs), "", *_by_hand(rows)])
    versions = env.get("versions", {})
    git = env.get("git", {})
    lines.extend(["## Environment", "", "```",
                  f"platform     {env.get('platform')} ({env.get('device_kind')}, {env.get('device_count')} device(s))",
                  f"cpu          {env.get('cpu_model')}, {env.get('threads')} threads, {env.get('cores')} cores",
                  "versions     " + ", ".join(f"{k} {v}" for k, v in versions.items() if v),
                  f"python       {env.get('python')}",
                  f"git          {git.get('commit')}{' (dirty)' if git.get('dirty') else ''}",
                  f"date (UTC)   {env.get('date_utc')}",
                  f"seeds        {env.get('seeds')}",
                  f"run          started {info.get('started')}, finished {info.get('finished', 'not yet')}",
                  "```", ""])
    samples = st.RunStore(run_dir).samples_name
    lines.extend(["## Files", "", "- [table.md](table.md) (paper layout), [rows.jsonl](rows.jsonl), "
                  f"[{samples}]({samples}), [spec.toml](spec.toml), "
                  "[env.json](env.json)"
                  + (f", [{st.CURVES}]({st.CURVES})" if (run_dir / st.CURVES).is_file() else ""),
                  *([f"- [{GRID_PAGE}]({GRID_PAGE}): what each ablation axis costs and buys"]
                    if (run_dir / GRID_PAGE).is_file() else []),
                  *([f"- [{SCALE_PAGE}]({SCALE_PAGE}): the AR-NAR gap against model size"]
                    if (run_dir / SCALE_PAGE).is_file() else []),
                  *([f"- [{GAP_PAGE}]({GAP_PAGE}): where the gap goes (`narbench gap`: decode-time diagnostics)"]
                    if (run_dir / GAP_PAGE).is_file() else []),
                  *(["- [serving.md](serving.md): the systems served under load by MLPerf LoadGen"]
                    if (run_dir / "serving.md").is_file() else []),
                  *(f"- ![{p}]({p})" for p in (*PLOTS, CURVE_PLOT, DIAL_PLOT, GRID_PLOT) if (run_dir / p).is_file()),
                  ""])
    theory = _theory_links(run_dir)
    if theory:
        lines.extend(["## Theory suites", "", *theory, ""])
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- entry

def write_report(run_dir: str | Path, finished: str | None = None) -> list[Path]:
    """Write ``table.md``, ``leaderboard.md`` and the plots into the run folder (``learning_curves.png``
    when it has ``curves.jsonl``; ``grid.md`` and ``grid.png`` when a family's rows vary an ablation axis; ``scale.md``
    and ``scale.png`` on a size axis).
    ``finished``: the time the run is about to be marked finished (``narbench run`` writes the report first)."""
    import matplotlib

    matplotlib.use("Agg")
    run = st.RunStore(st.resolve_run_dir(run_dir))
    samples = run.samples()
    rows = run.report_rows(samples)
    if not rows:
        raise UserError(f"{run.path} has no finished cells yet; run `narbench run` until some finish")
    info, env = {"run_id": run.run_id, "suite": rows[0].suite, **run.info}, run.env()
    if finished is not None:
        info["finished"] = finished
    scored = [r for r in rows if r.bleu is not None]
    if scored:
        plot_pareto(scored, run.path / PARETO)
        plot_bleu_vs_iterations(scored, run.path / BLEU_VS_ITERATIONS)
    plot_latency_cdf(rows, samples, run.path / LATENCY_CDF)
    curves = run.curves()
    if curves:
        plot_learning_curves(curves, run.path / CURVE_PLOT)
    modes = valid_target_counts(samples)
    if len(set(modes.values())) > 1:
        plot_dial(rows, modes, run.path / DIAL_PLOT)
    settings = run.spec_settings()
    grid = write_grid(run.path, rows, samples, info, settings["bootstrap_resamples"], defaults.SIGNIFICANCE_SEED)
    grid += write_scale(run.path, rows, samples, info, settings["bootstrap_resamples"], defaults.SIGNIFICANCE_SEED)
    grid += write_gap_page(run.path, rows, info)
    served = run.serving() if (run.path / st.SERVING).is_file() else []
    if served:
        from bench.serving import report as serving_report

        grid = [*grid, *serving_report.write(run.path, served, display_names(rows), run.serving_settings(), env,
                                             run.run_id)]
    write_text(run.path / "table.md", render_table(rows, info, env))
    write_text(run.path / "leaderboard.md", render_leaderboard(rows, info, env, run.path, samples))
    return [run.path / "table.md", run.path / "leaderboard.md", *grid,
            *(run.path / p for p in (*PLOTS, CURVE_PLOT, DIAL_PLOT) if (run.path / p).is_file())]
