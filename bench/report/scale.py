"""The scale page, ``scale.md`` and ``scale.png``: the AR-PaDIR BLEU gap against model size (issue 52).

Written for a run whose rows carry a ``size`` (a suite with several model presets: ``[model] preset = [...]``).
Per test set, size and NAR system: the size's AR greedy BLEU, the system's BLEU, the **gap** (the system's BLEU
minus AR greedy's of the same size, on the same sentences) with sacrebleu's paired bootstrap over sentences
(``bench.report.grid.bleu_difference``: the run's resamples and seed), and its paired speedups (the median over
sentences of AR ms / NAR ms, with the order-statistics 95% CI, ``bench.measure.stats.paired_speedup``) against
AR greedy and against the fastest AR system of that size (the AR-side row of lowest p50, CTranslate2 included).
A size's parameter count is its AR greedy model's (``model_params``).

``scale.png``: the gap against the parameter count (log x), one line per NAR system, its CI as bars, a panel
per test set, and the fitted trend as a dotted line where there is one. A trend (the slope of the gap per 4x
parameters, with its standard error) is fitted only for a system with three or more sizes, each weighted by its
own bootstrap CI, and given only where a line fits them: where the points scatter about the line more than their
CIs allow (a chi-squared test of the fit, p < ``FIT_ALPHA``) the page says so and gives no slope. The page says
how many points a trend rests on (with three, one degree of freedom is left) and that the CIs cover the test
sentences only, not a second training seed.

Built from ``rows.jsonl`` and ``samples.jsonl`` only (``grid._Run`` reads the per-sentence statistics).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from bench import store as st
from bench.report.grid import Cell, Effect, _Run
from bench.report.names import display_names
from bench.report.tables import render_budgets
from bench.rows import Row
from narbench_core import defaults
from narbench_core.errors import UserError
from narbench_core.io import read_jsonl, write_text
from narbench_core.markdown import table

SCALE_PAGE, SCALE_PLOT = "scale.md", "scale.png"
TREND_POINTS = 3          # sizes a system needs before a trend is fitted (a line through two points tells nothing)
FIT_ALPHA = 0.05          # a line whose chi-squared p-value is below this does not fit its points: no slope given
Z95 = 1.959963984540054   # a 95% CI's half-width in standard errors (the gap's CI read as a normal one)


@dataclass(frozen=True)
class Point:
    """One NAR system at one size on one test set, against that size's AR systems."""

    test_set: str
    size: str
    params: int | None         # the size's AR greedy model's parameters
    variant: str               # the system id without its size: one line across sizes
    name: str                  # its display name without the size
    ar_bleu: float
    bleu: float
    gap: Effect                # BLEU minus AR greedy's, paired bootstrap
    speedup: tuple[float, tuple[float, float] | None]          # vs AR greedy: median [CI]
    fastest: str               # the size's fastest AR system (display name)
    speedup_fastest: tuple[float, tuple[float, float] | None]  # vs it


@dataclass(frozen=True)
class Trend:
    """A weighted least-squares line through one NAR system's gaps against log4(parameters)."""

    variant: str
    test_set: str
    slope: float               # gap change per 4x parameters, BLEU
    stderr: float              # its standard error, scaled up by sqrt(chi2 / dof) where the points scatter more
    points: int                # than their CIs say
    intercept: float           # the line's gap at 1 parameter (log4 x = 0): for drawing it
    chi2: float                # the points' weighted squared residuals about the line
    p_fit: float               # P(chi2 this large or larger | the gaps lie on a line), on points - 2 dof

    @property
    def fits(self) -> bool:
        return self.p_fit >= FIT_ALPHA


