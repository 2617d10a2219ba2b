"""Serve one system under LoadGen's scenarios; one record per LoadGen test (``bench.serving.rows`` names the fields).

The order, for one system in its own worker process (``bench.measure.workers``), warmed up at every batch
shape the batcher can form (``ServingSpec.batch_sizes``):

1. SingleStream: one query at a time, batch 1, no wait: the cross-check against the harness's own batch-1
   timing of the same system (p50 and p90): the suite's interleaved timing (rows.jsonl), and the harness's timing
   of the same worker alone (``solo``) right before and right after SingleStream. With ``single_rounds`` R > 1,
   SingleStream is R LoadGen tests of ``min_queries`` / R queries each, with a solo timing before each and after
   the last (solo, SS, solo, SS, ..., solo): each round is compared with the two solo timings around it (pooled;
   their ratio recorded as ``solo_drift``), so the machine's drift, which moves this VM's speed by 10-40% within
   minutes, cancels instead of deciding the check. The reference is read at the very sentences LoadGen drew
   (``matched``: ``solo_matched_p50_ms``), since a few hundred random draws can be shorter or longer than the
   test set. The harness's clock runs inside the worker, LoadGen's from its
   issue: what lies between (LoadGen, the batcher, the pipe) is the driver's round trip, measured by the empty
   system, and the check compares LoadGen's figures with solo plus it (``bench.serving.report.agreement``).
2. Offline: every query at once, batches of up to ``max_batch``, once for each of the spec's ``max_batch``
   values: sentences per second. LoadGen issues as many samples as the expected rate fills in the minimum
   duration; the guess is the best rate measured so far (batch 1's at first), since a guess too high makes a
   test run as many times its minimum as it overshoots, and one too low ends early and is run again at the rate
   it measured. The largest batch of the
   fastest VALID Offline test (``best_offline``) is the system's batch from here on, as its users would
   choose: batching triples one engine's throughput and halves another's (docs/serving.md).
3. Server at ``loads`` x that Offline throughput (Poisson arrivals, PerformanceOnly): the latency-QPS curve,
   each test ``min_queries`` long or ``MAX_TEST_S`` at its rate, whichever is shorter, but no shorter than
   LoadGen's early stopping needs to accept the percentile with no query over the bound (``early_stop_queries``:
   459 at p99): it holds no bound, so that is all early stopping asks.
4. Server, per latency bound: LoadGen's FindPeakPerformance (it widens, then bisects, checking the bound at
   each step with ``search_queries``), from the largest curve QPS that held the bound, else from a quarter of
   SingleStream's QPS; a search whose first QPS already misses the bound finds nothing, and runs again from half
   of it (``SEARCHES`` in all). Then a PerformanceOnly test at the peak with ``min_queries`` validates it (p99
   needs hundreds of queries for LoadGen's early stopping); while LoadGen calls it INVALID for the bound (its
   latency check, or early stopping's bound on the p99), a lower QPS (``step_down``: by as much as the p99 missed
   the bound, 10% to 50% less), at most ``VALIDATIONS`` tests. No search or validation runs below the QPS at which
   ``min_queries`` would take ``MAX_TEST_S``: a bound no QPS from there up holds is recorded ``NOT_FOUND``. A
   bound that SingleStream's p99 already misses is recorded as unreachable without a search.

Each sample's outputs are compared with the system's batch-1 outputs (share identical, BLEU difference). Every
test also keeps the worker's own clock of its decoder calls (``worker_ms``: p50 and p90 a call, no pipe, no
queue), so a slow test tells the engine's time from the driver's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from bench.serving.loadgen import Result, Settings, run_test
from suites.spec import ServingSpec

SOLO_FIELDS = ("solo_p50_ms", "solo_p90_ms", "solo_drift")
VALIDATIONS = 4           # validation tests per bound before the peak is given up as INVALID
# No search or validation runs below the QPS at which min_queries would take longer. 240 s until 2026-11-29: in
# results/serving/20261129T094636Z-a6fb7c5b, 20 searches and validations ran below 700 / 60 = 11.7 QPS (1,989 s of
# its 4,946 s of LoadGen tests); 17 of them held nothing, and the other 3 were searches that widened to 18-28 QPS.
MAX_TEST_S = 60.0
STEP_DOWN = (0.5, 0.9)    # the next validation's QPS after the bound was missed: x bound / p99 within these
SEARCHES = 3              # FindPeakPerformance searches per bound, each from half the last one's first QPS
START_SHARE = 0.25        # a bound no curve point held starts its search at this share of SingleStream's QPS
BIG_BOUND_MS = 60_000.0   # the curve's tests hold no bound: LoadGen's early stopping then only needs enough queries


@dataclass(frozen=True)
class Baseline:
    """What the harness's own batch-1 timing said of the system (its row and outputs)."""

    p50_ms: float
    p90_ms: float
    hypotheses: list[str]          # batch-1 outputs, aligned with the sources
    solo_p50_ms: float | None = None   # the harness's batch-1 timing of the serving worker alone, before and
    solo_p90_ms: float | None = None   # after SingleStream, pooled
    solo_drift: float | None = None    # the last solo timing's p50 over the first's


