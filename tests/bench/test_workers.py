"""Timing workers (bench.measure.workers): each system in its own process, or a group's systems in one, driven in
the schedule's order; the solo check; the memory floor; a worker that dies mid-run gives a one-line error and the
run resumes."""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from bench.measure import timing, workers
from bench.measure.decoder import DecodeOutput
from bench.families import load_suite
from bench.runner import Runner
from bench.verify import verify_run
from bench.store import open_run
from grid_fakes import FakeDecoder, FakeFactory, fake_deps, fake_spec
from narbench_core.errors import UserError

SOURCES = ["one", "two words", "three more words", "four", "five five", "six"]


class StampDecoder:
    """Says which process ran each call, and when (CLOCK_MONOTONIC is one clock for every process)."""

    def __init__(self, name: str):
        self.name = name
        self.threads = int(os.environ.get("STAMP_THREADS", "0"))
        self.stamp = 0

    def prepare(self, sources):
        return list(sources)

    def run(self, prepared):
        self.stamp = time.monotonic_ns()
        return prepared

    def finish(self, outputs, prepared):
        return DecodeOutput([f"{os.getpid()} {self.stamp}" for _ in outputs], np.ones(len(outputs), np.int64))

    def warmup_inputs(self, batch_size):
        return [["warm"] * batch_size]


def stamp_decoder(name: str) -> StampDecoder:
    return StampDecoder(name)


class JaxLoadedDecoder(StampDecoder):
    """Says, for each sentence, whether its process has loaded JAX."""

    def finish(self, outputs, prepared):
        return DecodeOutput([str("jax" in sys.modules) for _ in outputs], np.ones(len(outputs), np.int64))


def test_a_worker_whose_decoder_is_not_jaxs_times_it_without_loading_jax():
    """CTranslate2's, ONNX Runtime's and the fakes' workers start without JAX (1.5-4 s of a worker's start): the
    protocol waits for JAX's arrays and places the decoders on the platform only where JAX is loaded."""
    specs = [workers.WorkerSpec("a", JaxLoadedDecoder, ("a",), platform="cpu")]
    with workers.WorkerPool(specs) as pool:
        timing.warm_up(pool.workers, 2)
        m = timing.measure_systems(pool.workers, SOURCES, batch_size=2)
    assert m.systems["a"].hypotheses == ["False"] * len(SOURCES)


def test_each_system_runs_in_its_own_process_in_the_schedule_order():
    specs = [workers.WorkerSpec(n, stamp_decoder, (n,), env={"STAMP_THREADS": "3"}) for n in ("a", "b", "c")]
    with workers.WorkerPool(specs) as pool:
        pids = {w.name: w.pid for w in pool.workers}
        assert all(w.info["threads"] == 3 for w in pool.workers)      # the env was set before the decoder loaded
        timing.warm_up(pool.workers, 2)
        m = timing.measure_systems(pool.workers, SOURCES, batch_size=2, solo_batches=[0, 2])
    assert len(set(pids.values())) == 3 and os.getpid() not in pids.values()
    calls = []
    for name, t in m.systems.items():
        for i, h in enumerate(t.hypotheses):
            pid, stamp = map(int, h.split())
            assert pid == pids[name]
            if i % 2 == 0:                                # one call per batch of 2
                calls.append((stamp, name))
    assert [n for _, n in sorted(calls)] == [n for _, _, n in m.schedule]
    assert m.schedule[:3] == [(0, 0, "a"), (0, 0, "b"), (0, 0, "c")] and m.schedule[3][2] == "b"  # rotated
    for t in m.systems.values():                          # the solo check timed batches 0 and 2 only
        assert np.isnan(t.solo_ms).tolist() == [False, False, True, True, False, False]


