"""A suite's ``[serving]`` step: after the batch-1 timing, each chosen system is served under LoadGen.

One system at a time, in a worker process of its own (``bench.measure.workers``, started with the family's
environment and serving options, as for timing): LoadGen, its threads and the dynamic batcher run in the
driver, the system's engine in the worker. After the warm-up at every batch shape, the harness times the
worker alone at batch 1 on the whole test set, with the suite's protocol (``bench.measure.timing``), right
before and right after SingleStream: so SingleStream is checked against the harness at the same moment, not
only against the suite's interleaved timing minutes earlier (a 2-core VM drifts within minutes, and the two
solo timings say by how much). First an empty system (``Echo``: it returns its sources) is served
SingleStream, so the driver's own round trip (LoadGen, batcher, pipe) is measured and recorded as system
``driver``. A system's records are saved once all its tests ran, with the seconds it took to serve
(``serve_seconds``, which ``narbench plan`` reads back): a killed run resumes at the next system. While it
serves, the process is registered busy, as timing is (``narbench_core.lock.busy``).
"""
from __future__ import annotations

import dataclasses
import functools
import os
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from bench import families
from bench.families import System
from bench.serving.measure import Baseline, check_systems, serve_system
from bench.serving.rows import record
from narbench_core import lock
from narbench_core.errors import UserError
from suites.spec import ServingSpec

DRIVER = "driver"          # the empty system's name in serving.jsonl


class Echo:
    """The empty system: returns its sources unchanged, so a served query's latency is the driver's round trip
    (LoadGen's issue, the batcher, the worker pipe) and nothing else."""

    name = DRIVER
    threads = 1

    def __init__(self, name: str = DRIVER):
        self.name = name

    def prepare(self, sources):
        return list(sources)

    def run(self, prepared):
        return prepared

    def finish(self, outputs, prepared):
        from narbench_core.outputs import DecodeOutput

        return DecodeOutput(list(outputs), np.ones(len(outputs), np.int64))

    def warmup_inputs(self, batch_size: int):
        return [["warm up"] * batch_size]


@dataclasses.dataclass(frozen=True)
class Served:
    """What serving needs of one system: how its worker builds it, and its batch-1 row and outputs."""

    system: System | None                   # None: the driver's empty system
    spec: Any                               # bench.measure.workers.WorkerSpec
    baseline: Baseline
    fields: dict                            # the record's identity fields (system, family, BLEU ...)


def chosen(spec, systems: Sequence[System]) -> list[System]:
    """The suite's systems ``[serving] systems`` names (all when it names none), in the suite's order."""
    serving: ServingSpec = spec.serving
    names = [s.name for s in systems]
    check_systems(names, serving.systems, spec.source or spec.name)
    return [s for s in systems if not serving.systems or s.name in serving.systems]


def worker_spec(system: System, checkpoint: Path, factory: Callable, serving: ServingSpec, platform):
    from bench.measure.workers import WorkerSpec

    family = families.get(system.family)
    options = {"name": system.name, **dict(system.options), **family.serving_options(serving)}
    return WorkerSpec(system.name, factory, (system.family, str(checkpoint), system.decoder), options,
                      family.worker_env(dict(system.options)), platform)


