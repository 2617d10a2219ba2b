"""Serving under load (bench.serving): the dynamic batcher, LoadGen driving a fake system of known service time in a
worker process (Offline throughput and the Server queue as theory predicts them), LoadGen's INVALID kept as such, a
suite's [serving] step through the runner (records, resume after a kill, the page), bad spec values, the plan."""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mlperf_loadgen")

from bench.families import load_suite                                     # noqa: E402
from bench.measure import workers                                         # noqa: E402
from bench.measure.decoder import DecodeOutput                            # noqa: E402
from bench.report import write_report                                     # noqa: E402
from bench.runner import Runner                                           # noqa: E402
from bench.serving import loadgen                                         # noqa: E402
from bench.serving.batcher import DynamicBatcher                          # noqa: E402
from bench.serving.measure import Baseline, serve_system                  # noqa: E402
from bench.serving.rows import SERVING_COLUMNS, serving_markdown          # noqa: E402
from bench.serving.run import solo_latencies                             # noqa: E402
from bench.store import open_run                                          # noqa: E402
from grid_fakes import FakeFactory, fake_deps, fake_spec                  # noqa: E402
from narbench_core.errors import UserError                                # noqa: E402
from suites.spec import ServingSpec, TimingSpec                           # noqa: E402

REPO = Path(__file__).resolve().parents[2]


class SleepDecoder:
    """A system of known service time: a batch of b sentences takes ``service_s * (1 + efficiency * (b - 1))``."""

    threads = 1

    def __init__(self, name: str, service_s: float, efficiency: float):
        self.name, self.service_s, self.efficiency = name, service_s, efficiency

    def prepare(self, sources):
        return list(sources)

    def run(self, prepared):
        time.sleep(self.service_s * (1 + self.efficiency * (len(prepared) - 1)))
        return prepared

    def finish(self, outputs, prepared):
        return DecodeOutput([s.upper() for s in outputs], np.ones(len(outputs), np.int64))

    def warmup_inputs(self, batch_size):
        return [["warm"] * batch_size]


SOURCES = [f"sentence {i}" for i in range(64)]


def serve_fn(worker):
    return lambda indices: worker.timed([SOURCES[i] for i in indices], "end_to_end").hypotheses


class Clocked:
    """``serve`` with each call's wall seconds kept: the service times of the very test that ran, so a check against
    queueing theory holds whatever the machine's load adds to a sleep and to the call into the worker process."""

    def __init__(self, serve):
        self.serve, self.seconds = serve, []

    def __call__(self, indices):
        start = time.perf_counter()
        try:
            return self.serve(indices)
        finally:
            self.seconds.append(time.perf_counter() - start)


@pytest.fixture(scope="module")
def sleeper():
    """One worker process hosting fake systems of 10 ms (batches 25% dearer per extra sentence) and 20 ms."""
    specs = [workers.WorkerSpec("s10", SleepDecoder, ("s10", 0.010, 0.25)),
             workers.WorkerSpec("s20", SleepDecoder, ("s20", 0.020, 0.25))]
    with workers.WorkerPool(specs) as pool:
        yield {w.name: w for w in pool.workers}


# ------------------------------------------------------------------------------------------------ batcher

def test_the_batcher_serves_waiting_queries_in_batches_of_at_most_max_batch():
    served, done = [], []
    gate = threading.Event()

    def serve(indices):
        gate.wait(5)
        served.append(list(indices))
        return [str(i) for i in indices]

    batcher = DynamicBatcher(serve, lambda batch, out: done.extend((q.index, o) for q, o in zip(batch, out)),
                             max_batch=4, max_wait_s=0.0)
    batcher.submit([(0, 0)])                 # taken at once: the server is free, no wait
    time.sleep(0.05)
    batcher.submit([(i, i) for i in range(1, 10)])
    gate.set()
    batcher.close()
    assert served[0] == [0] and [len(b) for b in served[1:]] == [4, 4, 1]
    assert sorted(done) == [(i, str(i)) for i in range(10)]
    assert batcher.batches == {1: 2, 4: 2}


def test_grouping_by_length_serves_the_oldest_with_the_waiting_queries_nearest_its_length():
    served, gate = [], threading.Event()
    lengths = [9, 1, 30, 10, 2, 8, 29, 11]

    def serve(indices):
        gate.wait(5)
        served.append(sorted(indices))
        return [""] * len(indices)

    batcher = DynamicBatcher(serve, lambda b, o: None, max_batch=3, max_wait_s=0.0, length=lengths.__getitem__)
    batcher.submit([(i, i) for i in range(len(lengths))])
    gate.set()
    batcher.close()
    # oldest 0 (9 words) with 5 (8) and 3 (10); then 1 (1) with 4 (2) and 7 (11); then 2 (30) with 6 (29)
    assert served == [[0, 3, 5], [1, 4, 7], [2, 6]]


def test_a_partial_batch_waits_up_to_max_wait_for_more_queries():
    served = []
    batcher = DynamicBatcher(lambda ix: served.append(list(ix)) or ["x"] * len(ix), lambda b, o: None,
                             max_batch=3, max_wait_s=0.5)
    batcher.submit([(0, 0)])
    time.sleep(0.05)
    batcher.submit([(1, 1)])
    time.sleep(0.05)
    batcher.submit([(2, 2)])                 # the batch fills before the wait runs out
    batcher.close()
    assert served == [[0, 1, 2]]


