"""Writers for a run folder: ``table.md``, ``leaderboard.md`` and plots.

Nothing here measures: every figure comes from ``rows.jsonl`` (and the per-sentence plots from
``samples.jsonl``). Tables render cells from the one column list (``bench.rows``); families give
their rows' order, plot labels and styles (``bench.families``).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

from bench import families, store as st
from bench.rows import P99_MIN_N, Row, column
from narbench_core import defaults
from narbench_core.errors import UserError
from narbench_core.io import write_text
from narbench_core.markdown import table
from narbench_core.phases import PHASES

NO_BLEURT = "no BLEURT checkpoint"
PLOTS = ("pareto.png", "latency_cdf.png", "bleu_vs_steps.png")
CURVE_PLOT = "learning_curves.png"       # drawn when the run has curves.jsonl (models trained with curves)

# The tables, each a list of columns (``bench.rows.VIEWS`` adds composite cells such as "p50 [CI]").
SUMMARY = ("system", "family", "hypotheses", "steps_view")
LATENCY_TABLE = ("system", "hypotheses", "steps_view", "bleu", "bleu_delta_vs_ar", "p50_view", "latency_p99_ms",
                 "speedup_p50_vs_ar", "passes_view", "stutter_per_1k_words", "stutter_sentence_share", "length_ratio",
                 "compile_s")
LEADERBOARD = ("system", "family", "hypotheses", "steps_view", "bleu", "train_steps", "train_seconds", "train_flops",
               "still_improving", "bleu_delta_vs_ar", "chrf", "bleurt",
               "latency_p50_ms", "latency_p99_ms", "speedup_p50_vs_ar", "interference", "stutter_per_1k_words",
               "length_ratio")
ISOLATION_TABLE = ("system", "isolated", "engine_threads", "latency_p50_ms", "solo_p50_ms", "interference",
                   "worker_peak_rss_mb")
PHASE_TABLE = ("system", "hypotheses", "steps_view", *(f"phase_{p}_view" for p in PHASES), "phase_p50_sum_ratio",
               "latency_p50_ms", "host_syncs")
STUTTER_CLAIM = 2.0        # the paper: non-autoregressive outputs stutter 2x or more as often as AR ones
RESULTS = ("system", "test_set", "family", "steps_view", "bleu", "chrf", "bleurt", "latency_p50_ms",
           "latency_p99_ms", "speedup_p50_vs_ar", "passes_mean", "stutter_per_1k_words", "n_sentences")


# ------------------------------------------------------------------------------------------ tables

def markdown_table(rows: Sequence[Row], names: Sequence[str], rank: bool = False, mark_best: bool = True) -> list[str]:
    """A markdown table of ``rows`` with the named columns; the best value of each score is bold."""
    cols = [column(n) for n in names]
    best = {}
    for c in cols:
        values = [r[c.name] for r in rows if c.render is None and c.higher_is_better is not None
                  and r[c.name] is not None]
        if mark_best and len(values) > 1:
            best[c.name] = max(values) if c.higher_is_better else min(values)
    cells = [[f"**{c.cell(r)}**" if c.name in best and r[c.name] == best[c.name] else c.cell(r) for c in cols]
             for r in rows]
    align = "".join("l" if c.align == "left" else "r" for c in cols)
    if rank:
        return table(["#", *(c.header for c in cols)], ([i, *row] for i, row in enumerate(cells, 1)), "r" + align)
    return table([c.header for c in cols], cells, align)


def system_order(rows: Sequence[Row]) -> list[str]:
    """Systems by family (registry order), then each family's own order."""
    first: dict[str, Row] = {}
    for r in rows:
        first.setdefault(r.system, r)
    return sorted(first, key=lambda n: (families.rank(first[n].family), families.get(first[n].family).sort_key(first[n])))


def test_sets(rows: Sequence[Row]) -> list[str]:
    return list(dict.fromkeys(r.test_set for r in rows))


def _signatures(rows: Sequence[Row], field: str) -> list[str]:
    return sorted({r[field] for r in rows if r[field]})


