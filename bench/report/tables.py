"""The tables of the report's pages, each rendered by the one markdown renderer (``narbench_core.markdown``).

The column lists (each a list of ``bench.rows`` columns; ``bench.rows.VIEWS`` adds composite cells such
as "p50 [CI]"), ``markdown_table`` (rows by named columns, the best score bold), the order of systems
and test sets that pages and plots share, and the sections both pages build from them: the systems x
test sets grid, training budgets, where the time goes, isolation and its note, the fastest AR.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from bench import families
from bench.rows import Row, column
from narbench_core import defaults
from narbench_core.markdown import table
from narbench_core.phases import PHASES

SUMMARY = ("system", "family", "hypotheses", "iterations_view")
LATENCY_TABLE = ("system", "hypotheses", "iterations_view", "bleu", "bleu_delta_vs_ar", "chrf", "p50_view", "latency_p99_ms",
                 "speedup_p50_vs_ar", "passes_view", "stutter_per_1k_words", "stutter_sentence_share", "length_ratio",
                 "compile_s")
LEADERBOARD = ("system", "bleu", "bleu_delta_vs_ar", "bleurt", "latency_p50_ms", "latency_p99_ms", "speedup_p50_vs_ar",
               "train_steps", "train_seconds", "still_improving")     # the rest is in table.md
ISOLATION_TABLE = ("system", "isolated", "engine_threads", "latency_p50_ms", "solo_p50_ms", "interference",
                   "worker_systems", "worker_peak_rss_mb")
PHASE_TABLE = ("system", "hypotheses", "iterations_view", *(f"phase_{p}_view" for p in PHASES), "phase_p50_sum_ratio",
               "latency_p50_ms", "host_syncs")
SIGNIFICANCE_TABLE = ("system", "hypotheses", "iterations_view", "bleu_bs_view", "bleu_delta_vs_ar", "bleu_p_ar",
                      "bleu_p_bs", "agreement_with_ar_greedy")
RESULTS = ("system", "test_set", "family", "iterations_view", "bleu", "chrf", "bleurt", "latency_p50_ms",
           "latency_p99_ms", "speedup_p50_vs_ar", "passes_mean", "stutter_per_1k_words", "n_sentences")
FASTEST_AR = ("System", "BLEU", "vs AR greedy", "fastest AR at >= its BLEU", "its BLEU", "its p50 ms",
              "speedup p50 [95% CI]")


def markdown_table(rows: Sequence[Row], names: Sequence[str], rank: bool = False, mark_best: bool = True,
                   shown: Mapping[str, str] | None = None) -> list[str]:
    """A markdown table of ``rows`` with the named columns; the best value of each score is bold. With
    ``shown`` (system id -> display name) the system column shows display names."""
    header, cells, align = _cells(rows, names, mark_best)
    if shown and "system" in names:
        at = list(names).index("system")
        for row, line in zip(rows, cells):
            line[at] = shown[row.system]
    if rank:
        return table(["#", *header], ([i, *row] for i, row in enumerate(cells, 1)), "r" + align)
    return table(header, cells, align)


def _cells(rows: Sequence[Row], names: Sequence[str], mark_best: bool) -> tuple[list[str], list[list[str]], str]:
    """The header, the cells and the alignment letters of a table of ``rows`` with the named columns
    (with ``mark_best``, the best value of each score bold when more than one row has one)."""
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
    return [c.header for c in cols], cells, align


def system_order(rows: Sequence[Row]) -> list[str]:
    """Systems by family (registry order), then each family's own order."""
    first: dict[str, Row] = {}
    for r in rows:
        first.setdefault(r.system, r)
    return sorted(first, key=lambda n: (families.rank(first[n].family), families.get(first[n].family).sort_key(first[n])))


def test_sets(rows: Sequence[Row]) -> list[str]:
    return list(dict.fromkeys(r.test_set for r in rows))


