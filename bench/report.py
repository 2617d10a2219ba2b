"""Writers for a run folder: ``table.md``, ``leaderboard.md``, plots, and ``verify_run``.

Nothing here measures: every figure comes from ``rows.jsonl`` (and the per-sentence plots from
``samples.jsonl``). ``verify_run`` recomputes every row's figures from ``samples.jsonl``.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from bench import store as st
from narbench_core.io import write_text
from bench.stats import min_samples

P99_MIN_N = min_samples(0.99)
NO_BLEURT = "no BLEURT checkpoint"
PLOTS = ("pareto.png", "latency_cdf.png", "bleu_vs_steps.png")


# ------------------------------------------------------------------------------------------ helpers

def _f(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.{digits}f}"


def _ms(value: Any) -> str:
    """Milliseconds with enough digits for sub-millisecond figures."""
    if value is None:
        return "–"
    return f"{value:.3f}" if value < 1 else f"{value:.2f}" if value < 10 else f"{value:.1f}"


def _ms_ci(ci: Any) -> str:
    return "(CI: n too small)" if not ci else f"[{_ms(ci[0])}, {_ms(ci[1])}]"


def _stars(p: float | None) -> str:
    if p is None:
        return ""
    return "**" if p < 0.01 else "*" if p < 0.05 else ""


def _hyp(row: dict) -> str:
    return str(row.get("hypotheses") or row.get("length_hyps") or 1)


def _steps(row: dict) -> str:
    return "N" if row.get("family") == "ar" else str(row.get("steps"))


def _system_order(rows: list[dict]) -> list[str]:
    """AR systems first (greedy, then beams), then PaDIR by distill, unmask rate, steps, name."""
    def key(row):
        if row["family"] == "ar":
            return (0, row.get("hypotheses") or 1, 0, 0, row["system"])
        return (1, bool(row.get("distill")), row.get("unmask_rate") or 0, row.get("steps") or 0, row["system"])

    seen: dict[str, tuple] = {}
    for row in rows:
        seen.setdefault(row["system"], key(row))
    return sorted(seen, key=seen.get)


def _test_sets(rows: list[dict]) -> list[str]:
    return list(dict.fromkeys(r["test_set"] for r in rows))


def _p99(row: dict) -> str:
    n = row.get("n_sentences") or 0
    return _ms(row.get("latency_p99_ms")) if n >= P99_MIN_N else f"n too small ({n} < {P99_MIN_N})"


def _speedup(row: dict) -> str:
    if row.get("speedup_p50_vs_ar") is None:
        return "–"
    ci = row.get("speedup_p50_ci")
    return f"{row['speedup_p50_vs_ar']:.2f}x " + (f"[{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "(CI: n too small)")


def _delta(row: dict) -> str:
    d = row.get("bleu_delta_vs_ar")
    if d is None:
        return "–"
    return f"{d:+.2f}{_stars(row.get('bleu_delta_p_value'))}"


# --------------------------------------------------------------------------------------------- table

def render_table(rows: list[dict], info: dict, env: dict) -> str:
    """The paper's Tables 1 and 3 (systems x test sets) plus per-test-set latency tables."""
    order = _system_order(rows)
    sets = _test_sets(rows)
    by = {(r["system"], r["test_set"]): r for r in rows}
    first = {name: next(r for r in rows if r["system"] == name) for name in order}
    lines = [f"# {info.get('suite', '?')}: run {info.get('run_id', '?')}", "",
             f"Platform **{rows[0].get('platform', '?')}** ({env.get('cpu_model') or env.get('device_kind', '?')}, "
             f"{env.get('threads', '?')} threads), batch size {rows[0].get('batch_size')}, "
             f"{str(rows[0].get('phase', 'end_to_end')).replace('_', '-')} latency. "
             "Steps 'N' = autoregressive; '# Hyp.' = beam size (AR) or length hypotheses (PaDIR).", ""]

    def grid(title: str, metric: str, digits: int) -> None:
        lines.extend([f"## {title}", "", "| Model | Family | # Hyp. | Steps | " + " | ".join(sets) + " |",
                      "|---|---|---:|---:|" + "---:|" * len(sets)])
        for name in order:
            r0 = first[name]
            cells = [_f(by[(name, ts)].get(metric), digits) if (name, ts) in by else "" for ts in sets]
            lines.append(f"| {name} | {r0['family'].upper()} | {_hyp(r0)} | {_steps(r0)} | " + " | ".join(cells) + " |")
        lines.append("")

    grid("Test BLEU (layout of the paper's Table 1)", "bleu", 2)
    if any(r.get("bleurt") is not None for r in rows):
        grid("Test BLEURT (layout of the paper's Table 3)", "bleurt", 4)
    else:
        lines.extend(["## Test BLEURT (paper's Table 3)", "", f"{NO_BLEURT}: pass `--bleurt-checkpoint DIR` "
                      "(or set NARBENCH_BLEURT) to fill this table.", ""])
    for ts in sets:
        ts_rows = [by[(n, ts)] for n in order if (n, ts) in by]
        n = ts_rows[0].get("n_sentences")
        lines.extend([f"## {ts}: latency and quality (n = {n} sentences)", "",
                      "| System | # Hyp. | Steps | BLEU | ΔBLEU vs AR greedy | p50 ms [95% CI] | p99 ms | "
                      "speedup p50 vs AR greedy [95% CI] | passes mean / p99 | stutter /1k words | "
                      "stutter sentences | compile s |",
                      "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"])
        for r in ts_rows:
            lines.append(
                f"| {r['system']} | {_hyp(r)} | {_steps(r)} | {_f(r.get('bleu'), 2)} | {_delta(r)} | "
                f"{_ms(r['latency_p50_ms'])} {_ms_ci(r.get('latency_p50_ci_ms'))} | {_p99(r)} | {_speedup(r)} | "
                f"{_f(r.get('passes_mean'))} / {_f(r.get('passes_p99'), 0)} | "
                f"{_f(r.get('stutter_per_1k_words'), 2)} | {_f(100 * r['stutter_sentence_share'] if r.get('stutter_sentence_share') is not None else None)}% | "
                f"{_f(r.get('compile_s'))} |")
        lines.append("")
    lines.extend(["ΔBLEU: paired bootstrap against AR greedy on the same sentences; * p < 0.05, ** p < 0.01. "
                  "Speedup: median of per-sentence ratios (AR greedy ms / system ms), sentences timed "
                  f"interleaved; CIs from order statistics. p99 needs n >= {P99_MIN_N} (MLPerf LoadGen rule).", ""])
    sigs = sorted({r["bleu_signature"] for r in rows if r.get("bleu_signature")})
    if sigs:
        lines.extend(["SacreBLEU: " + "; ".join(f"`{s}`" for s in sigs), ""])
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------- leaderboard

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


