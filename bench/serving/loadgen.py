"""One MLPerf LoadGen test of a server: the real ``mlperf_loadgen`` bindings drive a ``DynamicBatcher``.

``run_test`` builds LoadGen's query sample library over the test set (``n_samples`` sentences, all of them
in the performance set), a system under test whose ``issue_queries`` hands the queries to the batcher,
starts the test with the given ``Settings`` and logs into ``log_dir``, and returns what LoadGen's detail log
says (``Result``): validity and why, throughput, latency percentiles, and the peak of a
FindPeakPerformance search. LoadGen decides validity (duration, query count, latency bound, early
stopping); narbench only reads it. The outputs each sample got are kept so the caller can check them
against the system's batch-1 outputs.
"""
from __future__ import annotations

import gzip
import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from bench.serving.batcher import DynamicBatcher, Query
from narbench_core.errors import UserError

SUMMARY, DETAIL = "mlperf_log_summary.txt", "mlperf_log_detail.txt"
PEAK_RE = re.compile(r"Found peak performance field: ([0-9.]+)")
PERCENTILES = {"p50": "50.00", "p90": "90.00", "p99": "99.00"}
QPS_KEYS = {"SingleStream": "result_qps_with_loadgen_overhead", "Offline": "result_samples_per_second",
            "Server": "result_completed_samples_per_sec"}


def require_loadgen():
    try:
        import mlperf_loadgen
    except ImportError:
        raise UserError("serving needs MLPerf LoadGen; install the serving extra: pip install -e \".[serving]\"") \
            from None
    return mlperf_loadgen


@dataclass(frozen=True)
class Settings:
    """One LoadGen test: the scenario, the mode and the few settings narbench sets (the rest are LoadGen's)."""

    scenario: str                          # SingleStream | Offline | Server
    min_duration_s: float
    min_queries: int
    mode: str = "PerformanceOnly"          # or FindPeakPerformance (Server only)
    target_qps: float | None = None        # Server: the Poisson arrival rate (FindPeakPerformance: where it starts)
    bound_ms: float | None = None          # Server: the latency bound (LoadGen's server_target_latency)
    percentile: float = 0.99               # Server: the percentile the bound holds for
    expected_qps: float | None = None      # Offline: how many samples LoadGen issues (x min duration)
    expected_latency_ms: float | None = None   # SingleStream: LoadGen's query-count estimate
    seed: int = 0                          # LoadGen's sample-index and schedule seeds
    max_batch: int = 1
    max_wait_ms: float = 0.0

    def loadgen(self, lg):
        s = lg.TestSettings()
        s.scenario = getattr(lg.TestScenario, self.scenario)
        s.mode = getattr(lg.TestMode, self.mode)
        s.min_duration_ms = int(self.min_duration_s * 1000)
        s.min_query_count = int(self.min_queries)
        s.qsl_rng_seed = s.sample_index_rng_seed = s.schedule_rng_seed = int(self.seed)
        if self.scenario == "Server":
            s.server_target_qps = float(self.target_qps)
            s.server_target_latency_ns = int(self.bound_ms * 1e6)
            s.server_target_latency_percentile = float(self.percentile)
            s.server_find_peak_qps_decimals_of_precision = 0      # search to a step of 1 QPS
        if self.expected_qps:
            s.offline_expected_qps = float(self.expected_qps)
        if self.expected_latency_ms:
            s.single_stream_expected_latency_ns = int(self.expected_latency_ms * 1e6)
        return s


@dataclass
class Result:
    """What LoadGen's detail log says of one test, plus the batches the batcher formed and each sample's output."""

    validity: str                          # VALID | INVALID (LoadGen's word)
    invalid_reason: str
    qps: float | None                      # the scenario's throughput figure (QPS_KEYS)
    latency_ms: dict[str, float | None]    # p50, p90, p99, mean, max
    queries: int | None
    checks: dict[str, bool | None]         # min duration, min queries, latency constraints, early stopping
    peak_qps: float | None                 # FindPeakPerformance: the peak LoadGen found
    batches: dict[int, int] = field(default_factory=dict)       # batch size -> count
    outputs: dict[int, set[str]] = field(default_factory=dict)  # sample index -> every output it got
    served: list[int] = field(default_factory=list)             # every sample's index, in completion order

    @property
    def valid(self) -> bool:
        return self.validity == "VALID"


