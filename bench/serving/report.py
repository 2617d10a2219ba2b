"""The serving page (``serving.md``), its plot (``serving.png``) and the leaderboard's serving section.

Only tests LoadGen called VALID are reported as results; the INVALID ones are counted and stay in
serving.jsonl with LoadGen's reason. Tables are rendered from column lists of ``bench.serving.rows``.
"""
from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Mapping, Sequence

from bench.columns import fixed, ms
from bench.serving.measure import CPU_FIELDS
from bench.serving.rows import cell
from bench.serving.run import DRIVER
from narbench_core import markdown

PAGE, PLOT = "serving.md", "serving.png"
SINGLE_AGREES = 0.10      # SingleStream's p50 and p90 within 10% of the harness's batch-1 figures


def _valid(records: Sequence[dict], **match) -> list[dict]:
    return [r for r in records if r["validity"] == "VALID" and all(r.get(k) == v for k, v in match.items())]


def peaks(records: Sequence[dict]) -> dict[tuple[str, float], dict]:
    """(system, bound) -> the VALID peak test (the validation LoadGen accepted) of each system at each bound."""
    out = {}
    for r in _valid(records, purpose="peak"):
        key = (r["system"], r["bound_ms"])
        if key not in out or r["qps"] > out[key]["qps"]:
            out[key] = r
    return out


def _name(shown: Mapping[str, str], system: str) -> str:
    return shown.get(system, system)


def _table(records: Sequence[dict], names: Sequence[str], shown, header: Sequence[str] | None = None,
           extra: Sequence[tuple[str, callable]] = ()) -> list[str]:
    head = ["System", *(header or [cell_header(n) for n in names]), *(h for h, _ in extra)]
    body = [[_name(shown, r["system"]), *(cell(r, n) for n in names), *(f(r) for _, f in extra)] for r in records]
    return markdown.table(head, body, "l")


def cell_header(name: str) -> str:
    from bench.serving.rows import column

    return column(name).header


def single_stream_rows(records: Sequence[dict]) -> list[dict]:
    """One row per system and test set: its VALID SingleStream test, or, where SingleStream ran in rounds
    (``single_rounds``), the rounds' medians with the rounds themselves under ``rounds``."""
    groups: dict[tuple, list[dict]] = {}
    for r in _valid(records, scenario="SingleStream"):
        if r["system"] != DRIVER:
            groups.setdefault((r["system"], r.get("test_set")), []).append(r)
    return [rs[0] if len(rs) == 1 else _rounds_row(rs) for rs in groups.values()]


def _rounds_row(rounds: list[dict]) -> dict:
    def median(key: str) -> float | None:
        return _median([r[key] for r in rounds if r.get(key) is not None])

    first, last = rounds[0], rounds[-1]
    keys = ("latency_p50_ms", "latency_p90_ms", "latency_p99_ms", "solo_p50_ms", "solo_p90_ms", "worker_p50_ms",
            "qps", "solo_matched_p50_ms", "solo_matched_p90_ms", *CPU_FIELDS)
    return {**first, **{k: median(k) for k in keys}, "test": "singlestream-rounds", "rounds": rounds,
            "queries": sum(r["queries"] or 0 for r in rounds),
            "solo_drift": math.prod(r["solo_drift"] for r in rounds) if all(r.get("solo_drift") for r in rounds)
            else None, "date_utc": last.get("date_utc")}


def driver_of(records: Sequence[dict], test_set: str | None = None) -> dict | None:
    """The empty system's VALID SingleStream test (of ``test_set`` where given): the driver's round trip."""
    return next((r for r in _valid(records, system=DRIVER, scenario="SingleStream")
                 if test_set is None or r.get("test_set") == test_set), None)


def agreement(r: dict, driver: dict | None, against: str = "solo") -> tuple[float | None, float | None]:
    """SingleStream's p50 and p90 over the harness's batch-1 p50 and p90 plus the driver's round trip (``driver``,
    the empty system's SingleStream; the harness's clock runs inside the worker, LoadGen's from its issue):
    ``solo`` (the same worker timed alone right before and after SingleStream) or ``batch1`` (the suite's
    interleaved timing, rows.jsonl). A row of rounds (``single_stream_rows``): the median of its rounds' ratios,
    each round against the solo timings on either side of it."""
    return _median(ratios(r, driver, "p50", against)), _median(ratios(r, driver, "p90", against))


