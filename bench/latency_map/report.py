"""The latency map's report: ``speedmap.md`` (:func:`render`: where PaDIR wins, the cost model's
accuracy, accelerator projections, every timed row) and ``crossover.png`` (:func:`plot_crossover`),
both from the saved rows only. Every table is drawn by ``narbench_core.markdown.table``."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from bench.latency_map.model import FEATURES, CostModel, prediction_score
from bench.latency_map.spec import PROJECTED, RATES, MapSpec
from narbench_core.markdown import table

if TYPE_CHECKING:      # jax-importing modules load on first use, so `narbench --help` stays light
    from bench import costs


def _padir(rows: Sequence[dict]) -> list[dict]:
    """The refinement rows: every row that is not the AR baseline's."""
    return [r for r in rows if r["family"] != "ar"]


def plot_crossover(rows: Sequence[dict], spec: MapSpec, path: Path) -> None:
    """Speedup of PaDIR over AR greedy (p50) against target length: one panel per size and batch,
    one colour per T, solid k=1 / dashed k>1."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    sizes = [s for s in spec.sizes if any(r["size"] == s for r in rows)]
    fig, axes = plt.subplots(len(sizes), len(spec.batches), figsize=(4.2 * len(spec.batches), 3.4 * len(sizes)),
                             squeeze=False, sharey=True)
    colours = dict(zip(spec.iterations, plt.get_cmap("viridis")(np.linspace(0.0, 0.85, len(spec.iterations)))))
    styles = ["-", "--", ":", "-."]
    for i, size in enumerate(sizes):
        for j, batch in enumerate(spec.batches):
            ax = axes[i][j]
            ax.axhline(1.0, color="0.4", lw=0.8)
            for hi, k in enumerate(spec.length_hyps):
                for t in spec.iterations:
                    pts = sorted((r["target_length"], r["speedup_p50_vs_ar"]) for r in _padir(rows)
                                 if r["size"] == size and r["batch_size"] == batch and r["iterations"] == t
                                 and r["length_hyps"] == k)
                    if pts:
                        ax.plot(*zip(*pts), marker="o", ms=3, color=colours[t], ls=styles[hi % len(styles)],
                                label=f"T={t}, k={k}")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
            ax.set_xticks(list(spec.lengths), [str(n) for n in spec.lengths])
            ax.set_title(f"{size}, batch {batch}", fontsize=10)
            if i == len(sizes) - 1:
                ax.set_xlabel("target length (tokens)")
            if j == 0:
                ax.set_ylabel("speedup vs AR greedy (p50)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="upper center", ncol=min(len(labels), 8), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fmt_x(v: float | None) -> str:
    if v is None:
        return "-"
    return f"**{v:.2f}x**" if v >= 1.0 else f"{v:.2f}x"


# The measured-rows table: one column list (key, header, format).
COLUMNS = (
    ("size", "size", str), ("target_length", "length", str), ("batch_size", "batch", str),
    ("system", "system", str), ("calls", "calls", str),
    ("latency_p50_ms", "p50 ms", lambda v: f"{v:.1f}"), ("latency_p99_ms", "p99 ms", lambda v: f"{v:.1f}"),
    ("speedup_p50_vs_ar", "speedup p50", _fmt_x), ("speedup_p99_vs_ar", "speedup p99", _fmt_x),
    ("predicted_p50_ms", "predicted p50 ms", lambda v: f"{v:.1f}"),
    ("prediction_error", "error", lambda v: f"{100 * v:+.0f}%"),
    ("calibration", "fitted on", lambda v: "yes" if v else "no"),
)


def _table(rows: Sequence[dict], columns=COLUMNS) -> list[str]:
    return table([h for _, h, _ in columns],
                 ([fmt(r[key]) if r.get(key) is not None else "-" for key, _, fmt in columns] for r in rows),
                 "".join("l" if key in ("size", "system") else "r" for key, _, _ in columns))


def render(rows: Sequence[dict], spec: MapSpec, model: CostModel | None, env: dict, run_finished: bool = True,
           rates: costs.MachineRates | None = None) -> str:
    """``speedmap.md``: where PaDIR wins (speedup grids), the cost model's accuracy, projections, rows."""
    cpu = env.get("cpu_model", "unknown CPU")
    where = (f"**{cpu}** ({env.get('threads', '?')} threads, {env.get('platform', 'cpu')})"
             if env.get("platform", "cpu") == "cpu" else
             f"**{env.get('device_kind', '?')}** ({env.get('platform')}, {env.get('device_driver') or 'driver unknown'}; "
             f"host CPU {cpu})")
    lines = ["# Latency map: AR greedy vs PaDIR refine:T (k length hypotheses)", "",
             f"Measured on {where}, "
             f"random-weight models (seed {spec.seed}), vocabulary {spec.vocab_size:,}, source length = target "
             "length, every target length forced (AR: exactly that many decoder passes; PaDIR: k hypotheses of that "
             "length, exactly T passes, no early stop). End-to-end latency per call, timed interleaved "
             f"by `bench.measure.timing`; {spec.min_calls}-{spec.max_calls} calls per system and cell "
             f"(about {spec.cell_seconds:g} s of timed rounds per cell). Speedup = AR greedy p50 / PaDIR p50 "
             "(bold: PaDIR is faster). p99 ratios come from few calls; with forced lengths they mostly repeat "
             "the p50 ones.", ""]
    for size in spec.sizes:
        for batch in spec.batches:
            cell_rows_ = [r for r in _padir(rows) if r["size"] == size and r["batch_size"] == batch]
            if not cell_rows_:
                continue
            lengths = [n for n in spec.lengths if any(r["target_length"] == n for r in cell_rows_)]
            ar = {r["target_length"]: r for r in rows if r["family"] == "ar" and r["size"] == size
                  and r["batch_size"] == batch}
            body = [["AR greedy p50 ms", *(f"{ar[n]['latency_p50_ms']:.1f}" if n in ar else "-" for n in lengths)]]
            for k in spec.length_hyps:
                for t in spec.iterations:
                    by_len = {r["target_length"]: r for r in cell_rows_ if r["iterations"] == t and r["length_hyps"] == k}
                    body.append([f"T={t}, k={k}", *(_fmt_x(by_len[n]["speedup_p50_vs_ar"]) if n in by_len else "-"
                                                    for n in lengths)])
            lines += [f"## {size}, batch {batch}: PaDIR speedup over AR greedy (p50)", "",
                      *table(["", *(f"{n} tok" for n in lengths)], body, "l"), ""]
    if not run_finished:
        lines += [f"**Unfinished map**: {len({(r['size'], r['target_length'], r['batch_size']) for r in rows})} of "
                  f"{len(spec.cells())} cells timed so far; re-running the command resumes it.", ""]
    lines += _device_lines(rows, spec) + _model_lines(rows, model, rates, spec) + _projection_lines(rows, spec)
    lines += ["", "## Every timed row", ""] + _table(rows) + [""]
    return "\n".join(lines)