def _phase_words(phase: str | None) -> str:
    """How a row's timing phase reads in prose."""
    return {"device": "device-only (the jitted part and the wait)"}.get(phase or "end_to_end",
                                                                       "end-to-end (tokenize to detokenize)")


def render_leaderboard(rows: list[dict], info: dict, env: dict, run_dir: Path) -> str:
    sets = _test_sets(rows)
    lines = [f"# Leaderboard: {info.get('suite', '?')} (run {info.get('run_id', '?')})", "",
             "Systems sorted by test BLEU. Latency is "
             f"{_phase_words(rows[0].get('phase'))} at batch size "
             f"{rows[0].get('batch_size')} on **{rows[0].get('platform', '?')}**; speedups are against AR greedy, "
             "paired per sentence.", ""]
    apart = sorted({r["system"] for r in rows if r.get("baseline_timed_together") is False})
    if apart:
        lines.extend([f"Resumed run: {', '.join(apart)} were timed in a later session than AR greedy, so "
                      "their speedups pair latencies measured apart (not interleaved).", ""])
    has_bleurt = any(r.get("bleurt") is not None for r in rows)
    for ts in sets:
        ts_rows = sorted((r for r in rows if r["test_set"] == ts), key=lambda r: -(r.get("bleu") or -1e9))
        lines.extend([f"## {ts}", "", "| # | System | Family | # Hyp. | Steps | BLEU | ΔBLEU | chrF | "
                      + ("BLEURT | " if has_bleurt else "") + "p50 ms | p99 ms | speedup p50 | stutter /1k |",
                      "|---:|---|---|---:|---:|---:|---:|---:|" + ("---:|" if has_bleurt else "") + "---:|---:|---:|---:|"])
        for i, r in enumerate(ts_rows, 1):
            bleurt = f"{_f(r.get('bleurt'), 4)} | " if has_bleurt else ""
            lines.append(f"| {i} | {r['system']} | {r['family'].upper()} | {_hyp(r)} | {_steps(r)} | "
                         f"{_f(r.get('bleu'), 2)} | {_delta(r)} | {_f(r.get('chrf'), 1)} | {bleurt}"
                         f"{_ms(r['latency_p50_ms'])} | {_p99(r)} | {_speedup(r)} | "
                         f"{_f(r.get('stutter_per_1k_words'), 2)} |")
        lines.append("")
    if not has_bleurt:
        lines.extend([f"BLEURT: {NO_BLEURT} (pass `--bleurt-checkpoint DIR` or set NARBENCH_BLEURT).", ""])
    lines.extend(["ΔBLEU: paired bootstrap against AR greedy; * p < 0.05, ** p < 0.01. Full tables with CIs, "
                  "passes and stutter: [table.md](table.md).", ""])
    sigs = sorted({r["bleu_signature"] for r in rows if r.get("bleu_signature")})
    chrf = sorted({r["chrf_signature"] for r in rows if r.get("chrf_signature")})
    lines.extend(["## Reproduce", "", "```", info.get("command") or "narbench run", "```", "",
                  "SacreBLEU signatures: " + "; ".join(f"`{s}`" for s in sigs + chrf), ""])
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
                  "[samples.jsonl](samples.jsonl), [spec.toml](spec.toml), [env.json](env.json)",
                  *(f"- ![{p}]({p})" for p in PLOTS if (run_dir / p).is_file()), ""])
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