def ratios(r: dict, driver: dict | None, q: str, against: str = "solo") -> list[float]:
    """Each round's (or the one test's) ratio of SingleStream's ``q`` to ``against``'s plus the driver's; against
    ``solo``, the solo timings over the very sentences LoadGen drew where the record has them
    (``solo_matched_*``)."""
    extra = (driver or {}).get(f"latency_{q}_ms") or 0.0
    out = []
    for one in r.get("rounds") or [r]:
        a = one[f"latency_{q}_ms"]
        b = (one.get(f"solo_matched_{q}_ms") if against == "solo" else None) or one.get(f"{against}_{q}_ms")
        if a is not None and b:
            out.append(a / (b + extra))
    return out


def _median(xs: Sequence[float]) -> float | None:
    return float(statistics.median(xs)) if xs else None


def _range(xs: Sequence[float]) -> str:
    return f"{min(xs):.3f}-{max(xs):.3f}" if len(xs) > 1 else ""


def disagreements(records: Sequence[dict]) -> list[str]:
    """The systems whose SingleStream p50 or p90 is more than ``SINGLE_AGREES`` off the harness's solo timing plus
    the driver's round trip."""
    return [r["system"] for r in single_stream_rows(records)
            if any(x is not None and abs(x - 1) > SINGLE_AGREES
                   for x in agreement(r, driver_of(records, r.get("test_set"))))]


def verdict(records: Sequence[dict], shown: Mapping[str, str]) -> list[str]:
    """At each bound: the system that serves the most sentences per second (and its BLEU), and where the best
    NAR system stands against the fastest AR."""
    found = peaks(records)
    lines = []
    for bound in sorted({b for _, b in found}):
        at = [r for (s, b), r in found.items() if b == bound]
        best = max(at, key=lambda r: r["qps"])
        ar = [r for r in at if r["paradigm"] == "ar"]
        nar = [r for r in at if r["paradigm"] != "ar"]
        text = (f"- **p{_pct(best)} under {bound:g} ms**: {_name(shown, best['system'])} serves the most, "
                f"{best['qps']:.1f} sentences/s at {fixed(2)(best['bleu'])} BLEU")
        if ar and nar:
            a, n = max(ar, key=lambda r: r["qps"]), max(nar, key=lambda r: r["qps"])
            text += (f"; the best NAR system ({_name(shown, n['system'])}, {n['qps']:.1f}/s, {fixed(2)(n['bleu'])} BLEU) "
                     f"serves {n['qps'] / a['qps']:.2f}x the fastest AR ({_name(shown, a['system'])}, "
                     f"{a['qps']:.1f}/s, {fixed(2)(a['bleu'])} BLEU)")
        lines.append(text + ".")
    unreachable = sorted({(r["system"], r["bound_ms"]) for r in records if r["validity"] == "UNREACHABLE"})
    if unreachable:
        lines.append("- No load holds the bound (SingleStream's p99 is over it): " + ", ".join(
            f"{_name(shown, s)} at {b:g} ms" for s, b in unreachable) + ".")
    failed = no_peak(records)
    if failed:
        lines.append("- No validated peak (FindPeakPerformance found none, or LoadGen called every validation "
                     "INVALID): " + ", ".join(
                         f"{_name(shown, s)} at {b:g} ms (lowest QPS tried {q:.1f}, its p99 {p99:.0f} ms)"
                         for (s, b), (q, p99) in sorted(failed.items())) + ".")
    return lines


def no_peak(records: Sequence[dict]) -> dict[tuple[str, float], tuple[float, float]]:
    """(system, bound) -> (the lowest QPS tried, its p99) where a bound's search ran but found no peak
    (``NOT_FOUND``) or no validation was VALID."""
    found, out = peaks(records), {}
    for r in records:
        key = (r["system"], r["bound_ms"])
        if r["purpose"] == "peak" and r["validity"] in ("INVALID", "NOT_FOUND") and key not in found:
            if key not in out or r["target_qps"] < out[key][0]:
                out[key] = (r["target_qps"], r["latency_p99_ms"])
    return out