def points(rows: Sequence[Row], samples: Sequence[dict], n_resamples: int, seed: int) -> list[Point]:
    """Every sized NAR row against its size's AR greedy (its ``baseline_system``) and fastest AR, where both were
    timed and scored on the same sentences."""
    from bench.measure.stats import paired_speedup

    scored = [r for r in rows if r.get("size") is not None and r.bleu is not None and r.latency_p50_ms is not None]
    run = _Run([], samples, n_resamples, seed)                # its per-sentence statistics and paired tests
    by_key = {r.key: r for r in scored}
    shown = display_names(scored)
    out = []
    for r in scored:
        if r.paradigm == "ar":                         # the baseline side: every other row is compared with it
            continue
        base = by_key.get((r.baseline_system, r.test_set))
        ar_side = [a for a in scored if a.size == r.size and a.test_set == r.test_set and a.paradigm == "ar"]
        if base is None or not ar_side or not run.paired(r, base):
            continue
        fastest = min(ar_side, key=lambda a: (a.latency_p50_ms, a.system))
        gap = run.bleu([(Cell(r, base, ""), 1.0)])

        def speedup(against: Row) -> tuple[float, tuple[float, float] | None]:
            s = paired_speedup([x["latency_ms"] for x in run.samples[against.key]],
                               [x["latency_ms"] for x in run.samples[r.key]])
            return s.median, s.ci

        out.append(Point(r.test_set, r.size, base.model_params, r.system.removesuffix(f"-{r.size}"),
                         _without_size(shown[r.system], r.size), base.bleu, r.bleu, gap, speedup(base),
                         _without_size(shown[fastest.system], r.size),
                         speedup(fastest) if run.paired(r, fastest) else (math.nan, None)))
    return out


def _without_size(name: str, size: str) -> str:
    return name.replace(f", {size}", "")


def trends(found: Sequence[Point]) -> list[Trend]:
    """Per NAR system and test set with ``TREND_POINTS`` or more sizes of known parameters and gap CIs: the gap's
    weighted least-squares line against log4(parameters), each point weighted by 1 / its standard error squared
    (its paired-bootstrap 95% CI's half-width / ``Z95``), the chi-squared of the points about it, and the slope's
    standard error, scaled by sqrt(chi2 / dof) where that is over 1 (the points scatter beyond their CIs: models
    differ by more than test sentences do)."""
    from scipy.stats import chi2 as chi2_dist

    out = []
    for (variant, ts) in dict.fromkeys((p.variant, p.test_set) for p in found):
        pts = [p for p in found if p.variant == variant and p.test_set == ts and p.params and p.gap.ci
               and p.gap.ci[1] > p.gap.ci[0]]
        if len(pts) < TREND_POINTS:
            continue
        x = np.log(np.array([p.params for p in pts], dtype=np.float64)) / math.log(4.0)
        y = np.array([p.gap.value for p in pts], dtype=np.float64)
        w = 1.0 / (np.array([(p.gap.ci[1] - p.gap.ci[0]) / 2.0 for p in pts], dtype=np.float64) / Z95) ** 2
        x_mean, y_mean = np.sum(w * x) / np.sum(w), np.sum(w * y) / np.sum(w)
        spread = float(np.sum(w * (x - x_mean) ** 2))
        if spread <= 0:                                   # every point at one parameter count: no line
            continue
        slope = float(np.sum(w * (x - x_mean) * (y - y_mean)) / spread)
        intercept = float(y_mean - slope * x_mean)
        chi2 = float(np.sum(w * (y - (slope * x + intercept)) ** 2))
        dof = len(pts) - 2
        stderr = math.sqrt(1.0 / spread) * max(1.0, math.sqrt(chi2 / dof))
        out.append(Trend(variant, ts, slope, stderr, len(pts), intercept, chi2, float(chi2_dist.sf(chi2, dof))))
    return out


def _ci(effect_ci: tuple[float, float] | None, digits: int = 2) -> str:
    return "" if effect_ci is None else f" [{effect_ci[0]:.{digits}f}, {effect_ci[1]:.{digits}f}]"


def _params(n: int | None) -> str:
    return "–" if not n else f"{n / 1e6:.1f}M"


COLUMNS = ("size", "params", "AR greedy BLEU", "system", "BLEU", "gap [95% CI]", "speedup vs AR greedy [95% CI]",
           "fastest AR", "speedup vs it [95% CI]")