def render_grid(rows: Sequence[Row], title: str, metric: str) -> list[str]:
    """One score as systems x test sets (the layout of the paper's Tables 1 and 3): each system's
    ``SUMMARY`` columns, then its ``metric`` on each test set (blank where it has no row)."""
    by = {r.key: r for r in rows}
    first = [next(r for r in rows if r.system == name) for name in system_order(rows)]
    sets = test_sets(rows)
    fmt = column(metric).fmt
    header, cells, align = _cells(first, SUMMARY, mark_best=False)
    body = [[*summary, *(fmt(by[(row.system, ts)][metric]) if (row.system, ts) in by else "" for ts in sets)]
            for row, summary in zip(first, cells)]
    return [f"## {title}", "", *table([*header, *sets], body, align), ""]


def render_budgets(rows: Sequence[Row], curves: str = "learning_curves.png") -> list[str]:
    """The "Training budgets" table: one line per trained model (the rows' ``model``), with its FLOPs
    as a share of its baseline (AR) model's; [] when no row has a trained model. ``curves`` says where the
    models' learning curves are drawn."""
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
    stops = tuple(n for n in ("stopped_by", "decay_start", "plateau_dev_bleu", "best_dev_bleu", "dev_bleu_swing",
                              "best_dev_nll", "dev_nll_swing") if any(r[n] is not None for r in first.values()))
    tail = ("warm_start_seconds", "distill_seconds", *stops, "still_improving", "dev_length_exact",
            "dev_length_within2")
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
                  "the distilled training data. Stopped by: plateau (the rule's dev signal, BLEU or NLL, stopped "
                  "improving), cap (no plateau within its steps) or steps (a set number); decay from step: where "
                  "the plateau rule fired and the learning rate began to decay, and dev BLEU at plateau the best "
                  "before it. Len exact / ±2: dev sentences whose top predicted length is exact or within 2 tokens "
                  f"(models with a length predictor). Curves: {curves}.", ""])
    return lines


def signature_fields(signature: str) -> dict[str, str]:
    """A sacrebleu signature (``nrefs:1|ar:10000|seed:12345|...``) as its fields."""
    return dict(part.split(":", 1) for part in signature.split("|") if ":" in part)


def tests_note(rows: Sequence[Row]) -> str | None:
    """The sentence saying which of sacrebleu's paired tests gave the ΔBLEU stars, with its trials and
    seed (read from the rows' signatures); None when no row carries the tests."""
    signatures = sorted({r.bleu_ar_signature for r in rows if r.bleu_ar_signature})
    if not signatures:
        return None
    fields = [signature_fields(s) for s in signatures]
    trials = "/".join(sorted({f.get("ar", "?") for f in fields}))
    seeds = "/".join(sorted({f.get("seed", "?") for f in fields}))
    return (f"ΔBLEU: BLEU minus AR greedy's on the same sentences; * p < 0.05, ** p < 0.01 in sacrebleu's paired "
            f"approximate randomization test (its default test: `sacrebleu --paired-ar`, {trials} trials, seed "
            f"{seeds}; signatures under Reproduce).")


def render_significance(rows: Sequence[Row], order: Sequence[str]) -> list[str]:
    """Per test set, each system's BLEU against AR greedy in sacrebleu's two paired tests (approximate
    randomization and the paired bootstrap, with its mean and 95% CI), then the tests' signatures; []
    when no row carries them."""
    lines: list[str] = []
    for ts in test_sets(rows):
        ts_rows = [r for n in order for r in rows if r.system == n and r.test_set == ts and r.bleu_p_ar is not None]
        if ts_rows:
            lines.extend([f"## {ts}: BLEU against AR greedy, sacrebleu's paired tests", "",
                          *markdown_table(ts_rows, SIGNIFICANCE_TABLE, mark_best=False), ""])
    if not lines:
        return []
    signatures = sorted({s for r in rows for s in (r.bleu_ar_signature, r.bleu_bs_signature) if s})
    return [*lines, "p (AR): sacrebleu's paired approximate randomization test; p (bootstrap): its paired bootstrap "
            "resampling test, whose resamples also give each system's mean BLEU ± half its 95% interval (as "
            "`sacrebleu --paired-bs` prints it); = AR greedy: the share of sentences with AR greedy's hypothesis. "
            "Hypotheses identical to AR greedy's get p = 1 without a test (sacrebleu counts only strictly larger "
            "differences, so it would give them 1 / (trials + 1)). Signatures: "
            + "; ".join(f"`{s}`" for s in signatures), ""]


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