def test_a_server_error_completes_every_query_and_is_raised_after():
    completed = []

    def serve(indices):
        raise RuntimeError("engine broke")

    batcher = DynamicBatcher(serve, lambda b, o: completed.extend(b), max_batch=2, max_wait_s=0.0)
    batcher.submit([(0, 0), (1, 1), (2, 2)])
    batcher.close()
    assert len(completed) == 3 and isinstance(batcher.error, RuntimeError)


# ------------------------------------------------------------------- LoadGen on a fake of known service time

def test_offline_throughput_is_batches_of_max_batch_at_their_service_time(sleeper, tmp_path):
    """Offline keeps the server busy with batches of max_batch back to back: its throughput is the queries over the
    sum of the batches' service times (a batch of 8 sleeps 55 ms: 145.5 sentences/s on an idle machine)."""
    settings = loadgen.Settings("Offline", min_duration_s=3.0, min_queries=1, expected_qps=150.0, max_batch=8)
    serve = Clocked(serve_fn(sleeper["s20"]))
    result = loadgen.run_test(settings, serve, len(SOURCES), tmp_path / "offline")
    assert result.valid, result.invalid_reason
    assert max(result.batches) == 8 and sum(n for b, n in result.batches.items() if b != 8) <= 1  # one remainder
    expected = sum(b * n for b, n in result.batches.items()) / sum(serve.seconds)
    assert abs(result.qps / expected - 1) < 0.05, (result.qps, expected)
    assert result.outputs and all(texts == {SOURCES[i].upper()} for i, texts in result.outputs.items())
    logs = tmp_path / "offline"
    assert (logs / loadgen.SUMMARY).is_file() and (logs / (loadgen.DETAIL + ".gz")).is_file()


def test_server_latency_at_half_load_is_the_md1_queues(sleeper, tmp_path):
    """Poisson arrivals at half the server's capacity wait as queueing theory predicts: the mean time in the system
    of an M/G/1 queue (Pollaczek-Khinchine) on the service times the test itself took, 1.5 service times where they
    are all equal (M/D/1). The service time is measured first (SingleStream: one query at a time) to set the rate;
    the sleep's overshoot and the call into the worker process, which vary with the machine's load, count in both."""
    alone = loadgen.run_test(loadgen.Settings("SingleStream", min_duration_s=1.5, min_queries=50,
                                              expected_latency_ms=10.0),
                             serve_fn(sleeper["s10"]), len(SOURCES), tmp_path / "alone")
    service_ms = alone.latency_ms["mean"]
    assert service_ms >= 10.0                                 # the sleep itself is a floor
    qps = 0.5 / service_ms * 1000
    settings = loadgen.Settings("Server", min_duration_s=4.0, min_queries=100, target_qps=qps, bound_ms=1000.0,
                                max_batch=1)
    serve = Clocked(serve_fn(sleeper["s10"]))
    result = loadgen.run_test(settings, serve, len(SOURCES), tmp_path / "server")
    assert result.batches == {1: result.batches[1]} and len(serve.seconds) == result.batches[1]
    s, per_ms = np.asarray(serve.seconds) * 1000, qps / 1000          # service times (ms), arrivals per ms
    load = per_ms * s.mean()
    assert load < 0.9, (load, s.mean(), service_ms)            # served at about half its capacity, not swamped
    mg1 = s.mean() + per_ms * np.mean(s ** 2) / (2 * (1 - load))
    assert abs(result.latency_ms["mean"] / mg1 - 1) < 0.15, (result.latency_ms, s.mean(), load, mg1)


def test_a_qps_far_over_capacity_is_recorded_invalid_and_never_reported(sleeper, tmp_path):
    settings = loadgen.Settings("Server", min_duration_s=0.5, min_queries=20, target_qps=300.0, bound_ms=50.0,
                                max_batch=1)
    result = loadgen.run_test(settings, serve_fn(sleeper["s10"]), len(SOURCES), tmp_path / "over")
    assert result.validity == "INVALID" and result.checks["latency"] is False
    from bench.serving.measure import _record
    from bench.serving.report import peaks, render

    rec = {**_record("over", settings, "peak", 50.0, result, Baseline(10, 11, [s.upper() for s in SOURCES]),
                     None, None), "system": "s10", "paradigm": "ar", "bleu": 1.0}
    assert rec["validity"] == "INVALID" and peaks([rec]) == {}
    page = render([rec], {}, {**ServingSpec().__dict__}, {}, "r")
    assert "1 INVALID test(s)" in page and "Bound 50 ms" not in page