def with_solo(baseline: Baseline, blocks: Sequence[Sequence[float]]) -> Baseline:
    """``baseline`` with the solo timings' figures: p50 and p90 of ``blocks`` (each timing's latencies, ms)
    pooled, and the drift between them (the last timing's p50 over the first's)."""
    pooled = np.asarray([x for block in blocks for x in block], dtype=np.float64)
    p50, p90 = (float(v) for v in np.percentile(pooled, [50, 90]))
    drift = float(np.median(blocks[-1]) / np.median(blocks[0])) if len(blocks) > 1 else None
    return replace(baseline, solo_p50_ms=p50, solo_p90_ms=p90, solo_drift=drift)


def matched(before: Sequence[float], after: Sequence[float], served: Sequence[int], n: int) -> dict:
    """The solo timings around a SingleStream test over the sentences LoadGen drew (each as often as drawn):
    each sentence's mean of ``before`` and ``after`` (its latencies on the ``n`` test sentences, in order), p50
    and p90. LoadGen draws its samples at random, so a few hundred of them can be shorter or longer than the
    test set: this reference has the same sentences as the test, so only time and method differ."""
    if len(before) != n or len(after) != n or not served:
        return {}
    per_sentence = (np.asarray(before, np.float64) + np.asarray(after, np.float64)) / 2      # [n] ms
    p50, p90 = np.percentile(per_sentence[np.asarray(served, np.int64)], [50, 90])
    return {"solo_matched_p50_ms": float(p50), "solo_matched_p90_ms": float(p90)}