def offline_rows(records: Sequence[dict]) -> list[dict]:
    """Each system's fastest VALID Offline test (``bench.serving.measure.best_offline``), fastest first."""
    from bench.serving.measure import best_offline

    systems = dict.fromkeys(r["system"] for r in _valid(records, scenario="Offline"))
    return sorted((best_offline(records, s) for s in systems), key=lambda r: -r["qps"])


def _by_batch(records: Sequence[dict], system: str) -> str:
    best: dict[int, float] = {}
    for r in _valid(records, scenario="Offline", system=system):
        best[r["max_batch"]] = max(best.get(r["max_batch"], 0.0), r["qps"])
    return ", ".join(f"{b}: {q:.1f}" for b, q in sorted(best.items()))


def _batches(max_batch) -> str:
    if isinstance(max_batch, int) or len(max_batch) == 1:
        return str(max_batch if isinstance(max_batch, int) else max_batch[0])
    return (f"{', '.join(map(str, max_batch[:-1]))} or {max_batch[-1]} (Offline measures each; Server serves each system "
            "at the one its Offline throughput was highest at)")


def _pct(r: dict) -> str:
    return f"{(r.get('percentile') or 0.99) * 100:g}"


def render(records: Sequence[dict], shown: Mapping[str, str], settings: Mapping, env: Mapping, run_id: str) -> str:
    invalid = [r for r in records if r["validity"] == "INVALID"]
    driver = [r for r in _valid(records, system=DRIVER)]
    version = env.get("versions", {}).get("mlcommons-loadgen")
    lines = [f"# Serving under load (run {run_id})", "",
             f"Each system served by MLPerf LoadGen{f' (mlcommons-loadgen {version})' if version else ''} "
             f"on {env.get('cpu_model')} ({env.get('cores')} cores), from its own worker process; LoadGen and the "
             "dynamic batcher run in the driver. Sentences are LoadGen's samples (the test set is its query sample "
             "library); latency is from LoadGen's issue to the system's completion, detokenized text included.", "",
             f"Settings: minimum duration {settings['min_duration_s']:g} s a test, at least {settings['min_queries']} "
             f"queries for SingleStream, the Server curve and each peak's validation, {settings['search_queries']} for "
             f"each step of FindPeakPerformance; the batcher's largest batch {_batches(settings['max_batch'])}, held up to "
             f"{settings['max_wait_ms']:g} ms for more queries"
             + (", a batch cut from a longer queue grouping the oldest query with those nearest its length (in words)"
                if settings.get("group_by_length") else ", first come, first served") + ". "
             "These are CPU-sized: MLPerf's submission rules "
             "ask for 10 minutes a test (and 270,336 queries for Server), which would take days here. Only tests "
             "LoadGen called VALID are reported; "
             f"{len(invalid)} INVALID test(s) stay in serving.jsonl with LoadGen's reason.", ""]
    if driver:
        d = driver[0]
        lines += [f"**The driver's cost**: an empty system (it returns its sources) served SingleStream: p50 "
                  f"{ms(d['latency_p50_ms'])} ms, p99 {ms(d['latency_p99_ms'])} ms a query (LoadGen, batcher, the "
                  "worker's pipe). That much of every latency below is the driver's.", ""]
    says = verdict(records, shown)
    if says:
        lines += ["## What serving under load says", "", *says, ""]
    found = peaks(records)
    if found:
        lines += ["## Server: the highest QPS whose latency percentile holds the bound", "",
                  "Found by LoadGen's FindPeakPerformance (it widens, then bisects), then validated by a "
                  "PerformanceOnly test at that QPS, and at a lower QPS after each failed one (docs/serving.md says "
                  "how much lower).", ""]
        for bound in sorted({b for _, b in found}):
            rs = sorted((r for (s, b), r in found.items() if b == bound), key=lambda r: -r["qps"])
            lines += [f"### Bound {bound:g} ms", "", *_table(rs, ["bleu", "qps", "latency_p50_ms", "latency_p99_ms",
                                                               "mean_batch", "same_as_batch1", "bleu_delta_vs_batch1"],
                                                          shown), ""]
    offline = offline_rows(records)
    if offline:
        lines += ["## Offline: every query at once", "", "Sentences per second with batches of up to the batcher's "
                  "largest, at each largest batch measured (last column); the table's row is the fastest, the batch "
                  "the system is then served at. Its outputs under batching against the system's batch-1 outputs.", "",
                  *_table(offline, ["bleu", "qps", "max_batch", "mean_batch", "same_as_batch1",
                                    "bleu_delta_vs_batch1"], shown,
                          extra=(("QPS by max batch", lambda r: _by_batch(records, r["system"])),)), ""]
    single = single_stream_rows(records)
    if single:
        off = disagreements(records)
        d = driver_of(records)
        cpu = [k for k in CPU_FIELDS[:3] if any(r.get(k) is not None for r in single)]   # runs since 2026-11-29

        def drv(r: dict) -> dict | None:
            return driver_of(records, r.get("test_set"))

        lines += ["## SingleStream against the harness's batch-1 timing", "",
                  "LoadGen's SingleStream (one query at a time, from LoadGen's issue to the completion) against "
                  "narbench's own batch-1 timing of the same system: *solo*, the same worker timed alone on the "
                  "test set right before SingleStream and, where *drift* is given, again right after it (pooled; "
                  "*drift* is the p50 after over the p50 before). Where SingleStream ran in *rounds* (several "
                  "LoadGen tests, each between two solo timings: solo, SingleStream, solo, SingleStream, ..., solo), "
                  "each round is compared with the solo timings on either side of it, so that the machine's drift "
                  "cancels; the row gives the rounds' medians, the ratios are the medians of the rounds' ratios "
                  "(their range beside them), and *drift* is the last solo timing's p50 over the first's. "
                  "*batch-1* is the suite's interleaved timing earlier in the run (rows.jsonl; it differs "
                  "from solo by the machine's drift in between and by the interleaving). The harness's clock runs "
                  "inside the worker and LoadGen's from its issue, so each ratio's denominator adds the driver's "
                  "round trip (the empty system's SingleStream"
                  + (f": p50 {ms(d['latency_p50_ms'])} ms, p90 {ms(d['latency_p90_ms'])} ms" if d else ", not measured")
                  + f"). The check: p50 and p90 over solo plus the driver within {SINGLE_AGREES:.0%}; where *solo "
                  "p50 ms, same sentences* is given, over the solo timings of the very sentences LoadGen drew (each "
                  "as often as drawn: a few hundred random draws can run shorter or longer than the test set). "
                  "*worker p50* is the worker's own clock of its calls during SingleStream"
                  + ("; *driver CPU*, *worker CPU* and *others CPU* are the CPU time the driver (LoadGen, the batcher), "
                     "the worker (the engine) and everything else took during SingleStream, as shares of all the "
                     "machine's cores (0.5: one core of two)." if cpu else "."), "",
                  *_table(single, ["latency_p50_ms", "solo_p50_ms",
                                   *(["solo_matched_p50_ms"] if any(r.get("solo_matched_p50_ms") for r in single)
                                     else []),
                                   "batch1_p50_ms", "worker_p50_ms",
                                   "latency_p90_ms", "solo_p90_ms", "solo_drift", *cpu],
                         shown, extra=(
                      ("Rounds", lambda r: str(len(r.get("rounds") or [r]))),
                      ("p50 / (solo + driver)", lambda r: fixed(3)(agreement(r, drv(r))[0])),
                      ("its range over rounds", lambda r: _range(ratios(r, drv(r), "p50"))),
                      ("p90 / (solo + driver)", lambda r: fixed(3)(agreement(r, drv(r))[1])),
                      ("p50 / (batch-1 + driver)", lambda r: fixed(3)(agreement(r, drv(r), "batch1")[0])))), "",
                  (f"{len(single) - len(off)} of {len(single)} within {SINGLE_AGREES:.0%} of the solo timing plus the "
                   "driver's round trip" + (f"; not: {', '.join(_name(shown, s) for s in off)}." if off else ".")), ""]
    curve = sorted(_valid(records, purpose="curve"), key=lambda r: (r["system"], r["target_qps"]))
    if curve:
        lines += ["## Server: latency against load", "", "Poisson arrivals at shares of the system's Offline "
                  "throughput, no bound; with the peaks and SingleStream in [serving.png](serving.png).", "",
                  *_table(curve, ["target_qps", "qps", "latency_p50_ms", "latency_p99_ms", "mean_batch"], shown), ""]
    lines += ["## How this differs from the WMT efficiency task", "",
              "The WMT efficiency shared task (Helcl, Haddow and Birch used its protocol) times latency one sentence "
              "at a time and throughput on the whole test set in large batches using every core. Here: throughput "
              "is LoadGen's Offline with the batcher's largest batch, not a tuned batch per system; each engine "
              "keeps the thread count of its batch-1 system (one thread for CTranslate2 and ONNX Runtime, XLA's "
              "pool for JAX), and LoadGen's threads and the batcher share the same cores; Server has no WMT "
              "counterpart; and the test set is LoadGen's sample library, so sentences repeat when a test needs "
              "more queries than it has.", "", "Files: [serving.jsonl](serving.jsonl) (every test, VALID or not), "
              "LoadGen's logs under `serving/<system>/<test>/`.", ""]
    return "\n".join(lines)


