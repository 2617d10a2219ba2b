"""``serving.jsonl``: one record per LoadGen test of a served system, its columns declared once here.

``bench.serving.measure`` makes a test's figures; ``record`` adds the system's identity, its batch-1 BLEU
and the environment. ``serving_markdown`` renders the column reference docs/results_format.md holds.
"""
from __future__ import annotations

from typing import Any, Mapping

from bench.columns import Column, fixed, ms, plain
from narbench_core import markdown

C = Column
SERVING_COLUMNS = (
    C("suite", align="left", doc="the suite's name"),
    C("system", "System", align="left", doc="the served system (its batch-1 row in rows.jsonl has the same name); "
      "`driver` is the empty system that measures the driver's round trip"),
    C("test_set", "Test set", align="left", doc="the test set whose sentences are LoadGen's query sample library"),
    C("family", align="left", doc="the system's family"),
    C("paradigm", align="left", doc="ar or nar"),
    C("test", "Test", align="left", doc="the LoadGen test's name; its logs are in serving/<system>/<test>/"),
    C("scenario", "Scenario", align="left", doc="LoadGen's scenario: SingleStream, Offline or Server"),
    C("purpose", "Purpose", align="left",
      doc="singlestream | offline | curve (Server at a share of the Offline throughput) | peak-search "
          "(FindPeakPerformance) | peak (the PerformanceOnly test that validates a bound's peak)"),
    C("mode", align="left", doc="LoadGen's test mode: PerformanceOnly or FindPeakPerformance"),
    C("bound_ms", "Bound ms", fixed(0), doc="Server: the latency bound of the test (None: the curve's tests hold none)"),
    C("percentile", doc="Server: the latency percentile the bound holds for"),
    C("target_qps", "Target QPS", fixed(1), doc="Server: the Poisson arrival rate LoadGen scheduled"),
    C("validity", "LoadGen", align="left",
      doc="LoadGen's verdict, VALID or INVALID (never reported as a result); UNREACHABLE: a bound SingleStream's "
          "p99 already misses, so no search ran; NOT_FOUND: FindPeakPerformance found no QPS holding the bound "
          "down to the lowest rate a test may run at (bench.serving.measure.MAX_TEST_S)"),
    C("invalid_reason", align="left", doc="why LoadGen called the test INVALID, in its words"),
    C("checks", doc="LoadGen's checks: min_duration, min_queries, latency (the bound), early_stopping"),
    C("qps", "QPS", fixed(1), True,
      doc="sentences per second: SingleStream's QPS with LoadGen's overhead, Offline's samples per second, "
          "Server's completed samples per second"),
    C("peak_qps", "Peak QPS", fixed(1), True, doc="peak-search: the peak FindPeakPerformance found"),
    C("latency_p50_ms", "p50 ms", ms, False, doc="LoadGen's latency percentiles (issue to completion)"),
    C("latency_p90_ms", "p90 ms", ms, False, doc=""),
    C("latency_p99_ms", "p99 ms", ms, False, doc=""),
    C("latency_mean_ms", "mean ms", ms, False, doc=""),
    C("latency_max_ms", "max ms", ms, False, doc=""),
    C("queries", "Queries", plain, doc="queries LoadGen issued"),
    C("max_batch", "Max batch", doc="the batcher's largest batch"),
    C("max_wait_ms", "Max wait ms", doc="how long the batcher held a partial batch"),
    C("batches", doc="batch size -> batches served"),
    C("mean_batch", "Mean batch", fixed(2), doc="sentences per batch served"),
    C("samples_served", doc="distinct test sentences served"),
    C("same_as_batch1", "Same as batch 1", fixed(3), True,
      doc="the share of served sentences whose every output equals the system's batch-1 output"),
    C("bleu_delta_vs_batch1", "ΔBLEU vs batch 1", fixed(2),
      doc="BLEU of the served outputs (batch-1 outputs for sentences not served) minus the batch-1 BLEU"),
    C("bleu", "BLEU", fixed(2), True, doc="the system's batch-1 BLEU on the test set (rows.jsonl)"),
    C("batch1_p50_ms", "batch-1 p50 ms", ms, False, doc="the harness's own batch-1 p50 of the system (rows.jsonl)"),
    C("batch1_p90_ms", "batch-1 p90 ms", ms, False, doc="the harness's own batch-1 p90"),
    C("solo_p50_ms", "solo p50 ms", ms, False,
      doc="the harness's batch-1 p50 of the same worker, timed alone on the test set right before and right after "
          "SingleStream (its round, with single_rounds), the two timings pooled (the suite's timing ran earlier, "
          "interleaved with the other systems)"),
    C("solo_p90_ms", "solo p90 ms", ms, False, doc="the same timings' p90"),
    C("solo_drift", "solo drift", fixed(3), None,
      doc="the solo timing's p50 after SingleStream over its p50 before: how far the machine drifted meanwhile"),
    C("solo_matched_p50_ms", "solo p50 ms, same sentences", ms, False,
      doc="SingleStream: the same solo timings (each sentence's mean of the two) over the very sentences LoadGen "
          "drew, as often as it drew them: the check's like-for-like reference (None in runs before 2026-11-29)"),
    C("solo_matched_p90_ms", "solo p90 ms, same sentences", ms, False, doc="the same draw's p90"),
    C("worker_calls", doc="the decoder calls (one a batch) the worker served in the test"),
    C("worker_p50_ms", "worker p50 ms", ms, False,
      doc="the worker's own clock: p50 of its decoder calls in the test (a call is a batch), no pipe, no queue"),
    C("worker_p90_ms", "worker p90 ms", ms, False, doc="the same clock's p90"),
    C("driver_cpu_share", "driver CPU", fixed(3), None,
      doc="the driver process's CPU time in the test (LoadGen's threads, the batcher) over the machine's capacity "
          "(all cores' time; 0.5 is one core of two); None in runs before 2026-11-29"),
    C("worker_cpu_share", "worker CPU", fixed(3), None,
      doc="the worker process's CPU time (the engine's threads) over the machine's capacity, in the same test"),
    C("others_cpu_share", "others CPU", fixed(3), None,
      doc="the machine's busy share in the test that neither the driver nor the worker spent (other programs)"),
    C("steal_share", "steal", fixed(3), None, doc="the share of the machine's capacity the hypervisor stole"),
    C("engine_threads", doc="the engine's threads in the serving worker"),
    C("cpu_model", align="left", doc="the CPU's name"),
    C("git_commit", align="left", doc="the commit that served"),
    C("date_utc", align="left", doc="when the system was served"),
    C("serve_seconds", "serve s", fixed(0), None,
      doc="seconds the system took to serve, from its worker's start to its last test (`narbench plan` reads it "
          "back for the next run of the same settings on this machine)"),
)
BEGIN = "<!-- serving columns: generated by bench.serving.rows.serving_markdown -->"
END = "<!-- end of serving columns -->"


def column(name: str) -> Column:
    return next(c for c in SERVING_COLUMNS if c.name == name)


def record(figures: Mapping[str, Any], **fields: Any) -> dict:
    """A complete record: every column present (None where the test has no such figure)."""
    return {**{c.name: None for c in SERVING_COLUMNS}, **fields, **figures}


def cell(rec: Mapping[str, Any], name: str) -> str:
    return column(name).cell(rec)


def serving_markdown() -> str:
    """The reference of every ``serving.jsonl`` column, between ``BEGIN`` and ``END`` in docs/results_format.md."""
    better = {True: "higher", False: "lower", None: ""}
    body = ([f"`{c.name}`", c.label.replace("|", "\\|"), better[c.higher_is_better], c.doc.replace("|", "\\|")]
            for c in SERVING_COLUMNS)
    return "\n".join([BEGIN, "", *markdown.table(["column", "header", "better", "meaning"], body, "llll"), "",
                      END]) + "\n"


__all__ = ["SERVING_COLUMNS", "record", "serving_markdown"]