def test_serve_system_runs_every_scenario_and_checks_outputs_against_batch_1(sleeper, tmp_path):
    serving = ServingSpec(bounds_ms=(5.0, 400.0), min_duration_s=0.3, min_queries=40, search_queries=20, loads=(0.5,),
                          max_batch=(1, 4))
    base = Baseline(10.0, 11.0, [s.upper() for s in SOURCES])
    records = serve_system(serve_fn(sleeper["s10"]), len(SOURCES), base, serving, tmp_path, seed=0,
                           score=lambda hyps: 100.0 * np.mean([h == b for h, b in zip(hyps, base.hypotheses)]))
    purposes = [r["purpose"] for r in records]
    assert list(dict.fromkeys(purposes))[:3] == ["singlestream", "offline", "curve"]   # Offline may run twice a batch
    offline = [r for r in records if r["purpose"] == "offline" and r["validity"] == "VALID"]
    assert {r["max_batch"] for r in offline} == {1, 4}
    # batches of 4 take 17.5 ms (100/s at batch 1, 229/s at 4): Server serves at 4, from the fastest Offline test
    best = max(offline, key=lambda r: r["qps"])
    assert best["max_batch"] == 4
    curve = next(r for r in records if r["purpose"] == "curve")
    assert curve["max_batch"] == 4 and curve["target_qps"] == pytest.approx(0.5 * best["qps"])
    unreachable = [r for r in records if r["validity"] == "UNREACHABLE"]
    assert [r["bound_ms"] for r in unreachable] == [5.0]          # 10 ms a sentence never holds 5 ms
    assert "peak-search" in purposes and purposes[-1] == "peak"
    searches = [r for r in records if r["purpose"] == "peak-search"]
    assert all(r["mode"] == "FindPeakPerformance" for r in searches)
    assert searches[-1]["peak_qps"] or len(searches) == 3     # a search that found nothing ran again, lower
    served = [r for r in records if r.get("samples_served")]
    assert all(r["same_as_batch1"] == 1.0 and r["bleu_delta_vs_batch1"] == 0.0 for r in served)


def test_each_test_records_where_the_cpu_went_driver_worker_others_and_steal(sleeper, tmp_path):
    """Issue 51: PaDIR T = 2 on ONNX Runtime ran slower under LoadGen than alone; each test now says how much of the
    machine the driver and the worker took. Here the driver spins between queries and the worker only sleeps."""
    from bench.measure.load import Snapshot
    from bench.serving.measure import CPU_FIELDS, cpu_shares

    # The arithmetic, on made-up counters: 1,000 ticks of two cores, 300 busy; the driver 100, the worker 150.
    before = [Snapshot(10_000, 5_000, 0, 0, 0.0), Snapshot(10_000, 5_000, 0, 0, 0.0)]
    after = [Snapshot(11_000, 5_700, 20, 100, 5.0), Snapshot(11_000, 5_700, 20, 150, 5.0)]
    assert cpu_shares(before, after) == {"driver_cpu_share": 0.1, "worker_cpu_share": 0.15, "others_cpu_share": 0.05,
                                         "steal_share": 0.02}
    assert cpu_shares([None, None], after) == dict.fromkeys(CPU_FIELDS)

    worker = sleeper["s10"]

    def spin_then_serve(indices):
        end = time.process_time() + 0.010                                  # 10 ms of the driver's CPU per query
        while time.process_time() < end:
            pass
        return serve_fn(worker)(indices)

    serving = ServingSpec(scenarios=("SingleStream",), min_duration_s=0.3, min_queries=30)
    records = serve_system(spin_then_serve, len(SOURCES), Baseline(20.0, 22.0, [s.upper() for s in SOURCES]),
                           serving, tmp_path, seed=0, pids=(os.getpid(), worker.pid))
    assert all(set(CPU_FIELDS) <= set(r) for r in records)
    shares = records[0]
    assert shares["driver_cpu_share"] > shares["worker_cpu_share"] >= 0.0
    assert 0.0 <= shares["others_cpu_share"] <= 1.0 and 0.0 <= shares["steal_share"] <= 1.0
    without = serve_system(serve_fn(worker), len(SOURCES), Baseline(10.0, 11.0, [s.upper() for s in SOURCES]),
                           serving, tmp_path / "none", seed=0)
    assert all(r[k] is None for r in without for k in CPU_FIELDS)                # no pids: nothing made up


def test_no_search_or_validation_runs_below_the_lowest_rate_a_test_may_take(sleeper, tmp_path, monkeypatch):
    """A bound that no QPS from the floor (min_queries / MAX_TEST_S) up holds is NOT_FOUND: no validation runs, and
    the searches never start below the floor (a JAX system whose p99 missed 100 ms even at 2 QPS searched down to 1
    QPS and then validated there, 700 queries: 12 minutes a test)."""
    from bench.serving import measure
    from bench.serving.report import no_peak

    monkeypatch.setattr(measure, "MAX_TEST_S", 0.5)                # floor: 40 queries / 0.5 s = 80 QPS, 80% load
    # 25 ms: SingleStream's p99 (10 ms calls) stays under it on a busy machine, while at 80 QPS a queue forms
    serving = ServingSpec(bounds_ms=(25.0,), min_duration_s=0.3, min_queries=40, search_queries=20, loads=(),
                          max_batch=1, scenarios=("SingleStream", "Server"))
    records = serve_system(serve_fn(sleeper["s10"]), len(SOURCES), Baseline(10.0, 11.0, [s.upper() for s in SOURCES]),
                           serving, tmp_path, seed=0)
    searches = [r for r in records if r["purpose"] == "peak-search"]
    assert [r["target_qps"] for r in searches] == [80.0]           # started at the floor, not restarted lower
    (last,) = [r for r in records if r["purpose"] == "peak"]
    assert last["validity"] == "NOT_FOUND" and "no QPS from 80.0 up held the bound" in last["invalid_reason"]
    assert no_peak([{**r, "system": "s10"} for r in records]) == {("s10", 25.0): (80.0, last["latency_p99_ms"])}