def test_a_groups_systems_share_one_process_and_keep_the_schedule_order():
    specs = [workers.WorkerSpec("a", stamp_decoder, ("a",), group="m"), workers.WorkerSpec("b", stamp_decoder, ("b",)),
             workers.WorkerSpec("c", stamp_decoder, ("c",), group="m"),
             workers.WorkerSpec("d", stamp_decoder, ("d",), env={"STAMP_THREADS": "2"}, group="m")]   # another env
    with workers.WorkerPool(specs) as pool:
        assert [w.name for w in pool.workers] == ["a", "b", "c", "d"] and len(pool.processes) == 3
        pids = {w.name: w.pid for w in pool.workers}
        assert pids["a"] == pids["c"] and len({pids["a"], pids["b"], pids["d"]}) == 3
        assert [w.info["systems"] for w in pool.workers] == [2, 1, 2, 1]
        assert pool.workers[3].info["threads"] == 2
        timing.warm_up(pool.workers, 2)
        m = timing.measure_systems(pool.workers, SOURCES, batch_size=2)
    calls = []
    for name, t in m.systems.items():
        for i, h in enumerate(t.hypotheses):
            pid, stamp = map(int, h.split())
            assert pid == pids[name]
            if i % 2 == 0:
                calls.append((stamp, name))
    assert [n for _, n in sorted(calls)] == [n for _, _, n in m.schedule]    # each call ran its own decoder


def test_timing_stops_with_one_line_before_the_workers_exhaust_memory(monkeypatch):
    left = iter([3000.0, 20.0])                         # MB available after each worker process loads
    monkeypatch.setattr(workers, "meminfo_mb", lambda: (1000.0 * 24, next(left)))
    specs = [workers.WorkerSpec(n, stamp_decoder, (n,)) for n in ("a", "b")]
    with pytest.raises(UserError) as err:
        workers.WorkerPool(specs)
    assert str(err.value).startswith("timing stopped before memory ran out: 20 of 24,000 MB left after loading 2 of "
                                     "2 worker processes; time fewer systems at once")
    monkeypatch.setattr(workers, "meminfo_mb", lambda: None)       # a machine that cannot say: no check
    with workers.WorkerPool(specs) as pool:
        monkeypatch.setattr(workers, "meminfo_mb", lambda: (1000.0, 49.0))
        with pytest.raises(UserError, match=r"^timing stopped before memory ran out: 49 of 1,000 MB left after "
                                            r"warming up a;"):
            pool.workers[0].warmup(1)


def test_timing_stops_with_one_line_before_a_worker_passes_the_kernels_map_limit(monkeypatch):
    maps = iter([(100, 1000), (400, 1000), (400, 1000), (750, 1000)])    # before and after each warm-up
    monkeypatch.setattr(workers, "memory_maps", lambda pid: next(maps))
    with workers.WorkerPool([workers.WorkerSpec(n, stamp_decoder, (n,), group="m") for n in ("a", "b")]) as pool:
        pool.workers[0].warmup(1)                        # +300 maps: 400 + 300 fits under 1,000
        with pytest.raises(UserError, match=r"^timing stopped: the worker process of a, b holds 750 memory maps after "
                                            r"warming up b, and the next warm-up could pass the kernel's limit of 1,000;"):
            pool.workers[1].warmup(1)


def test_a_worker_whose_decoder_fails_to_load_names_the_system():
    with pytest.raises(UserError, match=r"^x: the worker could not load"):
        workers.WorkerPool([workers.WorkerSpec("x", failing_decoder)])


def test_a_failing_decoder_in_a_shared_worker_is_named():
    with pytest.raises(UserError, match=r"^y: the worker could not load"):
        workers.WorkerPool([workers.WorkerSpec("x", stamp_decoder, ("x",), group="m"),
                            workers.WorkerSpec("y", failing_decoder, group="m")])


def failing_decoder():
    from narbench_core.errors import UserError

    raise UserError("the worker could not load this")


def noisy_dying_decoder():
    """Says why it fails, then a library logs a line (as TensorFlow's CUDA stub does), then the process dies."""
    os.write(2, b"the real reason\n"
                b"I0000 00:00:1795657265.041797   10202 cudart_stub.cc:31] Could not find cuda drivers on your "
                b"machine, GPU will not be used.\n")
    os._exit(3)