def _cells(p: Point) -> list[str]:
    return [p.size, _params(p.params), f"{p.ar_bleu:.2f}", p.name, f"{p.bleu:.2f}",
            f"{p.gap.value:+.2f}{_ci(p.gap.ci)}", f"{p.speedup[0]:.2f}{_ci(p.speedup[1])}", p.fastest,
            "–" if math.isnan(p.speedup_fastest[0]) else f"{p.speedup_fastest[0]:.2f}{_ci(p.speedup_fastest[1])}"]


TREND_COLUMNS = ["test set", "system", "gap change per 4x params", "fit: chi2 (dof), p", "points"]


def _trend_cells(t: Trend, name: str) -> list:
    slope = f"{t.slope:+.2f} ± {t.stderr:.2f}" if t.fits else "none: the sizes are not on a line"
    return [t.test_set, name, slope, f"{t.chi2:.2f} ({t.points - 2}), p = {t.p_fit:.3f}", t.points]


RUN_COLUMNS = ["sizes", "run", "date", "commit", "timed on"]


def run_cells(run: st.RunStore, link: str) -> list[str]:
    """A run's line in a scale page's table of runs: its sizes, a link to it, its date, commit and machine."""
    from bench.measure.env import timed_on

    env, rows = run.env(), run.rows()
    git = env.get("git") or {}
    commit = (git.get("commit") or "?")[:7] + (" (uncommitted changes)" if git.get("dirty") else "")
    sizes = ", ".join(dict.fromkeys(r.size for r in rows if r.size)) or "–"
    return [sizes, f"[{run.run_id}]({link})", str(env.get("date_utc") or "?")[:10], commit, timed_on(env)]


def render_scale_page(found: Sequence[Point], info: dict, n_resamples: int, seed: int, rows: Sequence[Row] = (),
                      gap: Sequence[dict] = (), runs: Sequence[list[str]] = ()) -> str:
    """``scale.md``'s text: the runs it rests on (``runs``: ``run_cells``), per test set a table of every NAR
    system at every size, then the trends, every size's models as trained (``render_budgets``: steps, seconds,
    what stopped them) and, where the runs have ``gap`` records (``bench.gap``), where the gap goes at each
    size."""
    sizes = list(dict.fromkeys(p.size for p in sorted(found, key=lambda p: (p.params or 0))))
    several = "s" if len(runs) > 1 else ""
    lines = [f"# Scale: the AR-NAR gap against model size ({info.get('suite', '')}, run{several} "
             f"{info.get('run_id', '')})",
             "", f"Sizes: {', '.join(sizes)}. **Gap**: a NAR system's BLEU minus the AR greedy BLEU of the same size "
             f"on the same sentences, with the 95% interval of sacrebleu's paired bootstrap over sentences "
             f"({n_resamples} resamples, seed {seed}); negative: the NAR system is behind. **Speedups**: the median "
             "over sentences of the AR system's ms / the NAR system's ms, with its order-statistics 95% CI, against "
             "AR greedy and against the size's fastest AR system (lowest p50 of the AR side, CTranslate2 included). "
             "**Params**: the size's AR greedy model's.", ""]
    if len(runs) > 1:
        lines.extend(["Each size was trained, timed and scored in one run, on one machine: its speedups compare "
                      "systems of that run only, never across runs; its BLEU does not depend on the machine.", ""])
    if runs:
        lines.extend([*table(RUN_COLUMNS, runs, "lllll"), ""])
    for ts in dict.fromkeys(p.test_set for p in found):
        here = sorted((p for p in found if p.test_set == ts), key=lambda p: (p.variant, p.params or 0))
        lines.extend([f"## {ts}", "", *table(list(COLUMNS), (_cells(p) for p in here), "llrlrrrlr"), ""])
    fitted = trends(found)
    lines.extend(["## Trend", ""])
    if fitted:
        names = {p.variant: p.name for p in found}
        lines.extend(["The gap's slope against log4(parameters): BLEU per 4x parameters (positive: the gap closes as "
                      "the model grows), ± its standard error; a weighted least-squares line, each size weighted by "
                      "its gap's CI. **Fit**: the chi-squared of the sizes about the line on points - 2 degrees of "
                      f"freedom and its p-value; below {FIT_ALPHA} the sizes do not lie on a line within their CIs "
                      "and no slope is given. The CIs cover the test sentences only: each size is one trained model "
                      "(one seed), so a second seed's spread is not in them.", "",
                      *table(TREND_COLUMNS, (_trend_cells(t, names[t.variant]) for t in fitted), "ll"), ""])
    else:
        lines.extend([f"No trend is fitted: no system has {TREND_POINTS} sizes or more with a known parameter count.",
                      ""])
    lines.extend([f"![{SCALE_PLOT}]({SCALE_PLOT})", "",
                  "The gap against the parameters (log scale), one line per NAR system, its 95% interval as bars.", ""])
    lines.extend(render_budgets(rows, "each run's learning_curves.png" if len(runs) > 1 else "learning_curves.png"))
    if gap:
        from bench.gap import GAP_PAGE, gap_table

        lines.extend(["## Where the gap goes, by size", "",
                      f"From `narbench gap` ([{GAP_PAGE}]({GAP_PAGE}) says what each column means): BLEU each change "
                      "adds to the system as run, and the training-set BLEU of its model and of AR greedy.", ""])
        for ts in dict.fromkeys(r["test_set"] for r in gap if r["test_set"] != "train"):
            body = gap_table(rows, gap, ts)
            if body:
                lines.extend([f"### {ts}", "", *body, ""])
    return "\n".join(lines)