def test_the_solo_timing_is_the_harness_protocol_on_the_serving_worker(sleeper):
    latencies = solo_latencies(sleeper["s20"], SOURCES[:12], TimingSpec(turn=4))
    assert len(latencies) == 12 and min(latencies) >= 20.0          # every call sleeps 20 ms at batch 1


def test_singlestream_is_timed_alone_before_and_after_and_keeps_the_workers_own_clock(sleeper, tmp_path):
    """The solo timing runs right before and right after SingleStream (pooled; their p50 ratio is the drift), every
    record carries the pooled figures, and each test keeps the worker's own clock of its calls."""
    calls: list[float] = []
    worker = sleeper["s10"]

    def serve(indices):
        timed = worker.timed([SOURCES[i] for i in indices], "end_to_end")
        calls.append(timed.elapsed_ns / 1e6)
        return timed.hypotheses

    def drain():
        out, calls[:] = list(calls), []
        return out

    timings = iter([[10.0, 10.0, 12.0], [11.0, 13.0, 13.0]])        # before, after
    order = []
    serving = ServingSpec(bounds_ms=(400.0,), min_duration_s=0.3, min_queries=40, search_queries=20, loads=(0.5,),
                          max_batch=(1, 4), scenarios=("SingleStream", "Offline"))
    records = serve_system(serve, len(SOURCES), Baseline(10.0, 11.0, [s.upper() for s in SOURCES]), serving,
                           tmp_path, seed=0, on_test=order.append, solo=lambda: next(timings), worker_ms=drain)
    assert order[:3] == ["batch-1 timing, alone, before SingleStream", "singlestream",
                         "batch-1 timing, alone, after SingleStream"]
    single = records[0]
    assert single["solo_p50_ms"] == 11.5                                # median of the six pooled
    assert single["solo_p90_ms"] == pytest.approx(float(np.percentile([10, 10, 12, 11, 13, 13], 90)))
    assert single["solo_drift"] == pytest.approx(13.0 / 10.0)
    assert all(r["solo_p50_ms"] == 11.5 and r["solo_drift"] == single["solo_drift"] for r in records)
    # SingleStream: one call a query, each the worker's 10 ms sleep (its own clock: no pipe, no queue)
    assert single["worker_calls"] == single["queries"] and 10.0 <= single["worker_p50_ms"] < single["latency_p50_ms"]
    offline4 = next(r for r in records if r["test"].startswith("offline-b4") and r["validity"] == "VALID")
    assert offline4["worker_calls"] == sum(offline4["batches"].values())
    assert offline4["worker_p50_ms"] >= 10.0 * (1 + 0.25 * 3)          # a batch of 4 sleeps 17.5 ms


def test_singlestream_in_rounds_alternates_with_solo_timings_and_each_round_meets_its_neighbours(sleeper, tmp_path):
    """single_rounds = 3: solo, SS 1, solo, SS 2, solo, SS 3, solo; each round carries the two solo timings around
    it, each has a third of the queries, and the tests after SingleStream carry every solo timing pooled."""
    worker = sleeper["s10"]
    serve = lambda indices: worker.timed([SOURCES[i] for i in indices], "end_to_end").hypotheses  # noqa: E731
    timings = iter([[10.0, 10.0], [12.0, 12.0], [20.0, 20.0], [10.0, 14.0]])
    order = []
    serving = ServingSpec(bounds_ms=(400.0,), min_duration_s=0.2, min_queries=30, single_rounds=3, loads=(0.5,),
                          max_batch=(1,), scenarios=("SingleStream", "Offline"))
    records = serve_system(serve, len(SOURCES), Baseline(10.0, 11.0, [s.upper() for s in SOURCES]), serving,
                           tmp_path, seed=0, on_test=order.append, solo=lambda: next(timings))
    assert order[:7] == ["batch-1 timing, alone, before SingleStream", "singlestream-1",
                         "batch-1 timing, alone, after SingleStream 1 of 3", "singlestream-2",
                         "batch-1 timing, alone, after SingleStream 2 of 3", "singlestream-3",
                         "batch-1 timing, alone, after SingleStream 3 of 3"]
    rounds = [r for r in records if r["scenario"] == "SingleStream"]
    assert [r["test"] for r in rounds] == ["singlestream-1", "singlestream-2", "singlestream-3"]
    assert [r["solo_p50_ms"] for r in rounds] == [11.0, 16.0, 17.0]     # each round's two neighbours pooled
    assert [r["solo_drift"] for r in rounds] == pytest.approx([1.2, 20.0 / 12.0, 12.0 / 20.0])
    assert all(r["queries"] >= 10 for r in rounds)                      # min_queries / rounds each
    offline = next(r for r in records if r["scenario"] == "Offline")
    assert offline["solo_p50_ms"] == 12.0 and offline["solo_drift"] == pytest.approx(12.0 / 10.0)   # all eight pooled