def _style(row: dict) -> dict:
    if row["family"] == "ar":
        return {"color": "#1f4e79", "marker": "s"}
    return {"color": "#c0392b" if row.get("distill") else "#e67e22", "marker": "o"}


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


def _short(row: dict, many_rates: bool) -> str:
    """Point label: ``greedy``/``beam5`` for AR; ``T=4`` (+ unmask rate and other non-paper axes) for PaDIR."""
    if row["family"] == "ar":
        return row["system"].replace("ar-", "")
    rest = row["system"].replace(f"padir-s{row['steps']}-u{row['unmask_rate']:g}", "", 1).replace("-distill", "")
    return f"T={row['steps']}" + (f" u{row['unmask_rate']:g}" if many_rates else "") + rest.replace("-", " ")


def plot_pareto(rows: list[dict], path: Path) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    sets = _test_sets(rows)
    fig, axes = _axes_grid(len(sets), plt)
    for ax, ts in zip(axes, sets):
        rs = [r for r in rows if r["test_set"] == ts and r.get("bleu") is not None]
        pts = [(r["latency_p50_ms"], r["bleu"]) for r in rs]
        for r, (x, y) in zip(rs, pts):
            ax.scatter(x, y, s=46, zorder=3, **_style(r))
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
        many = len({r.get("unmask_rate") for r in rs if r["family"] == "nar"}) > 1
        _place_labels(ax, pts, [_short(r, many) for r in rs])
    handles = [Line2D([], [], ls="", marker="s", color="#1f4e79", label="AR"),
               Line2D([], [], ls="", marker="o", color="#e67e22", label="PaDIR (T = steps)"),
               Line2D([], [], ls="", marker="o", color="#c0392b", label="PaDIR, distilled"),
               Line2D([], [], ls="--", color="#555", marker="o", mfc="none", mec="#222", label="Pareto front")]
    axes[0].legend(handles=handles, fontsize=8, loc="best")
    fig.suptitle("Quality vs latency (batch %s, %s)" % (rows[0].get("batch_size"), rows[0].get("platform")))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_latency_cdf(rows: list[dict], samples: list[dict], path: Path) -> None:
    import matplotlib.pyplot as plt
    import numpy as np

    sets = _test_sets(rows)
    order = _system_order(rows)
    fig, axes = _axes_grid(len(sets), plt)
    first = {name: next(r for r in rows if r["system"] == name) for name in order}
    steps = sorted({r["steps"] for r in first.values() if r["family"] == "nar"})
    cmap = plt.get_cmap("viridis")
    ar_colors = ["#000000", "#7f7f7f", "#4a4a4a", "#b0b0b0"]
    colors, styles, ar_i = {}, {}, 0
    for name, r in first.items():  # AR in greys; PaDIR coloured by steps, distilled solid, else dashed
        if r["family"] == "ar":
            colors[name], styles[name] = ar_colors[ar_i % len(ar_colors)], "-"
            ar_i += 1
        else:
            colors[name] = cmap(0.85 * steps.index(r["steps"]) / max(1, len(steps) - 1))
            styles[name] = "-" if r.get("distill") else "--"
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