def _model_lines(rows: Sequence[dict], model: CostModel | None, rates: costs.MachineRates | None,
                 spec: MapSpec | None = None) -> list[str]:
    if model is None and spec is not None and not spec.calibrate:
        return ["## Cost model", "", "None: this map fits no cost model (`--no-cost-model`, or no calibration "
                "size) and was given none.", ""]
    if model is None:
        return ["## Cost model", "", "Not fitted yet: the calibration sizes have fewer than "
                f"{len(FEATURES)} timed rows.", ""]
    within, scored = prediction_score(rows)
    c = model.coef
    lines = ["## Cost model", "",
              f"`predicted = {c[0]:.3f} ms per call + {c[1]:.4f} ms per pass + {1e3 * c[2]:.2f} µs per kernel + "
              f"{c[3]:.3f} x work`, fitted (non-negative least squares on relative error) on the "
              f"{model.cells_fitted} rows of {', '.join(model.calibrated_on)}"
              + (f" **in another map, `{model.fitted_in}`**: none of this map's rows was fitted on" if model.fitted_in
                 else "") + ". Flops, bytes and kernels are XLA's "
              "cost analysis of the compiled encoder and of one more decoder pass (two chained passes minus one: "
              "the loop-invariant work counts once per call); batched dots (attention's products) and layout "
              "moves (transposes and copies) are read from the optimised HLO. work = compute + attention + layout "
              "+ memory, each at a rate measured on this machine inside a jitted loop: the other flops at the fp32 "
              "GEMM rate of the model's matmul shape and the part's rows, each batched dot at its shape's rate, "
              "each move at a transpose's rate for its size, bytes at the read bandwidth for a working set of that "
              f"size (this map's `{RATES}`, measured {_measured(rates)}). Each row's "
              "`work_ms` gives the four terms.", ""]
    if scored:
        errors = np.array([abs(r["prediction_error"]) for r in rows if not r["calibration"]])
        lines.append(f"Rows it was **not** fitted on: **{within} of {scored} ({100 * within / scored:.0f}%) "
                     f"predicted within ±25%**; median absolute error {100 * np.median(errors):.0f}%, "
                     f"worst {100 * errors.max():.0f}%.")
    else:
        lines.append("No row outside the calibration sizes has been timed yet, so the prediction is not scored.")
    fitted = np.array([abs(r["prediction_error"]) for r in rows if r["calibration"]])
    if fitted.size:
        lines.append(f"On the rows it was fitted on: median absolute error {100 * np.median(fitted):.0f}%.")
    return lines + [""]


def _measured(rates: costs.MachineRates | None) -> str:
    if rates is None:
        return "?"
    return ", ".join([rates.measured_at] + [f"{name} {at}" for name, at in sorted(rates.measured.items())])


AGREES = 0.25        # a measurement "matches" its projection within this share