def plot_scale(found: Sequence[Point], path: Path) -> None:
    """One panel per test set: the gap against the parameters (log x), one line per NAR system, CIs as bars, and
    each system's fitted trend (``trends``, where a line fits) dotted."""
    import matplotlib.pyplot as plt

    from bench.report.plots import _axes_grid

    sets = list(dict.fromkeys(p.test_set for p in found))
    fig, axs = _axes_grid(len(sets), plt, width=6.0, height=4.4)
    cmap = plt.get_cmap("tab10")
    lines = [t for t in trends(found) if t.fits]             # fitted once, drawn on each test set's panel
    for ax, ts in zip(axs, sets):
        here = [p for p in found if p.test_set == ts and p.params]
        fitted = [t for t in lines if t.test_set == ts]
        for i, variant in enumerate(dict.fromkeys(p.variant for p in here)):
            pts = sorted((p for p in here if p.variant == variant), key=lambda p: p.params)
            xs, ys = [p.params for p in pts], [p.gap.value for p in pts]
            lo = [p.gap.value - p.gap.ci[0] if p.gap.ci else 0.0 for p in pts]
            hi = [p.gap.ci[1] - p.gap.value if p.gap.ci else 0.0 for p in pts]
            ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", ms=4, capsize=3, lw=1.2, color=cmap(i % 10),
                        label=pts[0].name)
            line = next((t for t in fitted if t.variant == variant), None)
            if line is not None:                 # the fitted trend, over the sizes it rests on
                grid = np.geomspace(xs[0], xs[-1], 32)
                ax.plot(grid, line.intercept + line.slope * np.log(grid) / math.log(4.0), ls=":", lw=1.0,
                        color=cmap(i % 10))
        ax.axhline(0.0, color="#888", lw=0.8, ls="--")
        ax.set_xscale("log")
        ax.set_xlabel("parameters (AR greedy model, log scale)")
        ax.set_ylabel("BLEU gap vs AR greedy of the same size")
        ax.set_title(ts, fontsize=9)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7, loc="best")
    fig.suptitle("The AR-NAR gap against model size")
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.4 / fig.get_figheight()))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_scale(run_dir: Path, rows: Sequence[Row], samples: Sequence[dict], info: dict, n_resamples: int,
                seed: int) -> list[Path]:
    """``scale.md`` and ``scale.png`` in the run folder when its rows have NAR systems at two sizes or more."""
    found = points(rows, samples, n_resamples, seed)
    if len({p.size for p in found}) < 2:
        return []
    return _write(run_dir, found, info, n_resamples, seed, rows, _gap_records(run_dir),
                  [run_cells(st.RunStore(run_dir), ".")])