def plot_bleu_vs_steps(rows: list[dict], path: Path) -> None:
    import matplotlib.pyplot as plt

    sets = _test_sets(rows)
    fig, axes = _axes_grid(len(sets), plt)
    for ax, ts in zip(axes, sets):
        rs = [r for r in rows if r["test_set"] == ts and r.get("bleu") is not None]
        variants: dict[str, list[dict]] = {}
        for r in rs:
            if r["family"] == "nar":
                label = r["system"].replace(f"-s{r['steps']}-", "-", 1)
                variants.setdefault(label, []).append(r)
        palettes = {True: ["#c0392b", "#8e44ad", "#d35400", "#7b241c"], False: ["#e67e22", "#16a085", "#f1c40f", "#7f8c8d"]}
        used = {True: 0, False: 0}
        for label, vr in sorted(variants.items()):
            vr = sorted(vr, key=lambda r: r["steps"])
            distilled = bool(vr[0].get("distill"))
            color = palettes[distilled][used[distilled] % 4]
            used[distilled] += 1
            ax.plot([r["steps"] for r in vr], [r["bleu"] for r in vr], marker="o", lw=1.6, color=color,
                    ls="-" if distilled else "--", label=label.replace("padir-", "PaDIR "))
        ar_styles = [":", "-."]
        for j, r in enumerate(sorted((r for r in rs if r["family"] == "ar"), key=lambda r: r.get("hypotheses") or 1)):
            ax.axhline(r["bleu"], color="#1f4e79", lw=1.2, ls=ar_styles[j % 2], label=f"{r['system']} (AR)")
        steps = sorted({r["steps"] for r in rs if r["family"] == "nar"})
        if steps:
            ax.set_xscale("log", base=2)
            ax.set_xticks(steps, [str(s) for s in steps])
            ax.minorticks_off()
        ax.set_xlabel("refinement steps T (decoder passes)")
        ax.set_ylabel("BLEU")
        ax.set_title(ts, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    fig.suptitle("PaDIR quality vs refinement steps")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------- entry

def write_report(run_dir: str | Path) -> list[Path]:
    """Write ``table.md``, ``leaderboard.md`` and the three plots into the run folder."""
    import matplotlib

    matplotlib.use("Agg")
    from narbench_core.errors import UserError

    run = st.RunStore(st.resolve_run_dir(run_dir))
    rows, samples = run.rows(), run.samples()
    if not rows:
        raise UserError(f"{run.path} has no finished cells yet; run `narbench run` until some finish")
    info, env = {"run_id": run.run_id, **run.info}, run.env()
    out = []
    scored = [r for r in rows if r.get("bleu") is not None]
    if scored:
        plot_pareto(scored, run.path / "pareto.png")
        plot_bleu_vs_steps(scored, run.path / "bleu_vs_steps.png")
    plot_latency_cdf(rows, samples, run.path / "latency_cdf.png")
    out.extend(run.path / p for p in PLOTS if (run.path / p).is_file())
    write_text(run.path / "table.md", render_table(rows, info, env))
    write_text(run.path / "leaderboard.md", render_leaderboard(rows, info, env, run.path))
    return [run.path / "table.md", run.path / "leaderboard.md", *out]


# --------------------------------------------------------------------------------------------- verify

FIGURES = ("n_sentences", "bleu", "chrf", "stutter_per_1k_words", "stutter_sentence_share", "latency_p50_ms",
           "latency_p90_ms", "latency_p99_ms", "latency_mean_ms", "latency_min_ms", "latency_max_ms",
           "latency_p50_ci_ms", "latency_p90_ci_ms", "latency_p99_ci_ms", "passes_mean", "passes_p99",
           "speedup_p50_vs_ar", "speedup_p50_ci", "bleu_delta_vs_ar", "bleu_delta_ci", "bleu_delta_p_value")


def _close(a: Any, b: Any, rel: float = 1e-9) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b) and all(
            _close(x, y, rel) for x, y in zip(a, b))
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    return math.isclose(float(a), float(b), rel_tol=rel, abs_tol=1e-9)