def test_each_round_is_compared_with_the_solo_timings_of_the_very_sentences_loadgen_drew(sleeper, tmp_path):
    """LoadGen draws a few hundred samples at random; the solo timings (one latency per test sentence, in order)
    are read at exactly those sentences, each as often as drawn, each sentence's mean of the timings around."""
    from bench.serving.measure import matched

    worker = sleeper["s10"]
    served_ids: list[int] = []

    def serve(indices):
        served_ids.extend(indices)
        return worker.timed([SOURCES[i] for i in indices], "end_to_end").hypotheses

    n = len(SOURCES)
    timings = iter([[float(i) for i in range(n)], [float(i) + 2.0 for i in range(n)]])    # sentence i: i and i + 2
    serving = ServingSpec(bounds_ms=(400.0,), min_duration_s=0.2, min_queries=20, scenarios=("SingleStream",))
    (single,) = serve_system(serve, n, Baseline(10.0, 11.0, [s.upper() for s in SOURCES]), serving, tmp_path,
                             seed=0, solo=lambda: next(timings))
    drawn = np.asarray(served_ids, np.float64) + 1.0                   # each drawn sentence's mean of the two
    assert single["solo_matched_p50_ms"] == pytest.approx(float(np.percentile(drawn, 50)))
    assert single["solo_matched_p90_ms"] == pytest.approx(float(np.percentile(drawn, 90)))
    assert single["solo_p50_ms"] == pytest.approx(float(np.percentile([*range(n), *range(2, n + 2)], 50)))
    assert matched([1.0, 2.0], [3.0, 4.0], [1, 1, 0], 2) == {"solo_matched_p50_ms": 3.0,
                                                             "solo_matched_p90_ms": pytest.approx(3.0)}
    assert matched([1.0], [3.0], [0], 2) == {} and matched([1.0, 2.0], [3.0, 4.0], [], 2) == {}


def test_the_check_reads_the_same_sentence_solo_figures_where_a_round_has_them():
    from bench.serving.report import agreement, ratios

    r = {"latency_p50_ms": 11.0, "latency_p90_ms": 20.0, "solo_p50_ms": 9.0, "solo_p90_ms": 18.0,
         "solo_matched_p50_ms": 11.0, "solo_matched_p90_ms": 20.0, "batch1_p50_ms": 10.0, "batch1_p90_ms": 19.0}
    assert agreement(r, None) == (1.0, 1.0)                           # the same sentences: 11 / 11, not 11 / 9
    assert ratios({**r, "solo_matched_p50_ms": None}, None, "p50") == [pytest.approx(11 / 9)]
    assert ratios(r, None, "p50", "batch1") == [pytest.approx(1.1)]   # batch-1 has no same-sentence figure


def test_a_system_served_in_rounds_is_one_row_checked_by_the_median_of_its_rounds():
    """A noisy machine moves one round: the median of the rounds' ratios (each against its own neighbours) holds."""
    from bench.serving.report import agreement, disagreements, ratios, render, single_stream_rows
    from bench.serving.rows import record

    def round_(system, test, p50, solo50, drift=1.0):
        return record({"system": system, "test_set": "t", "scenario": "SingleStream", "purpose": "singlestream",
                       "test": test, "validity": "VALID", "latency_p50_ms": p50, "latency_p90_ms": p50,
                       "latency_p99_ms": p50, "solo_p50_ms": solo50, "solo_p90_ms": solo50, "solo_drift": drift,
                       "batch1_p50_ms": 10.0, "batch1_p90_ms": 10.0, "paradigm": "ar", "bleu": 1.0,
                       "qps": 1000.0 / p50, "queries": 10})

    steady = [round_("steady", f"singlestream-{i}", p, s) for i, (p, s) in enumerate([(10, 10), (13, 12.5), (10, 10)])]
    jumpy = [round_("jumpy", f"singlestream-{i}", p, s, d)
             for i, (p, s, d) in enumerate([(10, 10, 1.0), (16, 12, 2.0), (11, 10.5, 0.5)])]
    rows = single_stream_rows([*steady, *jumpy])
    assert [r["system"] for r in rows] == ["steady", "jumpy"] and [len(r["rounds"]) for r in rows] == [3, 3]
    assert rows[0]["latency_p50_ms"] == 10.0 and rows[0]["queries"] == 30
    assert rows[1]["solo_drift"] == pytest.approx(1.0)                  # the last solo timing over the first
    assert ratios(rows[1], None, "p50") == pytest.approx([1.0, 16 / 12, 11 / 10.5])
    assert agreement(rows[1], None)[0] == pytest.approx(11 / 10.5)     # one round off by a third; the median holds
    assert disagreements([*steady, *jumpy]) == []
    assert disagreements([*steady, *jumpy[1:]]) == ["jumpy"]           # two rounds: their mean, 1.190
    page = render([*steady, *jumpy], {}, {**ServingSpec().__dict__}, {}, "r")
    assert "| 1.000-1.333 |" in page and "2 of 2 within 10%" in page