def test_a_dead_worker_is_named_by_its_last_line_that_is_not_a_library_log():
    with pytest.raises(UserError) as err:
        workers.WorkerPool([workers.WorkerSpec("x", noisy_dying_decoder)])
    message = str(err.value)
    assert message.startswith("system x: its worker process") and "exit code 3: the real reason;" in message
    assert "cuda" not in message
    with pytest.raises(UserError, match=r"^system a: its worker process \(pid \d+, shared by 2 systems\) died "
                                        r"with exit code 3: the real reason;"):
        workers.WorkerPool([workers.WorkerSpec("a", stamp_decoder, ("a",), group="m"),
                            workers.WorkerSpec("x", noisy_dying_decoder, group="m")])


class DyingDecoder(FakeDecoder):
    def run(self, prepared):
        self.calls = getattr(self, "calls", 0) + 1
        if self.calls > self.factory.die_after_runs:
            os._exit(9)
        return super().run(prepared)


@dataclass
class DyingFactory(FakeFactory):
    """Builds fake decoders in a worker; the ``die_system``'s process exits after ``die_after_runs`` calls."""

    die_system: str = ""
    die_after_runs: int = 0

    def __call__(self, family, checkpoint_dir, spec, **options):
        if options["name"] == self.die_system:
            return DyingDecoder(Path(checkpoint_dir), spec, factory=self, **options)
        return super().__call__(family, checkpoint_dir, spec, **options)


def test_a_worker_dying_mid_run_is_a_one_line_error_and_the_run_resumes(tmp_path, fixed_peaks):
    path = tmp_path / "workertest.toml"
    path.write_text(fake_spec("workertest", test=["test"], ar_decoders=["greedy"], padir_iterations=[4],
                              max_test_sentences=6, timing="solo_sentences = 3\n"))
    spec = load_suite(path)
    run, _ = open_run(tmp_path / "results", spec.name, spec.spec_hash(), spec.to_toml(), "test")
    deps = fake_deps(tmp_path / "ckpt")
    deps.worker_factory = DyingFactory(die_system="ar-greedy", die_after_runs=3)     # warm-up + 2 timed calls
    with pytest.raises(UserError) as err:
        Runner(spec, deps, run, progress=False).run()
    message = str(err.value)
    assert "\n" not in message and message.startswith("system ar-greedy: its worker process")
    assert "exit code 9" in message and "re-run the same command to resume" in message
    assert run.rows() == [] and run.samples() == []       # nothing of the timed group was saved

    deps.worker_factory = DyingFactory()                  # nobody dies
    Runner(spec, deps, run, progress=False).run()
    rows = run.rows()
    assert rows and all(r.isolated and r.interference is not None and r.solo_p50_ms > 0 for r in rows)
    assert all(r.worker_peak_rss_mb > 0 for r in rows)
    # The fake AR and PaDIR families share a worker each, as the JAX ones do: every system of a family in one.
    by_family = {}
    for r in rows:
        by_family.setdefault(r.family, set()).add(r.system)
    assert all(r.worker_systems == len(by_family[r.family]) for r in rows)
    solo = [s for s in run.samples() if "solo_latency_ms" in s]
    assert len(solo) == 3 * len(rows)                     # the seeded sample: 3 sentences a system
    assert verify_run(run.path) == []
    assert set(run.env()["workers"]) == {r.system for r in rows}


def test_workers_get_the_drivers_compilation_cache_as_the_variables_jax_reads():
    """The test process turned JAX's persistent cache on (tests/conftest.py): a worker's environment names the same
    folder and thresholds, by the names JAX reads at import."""
    import jax

    env = workers._jax_cache_env()
    assert env == {"JAX_COMPILATION_CACHE_DIR": jax.config.jax_compilation_cache_dir,
                   "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
                   "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0.0"}
