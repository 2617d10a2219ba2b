"""The grid page, ``grid.md`` and ``grid.png``: what each ablation axis of a run costs and buys.

A family's rows vary an *axis* when two or more of its values occur (``Family.grid_axes``: a row's
values, None where the axis does not act). Each value is compared with a reference value
(``Family.grid_reference``) in every *cell* where the comparison exists: two rows of one family on one
test set that differ in that axis only. Every other axis holds one value in both, or does not act in
one of them (None matches any value: a glancing model is compared with the paper's recipe at each
unmasking rate, and T = 1, where remasking does not act, with each remasking at T = 4).

Per cell: ΔBLEU (value minus reference) with sacrebleu's paired bootstrap over sentences (its
resampling, 95% interval and p-value, ``bleu_difference``), and the paired
latency ratio (the median over sentences of value ms / reference ms; below 1 the value is faster) with
its order-statistics CI (``bench.measure.stats``). Over the cells: the mean ΔBLEU, its CI from the same
bootstrap (one resample of sentence indices serves every cell of a test set), and the median over
sentences of each sentence's geometric mean ratio across the cells, with its CI. The two axes a family
names in ``Family.interaction`` (PaDIR: distillation x T) get the first's effect at each value of the
second and its difference from the effect at the second's reference value, with CIs from one
bootstrap. ``grid.png``: BLEU against p50 latency with the Pareto front of all systems, one panel per
axis and test set, the family's points coloured by the axis value.

Built from ``rows.jsonl`` and ``samples.jsonl`` only, so it works on any existing run. The BLEU
statistic lives in ``bleu_difference`` alone.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from bench import families
from bench.report.plots import GRID_PAGE, GRID_PLOT, _axes_grid, _latency_axis, pareto_front
from bench.report.tables import test_sets
from bench.rows import Row, column
from narbench_core import langs
from narbench_core.markdown import table

CONFIDENCE = 0.95
SIZE = "size"             # the row column a suite's size axis fills: held equal in every cell, never an axis here


# --------------------------------------------------------------------------------------- statistics

@dataclass(frozen=True)
class Effect:
    value: float
    ci: tuple[float, float] | None
    p_value: float | None = None


def bleu_difference(terms: Sequence[tuple[np.ndarray, np.ndarray, float]], metric, n_resamples: int,
                    seed: int) -> Effect:
    """The page's BLEU statistic, in this one function: ``sum(w * (BLEU(a) - BLEU(b)))`` over ``terms`` of
    per-sentence BLEU statistics ``(a, b, w)`` on the same sentences (``metric``: the sacrebleu ``BLEU``
    that extracted them), tested as sacrebleu's paired bootstrap (``sacrebleu --paired-bs``,
    ``sacrebleu.significance._paired_bs_test``) tests one system against a baseline: ``n_resamples``
    resamples of the sentence indices from ``numpy.random.default_rng(seed)``, every term resampled
    alike; the 95% interval of the resampled statistic by sacrebleu's rule (``estimate_ci``: the
    ``n_resamples // 40``-th smallest and largest) and its p-value (``_compute_p_value``: the share of
    centred absolute resampled differences above the observed one, +1 smoothed). One term of weight 1
    gives sacrebleu's p-value of that pair (identical hypotheses: 1, as ``quality.paired_tests`` says)."""
    def score(stats: np.ndarray) -> float:
        return metric._compute_score_from_stats(stats.sum(0)).score

    n = terms[0][0].shape[0]
    observed = sum(w * (score(a) - score(b)) for a, b, w in terms)
    idxs = np.random.default_rng(seed).choice(n, size=(n_resamples, n), replace=True)
    diffs = np.array([sum(w * (score(a[i]) - score(b[i])) for a, b, w in terms) for i in idxs])
    ordered = np.sort(diffs)
    low, high = ordered[n_resamples // 40], ordered[n_resamples - n_resamples // 40 - 1]
    if all(np.array_equal(a, b) for a, b, _ in terms):
        return Effect(float(observed), (float(low), float(high)), 1.0)
    centred = np.abs(diffs) - np.abs(diffs).mean()
    p = (np.sum(centred > abs(observed)) + 1) / (n_resamples + 1)
    return Effect(float(observed), (float(low), float(high)), float(p))


def latency_ratio(ratios: Sequence[np.ndarray]) -> Effect:
    """The median over sentences of each sentence's geometric mean latency ratio over the cells (one cell:
    its ratios), with the order-statistics CI of that median (None when there are too few sentences)."""
    from bench.measure import stats

    per_sentence = np.exp(np.mean(np.log(np.vstack(ratios)), axis=0))
    return Effect(float(np.median(per_sentence)), stats.quantile_ci(per_sentence, 0.5, CONFIDENCE))


# ------------------------------------------------------------------------------------------- the grid

@dataclass
class Cell:
    """One comparison: ``value`` (a row with the axis at the compared value) against ``reference``."""
    value: Row
    reference: Row
    context: str                      # the other varying axes, as the display names say them
    bleu: Effect | None = None
    latency: Effect | None = None
    ratios: np.ndarray | None = None  # per sentence: value ms / reference ms


@dataclass
class Comparison:
    test_set: str
    family: str
    axis: str
    value: Any
    reference: Any
    cells: list[Cell]
    bleu: Effect | None = None
    latency: Effect | None = None


class _Run:
    """A run's scored rows with what the comparisons need: axis values, per-sentence BLEU statistics
    (computed on first use) and latencies, by (system, test set)."""

    def __init__(self, rows: Sequence[Row], samples: Sequence[dict], n_resamples: int, seed: int):
        self.rows = [r for r in rows if r.bleu is not None and families.get(r.family).grid_axes(r)]
        # the model size (a suite's size axis) is held, never varied: two sizes are compared on the scale page
        self.axes = {r.key: {**families.get(r.family).grid_axes(r), SIZE: r.get("size")} for r in self.rows}
        self.n_resamples, self.seed = n_resamples, seed
        groups: dict[tuple[str, str], list[dict]] = {}
        for s in samples:
            groups.setdefault((s["system"], s["test_set"]), []).append(s)
        self.samples = {k: sorted(v, key=lambda s: s["index"]) for k, v in groups.items()}
        self._stats: dict[tuple[str, str], np.ndarray] = {}
        self._metrics: dict[str, Any] = {}

    def varying(self) -> dict[str, dict[str, list]]:
        """family -> axis -> its sorted values, for the axes with two or more values among the family's rows."""
        out: dict[str, dict[str, list]] = {}
        for family in dict.fromkeys(r.family for r in self.rows):
            seen: dict[str, set] = {}
            for r in self.rows:
                if r.family == family:
                    for axis, v in self.axes[r.key].items():
                        if v is not None and axis != SIZE:
                            seen.setdefault(axis, set()).add(v)
            axes = {a: sorted(vs) for a, vs in seen.items() if len(vs) > 1}
            if axes:
                out[family] = axes
        return out

    def metric(self, row: Row):
        """sacrebleu's ``BLEU`` of the row's test set, its references cached (as ``quality.paired_tests`` builds it)."""
        from sacrebleu.metrics import BLEU

        if row.test_set not in self._metrics:
            g = self.samples[row.key]
            refs = ([[s["references"][k] for s in g] for k in range(len(g[0]["references"]))]
                    if "references" in g[0] else [[s["reference"] for s in g]])
            self._metrics[row.test_set] = BLEU(tokenize=langs.bleu_tokenizer(row.target_lang or "en"), references=refs)
        return self._metrics[row.test_set]

    def stats(self, row: Row) -> np.ndarray:
        """Per-sentence BLEU statistics of the row's hypotheses (sacrebleu's, as its paired tests extract them)."""
        if row.key not in self._stats:
            hyps = [s["hypothesis"] for s in self.samples[row.key]]
            self._stats[row.key] = np.array(self.metric(row)._extract_corpus_statistics(hyps, None), dtype="float32")
        return self._stats[row.key]

    def paired(self, a: Row, b: Row) -> bool:
        """Do both rows have samples of the same sentences?"""
        sa, sb = self.samples.get(a.key), self.samples.get(b.key)
        return bool(sa and sb) and [s["index"] for s in sa] == [s["index"] for s in sb]

    def ratios(self, value: Row, reference: Row) -> np.ndarray:
        from bench.measure import stats

        return stats.paired_ratios([s["latency_ms"] for s in self.samples[value.key]],         # value / reference
                                   [s["latency_ms"] for s in self.samples[reference.key]])

    def bleu(self, cells: Sequence[tuple[Cell, float]]) -> Effect:
        return bleu_difference([(self.stats(c.value), self.stats(c.reference), w) for c, w in cells],
                               self.metric(cells[0][0].value), self.n_resamples, self.seed)


def _matches(x: dict, y: dict, axis: str) -> bool:
    """Do two rows' axis values differ in ``axis`` only (None: the axis does not act there, matches any)?"""
    return all(x[k] == y[k] or x[k] is None or y[k] is None for k in x if k != axis)


def _texts(row: Row) -> dict[str, str | None]:
    return {axis: text for axis, text, _ in families.get(row.family).name_parts(row)}


def value_text(row: Row, axis: str) -> str:
    """How a row's value of ``axis`` reads ("T=4", "distilled"), as the display names say it."""
    text = _texts(row).get(axis)
    value = families.get(row.family).grid_axes(row)[axis]
    return (text or f"{axis} {value}").lstrip(", ")


def _context(x: Row, y: Row, axis: str, varying: Sequence[str]) -> str:
    tx, ty = _texts(x), _texts(y)
    ax, ay = families.get(x.family).grid_axes(x), families.get(y.family).grid_axes(y)
    parts = []
    for other in varying:
        if other == axis:
            continue
        row, values, texts = (x, ax, tx) if ax.get(other) is not None else (y, ay, ty)
        if values.get(other) is not None:
            parts.append((texts.get(other) or f"{other} {values[other]}").lstrip(", "))
    if x.get(SIZE) is not None:
        parts.append(str(x.get(SIZE)))
    return ", ".join(parts)


def comparisons(run: _Run) -> list[Comparison]:
    """Every value of every varying axis against its reference, per test set, with per-cell and mean effects."""
    out = []
    varying = run.varying()
    for ts in test_sets(run.rows):
        for family, axes in varying.items():
            rows = [r for r in run.rows if r.test_set == ts and r.family == family]
            fam = families.get(family)
            for axis, values in axes.items():
                ref = fam.grid_reference(axis, values)
                for value in values:
                    if value == ref:
                        continue
                    cells = [Cell(x, y, _context(x, y, axis, list(axes)))
                             for x in rows if run.axes[x.key][axis] == value
                             for y in rows if run.axes[y.key][axis] == ref
                             and _matches(run.axes[x.key], run.axes[y.key], axis) and run.paired(x, y)]
                    if not cells:
                        continue
                    for c in cells:
                        c.bleu = run.bleu([(c, 1.0)])
                        c.ratios = run.ratios(c.value, c.reference)
                        c.latency = latency_ratio([c.ratios])
                    out.append(Comparison(ts, family, axis, value, ref, cells,
                                          run.bleu([(c, 1.0 / len(cells)) for c in cells]),
                                          latency_ratio([c.ratios for c in cells])))
    return out


@dataclass
class Interaction:
    test_set: str
    family: str
    axis: str                 # the effect's axis (distill)
    by: str                   # the axis it is shown along (iterations)
    at: Any                   # a value of ``by``
    cells: list[Cell]
    bleu: Effect
    latency: Effect
    contrast: Effect | None   # the effect here minus the effect at ``by``'s reference value (None there)


def interactions(run: _Run, found: Sequence[Comparison]) -> list[Interaction]:
    """The effect of each family's ``interaction`` axis along its second axis (both must vary)."""
    out = []
    varying = run.varying()
    for comp in found:
        pair = families.get(comp.family).interaction
        axes = varying.get(comp.family, {})
        if not pair or comp.axis != pair[0] or pair[1] not in axes:
            continue
        by = pair[1]
        groups: dict[Any, list[Cell]] = {}
        for c in comp.cells:
            at = run.axes[c.value.key][by]
            groups.setdefault(at if at is not None else run.axes[c.reference.key][by], []).append(c)
        ref_at = families.get(comp.family).grid_reference(by, axes[by])
        for at in sorted(groups):
            cells = groups[at]
            weights = [(c, 1.0 / len(cells)) for c in cells]
            contrast = None
            if at != ref_at and ref_at in groups:
                base = groups[ref_at]
                contrast = run.bleu(weights + [(c, -1.0 / len(base)) for c in base])
            out.append(Interaction(comp.test_set, comp.family, comp.axis, by, at, cells, run.bleu(weights),
                                   latency_ratio([c.ratios for c in cells]), contrast))
    return out


# ------------------------------------------------------------------------------------------- rendering

def _bleu_cell(e: Effect | None) -> str:
    if e is None:
        return "–"
    stars = "" if e.p_value is None else "**" if e.p_value < 0.01 else "*" if e.p_value < 0.05 else ""
    return f"{e.value:+.2f}{stars} [{e.ci[0]:+.2f}, {e.ci[1]:+.2f}]"


def _ratio_cell(e: Effect | None) -> str:
    if e is None:
        return "–"
    return f"{e.value:.2f}x " + (f"[{e.ci[0]:.2f}, {e.ci[1]:.2f}]" if e.ci else "(CI: n too small)")


def _heading(axis: str) -> str:
    col = column(axis)
    return f"{axis}" + (f" ({col.header})" if col.header != axis else "") + (f": {col.doc}" if col.doc else "")


def _show(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value).lower() if isinstance(value, bool) else str(value)


def render_grid_page(rows: Sequence[Row], samples: Sequence[dict], info: dict, n_resamples: int,
                     seed: int) -> tuple[str, list[Comparison]] | None:
    """``grid.md``'s text and the comparisons behind it; None when no family's rows vary an axis."""
    run = _Run(rows, samples, n_resamples, seed)
    varying = run.varying()
    if not varying:
        return None
    found = comparisons(run)
    inter = interactions(run, found)
    lines = [f"# Grid: {info.get('suite', '')} (run {info.get('run_id', '')})", "",
             "What each ablation axis of the run costs and buys: each value against a reference value, in every "
             "cell where the two systems differ in that axis only (every other axis the same, or not acting in "
             "one of them: a setting silences it). **ΔBLEU**: the value's BLEU minus the reference's, with the "
             f"95% interval and p-value of sacrebleu's paired bootstrap over sentences ({n_resamples} resamples, "
             f"seed {seed}, as `sacrebleu --paired-bs`; the mean over cells resamples the same sentences in every "
             "cell); * p < 0.05, ** p < 0.01. **Latency ratio**: the median "
             "over sentences of the value's ms / the reference's ms (below 1: the value is faster), with its "
             "order-statistics 95% CI; over cells, of each sentence's geometric mean across the cells.", ""]
    for family, axes in varying.items():
        label = families.get(family).label
        lines.append(f"{label} axes: " + "; ".join(
            f"{a} {', '.join(_show(v) for v in vs)} (reference {_show(families.get(family).grid_reference(a, vs))})"
            for a, vs in axes.items()) + ".")
    lines.append("")
    for ts in test_sets(run.rows):
        here = [c for c in found if c.test_set == ts]
        if not here:
            continue
        lines.extend([f"## {ts}", ""])
        for axis in dict.fromkeys(c.axis for c in here):
            comps = [c for c in here if c.axis == axis]
            lines.extend([f"### {_heading(axis)}", "",
                          *table(["value", "against", "cells", "ΔBLEU [95% CI]", "latency ratio [95% CI]"],
                                 ([value_text(c.cells[0].value, axis), value_text(c.cells[0].reference, axis),
                                   len(c.cells), _bleu_cell(c.bleu), _ratio_cell(c.latency)] for c in comps), "ll"),
                          "", "Per cell:", "",
                          *table(["value", "against", "the other axes", "ΔBLEU [95% CI]", "latency ratio [95% CI]"],
                                 ([value_text(cell.value, axis), value_text(cell.reference, axis), cell.context,
                                   _bleu_cell(cell.bleu), _ratio_cell(cell.latency)]
                                  for c in comps for cell in c.cells), "lll"), ""])
        for axis, by in dict.fromkeys((i.axis, i.by) for i in inter if i.test_set == ts):
            its = [i for i in inter if i.test_set == ts and i.axis == axis and i.by == by]
            first = its[0].cells[0]
            ref_at = next((i.at for i in its if i.contrast is None), None)
            effect = f"{value_text(first.value, axis)} against {value_text(first.reference, axis)}"
            lines.extend([f"### Interaction: {axis} x {by}", "",
                          f"The effect of {effect} at each {by} value, and how much it differs from the effect at "
                          f"{by} {_show(ref_at)} (the same bootstrap resamples both).", "",
                          *table([by, "cells", "ΔBLEU [95% CI]", f"minus the ΔBLEU at {by} {_show(ref_at)} [95% CI]",
                                  "latency ratio [95% CI]"],
                                 ([_show(i.at), len(i.cells), _bleu_cell(i.bleu),
                                   "–" if i.contrast is None else _bleu_cell(i.contrast), _ratio_cell(i.latency)]
                                  for i in its), "l"), ""])
    lines.extend(["## Pareto fronts by axis", "", f"![{GRID_PLOT}]({GRID_PLOT})", "",
                  "BLEU against p50 latency of every system (grey: other families) with the Pareto front of them all "
                  "(dashed) and of the family that varies the axis (solid, its points ringed); in each panel that "
                  "family's points are coloured by the axis value (hollow: the axis does not act in that system).",
                  ""])
    return "\n".join(lines), found


def plot_grid(rows: Sequence[Row], path: Path) -> None:
    """One panel per (test set, varying axis): BLEU against p50 latency, the family's points coloured by the axis."""
    import matplotlib.pyplot as plt

    scored = [r for r in rows if r.bleu is not None and r.latency_p50_ms is not None]
    run = _Run(scored, [], 0, 0)
    panels = [(ts, family, axis, values) for ts in test_sets(scored)
              for family, axes in run.varying().items() for axis, values in axes.items()]
    fig, axs = _axes_grid(len(panels), plt, width=5.2, height=4.2)
    cmap = plt.get_cmap("tab10")
    for ax, (ts, family, axis, values) in zip(axs, panels):
        rs = [r for r in scored if r.test_set == ts]
        pts = [(r.latency_p50_ms, r.bleu) for r in rs]
        for r, (x, y) in zip(rs, pts):
            v = run.axes.get(r.key, {}).get(axis) if r.family == family else None
            if r.family != family:
                ax.scatter(x, y, s=22, color="#bbbbbb", zorder=2)
            elif v is None:
                ax.scatter(x, y, s=30, facecolors="none", edgecolors="#666666", zorder=3)
            else:
                ax.scatter(x, y, s=30, color=cmap(values.index(v) % 10), zorder=3)
        front = pareto_front(pts)
        if front:
            ax.step([pts[i][0] for i in front], [pts[i][1] for i in front], where="post", color="#999", lw=1.0,
                    ls="--", zorder=1)
        own = [i for i, r in enumerate(rs) if r.family == family]
        mine = [own[i] for i in pareto_front([pts[i] for i in own])]
        if mine:                                   # the family's own front, its points ringed
            ax.step([pts[i][0] for i in mine], [pts[i][1] for i in mine], where="post", color="#222", lw=1.0, zorder=1)
            ax.scatter([pts[i][0] for i in mine], [pts[i][1] for i in mine], s=110, facecolors="none",
                       edgecolors="#222", lw=1.0, zorder=4)
        for i, v in enumerate(values):
            ax.scatter([], [], color=cmap(i % 10), label=_show(v))
        ax.legend(fontsize=7, title=axis, title_fontsize=7, loc="best")
        ax.set_xlabel("p50 latency per sentence, ms")
        _latency_axis(ax, [p[0] for p in pts] or [1.0])
        ax.set_ylabel("BLEU")
        ax.set_title(f"{ts}: {families.get(family).label} by {axis}", fontsize=9)
        ax.grid(alpha=0.3, which="both")
    fig.suptitle("Quality vs latency, coloured by each ablation axis")
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.4 / fig.get_figheight()))   # the title above the top row's titles
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_grid(run_dir: Path, rows: Sequence[Row], samples: Sequence[dict], info: dict, n_resamples: int,
               seed: int) -> list[Path]:
    """``grid.md`` and ``grid.png`` in the run folder when a family's rows vary an axis; else nothing."""
    from narbench_core.io import write_text

    page = render_grid_page(rows, samples, info, n_resamples, seed)
    if page is None:
        return []
    write_text(run_dir / GRID_PAGE, page[0])
    plot_grid(rows, run_dir / GRID_PLOT)
    return [run_dir / GRID_PAGE, run_dir / GRID_PLOT]