def test_the_singlestream_check_is_against_solo_plus_the_drivers_round_trip():
    """The harness's clock runs inside the worker and LoadGen's from its issue: the check adds the driver's round trip
    (the empty system's SingleStream) to the solo figures before it compares."""
    from bench.serving.report import agreement, disagreements, driver_of, render
    from bench.serving.rows import record

    def single(system, p50, p90, solo50=None, solo90=None):
        return record({"system": system, "test_set": "t", "scenario": "SingleStream", "purpose": "singlestream",
                "validity": "VALID", "latency_p50_ms": p50, "latency_p90_ms": p90, "latency_p99_ms": p90,
                "solo_p50_ms": solo50, "solo_p90_ms": solo90, "batch1_p50_ms": solo50, "batch1_p90_ms": solo90,
                "paradigm": "ar", "bleu": 1.0, "qps": 1000.0 / p50})

    driver = single("driver", 0.3, 0.4)
    near = single("near", 3.4, 4.4, 3.1, 4.0)          # 3.4 / (3.1 + 0.3) = 1.0: agrees only with the driver added
    slow = single("slow", 4.0, 4.4, 3.1, 4.0)          # 4.0 / 3.4 = 1.18: off even with it
    records = [driver, near, slow]
    assert driver_of(records, "t") is driver and driver_of(records, "other") is None
    assert agreement(near, driver) == (pytest.approx(1.0), pytest.approx(1.0))
    assert agreement(near, None)[0] == pytest.approx(3.4 / 3.1)        # 1.097: the driver's 0.3 ms is 9% here
    assert disagreements(records) == ["slow"]
    assert disagreements([near, slow]) == ["near", "slow"]              # no driver measured: nothing added
    page = render(records, {}, {**ServingSpec().__dict__}, {}, "r")
    assert "1 of 2 within 10% of the solo timing plus the driver's round trip; not: slow." in page
    assert "p50 0.300 ms, p90 0.400 ms" in page


# ----------------------------------------------------------------------------- a suite's [serving] step

SERVING = ('\n[serving]\nsystems = ["ar-greedy", "padir-s4-u0.15-distill"]\nbounds_ms = [60]\nmin_duration_s = 0.3\n'
           "min_queries = 200\nsearch_queries = 10\nloads = [0.5]\nmax_batch = 4\nstart_qps = 50\n")


class DyingFactory(FakeFactory):
    """Fake decoders of 5 ms a call (so LoadGen's peak search stays in the hundreds of QPS); the distilled PaDIR
    system's worker dies when asked to serve a batch of more than one sentence."""

    def __call__(self, family, checkpoint_dir, spec, **options):
        decoder = super().__call__(family, checkpoint_dir, spec, **options)
        run, dies = decoder.run, bool(options.get("die_serving"))

        def slow_run(prepared):
            if dies and len(prepared["sources"]) > 1:
                os._exit(7)
            time.sleep(0.005)
            return run(prepared)

        decoder.run = slow_run
        return decoder


def _suite(tmp_path, extra=SERVING):
    path = tmp_path / "servetest.toml"
    path.write_text(fake_spec("servetest", test=["test", "test+refs"], ar_decoders=["greedy"], padir_iterations=[4],
                              max_test_sentences=12, timing="solo_sentences = 0\ncosts = false\n") + extra)
    return load_suite(path)


def test_a_suite_serves_its_chosen_systems_after_timing_and_resumes_after_a_kill(tmp_path, monkeypatch):
    spec = _suite(tmp_path)
    run, _ = open_run(tmp_path / "results", spec.name, spec.spec_hash(), spec.to_toml(), "test")
    deps = fake_deps(tmp_path / "ckpt")
    deps.worker_factory = DyingFactory()
    monkeypatch.setattr("bench.families.padir.PaDIRFamily.serving_options",
                        lambda self, serving: {"die_serving": True}, raising=False)
    with pytest.raises(UserError, match=r"^system padir-s4-u0.15-distill: its worker process .* died with exit code 7"):
        Runner(spec, deps, run, progress=False).run()
    first = run.serving()
    assert {r["system"] for r in first} == {"driver", "ar-greedy"}      # saved before the kill; padir-s4 not
    assert len(run.rows()) == 6                                         # batch-1 timing finished first

    monkeypatch.undo()
    deps.worker_factory = DyingFactory()
    Runner(spec, deps, run, progress=False).run()
    records = run.serving()
    assert records[:len(first)] == first                                # the served systems were not served again
    assert {r["system"] for r in records} == {"driver", "ar-greedy", "padir-s4-u0.15-distill"}
    assert {r["test_set"] for r in records} == {"fake_task:test"}
    assert all(set(r) == {c.name for c in SERVING_COLUMNS} for r in records)
    ar = [r for r in records if r["system"] == "ar-greedy"]
    assert {r["scenario"] for r in ar} == {"SingleStream", "Offline", "Server"}
    assert all(r["same_as_batch1"] == 1.0 for r in ar if r["samples_served"])
    assert ar[0]["batch1_p50_ms"] == next(r for r in run.rows() if r.system == "ar-greedy"
                                          and r.test_set == "fake_task:test").latency_p50_ms
    assert ar[0]["purpose"] == "singlestream" and ar[0]["solo_p50_ms"] >= 5.0      # timed alone: >= its 5 ms sleep
    assert all(r["solo_p50_ms"] == ar[0]["solo_p50_ms"] for r in ar if r["validity"] != "UNREACHABLE")
    assert ar[0]["solo_drift"] > 0 and ar[0]["worker_calls"] == ar[0]["queries"]
    assert len({r["serve_seconds"] for r in ar}) == 1 and isinstance(ar[0]["serve_seconds"], float)  # one figure
    assert (run.path / "serving" / "padir-s4-u0.15-distill" / "offline" / loadgen.SUMMARY).is_file()

    write_report(run.path)
    page = (run.path / "serving.md").read_text()
    assert "SingleStream against the harness's batch-1 timing" in page and "driver's cost" in page
    assert all(r["driver_cpu_share"] is not None and r["worker_cpu_share"] is not None for r in ar if r["queries"])
    assert "driver CPU" in page and "worker CPU" in page                # where the CPU went, on the page
    assert (run.path / "serving.png").is_file()
    assert "serving.md" in (run.path / "leaderboard.md").read_text()
    plan_reads_back_how_long_each_system_took_to_serve(spec, run, tmp_path)