def _device_lines(rows: Sequence[dict], spec: MapSpec) -> list[str]:
    """Timed on an accelerator narbench states peaks for (``device_projection``): each row beside its roofline
    projection on that same device, absolute and as PaDIR's speedup over AR greedy, and how many agree."""
    from bench import costs

    timed_on = next((r for r in rows if r.get("device_projection")), None)
    if timed_on is None:
        return []
    own, kind = timed_on["device_projection"], timed_on.get("device_kind")
    acc, col = costs.accelerator(own), f"projection_{own}_ms"
    ar = {(r["size"], r["target_length"], r["batch_size"]): r for r in rows if r["family"] == "ar"}
    order = lambda r: (spec.sizes.index(r["size"]) if r["size"] in spec.sizes else 99, r["batch_size"],  # noqa: E731
                       r["target_length"], r["family"] != "ar", r["length_hyps"], r["iterations"] or 0)
    body, absolute, speedups = [], [], []
    for r in sorted((r for r in rows if r.get(col)), key=order):
        a = ar.get((r["size"], r["target_length"], r["batch_size"]))
        projected = a[col] / r[col] if a is not None and a.get(col) and r["family"] != "ar" else None
        measured = r["speedup_p50_vs_ar"] if r["family"] != "ar" else None
        absolute.append(r["latency_p50_ms"] / r[col])
        if projected and measured:
            speedups.append(measured / projected)
        body.append([r["size"], r["target_length"], r["batch_size"], r["system"], f"{r['latency_p50_ms']:.2f}",
                     f"{r['latency_p99_ms']:.2f}", f"{r[col]:.3f}", f"{r['latency_p50_ms'] / r[col]:.1f}",
                     _fmt_x(measured), "-" if projected is None else f"{projected:.2f}x",
                     "-" if not (projected and measured) else f"{measured / projected:.2f}"])
    near = lambda xs: sum(abs(x - 1) <= AGREES for x in xs)  # noqa: E731
    return ["## Measured on this device against its roofline projection", "",
            f"The device, {kind}, is `{own}` in narbench's table of published peaks ({acc.peak_flops / 1e12:,.1f} "
            f"TFLOP/s {acc.dtype} dense, {acc.bandwidth / 1e9:,.0f} GB/s; {acc.source}). Each row: the measured p50 "
            "and p99 (ms a call), the roofline projection of the same decoder on those peaks (encoder + passes x "
            "max(flops / peak, bytes / bandwidth): a lower bound with no launch or per-step overhead), their "
            "ratio, and PaDIR's speedup over AR greedy measured and projected.", "",
            f"- PaDIR speedups within ±{AGREES:.0%} of the projected speedup: **{near(speedups)} of {len(speedups)}**"
            + (f" (measured / projected: median {np.median(speedups):.2f}, range {min(speedups):.2f}-"
               f"{max(speedups):.2f})." if speedups else "."),
            f"- Absolute p50 within ±{AGREES:.0%} of its projection: **{near(absolute)} of {len(absolute)}** rows"
            + (f" (measured / projected: median {np.median(absolute):.1f}x)." if absolute else "."), "",
            *table(["size", "length", "batch", "system", "p50 ms", "p99 ms", "projection ms", "p50 / projection",
                    "speedup", "projected speedup", "speedup / projected"], body, "l"), ""]


def _projection_lines(rows: Sequence[dict], spec: MapSpec) -> list[str]:
    from bench import costs

    peaks = "; ".join(f"{a.name} {a.peak_flops / 1e12:,.0f} TFLOP/s {a.dtype}, {a.bandwidth / 1e9:,.0f} GB/s"
                      for a in map(costs.accelerator, PROJECTED))
    lines = ["## Projections (roofline bounds, not measurements)", "",
             "Encoder + passes x max(flops / peak, bytes / bandwidth) with each accelerator's published dense "
             f"peak ({peaks}): no launch or per-step overhead, which on an accelerator is "
             "what AR pays most, so these bound from below and flatter neither side's fixed costs. "
             "Speedup of PaDIR T=4 over AR greedy at batch 1:", ""]
    body = []
    for r in sorted(_padir(rows), key=lambda r: (spec.sizes.index(r["size"]), r["target_length"], r["length_hyps"])):
        if r["batch_size"] != 1 or r["iterations"] != 4:
            continue
        ar = next((a for a in rows if a["family"] == "ar" and (a["size"], a["target_length"], a["batch_size"])
                   == (r["size"], r["target_length"], 1)), None)
        if ar is None:
            continue
        proj = [ar[f"projection_{n}_ms"] / r[f"projection_{n}_ms"] for n in PROJECTED]
        body.append([r["size"], r["target_length"], r["length_hyps"], _fmt_x(r["speedup_p50_vs_ar"]),
                     *(f"{p:.1f}x" for p in proj)])
    here = "CPU measured" if all(r.get("platform", "cpu") in (None, "cpu") for r in rows) else "measured"
    return lines + table(["size", "length", "k", here, *PROJECTED], body, "l")