def render_table(rows: list[Row], info: dict, env: dict) -> str:
    """The paper's Tables 1 and 3 (systems x test sets) plus per-test-set latency tables."""
    order = system_order(rows)
    sets = test_sets(rows)
    by = {r.key: r for r in rows}
    first = [next(r for r in rows if r.system == name) for name in order]
    r0 = rows[0]
    lines = [f"# {info['suite']}: run {info['run_id']}", "",
             f"Platform **{r0.platform}** ({env.get('cpu_model') or env.get('device_kind', '?')}, "
             f"{env.get('threads', '?')} threads), batch size {r0.batch_size}, "
             f"{str(r0.phase).replace('_', '-')} latency. "
             "Steps 'N' = autoregressive; '# Hyp.' = beam size (AR) or length hypotheses (PaDIR).", ""]

    def grid(title: str, metric: str) -> None:
        fmt = column(metric).fmt
        head = markdown_table(first, SUMMARY, mark_best=False)
        lines.extend([f"## {title}", "", head[0] + " " + " | ".join(sets) + " |", head[1] + "---:|" * len(sets)])
        for row, line in zip(first, head[2:]):
            lines.append(line + " " + " | ".join(fmt(by[(row.system, ts)][metric]) if (row.system, ts) in by else ""
                                                 for ts in sets) + " |")
        lines.append("")

    grid("Test BLEU (layout of the paper's Table 1)", "bleu")
    lines.extend(render_budgets(rows))
    if any(r.bleurt is not None for r in rows):
        grid("Test BLEURT (layout of the paper's Table 3)", "bleurt")
    else:
        lines.extend(["## Test BLEURT (paper's Table 3)", "", f"{NO_BLEURT}: pass `--bleurt-checkpoint DIR` "
                      "(or set NARBENCH_BLEURT) to fill this table.", ""])
    for ts in sets:
        ts_rows = [by[(n, ts)] for n in order if (n, ts) in by]
        lines.extend([f"## {ts}: latency and quality (n = {ts_rows[0].n_sentences} sentences)", "",
                      *markdown_table(ts_rows, LATENCY_TABLE), ""])
    lines.extend(render_phases(rows, order))
    lines.extend(render_isolation(rows, order))
    lines.extend(["ΔBLEU: paired bootstrap against AR greedy on the same sentences; * p < 0.05, ** p < 0.01. "
                  "Speedup: median of per-sentence ratios (AR greedy ms / system ms), sentences timed "
                  f"interleaved; CIs from order statistics. p99 needs n >= {P99_MIN_N} (MLPerf LoadGen rule). "
                  "Bold: the best value of a column.", ""])
    sigs = _signatures(rows, "bleu_signature")
    if sigs:
        lines.extend(["SacreBLEU: " + "; ".join(f"`{s}`" for s in sigs), ""])
    return "\n".join(lines)


def render_isolation(rows: Sequence[Row], order: Sequence[str]) -> list[str]:
    """Where each system ran, with how many threads, and its solo check (first test set with one)."""
    ts = next((t for t in test_sets(rows) if any(r.test_set == t and r.interference is not None for r in rows)), None)
    if ts is None:
        return []
    ts_rows = [r for n in order for r in rows if r.system == n and r.test_set == ts]
    return [f"## Isolation and the solo check: {ts}", "", *markdown_table(ts_rows, ISOLATION_TABLE, mark_best=False),
            "", *isolation_note(rows)]