def plan_reads_back_how_long_each_system_took_to_serve(spec, run, tmp_path):
    """``narbench plan`` takes a system served before on this machine with the same [serving] settings at its own
    recorded ``serve_seconds``; other settings (here a shorter minimum duration) fall back to the arithmetic."""
    from bench import estimate
    from bench.plan import expand
    from bench.preview import _serving
    from bench.serving.measure import estimate_seconds

    took = {r["system"]: r["serve_seconds"] for r in run.serving()}
    assert set(took) == {"driver", "ar-greedy", "padir-s4-u0.15-distill"} and all(took.values())
    env = json.loads((run.path / "env.json").read_text())             # the fakes' machine
    measured = estimate.Measured.collect(run.path.parents[1], None, {k: env.get(k) for k in ("cpu_model", "threads")})
    assert measured.runs == [f"{spec.name}/{run.path.name}"]
    systems = list(dict.fromkeys(c.system for c in expand(spec).eval_cells))
    costs = {s.name: (estimate.SystemCost(latency_ms=5.0, compile_s=0.0, how="measured"), 1.0) for s in systems}
    assert _serving(spec, systems, costs, 12, measured)[1] == pytest.approx(sum(took.values()))
    other = _suite(tmp_path, SERVING.replace("min_duration_s = 0.3", "min_duration_s = 0.2"))
    names, seconds = _serving(other, systems, costs, 12, measured)
    driver = max(0.2, other.serving.min_queries * 1e-4)
    expected = driver + sum(estimate_seconds(other.serving, 5.0, 0.0, 12) for _ in names)
    assert seconds == pytest.approx(expected)


@pytest.mark.parametrize("line, message", [
    ("start_qps = 0", "serving.start_qps: expected a number > 0"),
    ("bounds_ms = [0]", "serving.bounds_ms: expected latency bounds in ms > 0"),
    ("max_batch = 0", "serving.max_batch: expected an integer >= 1"),
    ("max_batch = [4, 0]", "serving.max_batch: expected integers >= 1, got 0"),
    ("max_batch = [4, 4]", "serving.max_batch: expected distinct integers >= 1"),
    ("group_by_length = 1", "serving.group_by_length: expected true or false"),
    ('scenarios = ["MultiStream"]', "serving.scenarios: expected scenarios of"),
    ("loads = [1.5]", "serving.loads: expected shares of the Offline throughput"),
])
def test_bad_serving_values_are_one_line_errors(tmp_path, line, message):
    with pytest.raises(UserError) as err:
        _suite(tmp_path, f"\n[serving]\n{line}\n")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_serving_an_unknown_system_is_a_one_line_error(tmp_path):
    spec = _suite(tmp_path, '\n[serving]\nsystems = ["ar-beam9"]\n')
    from bench.plan import expand
    from bench.serving.run import chosen

    with pytest.raises(UserError, match="serving.systems: 'ar-beam9' is not a system of this suite"):
        chosen(spec, expand(spec).systems)


def test_a_suite_without_serving_keeps_its_spec_hash():
    assert load_suite("default").spec_hash().startswith("691feb19")   # results/default/20261127T095230Z-691feb19


def test_the_serving_suite_serves_the_default_models_and_plan_estimates_it():
    from bench.plan import expand

    spec = load_suite("serving")
    default = {c.label for c in expand(load_suite("default")).train_cells}
    assert {c.label for c in expand(spec).train_cells} <= default           # trains nothing the default does not
    assert spec.serving.bounds_ms == (100.0, 250.0) and len(expand(spec).systems) == 11



def test_plans_serving_estimate_is_the_documented_arithmetic():
    from bench.serving.measure import estimate_seconds

    serving = ServingSpec(bounds_ms=(15.0, 100.0), min_duration_s=5, min_queries=700, search_queries=200, loads=(0.5,),
                          max_batch=16)
    # warm-up 2 s x 5 batch shapes; the solo timings 2 x 500 x 10 ms; SingleStream 700 x 10 ms; Offline 1.5 x 5 s; the
    # curve at 0.5 x 400/s: 5 s; 15 ms < 2 x 10 ms: no search; 100 ms: 9 search steps of 5 s, 2 validations of 5 s
    # at 0.6 x 400/s
    assert estimate_seconds(serving, 10.0, 2.0, 500) == pytest.approx(10 + 10 + 7 + 7.5 + 5 + 45 + 10)
    # Offline once for each largest batch, warm-up for each power of two up to the largest
    several = ServingSpec(bounds_ms=(15.0,), min_duration_s=5, min_queries=700, loads=(), max_batch=(1, 4, 16))
    assert estimate_seconds(several, 10.0, 2.0) == pytest.approx(10 + 7 + 3 * 7.5)
    # a slow system: the curve at 4/s runs the queries LoadGen's early stopping needs at p99 (459, not 700); the
    # search and validations at the floor, 700 / MAX_TEST_S QPS: 9 steps of 200 queries and 2 validations of
    # MAX_TEST_S
    from bench.serving import measure

    assert measure.early_stop_queries(0.99) == 459 and measure.early_stop_queries(0.9) == 44
    slow = ServingSpec(bounds_ms=(2000.0,), min_duration_s=5, min_queries=700, search_queries=200, loads=(1.0,),
                       max_batch=1, scenarios=("Server",))
    floor = 700 / measure.MAX_TEST_S
    assert estimate_seconds(slow, 250.0) == pytest.approx(
        459 / 4.0 + 9 * 200 / floor + 2 * measure.MAX_TEST_S + 1.5 * 5)