def render_isolation(rows: Sequence[Row], order: Sequence[str]) -> list[str]:
    """Where each system ran, with how many threads, and its solo check (first test set with one)."""
    ts = next((t for t in test_sets(rows) if any(r.test_set == t and r.interference is not None for r in rows)), None)
    if ts is None:
        return []
    ts_rows = [r for n in order for r in rows if r.system == n and r.test_set == ts]
    return [f"## Isolation and the solo check: {ts}", "", *markdown_table(ts_rows, ISOLATION_TABLE, mark_best=False),
            "", *isolation_note(rows)]


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


def _processes_text(timed: Sequence[Row]) -> str:
    """Where the systems ran while timed: each in a worker process of its own, a family's systems sharing one
    (``worker_systems``), or all in the driver's process."""
    if not all(r.isolated for r in timed):
        return "The systems shared one process while timed"
    shared = sorted({r.system for r in timed if (r.worker_systems or 1) > 1})
    if not shared:
        return "Each system was timed in a worker process of its own"
    return (f"Each system was timed in a worker process apart from the driver: a family's systems shared one where "
            f"the family allows it ({len(shared)} of {len({r.system for r in timed})} systems), every other system had "
            "one of its own")


def isolation_note(rows: Sequence[Row]) -> list[str]:
    """How the systems were kept apart while timed, and a flag on every row the others slowed (or sped up)."""
    timed = [r for r in rows if r.interference is not None]
    if not timed:
        return []
    lo, hi = defaults.INTERFERENCE_OK
    lines = [_processes_text(timed) + _schedule_text(timed) + " on a seeded sample of the "
             "sentences (solo check). In suite / solo is the p50 over those sentences in the schedule divided by their "
             "solo p50."]
    off = [r for r in timed if not lo <= r.interference <= hi]
    if off:
        lines[0] += (f" **Flagged (outside {lo:g}-{hi:g}, the other systems changed its speed):** "
                     + ", ".join(f"{r.system} on {r.test_set} ({r.interference:.2f}x)" for r in off) + ".")
    else:
        lines[0] += f" Every row is within {lo:g}-{hi:g}."
    loads = {r.test_set: r.others_cpu_share for r in timed if r.others_cpu_share is not None}
    if loads:
        busy = {ts: share for ts, share in loads.items() if share > defaults.BUSY_SHARE}
        lines[0] += (f" **Timed on a busy machine:** processes not of this run took "
                     + ", ".join(f"{share:.0%} of the CPU while {ts} was timed" for ts, share in sorted(busy.items()))
                     + " (env.json's machine_load)." if busy else
                     f" Other processes took at most {max(loads.values()):.0%} of the CPU while it timed "
                     f"(warned above {defaults.BUSY_SHARE:.0%}).")
    return [*lines, ""]


def _latencies(samples: Sequence[dict]) -> dict[tuple[str, str], dict[int, float]]:
    """(system, test set) -> sentence index -> latency ms."""
    lat: dict[tuple[str, str], dict[int, float]] = {}
    for s in samples:
        lat.setdefault((s["system"], s["test_set"]), {})[s["index"]] = s["latency_ms"]
    return lat


def _paired(lat: dict, baseline: Row, system: Row) -> str:
    """``system``'s p50 speedup over ``baseline`` paired per sentence, "0.12x [0.11, 0.13]" ("-" unpaired)."""
    from bench.measure import stats

    a, b = lat.get((baseline.system, baseline.test_set), {}), lat.get((system.system, system.test_set), {})
    common = sorted(set(a) & set(b))
    if not common:
        return "-"
    sp = stats.paired_speedup([a[i] for i in common], [b[i] for i in common])
    return f"{sp.median:.2f}x" + ("" if sp.ci is None else f" [{sp.ci[0]:.2f}, {sp.ci[1]:.2f}]")