def render_phases(rows: Sequence[Row], order: Sequence[str]) -> list[str]:
    """"Where the time goes": each system's p50 per phase, once per timed measurement (test sets that
    score the same timed hypotheses, e.g. ``test`` and ``test+refs``, share one table); [] before phases."""
    lines: list[str] = []
    seen: dict[tuple, list[str]] = {}
    for ts in test_sets(rows):
        here = {r.system: r for r in rows if r.test_set == ts and r.phase_p50_ms}
        if here:
            key = tuple((n, here[n].latency_p50_ms) for n in order if n in here)
            seen.setdefault(key, []).append(ts)
    for key, names in seen.items():
        ts_rows = [r for n, _ in key for r in rows if r.system == n and r.test_set == names[0]]
        lines.extend([f"## Where the time goes: {', '.join(names)} (p50 ms per phase)", "",
                      *markdown_table(ts_rows, PHASE_TABLE, mark_best=False), "",
                      "Each call's phases add up to its latency exactly (they split one timed window); "
                      "'phases / p50' sums the phases' p50s over the latency p50. Encode: the encoder, with "
                      "length prediction for PaDIR (CTranslate2 does not expose it: inside its passes). Host "
                      "sync: device values read back (PaDIR's predicted lengths, the results).", ""])
    return lines


def render_budgets(rows: Sequence[Row]) -> list[str]:
    """The "Training budgets" table: one line per trained model (the rows' ``model``), with its FLOPs
    as a share of its baseline (AR) model's; [] when no row has a trained model."""
    order = {name: i for i, name in enumerate(system_order(rows))}
    first: dict[str, Row] = {}
    for r in sorted(rows, key=lambda r: (r.task, order[r.system])):   # per task, in the order of the systems
        if r.model is not None:
            first.setdefault(r.model, r)
    if not first:
        return []
    by_system = {(r.task, r.system): r for r in rows}
    base_label = families.get(families.BASELINE).label
    names = ("family", "train_steps", "train_tokens", "train_seconds", "train_flops")
    tail = ("warm_start_seconds", "distill_seconds", "still_improving", "dev_length_exact", "dev_length_within2")
    body = []
    for model, r in first.items():
        base = by_system.get((r.task, r.baseline_system))
        share = (r.train_flops / base.train_flops if base is not None and r.train_flops is not None
                 and base.train_flops else None)
        body.append([model, *(column(n).cell(r) for n in names), "–" if share is None else f"{100 * share:.0f}%",
                     *(column(n).cell(r) for n in tail)])
    header = ["model", *(column(n).header for n in names), f"FLOPs / {base_label}", *(column(n).header for n in tail)]
    lines = ["## Training budgets", "", *table(header, body, "ll")]
    lines.extend(["", "Seconds: in train steps only (compiling, checkpoints and dev evaluation excluded). FLOPs: XLA's "
                  "cost analysis of each step's compiled train step, summed. Warm-start s: the train s of the model "
                  "a warm-started one starts from (its total budget is both). Distill s: the teacher's decoding of "
                  "the distilled training data. Len exact / ±2: dev sentences whose top predicted length is exact "
                  "or within 2 tokens (models with a length predictor). Curves: learning_curves.png.", ""])
    return lines


# ---------------------------------------------------------------------------------------- leaderboard

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


FASTEST_AR = ("System", "BLEU", "vs AR greedy", "fastest AR at >= its BLEU", "its BLEU", "its p50 ms",
              "speedup p50 [95% CI]")


