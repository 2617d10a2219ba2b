"""The report's plots, drawn from the saved rows and samples: BLEU against p50 latency with the Pareto
front, latency CDFs, BLEU over refinement iterations, learning curves. Families give each row's point label
and style (``bench.families``); matplotlib is imported inside each plot."""
from __future__ import annotations

import math
from pathlib import Path

from bench import families
from bench.report.tables import MODES_METRICS, system_order, test_sets
from bench.rows import Row, column

PARETO, LATENCY_CDF, BLEU_VS_ITERATIONS = "pareto.png", "latency_cdf.png", "bleu_vs_iterations.png"
PLOTS = (PARETO, LATENCY_CDF, BLEU_VS_ITERATIONS)
CURVE_PLOT = "learning_curves.png"       # drawn when the run has curves.jsonl (models trained with curves)
DECAY_MARK = "learning-rate decay starts (where the plateau rule fired, for models stopped by it)"
GRID_PAGE, GRID_PLOT = "grid.md", "grid.png"   # written when a family's rows vary an ablation axis (bench.report.grid)


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
    """Dev BLEU and dev NLL against training seconds, one line per trained model (``curves.jsonl``), with a
    ring on the point where a model's learning-rate decay started (its plateau, when the rule fired)."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    models = list(dict.fromkeys(p["model"] for p in points))
    rings = any(p.get("decaying") for p in points)
    legend_rows = len(models) + rings                         # one per row: model names are long
    fig, (bleu_ax, nll_ax) = plt.subplots(1, 2, figsize=(12, 4.6 + 0.22 * legend_rows))
    cmap = plt.get_cmap("tab10")
    for i, model in enumerate(models):
        pts = sorted((p for p in points if p["model"] == model), key=lambda p: p["step"])
        style = {"color": cmap(i % 10), "ls": ["-", "--", ":"][i // 10 % 3], "marker": "o", "ms": 3, "lw": 1.5}
        seconds = [p["seconds"] for p in pts]
        bleu_ax.plot(seconds, [p["dev_bleu"] for p in pts], label=model, **style)
        nll_ax.plot(seconds, [p["dev_nll"] for p in pts], label=model, **style)
        before = [p for p in pts if p.get("decaying") is False]
        if before and any(p.get("decaying") for p in pts):    # the last point at the peak rate: the decay's start
            start = before[-1]
            for ax, what in ((bleu_ax, "dev_bleu"), (nll_ax, "dev_nll")):
                ax.plot([start["seconds"]], [start[what]], marker="o", ms=11, mfc="none", mec=style["color"],
                        mew=1.5, ls="none", label=DECAY_MARK)
    for ax, what in ((bleu_ax, "dev BLEU"), (nll_ax, "dev NLL per target token")):
        ax.set_xlabel("training seconds (train steps only)")
        ax.set_ylabel(what)
        ax.grid(alpha=0.3)
    fig.suptitle("Learning curves (dev sample, seeded)")
    bottom = (0.3 + 0.22 * legend_rows) / fig.get_figheight()
    fig.tight_layout(rect=(0, bottom, 1, 1))
    handles, labels = bleu_ax.get_legend_handles_labels()     # below the axes: model names are long
    if rings:                                                   # one legend entry for every model's ring
        handles = [h for h, label in zip(handles, labels) if label != DECAY_MARK]
        handles.append(Line2D([], [], marker="o", ms=9, mfc="none", mec="grey", ls="none"))
        labels = [label for label in labels if label != DECAY_MARK] + [DECAY_MARK]
    fig.legend(handles, labels, loc="lower center", ncol=1, fontsize=7, frameon=False)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_bleu_vs_iterations(rows: list[Row], path: Path) -> None:
    """A line over refinement iterations T per variant (systems that differ only in T); other systems as levels."""
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
            vr = sorted(vr, key=lambda r: r.iterations)
            distilled = bool(vr[0].distill)
            color = palettes[distilled][used[distilled] % 4]
            used[distilled] += 1
            ax.plot([r.iterations for r in vr], [r.bleu for r in vr], marker="o", lw=1.6, color=color,
                    ls="-" if distilled else "--", label=label)
        levels = sorted((r for r in rs if r.variant is None), key=lambda r: (families.rank(r.family), r.hypotheses))
        for j, r in enumerate(levels):
            ax.axhline(r.bleu, color="#1f4e79", lw=1.2, ls=[":", "-.", "--"][j % 3], label=r.system)
        t_values = sorted({r.iterations for r in rs if r.variant is not None})
        if t_values:
            ax.set_xscale("log", base=2)
            ax.set_xticks(t_values, [str(t) for t in t_values])
            ax.minorticks_off()
        ax.set_xlabel("refinement iterations T (at most T decoder passes)")
        ax.set_ylabel("BLEU")
        ax.set_title(ts, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    fig.suptitle("Quality vs refinement iterations")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


DIAL_PLOT = "dial.png"      # drawn when test sets differ in their number of valid targets (the dependency dial)


def plot_dial(rows: list[Row], modes: dict[str, int], path: Path) -> None:
    """The dial: each metric of ``tables.MODES_METRICS`` (one row of panels each) against the test
    sets' number of valid targets, models trained on the task's data (left) and on a teacher's outputs
    (right); systems of the other side (no model of their own there, e.g. AR) appear in both as dotted
    references. One line per system."""
    import matplotlib.pyplot as plt

    scored = [r for r in rows if r.test_set in modes and r.bleu is not None]
    xs = sorted(set(modes.values()))
    fig, axes = plt.subplots(len(MODES_METRICS), 2, figsize=(11, 3.2 * len(MODES_METRICS)), squeeze=False,
                             sharey="row")
    lines: dict[str, list[Row]] = {}
    for r in scored:
        lines.setdefault(r.system, []).append(r)
    distilled_families = {r.family for r in scored if r.distill}
    label = {s: families.get(rs[0].family).point_label(rs[0]) for s, rs in lines.items()}
    shades = sorted({label[s] for s, rs in lines.items() if rs[0].family in distilled_families},
                    key=lambda text: (len(text), text))          # T=1, T=2, T=4, T=10: one colour each, both sides
    cmap = plt.get_cmap("viridis")
    for j, distill in enumerate((False, True)):
        own = [s for s, rs in lines.items() if bool(rs[0].distill) == distill and rs[0].family in distilled_families]
        for i, name in enumerate(MODES_METRICS):
            ax = axes[i][j]
            for k, (system, rs) in enumerate(sorted(lines.items())):
                if system not in own and rs[0].family in distilled_families:
                    continue
                rs = sorted(rs, key=lambda r: modes[r.test_set])
                pts = [(modes[r.test_set], r[name]) for r in rs if r[name] is not None]
                if not pts:
                    continue
                style = ({"color": cmap(shades.index(label[system]) / max(len(shades) - 1, 1) * 0.85), "ls": "-"}
                         if system in own else {"color": families.get(rs[0].family).style(rs[0])["color"], "ls": ":"})
                ax.plot(*zip(*pts), marker="o", lw=1.5, label=label[system] if system in own else system, **style)
            ax.set_xticks(xs)
            ax.set_xlabel("valid targets per source (modes)")
            ax.set_ylabel(column(name).header)
            ax.grid(alpha=0.3)
            if i == 0:
                ax.set_title("trained on the teacher's outputs (distilled)" if distill else "trained on the data")
                ax.legend(fontsize=7, loc="best")
    fig.suptitle("The dependency dial: quality as targets get more modes")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