def _sides(rows: Sequence[Row], ts: str) -> tuple[list[Row], list[Row]]:
    """A test set's timed AR-side rows, fastest first, and its scored non-autoregressive rows, best first."""
    here = [r for r in rows if r.test_set == ts and r.latency_p50_ms is not None]
    ar = sorted((r for r in here if r.paradigm == "ar"), key=lambda r: r.latency_p50_ms)
    nar = sorted((r for r in here if r.paradigm != "ar" and r.bleu is not None), key=lambda r: -r.bleu)
    return ar, nar


def fastest_ar(rows: Sequence[Row], samples: Sequence[dict], shown: Mapping[str, str]) -> list[str]:
    """Per test set: the fastest AR-side system (lowest p50, any family: JAX AR, CTranslate2 ...), and
    for each non-autoregressive row its paired per-sentence p50 speedup against the fastest AR-side
    row whose BLEU is at least its own (the AR a user would deploy instead). Systems by their display
    names (``shown``). Empty without NAR rows."""
    lat = _latencies(samples)
    lines: list[str] = []
    for ts in test_sets(rows):
        ar, nar = _sides(rows, ts)
        if not ar or not nar:
            continue
        top = ar[0]
        lines.extend([f"**Fastest AR** on {ts}: {shown[top.system]} (p50 {top.latency_p50_ms:.1f} ms"
                      + (f", BLEU {top.bleu:.2f}" if top.bleu is not None else "") + "). Each non-autoregressive "
                      "system against the fastest AR-side system at equal or better BLEU (paired per sentence):", ""])
        body = []
        for r in nar:
            rival = next((a for a in ar if a.bleu is not None and a.bleu >= r.bleu), None)
            greedy = "-" if r.speedup_p50_vs_ar is None else f"{r.speedup_p50_vs_ar:.2f}x"
            if rival is None:
                body.append([shown[r.system], f"{r.bleu:.2f}", greedy, "none: better than every AR", "-", "-", "-"])
                continue
            body.append([shown[r.system], f"{r.bleu:.2f}", greedy, shown[rival.system], f"{rival.bleu:.2f}",
                         f"{rival.latency_p50_ms:.1f}", _paired(lat, rival, r)])
        lines.extend([*table(FASTEST_AR, body, "lrrl"), ""])
    return lines


def run_says(rows: Sequence[Row], samples: Sequence[dict], ts: str, shown: Mapping[str, str]) -> list[str]:
    """"What this run says" on one test set, from its rows alone: the best BLEU, the fastest system within
    ``defaults.SAYS_BLEU_MARGIN`` of it, the best non-autoregressive system's paired p50 speedup against
    AR greedy and against the fastest AR-side system, and the fastest non-autoregressive system within that
    margin of AR greedy (or how far behind the closest is). [] when nothing was scored."""
    scored = [r for r in rows if r.test_set == ts and r.bleu is not None]
    if not scored:
        return []
    best = max(scored, key=lambda r: r.bleu)
    margin = defaults.SAYS_BLEU_MARGIN
    near = [r for r in scored if r.bleu >= best.bleu - margin and r.latency_p50_ms is not None]
    words = [f"the best BLEU is {shown[best.system]}'s {best.bleu:.2f}"]
    if near:
        quick = min(near, key=lambda r: r.latency_p50_ms)
        words.append(f"; the fastest system within {margin:g} BLEU of it is "
                     + ("that one" if quick is best else f"{shown[quick.system]} ({quick.bleu:.2f})")
                     + f", at p50 {quick.latency_p50_ms:.1f} ms")
    words.append(".")
    ar, _ = _sides(rows, ts)
    base, fast_nar, top_nar = near_baseline(rows, ts)
    if ar and base is not None:
        lat, top = _latencies(samples), ar[0]
        delta = "" if top_nar.bleu_delta_vs_ar is None else f", {top_nar.bleu_delta_vs_ar:+.2f} against AR greedy"
        words.append(f" The best non-autoregressive system, {shown[top_nar.system]} ({top_nar.bleu:.2f} BLEU{delta}), "
                     f"has a p50 speedup of {_paired(lat, base, top_nar)} against {shown[base.system]} "
                     f"({base.latency_p50_ms:.1f} ms) and {_paired(lat, top, top_nar)} against the fastest AR-side "
                     f"system, {shown[top.system]} ({top.latency_p50_ms:.1f} ms, {column('bleu').cell(top)} BLEU), "
                     "paired per sentence (below 1x: slower).")
        words.append(" " + _near_baseline(base, fast_nar, top_nar, top, lat, shown))
    return [f"**What this run says** on {ts}: " + "".join(words), ""]