def serve_system(serve: Callable[[list[int]], list[str]], n: int, baseline: Baseline, serving: ServingSpec,
                 log_root: Path, seed: int, score: Callable[[list[str]], float] | None = None,
                 on_test: Callable[[str], None] = lambda label: None,
                 length: Callable[[int], int] | None = None,
                 solo: Callable[[], Sequence[float]] | None = None,
                 worker_ms: Callable[[], Sequence[float]] | None = None,
                 pids: Sequence[int] = ()) -> list[dict]:
    """Every LoadGen test of one system, as records (``bench.serving.rows.record`` adds the run's fields);
    ``length`` (a sample index -> its source's length) is the batcher's, where ``serving.group_by_length``.
    ``solo`` times the system alone at batch 1 by the harness's protocol (its latencies, ms): called right before
    and right after SingleStream. ``worker_ms`` hands over (and forgets) the worker's own time of each decoder
    call since it was last called. ``pids`` (the driver's process, the worker's) puts each test's CPU shares on its
    record (``cpu_shares``)."""
    records: list[dict] = []
    base_bleu = score(baseline.hypotheses) if score else None
    drain = worker_ms or (lambda: ())

    def test(label: str, settings: Settings, purpose: str, bound: float | None = None) -> Result:
        on_test(label)
        drain()
        before = _snapshots(pids)
        result = run_test(settings, serve, n, log_root / label, length if serving.group_by_length else None)
        records.append({**_record(label, settings, purpose, bound, result, baseline, score, base_bleu),
                        **_worker_clock(drain()), **cpu_shares(before, _snapshots(pids))})
        return result

    common = dict(min_duration_s=serving.min_duration_s, seed=seed)
    singles: list[Result] = []
    if "SingleStream" in serving.scenarios:
        rounds = serving.single_rounds if solo is not None else 1
        blocks: list[list[float]] = []                                  # each solo timing's latencies, ms

        def time_alone(when: str) -> None:
            on_test(f"batch-1 timing, alone, {when}")
            blocks.append(list(solo()))

        if solo is not None:
            time_alone("before SingleStream")
        for i in range(1, rounds + 1):
            expected = float(np.median(blocks[-1])) if blocks else baseline.p50_ms
            singles.append(test("singlestream" if rounds == 1 else f"singlestream-{i}", Settings(
                "SingleStream", min_queries=-(-serving.min_queries // rounds), expected_latency_ms=expected,
                **common), "singlestream"))
            if solo is not None:
                time_alone("after SingleStream" if rounds == 1 else f"after SingleStream {i} of {rounds}")
                around = with_solo(baseline, blocks[-2:])
                records[-1].update({k: getattr(around, k) for k in SOLO_FIELDS},
                                   **matched(blocks[-2], blocks[-1], singles[-1].served, n))
        if blocks:                                     # every later test: all the solo timings pooled
            baseline = with_solo(baseline, blocks)
    offline_qps, best = 1000.0 / baseline.p50_ms, serving.max_batch[-1]
    if "Offline" in serving.scenarios or "Server" in serving.scenarios:
        measured = [1000.0 / baseline.p50_ms]                         # sentences/s: batch 1's, then each test's
        for b in serving.max_batch:
            name = "offline" if len(serving.max_batch) == 1 else f"offline-b{b}"
            batch = dict(max_batch=b, max_wait_ms=serving.max_wait_ms)
            result = test(name, Settings("Offline", min_queries=1, expected_qps=max(measured), **batch, **common),
                          "offline")
            if not result.valid and result.checks.get("min_duration") is False and result.qps:
                result = test(f"{name}-2", Settings("Offline", min_queries=1, expected_qps=result.qps * 1.1, **batch,
                                                    **common), "offline")
            if result.valid and result.qps:
                measured.append(result.qps)
        chosen = best_offline(records)
        if chosen is not None:
            offline_qps, best = chosen["qps"], chosen["max_batch"]
    batch = dict(max_batch=best, max_wait_ms=serving.max_wait_ms)
    if "Server" not in serving.scenarios:
        return records
    curve: list[tuple[float, Result]] = []
    for load in serving.loads:
        qps = load * offline_qps
        curve.append((qps, test(f"server-load{load:g}", Settings(
            "Server", min_queries=curve_queries(serving, qps), target_qps=qps, bound_ms=BIG_BOUND_MS,
            percentile=serving.percentile, **batch, **common), "curve")))
    rates = [r.qps for r in singles if r.qps]
    single_qps = float(np.median(rates)) if rates else 1000.0 / baseline.p50_ms
    p99s = [r for r in singles if r.latency_ms["p99"] is not None]
    lowest = min(p99s, key=lambda r: r.latency_ms["p99"], default=None)
    for bound in serving.bounds_ms:
        if lowest is not None and lowest.latency_ms["p99"] > bound:        # every SingleStream round missed it
            records.append(_unreachable(bound, lowest))
            continue
        held = [q for q, r in curve if r.valid and (r.latency_ms["p99"] or 0) <= bound]
        floor = serving.min_queries / MAX_TEST_S
        start = max(floor, serving.start_qps or (max(held) if held else START_SHARE * single_qps))
        for attempt in range(1, SEARCHES + 1):
            search = test(f"server-{bound:g}ms-search{attempt}", Settings(
                "Server", mode="FindPeakPerformance", min_queries=serving.search_queries, target_qps=start,
                bound_ms=bound, percentile=serving.percentile, **batch, **common), "peak-search", bound)
            if search.peak_qps or start <= floor:
                break
            start = max(floor, start * 0.5)  # LoadGen's first QPS already missed the bound: start lower
        if not search.peak_qps:
            records.append(_not_found(bound, start, search))
            continue
        qps = search.peak_qps
        for attempt in range(1, VALIDATIONS + 1):
            result = test(f"server-{bound:g}ms-peak{attempt}", Settings(
                "Server", min_queries=serving.min_queries, target_qps=qps, bound_ms=bound,
                percentile=serving.percentile, **batch, **common), "peak", bound)
            if result.valid or not (result.checks.get("min_duration") and result.checks.get("min_queries")):
                break
            qps *= step_down(bound, result.latency_ms.get("p99"))
            if qps < floor:
                break
    return records


EARLY_STOP_CONFIDENCE = 0.99   # LoadGen's early stopping: the confidence its bound on the percentile holds at


def early_stop_queries(percentile: float) -> int:
    """The fewest queries with none over the latency bound that LoadGen's early stopping accepts at
    ``percentile``: the n at which percentile ** n <= 1 - its confidence (459 at p99). In the fifth committed
    serving run a curve test of 306 queries, all far under its bound, was INVALID for early stopping alone."""
    return math.ceil(math.log(1.0 - EARLY_STOP_CONFIDENCE) / math.log(percentile))


def curve_queries(serving: ServingSpec, qps: float) -> int:
    """Queries of a curve test at ``qps``: ``min_queries`` or ``MAX_TEST_S`` of them at that rate, whichever is
    fewer, but never fewer than early stopping needs (``early_stop_queries``)."""
    return min(serving.min_queries, max(early_stop_queries(serving.percentile), int(qps * MAX_TEST_S)))


def step_down(bound_ms: float, p99_ms: float | None) -> float:
    """The factor on a validation's QPS after LoadGen called it INVALID for the bound: bound / p99 within
    ``STEP_DOWN`` (10% less where the p99 held and early stopping's bound on it did not, up to half where a queue
    built up). In results/serving/20261129T094636Z-a6fb7c5b, 10% steps left 9 of the 18 bounds validated INVALID
    after four validations; four first validations had their p99 at 2.8-21x the bound."""
    low, high = STEP_DOWN
    if not p99_ms or p99_ms <= bound_ms:
        return high
    return min(high, max(low, bound_ms / p99_ms))


def best_offline(records: Sequence[dict], system: str | None = None) -> dict | None:
    """The VALID Offline test of the highest throughput (of ``system``, when records hold several systems'): its
    ``max_batch`` is the batch the system is served at in Server."""
    offline = [r for r in records if r["scenario"] == "Offline" and r["validity"] == "VALID" and r["qps"]
               and (system is None or r.get("system") == system)]
    return max(offline, key=lambda r: (r["qps"], -r["max_batch"]), default=None)


def _record(label: str, settings: Settings, purpose: str, bound: float | None, result: Result, baseline: Baseline,
            score, base_bleu) -> dict:
    outputs = result.outputs
    same = [texts == {baseline.hypotheses[i]} for i, texts in outputs.items()]
    first = [min(outputs[i]) if i in outputs else baseline.hypotheses[i] for i in range(len(baseline.hypotheses))]
    return {
        "test": label, "scenario": settings.scenario, "purpose": purpose, "mode": settings.mode,
        "bound_ms": bound, "percentile": settings.percentile if settings.scenario == "Server" else None,
        "target_qps": settings.target_qps, "validity": result.validity, "invalid_reason": result.invalid_reason,
        "checks": result.checks, "qps": result.qps, "peak_qps": result.peak_qps,
        **{f"latency_{k}_ms": v for k, v in result.latency_ms.items()}, "queries": result.queries,
        "max_batch": settings.max_batch, "max_wait_ms": settings.max_wait_ms, "batches": result.batches,
        "mean_batch": (sum(k * v for k, v in result.batches.items()) / max(1, sum(result.batches.values()))),
        "samples_served": len(outputs),
        "same_as_batch1": (sum(same) / len(same)) if same else None,
        "bleu_delta_vs_batch1": (score(first) - base_bleu) if score and outputs else None,
        "batch1_p50_ms": baseline.p50_ms, "batch1_p90_ms": baseline.p90_ms,
        "solo_p50_ms": baseline.solo_p50_ms, "solo_p90_ms": baseline.solo_p90_ms, "solo_drift": baseline.solo_drift,
    }


def _worker_clock(calls_ms: Sequence[float]) -> dict:
    """The worker's own clock over a test's decoder calls (one call a batch): p50 and p90 a call, ms."""
    if not len(calls_ms):
        return {"worker_calls": 0, "worker_p50_ms": None, "worker_p90_ms": None}
    p50, p90 = (float(v) for v in np.percentile(np.asarray(calls_ms, dtype=np.float64), [50, 90]))
    return {"worker_calls": len(calls_ms), "worker_p50_ms": p50, "worker_p90_ms": p90}


def _snapshots(pids: Sequence[int]) -> list:
    from bench.measure import load

    return [load.snapshot([pid]) for pid in pids]


CPU_FIELDS = ("driver_cpu_share", "worker_cpu_share", "others_cpu_share", "steal_share")


def cpu_shares(before: Sequence, after: Sequence) -> dict:
    """Where the machine's CPU went during one test, as shares of all its cores (``bench.measure.load.share``
    between snapshots of the driver's process and of the worker's, in that order): the driver (LoadGen's threads
    and the batcher), the worker (the engine), everything else, and the hypervisor's steal. None each where the
    kernel cannot say (outside Linux) or no pids were given."""
    from bench.measure import load

    shares = [load.share(b, a) for b, a in zip(before, after)]
    if len(shares) != 2 or None in shares:
        return dict.fromkeys(CPU_FIELDS)
    driver, worker = shares
    return {"driver_cpu_share": driver["narbench"], "worker_cpu_share": worker["narbench"],
            "others_cpu_share": round(max(0.0, worker["busy"] - driver["narbench"] - worker["narbench"]), 4),
            "steal_share": worker["steal"]}


def _unreachable(bound: float, single: Result) -> dict:
    """A bound the system misses at batch 1 with no queue (SingleStream's p99 is over it): no QPS holds it."""
    return {"test": f"server-{bound:g}ms-unreachable", "scenario": "Server", "purpose": "peak", "mode": None,
            "bound_ms": bound, "validity": "UNREACHABLE",
            "invalid_reason": f"SingleStream p99 {single.latency_ms['p99']:.1f} ms is over the bound", "qps": 0.0}


def _not_found(bound: float, lowest: float, search: Result) -> dict:
    """A bound FindPeakPerformance found no QPS for, down to the lowest QPS a test may run at (``MAX_TEST_S``)."""
    return {"test": f"server-{bound:g}ms-not-found", "scenario": "Server", "purpose": "peak", "mode": None,
            "bound_ms": bound, "validity": "NOT_FOUND", "target_qps": lowest, "qps": 0.0,
            "latency_p99_ms": search.latency_ms.get("p99"),
            "invalid_reason": f"no QPS from {lowest:.1f} up held the bound (at {lowest:.1f} QPS the p99 was "
                              f"{search.latency_ms.get('p99') or float('nan'):.0f} ms); lower rates are not tried "
                              f"(a validation would run over {MAX_TEST_S:.0f} s)"}


def check_systems(names: Sequence[str], chosen: Sequence[str], source: str) -> None:
    """``[serving] systems`` must name systems of the suite."""
    from narbench_core.errors import UserError

    unknown = [s for s in chosen if s not in set(names)]
    if unknown:
        raise UserError(f"{source}: serving.systems: {unknown[0]!r} is not a system of this suite; "
                        f"choose from {', '.join(sorted(names)[:12])}")


SEARCH_STEPS = 9          # FindPeakPerformance's tests to a step of 1 QPS (8 to 10 seen: it widens, then bisects)
BATCH_GAIN = 0.5          # throughput at batch B taken as B ** BATCH_GAIN x batch 1's (plan's rough model)
VALIDATIONS_SEEN = 2      # validation tests a bound took on average (results/serving, 2026-11-28: 1 to 3)


def estimate_seconds(serving: ServingSpec, latency_ms: float, compile_s: float = 0.0, sentences: int = 0) -> float:
    """Seconds to serve one system of batch-1 latency ``latency_ms`` whose batch-1 warm-up took ``compile_s``
    (``narbench plan``) on a test set of ``sentences``: the warm-up of every batch shape, the solo batch-1 timings
    around each SingleStream round, then LoadGen's tests, each lasting its minimum duration or as long as its
    queries take at the rate it runs, whichever is longer, with ``VALIDATIONS_SEEN`` validations a bound; no Server
    test runs at a rate that would take over ``MAX_TEST_S``."""
    d, one = serving.min_duration_s, max(latency_ms, 0.01) / 1000.0
    floor = serving.min_queries / MAX_TEST_S                         # QPS: the lowest a search or validation runs at
    offline = max(serving.max_batch) ** BATCH_GAIN / one             # sentences/s, batched
    seconds = compile_s * len(serving.batch_sizes)
    if "SingleStream" in serving.scenarios:
        rounds = serving.single_rounds
        seconds += (rounds + 1) * sentences * one + rounds * max(d, -(-serving.min_queries // rounds) * one)
    if "Offline" in serving.scenarios or "Server" in serving.scenarios:
        seconds += d * 1.5 * len(serving.max_batch)                 # a first guess may run again
    if "Server" in serving.scenarios:
        for load in serving.loads:
            rate = load * offline
            seconds += max(d, curve_queries(serving, rate) / rate)
        for bound in serving.bounds_ms:
            if bound < 2 * latency_ms:                               # likely unreachable: no search runs
                continue
            peak = max(floor, 0.6 * offline)
            seconds += (SEARCH_STEPS * max(d, serving.search_queries / peak)
                        + VALIDATIONS_SEEN * max(d, serving.min_queries / peak))
    return seconds