def serve_all(spec, store, served: list[Served], sources: list[str], references: list[str], target_lang: str,
              env_fields: dict, progress: bool = True) -> list[dict]:
    """Serve each system of ``served`` not yet in ``store``'s serving.jsonl; returns the new records."""
    from tqdm.auto import tqdm

    from bench.measure.quality import corpus_bleu
    from bench.measure.workers import WorkerPool
    from narbench_core import langs

    serving: ServingSpec = spec.serving
    done = store.served_keys()
    todo = [s for s in served if (s.fields["system"], s.fields["test_set"]) not in done]
    tokenize = langs.bleu_tokenizer(target_lang)
    score = lambda hyps: corpus_bleu(hyps, [references], tokenize).score  # noqa: E731
    out: list[dict] = []
    bar = tqdm(todo, desc="serve", unit="system", disable=not progress, dynamic_ncols=True)
    for item in bar:
        name = item.fields["system"]
        bar.set_postfix_str(f"{name}: start")
        started = time.perf_counter()
        with lock.busy(f"serving {spec.name}"), WorkerPool([item.spec]) as pool:
            worker = pool.workers[0]
            for b in serving.batch_sizes:
                bar.set_postfix_str(f"{name}: warm up batch {b}")
                worker.warmup(b)
            calls_ms: list[float] = []

            def serve(indices: list[int]) -> list[str]:
                timed = worker.timed([sources[i] for i in indices], "end_to_end")
                calls_ms.append(timed.elapsed_ns / 1e6)
                return timed.hypotheses

            def drain() -> list[float]:
                out, calls_ms[:] = list(calls_ms), []
                return out

            solo = None
            if item.system is not None and "SingleStream" in serving.scenarios:
                solo = functools.partial(solo_latencies, worker, sources, spec.timing)
            figures = serve_system(serve, len(sources), item.baseline,
                                   serving if item.system is not None else _driver_only(serving),
                                   store.path / "serving" / name, spec.seeds[0],
                                   score if item.system is not None else None,
                                   on_test=lambda label: bar.set_postfix_str(f"{name}: {label}"),
                                   length=lambda i: len(sources[i].split()), solo=solo, worker_ms=drain,
                                   pids=(os.getpid(), worker.pid))
            threads = worker.info["threads"]
        date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        fields = {**{k: env_fields.get(k) for k in ("cpu_model", "git_commit")}, **item.fields,
                  "engine_threads": threads, "date_utc": date,
                  "serve_seconds": round(time.perf_counter() - started, 1)}
        records = [record(f, **fields) for f in figures]
        store.save_serving(records)
        out.extend(records)
    return out


def solo_latencies(worker, sources: list[str], timing) -> list[float]:
    """The harness's batch-1 timing of ``worker`` alone on ``sources`` (the suite's phase and turn; a turn's first
    call untimed, as in the suite's schedule): its latencies, ms."""
    from bench.measure.timing import measure_systems

    measured = measure_systems([worker], sources, 1, timing.phase, turn=timing.turn, rotate=False)
    return [float(v) for v in measured.latencies(worker.name)]


def _driver_only(serving: ServingSpec) -> ServingSpec:
    return dataclasses.replace(serving, scenarios=("SingleStream",))


def plan_served(spec, store, systems: list[tuple[System, Path]], test_set: str, sources: list[str],
                factory: Callable, platform) -> list[Served]:
    """The driver's empty system and each of ``systems`` (chosen by ``chosen``) with its batch-1 row and outputs
    on ``test_set`` (from the run's rows.jsonl and samples.jsonl: the batch-1 timing runs first)."""
    from bench.measure.workers import WorkerSpec

    serving: ServingSpec = spec.serving
    rows = {r.system: r for r in store.rows() if r.test_set == test_set}
    cells = store.cells()
    out = []
    for system, ckpt in systems:
        row, samples = rows.get(system.name), cells.get((system.name, test_set))
        if row is None or not samples:
            raise UserError(f"{system.name} has no batch-1 row on {test_set} to serve against; re-run the same "
                            "command to time it first")
        baseline = Baseline(row.latency_p50_ms, row.latency_p90_ms, [s["hypothesis"] for s in samples])
        out.append(Served(system, worker_spec(system, ckpt, factory, serving, platform), baseline, {
            "suite": spec.name, "system": system.name, "test_set": test_set, "family": system.family,
            "paradigm": families.get(system.family).paradigm, "bleu": row.bleu}))
    if out:
        driver = Served(None, WorkerSpec(DRIVER, Echo, (DRIVER,), platform=platform),
                        Baseline(0.1, 0.1, list(sources)),
                        {"suite": spec.name, "system": DRIVER, "test_set": test_set, "family": None,
                         "paradigm": None, "bleu": None})
        out.insert(0, driver)
    return out