def write_across(run_dirs: Sequence[str | Path], out: str | Path | None = None) -> list[Path]:
    """``scale.md`` and ``scale.png`` from several runs of one suite with a size axis, each of some of its sizes
    (``narbench run --sizes``: a size trained and timed on one machine, its run committed before the next size's
    models train, perhaps on another machine), into ``out`` (default: ``<results>/<suite>/sizes-<sizes>``
    beside the runs). A size's gap and speedups pair systems of its own run; the page names each run's machine.
    ``narbench scale`` runs it."""
    import os

    stores = [st.RunStore(st.resolve_run_dir(d)) for d in run_dirs]
    twice = [r.path for i, r in enumerate(stores) if r.path.resolve() in {o.path.resolve() for o in stores[:i]}]
    if twice:
        raise UserError(f"{twice[0]} is passed twice; pass each run once")
    if len(stores) < 2:
        raise UserError("narbench scale wants two runs or more (each of some sizes of one suite); one run with "
                        "several sizes has its scale page already (`narbench report RUN`)")
    rows, samples, gap, owner, suites, resamples = [], [], [], {}, set(), set()
    for run in stores:
        own = run.samples()
        these = run.report_rows(own)
        sized = [r for r in these if r.size]
        if not sized:
            raise UserError(f"{run.path}: its rows name no model size; pass runs of a suite with a size axis "
                            "([model] preset = [...]; `narbench run --sizes SIZE`)")
        for size in dict.fromkeys(r.size for r in sized):
            if size in owner:
                raise UserError(f"size {size} is in two runs ({owner[size]} and {run.path}); pass one run per size")
            owner[size] = run.path
        suites.add(sized[0].suite)
        resamples.add(run.spec_settings()["bootstrap_resamples"])
        rows.extend(these)
        samples.extend(own)
        gap.extend(_gap_records(run.path))
    if len(suites) > 1:
        raise UserError(f"the runs are of several suites ({', '.join(sorted(suites))}); pass runs of one suite")
    if len(resamples) > 1:
        raise UserError(f"the runs' paired bootstraps differ ({', '.join(map(str, sorted(resamples)))} resamples); "
                        "pass runs of one spec's settings")
    [suite], [n_resamples] = suites, resamples
    found = points(rows, samples, n_resamples, defaults.SIGNIFICANCE_SEED)
    if not found:
        raise UserError("no NAR system of these runs has BLEU and latencies beside its size's AR greedy; pass "
                        "finished runs (`narbench run --sizes SIZE` until it finishes)")
    sizes = list(dict.fromkeys(p.size for p in sorted(found, key=lambda p: (p.params or 0))))
    target = Path(out) if out else stores[0].path.parent / f"sizes-{'-'.join(sizes)}"
    target.mkdir(parents=True, exist_ok=True)
    stores.sort(key=lambda r: min((sizes.index(s) for s, at in owner.items() if at == r.path and s in sizes),
                                  default=len(sizes)))
    info = {"suite": suite, "run_id": ", ".join(r.run_id for r in stores)}
    runs = [run_cells(r, Path(os.path.relpath(r.path, target)).as_posix()) for r in stores]
    return _write(target, found, info, n_resamples, defaults.SIGNIFICANCE_SEED, rows, gap, runs)


def _gap_records(run_dir: Path) -> list[dict]:
    from bench.gap import GAP_FILE

    return read_jsonl(run_dir / GAP_FILE) if (run_dir / GAP_FILE).is_file() else []


def _write(folder: Path, found: Sequence[Point], info: dict, n_resamples: int, seed: int, rows: Sequence[Row],
           gap: Sequence[dict], runs: Sequence[list[str]]) -> list[Path]:
    write_text(folder / SCALE_PAGE, render_scale_page(found, info, n_resamples, seed, rows, gap, runs))
    plot_scale(found, folder / SCALE_PLOT)
    return [folder / SCALE_PAGE, folder / SCALE_PLOT]