def near_baseline(rows: Sequence[Row], ts: str) -> tuple[Row | None, Row | None, Row | None]:
    """On one test set: the baseline row (AR greedy), the fastest (lowest p50) non-autoregressive row at
    most ``defaults.SAYS_BLEU_MARGIN`` BLEU below it (None if none is that close), and the
    non-autoregressive row of best BLEU. All None without a timed, scored baseline or such rows."""
    _, nar = _sides(rows, ts)
    base = next((r for r in rows if r.test_set == ts and r.system == r.baseline_system and r.bleu is not None
                 and r.latency_p50_ms is not None), None)
    if base is None or not nar:
        return None, None, None
    near = [r for r in nar if r.bleu >= base.bleu - defaults.SAYS_BLEU_MARGIN]
    return base, min(near, key=lambda r: r.latency_p50_ms) if near else None, nar[0]


def _near_baseline(base: Row, quick: Row | None, close: Row, top: Row, lat: dict, shown: Mapping[str, str]) -> str:
    """The sentence on ``near_baseline``'s rows: the fastest non-autoregressive row ``quick`` near AR greedy
    ``base`` with its paired speedups against it and the fastest AR-side row ``top``; or, when none is that
    close, how far the closest (``close``, the best non-autoregressive row) is behind."""
    margin = defaults.SAYS_BLEU_MARGIN
    if quick is None:
        return (f"No non-autoregressive system is within {margin:g} BLEU of {shown[base.system]}: the closest, "
                f"{shown[close.system]}, is {base.bleu - close.bleu:.2f} behind.")
    return (f"The fastest non-autoregressive system within {margin:g} BLEU of {shown[base.system]} is "
            f"{shown[quick.system]} ({quick.bleu:.2f} BLEU, p50 {quick.latency_p50_ms:.1f} ms): "
            f"{_paired(lat, base, quick)} against {shown[base.system]} and {_paired(lat, top, quick)} against "
            f"{shown[top.system]}, paired per sentence.")


MODES_METRICS = ("exact_match", "bleu", "mode_mixing", "stutter_per_1k_words")   # the dial's figures


def valid_target_counts(samples: Sequence[dict]) -> dict[str, int]:
    """Test set -> its number of modes: the most valid targets a source of it has (test sets whose
    samples carry ``valid_targets``, i.e. tasks that know every correct output)."""
    out: dict[str, int] = {}
    for s in samples:
        if "valid_targets" in s:
            out[s["test_set"]] = max(out.get(s["test_set"], 0), len(s["valid_targets"]))
    return out


def render_modes(rows: Sequence[Row], samples: Sequence[dict]) -> list[str]:
    """"By number of valid targets": per metric, each system (one line across tasks) by its test sets'
    number of modes; [] unless two or more test sets differ in it (the dependency dial)."""
    modes = valid_target_counts(samples)
    by_modes = sorted(set(modes.values()))
    if len(by_modes) < 2:
        return []
    order = system_order(rows)
    cell = {(r.system, modes[r.test_set]): r for r in rows if r.test_set in modes}
    systems = [s for s in order if any((s, m) in cell for m in by_modes)]
    lines = ["## By number of valid targets", "",
             "Each test set's sources have this many equally valid targets (the task's modes); every system is "
             "scored against all of them. " + "; ".join(
                 f"{column(n).header}: {column(n).doc}" for n in ("exact_match", "mode_mixing")) + ".", ""]
    for name in MODES_METRICS:
        col = column(name)
        body = [[s, *(col.cell(cell[s, m]) if (s, m) in cell else "–" for m in by_modes)] for s in systems]
        lines.extend([f"**{col.header}**", "", *table(["system", *(f"{m} mode{'s' * (m > 1)}" for m in by_modes)],
                                                     body, "l"), ""])
    return lines