def test_a_missed_bound_steps_the_validation_down_by_as_much_as_its_p99_missed():
    from bench.serving.measure import STEP_DOWN, step_down

    low, high = STEP_DOWN
    assert step_down(100.0, 141.0) == pytest.approx(100 / 141)      # between the limits: bound / p99
    assert step_down(250.0, 1792.0) == low                          # a queue built up: at most half
    assert step_down(100.0, 95.0) == high                           # the p99 held, early stopping's bound did not
    assert step_down(100.0, None) == high and step_down(100.0, 105.0) == high


def test_offline_guesses_the_best_rate_measured_so_far(tmp_path, monkeypatch):
    """Each Offline test's expected rate (how many samples LoadGen issues) is the best VALID rate measured so far,
    batch 1's timing at first: a system whose throughput falls with the batch is never issued a batch-scaled
    guess it would take several minimum durations to serve."""
    from bench.serving import loadgen as lg_module
    from bench.serving import measure

    rates = {1: 100.0, 4: 300.0, 16: 150.0}                         # sentences/s by max_batch
    seen = []

    def fake_test(settings, serve, n, log_dir, length=None):
        seen.append((settings.max_batch, settings.expected_qps))
        return lg_module.Result("VALID", "", rates[settings.max_batch], dict.fromkeys(("p50", "p90", "p99")), 10,
                                {"min_duration": True}, None)

    monkeypatch.setattr(measure, "run_test", fake_test)
    serving = ServingSpec(bounds_ms=(100.0,), min_duration_s=1, min_queries=10, max_batch=(1, 4, 16),
                          scenarios=("Offline",))
    records = measure.serve_system(lambda idx: [""] * len(idx), 4, Baseline(20.0, 22.0, [""] * 4), serving,
                                   tmp_path, seed=0)
    assert seen == [(1, 50.0), (4, 100.0), (16, 300.0)]
    assert measure.best_offline(records)["max_batch"] == 4


def test_results_format_lists_the_serving_columns():
    text = (REPO / "docs" / "results_format.md").read_text(encoding="utf-8")
    block = serving_markdown()
    assert block in text, "docs/results_format.md's serving columns differ: paste bench.serving.rows.serving_markdown()"
    assert json.dumps([c.name for c in SERVING_COLUMNS])


def _peak(system, paradigm, bound, qps, bleu, validity="VALID"):
    from bench.serving.rows import record

    return record({"scenario": "Server", "purpose": "peak", "bound_ms": bound, "validity": validity, "qps": qps,
                   "percentile": 0.99}, system=system, paradigm=paradigm, bleu=bleu)


def test_the_verdict_names_the_most_served_system_per_bound_and_the_best_nar_against_the_fastest_ar():
    from bench.serving.report import leaderboard_section, verdict

    records = [_peak("ar", "ar", 100.0, 40.0, 25.0), _peak("ct2", "ar", 100.0, 90.0, 24.9),
               _peak("nar", "nar", 100.0, 120.0, 12.7), _peak("nar", "nar", 100.0, 300.0, 12.7, "INVALID"),
               _peak("ar", "ar", 250.0, 60.0, 25.0),
               {**_peak("nar", "nar", 250.0, 0.0, 12.7, "UNREACHABLE")}]
    lines = verdict(records, {"ct2": "CTranslate2 int8"})
    assert lines[0].startswith("- **p99 under 100 ms**: nar serves the most, 120.0 sentences/s at 12.70 BLEU")
    assert "serves 1.33x the fastest AR (CTranslate2 int8, 90.0/s, 24.90 BLEU)" in lines[0]
    assert lines[1].startswith("- **p99 under 250 ms**: ar serves the most") and "NAR" not in lines[1]
    assert lines[2] == "- No load holds the bound (SingleStream's p99 is over it): nar at 250 ms."
    assert leaderboard_section(records, {})[0] == "## Serving under load"
    assert leaderboard_section([], {}) == []


def test_a_bound_whose_validations_all_failed_is_named_with_the_lowest_qps_tried():
    from bench.serving.report import verdict

    records = [{**_peak("ar", "ar", 250.0, 7.0, 25.0, "INVALID"), "target_qps": 7.2, "latency_p99_ms": 365.0},
               {**_peak("ar", "ar", 250.0, 5.7, 25.0, "INVALID"), "target_qps": 5.8, "latency_p99_ms": 329.0}]
    assert verdict(records, {}) == ["- No validated peak (FindPeakPerformance found none, or LoadGen called every "
                                    "validation INVALID): ar at 250 ms (lowest QPS tried 5.8, its p99 329 ms)."]