def fastest_ar(rows: Sequence[Row], samples: Sequence[dict]) -> list[str]:
    """Per test set: the fastest AR-side system (lowest p50, any family: JAX AR, CTranslate2 ...), and
    for each non-autoregressive row its paired per-sentence p50 speedup against the fastest AR-side
    row whose BLEU is at least its own (the AR a user would deploy instead). Empty without NAR rows."""
    from bench.measure import stats

    lat: dict[tuple[str, str], dict[int, float]] = {}
    for s in samples:
        lat.setdefault((s["system"], s["test_set"]), {})[s["index"]] = s["latency_ms"]
    lines: list[str] = []
    for ts in test_sets(rows):
        here = [r for r in rows if r.test_set == ts and r.latency_p50_ms is not None]
        ar = sorted((r for r in here if r.paradigm == "ar"), key=lambda r: r.latency_p50_ms)
        nar = sorted((r for r in here if r.paradigm != "ar" and r.bleu is not None), key=lambda r: -r.bleu)
        if not ar or not nar:
            continue
        top = ar[0]
        lines.extend([f"**Fastest AR** on {ts}: {top.system} (p50 {top.latency_p50_ms:.1f} ms"
                      + (f", BLEU {top.bleu:.2f}" if top.bleu is not None else "") + "). Each non-autoregressive "
                      "system against the fastest AR-side system at equal or better BLEU (paired per sentence):", ""])
        body = []
        for r in nar:
            rival = next((a for a in ar if a.bleu is not None and a.bleu >= r.bleu), None)
            greedy = "-" if r.speedup_p50_vs_ar is None else f"{r.speedup_p50_vs_ar:.2f}x"
            if rival is None:
                body.append([r.system, f"{r.bleu:.2f}", greedy, "none: better than every AR", "-", "-", "-"])
                continue
            a, b = lat.get((rival.system, ts), {}), lat.get((r.system, ts), {})
            common = sorted(set(a) & set(b))
            if common:
                sp = stats.paired_speedup([a[i] for i in common], [b[i] for i in common])
                ci = "" if sp.ci is None else f" [{sp.ci[0]:.2f}, {sp.ci[1]:.2f}]"
                cell = f"{sp.median:.2f}x{ci}"
            else:
                cell = "-"
            body.append([r.system, f"{r.bleu:.2f}", greedy, rival.system, f"{rival.bleu:.2f}",
                         f"{rival.latency_p50_ms:.1f}", cell])
        lines.extend([*table(FASTEST_AR, body, "lrrl"), ""])
    return lines


def _schedule_text(rows: Sequence[Row]) -> str:
    """How the rows were scheduled: rows from before turns (``turn`` absent) ran one batch a turn with the
    solo check after the schedule; since then the solo rounds are spread through it."""
    turns = sorted({r.turn or 1 for r in rows})
    if all(r.turn is None for r in rows):
        return (", each call following the other systems' calls (one batch a turn); after the interleaved "
                "schedule, each was timed again alone")
    return (f", each decoding {'/'.join(map(str, turns))} batches back to back when its turn came (after one "
            "untimed call, so its caches were its own); in solo rounds spread through the schedule, each was "
            "timed again alone")


def isolation_note(rows: Sequence[Row]) -> list[str]:
    """How the systems were kept apart while timed, and a flag on every row the others slowed (or sped up)."""
    timed = [r for r in rows if r.interference is not None]
    if not timed:
        return []
    lo, hi = defaults.INTERFERENCE_OK
    isolated = all(r.isolated for r in timed)
    lines = [("Each system was timed in a worker process of its own" if isolated else
              "The systems shared one process while timed") + _schedule_text(timed) + " on a seeded sample of the "
             "sentences (solo check). In suite / solo is the p50 over those sentences in the schedule divided by their "
             "solo p50."]
    off = [r for r in timed if not lo <= r.interference <= hi]
    if off:
        lines[0] += (f" **Flagged (outside {lo:g}-{hi:g}, the other systems changed its speed):** "
                     + ", ".join(f"{r.system} on {r.test_set} ({r.interference:.2f}x)" for r in off) + ".")
    else:
        lines[0] += f" Every row is within {lo:g}-{hi:g}."
    return [*lines, ""]


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
    for ts in test_sets(rows):
        ts_rows = sorted((r for r in rows if r.test_set == ts), key=lambda r: -(r.bleu if r.bleu is not None else -1e9))
        lines.extend([f"## {ts}", "", *markdown_table(ts_rows, names, rank=True), ""])
    if not has_bleurt:
        lines.extend([f"BLEURT: {NO_BLEURT} (pass `--bleurt-checkpoint DIR` or set NARBENCH_BLEURT).", ""])
    verdict = stutter_verdict(rows)
    if verdict:
        lines.extend([verdict, ""])
    lines.extend(isolation_note(rows))
    lines.extend(fastest_ar(rows, samples))
    lines.extend(["ΔBLEU: paired bootstrap against AR greedy; * p < 0.05, ** p < 0.01. Bold: the best value of a "
                  "column. Len ratio: hypothesis words / reference words. Full tables with CIs, passes and stutter: "
                  "[table.md](table.md).", "",
                  "Train steps, seconds and FLOPs: the training budget of the system's model (seconds in train "
                  "steps only; FLOPs from XLA's cost analysis of the compiled train step, summed over steps; "
                  f"per model in table.md). Still improving: {column('still_improving').doc}; the curves are in "
                  "learning_curves.png and curves.jsonl.", ""])
    sigs = _signatures(rows, "bleu_signature") + _signatures(rows, "chrf_signature")
    lines.extend(["## Reproduce", "", "```", info.get("command") or "narbench run", "```", "",
                  "SacreBLEU signatures: " + "; ".join(f"`{s}`" for s in sigs), ""])
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
    lines.extend(["## Files", "", "- [table.md](table.md) (paper layout), [rows.jsonl](rows.jsonl), "
                  "[samples.jsonl](samples.jsonl), [spec.toml](spec.toml), [env.json](env.json)"
                  + (f", [{st.CURVES}]({st.CURVES})" if (run_dir / st.CURVES).is_file() else ""),
                  *(f"- ![{p}]({p})" for p in (*PLOTS, CURVE_PLOT) if (run_dir / p).is_file()), ""])
    theory = _theory_links(run_dir)
    if theory:
        lines.extend(["## Theory suites", "", *theory, ""])
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- plots