def verify_run(run_dir: str | Path) -> list[str]:
    """Recompute every row's figures from ``samples.jsonl``; returns the mismatches (empty: all agree).

    Checks the DESIGN.md fields are present, then BLEU, chrF, stutter, latency percentiles and CIs,
    passes, the paired speedup and the BLEU delta against the row's baseline.
    """
    from bench.grid import cell_figures

    run = st.RunStore(st.resolve_run_dir(run_dir))
    rows, samples = run.rows(), run.samples()
    groups: dict[tuple[str, str], list[dict]] = {}
    for s in samples:
        groups.setdefault((s["system"], s["test_set"]), []).append(s)
    for g in groups.values():
        g.sort(key=lambda s: s["index"])
    problems = []
    if not rows:
        problems.append("rows.jsonl has no rows")
    for row in rows:
        key = (row.get("system"), row.get("test_set"))
        missing = [f for f in st.ROW_FIELDS if f not in row]
        if missing:
            problems.append(f"{key}: missing fields {missing}")
        g = groups.get(key)
        if not g:
            problems.append(f"{key}: no samples")
            continue
        bad_sample = [f for f in st.SAMPLE_FIELDS if any(f not in s for s in g)]
        if bad_sample:
            problems.append(f"{key}: samples lack {bad_sample}")
            continue
        if "references" in g[0]:
            refs = [[s["references"][k] for s in g] for k in range(len(g[0]["references"]))]
        else:
            refs = [[s["reference"] for s in g]]
        base = groups.get((row.get("baseline_system"), row["test_set"]))
        base_ok = base is not None and [s["index"] for s in base] == [s["index"] for s in g]
        scored = row.get("bleu") is not None
        figures = cell_figures(
            [s["hypothesis"] for s in g], refs, [s["latency_ms"] for s in g], [s["passes"] for s in g],
            row.get("target_lang", "en"),
            [s["latency_ms"] for s in base] if base_ok and row.get("speedup_p50_vs_ar") is not None else None,
            [s["hypothesis"] for s in base] if base_ok and row.get("bleu_delta_vs_ar") is not None else None,
            _bootstrap_n(run), _seed(run), score=scored)
        for name in FIGURES:
            if name in figures and not _close(row.get(name), figures[name]):
                problems.append(f"{key}: {name} = {row.get(name)!r} in rows.jsonl but {figures[name]!r} from samples")
    extra = set(groups) - {(r.get("system"), r.get("test_set")) for r in rows}
    if extra:
        problems.append(f"samples without a row (unfinished cells): {sorted(extra)}")
    return problems


def _spec(run: st.RunStore):
    import tomllib

    return tomllib.loads(run.spec_text()) if run.spec_text() else {}


def _bootstrap_n(run: st.RunStore) -> int:
    return int(_spec(run).get("bootstrap_resamples", 1000))


def _seed(run: st.RunStore) -> int:
    return int((_spec(run).get("seeds") or [0])[0])