def plot(records: Sequence[dict], shown: Mapping[str, str], path: Path) -> None:
    """p50 and p99 against the QPS served, per system: SingleStream, the Server curve and the validated peaks."""
    import matplotlib.pyplot as plt

    systems = list(dict.fromkeys(r["system"] for r in records if r["system"] != DRIVER))
    fig, ax = plt.subplots(1, 2, figsize=(12, 4.8), sharey=True)
    for system in systems:
        pts = sorted((r["qps"], r["latency_p50_ms"], r["latency_p99_ms"], r["purpose"] == "peak")
                     for r in _valid(records, system=system)
                     if r["purpose"] in ("singlestream", "curve", "peak") and r["qps"])
        if not pts:
            continue
        for a, k in ((ax[0], 1), (ax[1], 2)):
            line, = a.plot([p[0] for p in pts], [p[k] for p in pts], marker="o", ms=3, label=_name(shown, system))
            peak = [p for p in pts if p[3]]
            a.scatter([p[0] for p in peak], [p[k] for p in peak], s=40, color=line.get_color(), zorder=3)
    for a, label in ((ax[0], "p50"), (ax[1], "p99")):
        a.set_title(f"{label} latency against load (large dots: each bound's validated peak)", fontsize=10)
    for bound in sorted({r["bound_ms"] for r in records if r["purpose"] == "peak" and r["bound_ms"]}):
        for a in ax:
            a.axhline(bound, color="#888", ls=":", lw=1)
    for a in ax:
        a.set_xlabel("sentences per second served")
        a.set_yscale("log")
        a.grid(alpha=0.3, which="both")
    ax[0].set_ylabel("latency, ms (log scale)")
    if ax[1].get_legend_handles_labels()[0]:
        ax[1].legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def leaderboard_section(records: Sequence[dict], shown: Mapping[str, str]) -> list[str]:
    says = verdict(records, shown)
    if not says:
        return []
    return ["## Serving under load", "", *says, "", f"Every scenario, LoadGen's validity and the latency-load "
            f"plot: [{PAGE}]({PAGE}).", ""]


def write(run_dir: Path, records: Sequence[dict], shown: Mapping[str, str], settings: Mapping, env: Mapping,
          run_id: str) -> list[Path]:
    from narbench_core.io import write_text

    write_text(run_dir / PAGE, render(records, shown, settings, env, run_id))
    plot(records, shown, run_dir / PLOT)
    return [run_dir / PAGE, run_dir / PLOT]