def _axes_grid(n: int, plt, width: float = 6.0, height: float = 4.6):
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def _latency_axis(ax, values: list[float]) -> None:
    """Log scale when latencies span more than a decade, else linear; plain-number tick labels."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    lo, hi = min(values), max(values)
    if lo > 0 and hi / lo > 10:
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(ax.get_xlabel() + " (log scale)")


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of points not dominated (lower latency and higher BLEU), sorted by latency."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front, best = [], -math.inf
    for i in order:
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return front


def _place_labels(ax, points: list[tuple[float, float]], labels: list[str]) -> None:
    """Annotate points, moving each label to the first nearby slot that overlaps no earlier label."""
    fig = ax.figure
    fig.canvas.draw()
    placed: list[tuple[float, float, float, float]] = []
    offsets = [(6, 4), (6, -12), (-8, 6), (-8, -14), (6, 14), (6, -22), (-8, 16), (-8, -24), (6, 24), (6, -32)]
    for (x, y), text in sorted(zip(points, labels), key=lambda pl: (pl[0][0], -pl[0][1])):
        px, py = ax.transData.transform((x, y))
        w, h = 5.6 * len(text) * fig.dpi / 100, 9 * fig.dpi / 100
        for dx, dy in offsets:
            left = px + dx * fig.dpi / 72 - (w if dx < 0 else 0)
            box = (left, py + dy * fig.dpi / 72, left + w, py + dy * fig.dpi / 72 + h)
            if not any(box[0] < b[2] and b[0] < box[2] and box[1] < b[3] and b[1] < box[3] for b in placed):
                break
        placed.append(box)
        ax.annotate(text, (x, y), textcoords="offset points", xytext=(dx, dy), fontsize=7, color="#333",
                    ha="right" if dx < 0 else "left")


def _style(row: Row) -> dict:
    return families.get(row.family).style(row)


def plot_pareto(rows: list[Row], path: Path) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    sets = test_sets(rows)
    fig, axes = _axes_grid(len(sets), plt)
    legend: dict[str, dict] = {}
    for ax, ts in zip(axes, sets):
        rs = [r for r in rows if r.test_set == ts and r.bleu is not None]
        pts = [(r.latency_p50_ms, r.bleu) for r in rs]
        for r, (x, y) in zip(rs, pts):
            style = _style(r)
            legend.setdefault(style["label"], style)
            ax.scatter(x, y, s=46, zorder=3, color=style["color"], marker=style["marker"])
        front = pareto_front(pts)
        if front:
            fx, fy = [pts[i][0] for i in front], [pts[i][1] for i in front]
            ax.step(fx, fy, where="post", color="#555", lw=1.2, ls="--", zorder=2)
            ax.scatter(fx, fy, s=170, facecolors="none", edgecolors="#222", lw=1.2, zorder=4)
        ax.set_xlabel("p50 latency per sentence, ms")
        _latency_axis(ax, [p[0] for p in pts] or [1.0])
        ax.set_ylabel("BLEU")
        ax.set_title(ts, fontsize=10)
        ax.grid(alpha=0.3, which="both")
        ax.margins(x=0.18, y=0.15)
        _place_labels(ax, pts, [families.get(r.family).point_label(r) for r in rs])
    handles = [Line2D([], [], ls="", marker=s["marker"], color=s["color"], label=label) for label, s in legend.items()]
    handles.append(Line2D([], [], ls="--", color="#555", marker="o", mfc="none", mec="#222", label="Pareto front"))
    axes[0].legend(handles=handles, fontsize=8, loc="best")
    fig.suptitle(f"Quality vs latency (batch {rows[0].batch_size}, {rows[0].platform})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_latency_cdf(rows: list[Row], samples: list[dict], path: Path) -> None:
    """One line per system: AR-paradigm systems in greys, the others in colours (distilled solid)."""
    import matplotlib.pyplot as plt
    import numpy as np

    sets = test_sets(rows)
    order = system_order(rows)
    fig, axes = _axes_grid(len(sets), plt)
    first = {name: next(r for r in rows if r.system == name) for name in order}
    others = [name for name, r in first.items() if r.paradigm != "ar"]
    cmap = plt.get_cmap("viridis")
    greys = ["#000000", "#7f7f7f", "#4a4a4a", "#b0b0b0"]
    colors, styles, n_ar = {}, {}, 0
    for name, r in first.items():
        if r.paradigm == "ar":
            colors[name], styles[name] = greys[n_ar % len(greys)], "-"
            n_ar += 1
        else:
            colors[name] = cmap(0.85 * others.index(name) / max(1, len(others) - 1))
            styles[name] = "-" if r.distill else "--"
    for ax, ts in zip(axes, sets):
        for name in order:
            lat = np.sort([s["latency_ms"] for s in samples if s["test_set"] == ts and s["system"] == name])
            if lat.size == 0:
                continue
            y = np.arange(1, lat.size + 1) / lat.size
            ax.step(lat, y, where="post", color=colors[name], ls=styles[name], lw=1.5, label=name)
        ax.axhline(0.5, color="#999", lw=0.8)
        ax.axhline(0.99, color="#999", lw=0.8)
        ax.set_xlabel("latency per sentence, ms")
        _latency_axis(ax, [x for line in ax.get_lines() for x in line.get_xdata()] or [1.0])
        ax.set_ylabel("share of sentences")
        ax.set_ylim(0, 1.01)
        ax.set_title(ts, fontsize=10)
        ax.grid(alpha=0.3, which="both")
    axes[-1].legend(fontsize=7, loc="lower right", ncol=1 if len(order) <= 8 else 2)
    fig.suptitle("Latency CDF (grey lines: p50 and p99)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_learning_curves(points: list[dict], path: Path) -> None:
    """Dev BLEU and dev NLL against training seconds, one line per trained model (``curves.jsonl``)."""
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(p["model"] for p in points))
    legend_rows = len(models)                                 # one per row: model names are long
    fig, (bleu_ax, nll_ax) = plt.subplots(1, 2, figsize=(12, 4.6 + 0.22 * legend_rows))
    cmap = plt.get_cmap("tab10")
    for i, model in enumerate(models):
        pts = sorted((p for p in points if p["model"] == model), key=lambda p: p["step"])
        style = {"color": cmap(i % 10), "ls": ["-", "--", ":"][i // 10 % 3], "marker": "o", "ms": 3, "lw": 1.5}
        seconds = [p["seconds"] for p in pts]
        bleu_ax.plot(seconds, [p["dev_bleu"] for p in pts], label=model, **style)
        nll_ax.plot(seconds, [p["dev_nll"] for p in pts], label=model, **style)
    for ax, what in ((bleu_ax, "dev BLEU"), (nll_ax, "dev NLL per target token")):
        ax.set_xlabel("training seconds (train steps only)")
        ax.set_ylabel(what)
        ax.grid(alpha=0.3)
    fig.suptitle("Learning curves (dev sample, seeded)")
    bottom = (0.3 + 0.22 * legend_rows) / fig.get_figheight()
    fig.tight_layout(rect=(0, bottom, 1, 1))
    handles, labels = bleu_ax.get_legend_handles_labels()     # below the axes: model names are long
    fig.legend(handles, labels, loc="lower center", ncol=1, fontsize=7, frameon=False)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_bleu_vs_steps(rows: list[Row], path: Path) -> None:
    """A line over steps per variant (systems that differ only in steps); other systems as levels."""
    import matplotlib.pyplot as plt

    sets = test_sets(rows)
    fig, axes = _axes_grid(len(sets), plt)
    palettes = {True: ["#c0392b", "#8e44ad", "#d35400", "#7b241c"], False: ["#e67e22", "#16a085", "#f1c40f", "#7f8c8d"]}
    for ax, ts in zip(axes, sets):
        rs = [r for r in rows if r.test_set == ts and r.bleu is not None]
        variants: dict[str, list[Row]] = {}
        for r in rs:
            if r.variant is not None:
                variants.setdefault(r.variant, []).append(r)
        used = {True: 0, False: 0}
        for label, vr in sorted(variants.items()):
            vr = sorted(vr, key=lambda r: r.steps)
            distilled = bool(vr[0].distill)
            color = palettes[distilled][used[distilled] % 4]
            used[distilled] += 1
            ax.plot([r.steps for r in vr], [r.bleu for r in vr], marker="o", lw=1.6, color=color,
                    ls="-" if distilled else "--", label=label)
        levels = sorted((r for r in rs if r.variant is None), key=lambda r: (families.rank(r.family), r.hypotheses))
        for j, r in enumerate(levels):
            ax.axhline(r.bleu, color="#1f4e79", lw=1.2, ls=[":", "-.", "--"][j % 3], label=r.system)
        steps = sorted({r.steps for r in rs if r.variant is not None})
        if steps:
            ax.set_xscale("log", base=2)
            ax.set_xticks(steps, [str(s) for s in steps])
            ax.minorticks_off()
        ax.set_xlabel("refinement steps T (decoder passes)")
        ax.set_ylabel("BLEU")
        ax.set_title(ts, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    fig.suptitle("Quality vs refinement steps")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------- entry

def write_report(run_dir: str | Path) -> list[Path]:
    """Write ``table.md``, ``leaderboard.md`` and the plots into the run folder (``learning_curves.png``
    when it has ``curves.jsonl``)."""
    import matplotlib

    matplotlib.use("Agg")
    run = st.RunStore(st.resolve_run_dir(run_dir))
    rows, samples = run.rows(), run.samples()
    if not rows:
        raise UserError(f"{run.path} has no finished cells yet; run `narbench run` until some finish")
    info, env = {"run_id": run.run_id, "suite": rows[0].suite, **run.info}, run.env()
    scored = [r for r in rows if r.bleu is not None]
    if scored:
        plot_pareto(scored, run.path / "pareto.png")
        plot_bleu_vs_steps(scored, run.path / "bleu_vs_steps.png")
    plot_latency_cdf(rows, samples, run.path / "latency_cdf.png")
    curves = run.curves()
    if curves:
        plot_learning_curves(curves, run.path / CURVE_PLOT)
    write_text(run.path / "table.md", render_table(rows, info, env))
    write_text(run.path / "leaderboard.md", render_leaderboard(rows, info, env, run.path, samples))
    return [run.path / "table.md", run.path / "leaderboard.md", *(run.path / p for p in (*PLOTS, CURVE_PLOT) if (run.path / p).is_file())]