def read_detail(path: Path) -> dict:
    """The MLLOG records of a LoadGen detail log as key -> value (the last record of a key wins), with every
    ``generic_message`` under ``messages``. A log LoadGen cut short is one line naming the fix."""
    records, messages = {}, []
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for line in f:
                if not line.startswith(":::MLLOG "):
                    continue
                try:
                    rec = json.loads(line[len(":::MLLOG "):])
                except json.JSONDecodeError:
                    raise UserError(f"{path}: a LoadGen log line is not JSON; delete the folder and re-run to "
                                    "serve that system again") from None
                if rec.get("key") == "generic_message":
                    messages.append(str(rec.get("value")))
                else:
                    records[rec.get("key")] = rec.get("value")
    except OSError as e:
        raise UserError(f"{path}: LoadGen's detail log cannot be read ({e.strerror}); re-run to serve again") from None
    records["messages"] = messages
    return records


def result_of(records: dict, scenario: str) -> Result:
    if "result_validity" not in records:
        raise UserError("LoadGen wrote no result (its detail log has no result_validity); see its log for the error")
    latency = {k: _ms(records.get(f"result_{v}_percentile_latency_ns")) for k, v in PERCENTILES.items()}
    latency.update(mean=_ms(records.get("result_mean_latency_ns")), max=_ms(records.get("result_max_latency_ns")))
    peaks = [float(m.group(1)) for msg in records["messages"] if (m := PEAK_RE.search(msg))]
    return Result(
        validity=str(records["result_validity"]), invalid_reason=str(records.get("result_invalid_reason") or ""),
        qps=_float(records.get(QPS_KEYS[scenario])), latency_ms=latency, queries=records.get("result_query_count"),
        checks={"min_duration": records.get("result_min_duration_met"),
                "min_queries": records.get("result_min_queries_met"),
                "latency": records.get("result_perf_constraints_met"),
                "early_stopping": records.get("early_stopping_met")},
        peak_qps=peaks[-1] if peaks else None)


def _ms(ns) -> float | None:
    return None if ns is None else float(ns) / 1e6


def _float(x) -> float | None:
    return None if x is None else float(x)


def run_test(settings: Settings, serve: Callable[[list[int]], list[str]], n_samples: int, log_dir: Path,
             length: Callable[[int], int] | None = None) -> Result:
    """Run one LoadGen test of ``serve`` (sample indices -> outputs) over ``n_samples`` samples; its summary log
    and its detail log (gzip) stay in ``log_dir``, which is replaced whole. ``length`` (a sample index -> its
    length) makes the batcher group queries of similar length (``DynamicBatcher``)."""
    lg = require_loadgen()
    log_dir = Path(log_dir)
    if log_dir.exists():
        shutil.rmtree(log_dir)
    log_dir.mkdir(parents=True)
    outputs: dict[int, set[str]] = {}
    served: list[int] = []

    def complete(batch: list[Query], texts: list[str]) -> None:
        for q, text in zip(batch, texts):
            outputs.setdefault(q.index, set()).add(text)
            served.append(q.index)
        lg.QuerySamplesComplete([lg.QuerySampleResponse(q.id, 0, 0) for q in batch])

    batcher = DynamicBatcher(serve, complete, settings.max_batch, settings.max_wait_ms / 1e3, length)
    sut = lg.ConstructSUT(lambda samples: batcher.submit([(s.id, s.index) for s in samples]), lambda: None)
    qsl = lg.ConstructQSL(n_samples, n_samples, lambda indices: None, lambda indices: None)
    log = lg.LogSettings()
    log.log_output.outdir = str(log_dir)
    log.log_output.copy_summary_to_stdout = False
    log.enable_trace = False
    try:
        lg.StartTestWithLogSettings(sut, qsl, settings.loadgen(lg), log)
    finally:
        batcher.close()
        lg.DestroyQSL(qsl)
        lg.DestroySUT(sut)
    if batcher.error is not None:
        raise batcher.error
    for name in ("mlperf_log_trace.json", "mlperf_log_accuracy.json"):
        (log_dir / name).unlink(missing_ok=True)
    detail = log_dir / DETAIL
    if detail.is_file():
        with open(detail, "rb") as src, gzip.open(str(detail) + ".gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        detail.unlink()
    result = result_of(read_detail(Path(str(detail) + ".gz")), settings.scenario)
    result.batches, result.outputs, result.served = dict(sorted(batcher.batches.items())), outputs, served
    return result
