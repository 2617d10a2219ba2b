"""The one timing protocol for every decoder (the timer yields durations; statistics live in bench.stats).

Protocol
1. ``warmup(decoders, batch_size)``: every shape bucket of ``decoder.warmup_inputs`` is run once
   (run + block + finish), so compilation never lands in a measured round; the seconds it took are
   returned per decoder and reported apart as ``compile_s``.
2. ``measure(decoders, sources, ...)``: the sources are cut into consecutive batches; for each batch
   every system runs once before the next batch starts (A, B, C, then A, B, C on the next batch), so
   machine drift hits all systems alike and latencies are paired per sentence. With ``rotate=True``
   the order shifts by one system per batch (A B C, B C A, C A B ...) to cancel order effects.
3. Phases: ``end_to_end`` (the paper's measure) times prepare + run + ``jax.block_until_ready`` +
   finish; ``device`` times run + ``block_until_ready`` only (prepare and finish still run, untimed).
4. Phases (``narbench_core.phases``): inside each timed window a recorder splits the time into
   tokenize (``prepare``), encode and host_sync (marked by the decoder inside ``run``/``finish``),
   passes (up to the end of ``block_until_ready``) and detokenize (the rest of ``finish``); the
   phases partition the window, so they add up to its time. Blocking waits are counted.
5. A batch's wall time is every one of its sentences' latency (what each sentence waited).
   ``repeats > 1`` runs the whole interleaved schedule again; per-sentence latency is the median
   over repeats (raw times are kept).
Clock: ``time.perf_counter_ns`` (injectable for tests); Python's cyclic GC is paused inside each timed
window and runs between windows. Nothing here computes percentiles.
"""
from __future__ import annotations

import contextlib
import gc
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import jax
import numpy as np

from bench.decoder import DecodeOutput, Decoder
from narbench_core import phases
from narbench_core.errors import UserError

PHASES = ("end_to_end", "device")
Clock = Callable[[], int]  # returns nanoseconds


def default_platform() -> str:
    """JAX's default backend (``cpu``, ``gpu``, ``tpu``), recorded in every row."""
    return jax.default_backend()


def resolve_platform(requested: str | None) -> str:
    """The platform to time on: ``requested`` (``--platform``) if this machine has it, else the default."""
    if not requested:
        return default_platform()
    try:
        jax.devices(requested)
    except RuntimeError:
        raise UserError(f"platform {requested!r} is not available here (default backend: "
                        f"{default_platform()}); drop --platform or pass --platform {default_platform()}") from None
    return requested


def _device_scope(platform: str | None):
    if platform is None or platform == default_platform():
        return contextlib.nullcontext()
    return jax.default_device(jax.devices(platform)[0])


def _check_decoders(decoders: Sequence[Decoder]) -> None:
    if not decoders:
        raise UserError("no decoders to time; add at least one system to the suite")
    names = [d.name for d in decoders]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise UserError(f"duplicate system names {dupes}; give each decoder a unique name")


def warmup(decoders: Sequence[Decoder], batch_size: int = 1, clock: Clock = time.perf_counter_ns,
           platform: str | None = None) -> dict[str, float]:
    """Run every warm-up shape bucket once per decoder; returns compile (warm-up) seconds per decoder."""
    _check_decoders(decoders)
    seconds: dict[str, float] = {}
    with _device_scope(platform):
        for decoder in decoders:
            inputs = decoder.warmup_inputs(batch_size)
            start = clock()
            for prepared in inputs:
                outputs = decoder.run(prepared)
                jax.block_until_ready(outputs)
                decoder.finish(outputs, prepared)
            seconds[decoder.name] = (clock() - start) / 1e9
    return seconds


@dataclass(frozen=True)
class SystemTiming:
    """Per-sentence results of one system, aligned with the measured sources."""

    name: str
    latencies_ms: np.ndarray          # [n_sentences] float64: median over repeats of its batch's time
    raw_ms: np.ndarray                # [repeats, n_sentences] float64
    hypotheses: list[str]             # [n_sentences], from the first repeat
    passes: np.ndarray                # [n_sentences] int
    phase_ms: list[dict[str, float]] = field(default_factory=list)  # [n_sentences] phase -> ms, of the
                                      # repeat whose time is the median (the lower middle one if even)
    host_syncs: np.ndarray | None = None  # [n_sentences] int: blocking waits in that repeat's call


@dataclass(frozen=True)
class Measurement:
    """What one ``measure`` call produced: per-system timings plus the schedule that was run."""

    platform: str
    phase: str
    batch_size: int
    repeats: int
    rotate: bool
    systems: dict[str, SystemTiming]
    schedule: list[tuple[int, int, str]] = field(default_factory=list)  # (repeat, batch, system) in run order

    def latencies(self, name: str) -> np.ndarray:
        return self.systems[name].latencies_ms


def batches(n: int, batch_size: int) -> list[range]:
    """Consecutive index ranges of at most ``batch_size`` sentences."""
    return [range(i, min(i + batch_size, n)) for i in range(0, n, batch_size)]


@contextlib.contextmanager
def _gc_paused():
    """Python's cyclic GC is paused inside a timed window (it runs between windows instead)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@dataclass(frozen=True)
class _Timed:
    """One timed call: its window, its phases (which add up to it) and its blocking waits."""
    elapsed_ns: int
    result: DecodeOutput
    phase_ms: dict[str, float]
    syncs: int


def _time_one(decoder: Decoder, sources: list[str], phase: str, clock: Clock) -> _Timed:
    if phase == "end_to_end":
        with _gc_paused(), phases.recording(clock) as rec:
            prepared = decoder.prepare(sources)
            rec.mark(phases.TOKENIZE)
            outputs = decoder.run(prepared)
            jax.block_until_ready(outputs)
            rec.mark(phases.PASSES)
            rec.sync()
            result = decoder.finish(outputs, prepared)
            rec.mark(phases.DETOKENIZE)
    else:  # device
        prepared = decoder.prepare(sources)
        with _gc_paused(), phases.recording(clock) as rec:
            outputs = decoder.run(prepared)
            jax.block_until_ready(outputs)
            rec.mark(phases.PASSES)
            rec.sync()
        result = decoder.finish(outputs, prepared)
    return _Timed(rec.last - rec.start, result, dict(rec.ms), rec.syncs)


def measure(decoders: Sequence[Decoder], sources: Sequence[str], batch_size: int = 1,
            phase: str = "end_to_end", repeats: int = 1, rotate: bool = True,
            clock: Clock = time.perf_counter_ns, platform: str | None = None,
            on_batch: Callable[[int, int], None] | None = None) -> Measurement:
    """Time all systems interleaved on the same sentences (see module docstring). ``on_batch(done,
    total)`` is called after every batch's round of systems (outside the timed windows), with the
    sentences timed so far over all repeats, e.g. to move a progress bar."""
    _check_decoders(decoders)
    if phase not in PHASES:
        raise UserError(f"unknown timing phase {phase!r}; choose one of {list(PHASES)}")
    if batch_size < 1:
        raise UserError(f"batch size must be >= 1, got {batch_size}; pass --batch-size 1 or more")
    if repeats < 1:
        raise UserError(f"repeats must be >= 1, got {repeats}")
    sources = list(sources)
    if not sources:
        raise UserError("no sentences to time; the test set is empty")
    n, k = len(sources), len(decoders)
    raw = np.zeros((k, repeats, n), dtype=np.float64)                # [system, repeat, sentence] ms
    hyps: list[list[str | None]] = [[None] * n for _ in range(k)]
    passes = np.zeros((k, n), dtype=np.int64)
    calls: list[list[list[tuple[dict[str, float], int] | None]]] = [
        [[None] * n for _ in range(repeats)] for _ in range(k)]           # [system][repeat][sentence]
    schedule: list[tuple[int, int, str]] = []
    with _device_scope(platform):
        for rep in range(repeats):
            for b, idx in enumerate(batches(n, batch_size)):
                offset = (b + rep) % k if rotate else 0
                for j in range(k):
                    s = (j + offset) % k
                    decoder = decoders[s]
                    schedule.append((rep, b, decoder.name))
                    timed = _time_one(decoder, [sources[i] for i in idx], phase, clock)
                    result = timed.result
                    if len(result.hypotheses) != len(idx):
                        raise ValueError(f"decoder {decoder.name!r} returned {len(result.hypotheses)} "
                                         f"hypotheses for {len(idx)} sources")
                    raw[s, rep, idx.start:idx.stop] = timed.elapsed_ns / 1e6
                    calls[s][rep][idx.start:idx.stop] = [(timed.phase_ms, timed.syncs)] * len(idx)
                    if rep == 0:
                        hyps[s][idx.start:idx.stop] = list(result.hypotheses)
                        passes[s, idx.start:idx.stop] = np.asarray(result.passes).reshape(-1)
                if on_batch is not None:
                    on_batch(rep * n + idx.stop, repeats * n)
    systems = {}
    for s, decoder in enumerate(decoders):
        per_sentence = np.median(raw[s], axis=0)  # [n_sentences]
        middle = np.argsort(raw[s], axis=0, kind="stable")[(repeats - 1) // 2]   # [n_sentences] repeat index
        chosen = [calls[s][int(r)][j] for j, r in enumerate(middle)]
        systems[decoder.name] = SystemTiming(
            name=decoder.name, latencies_ms=per_sentence, raw_ms=raw[s].copy(),
            hypotheses=[str(h) for h in hyps[s]], passes=passes[s].copy(),
            phase_ms=[dict(c[0]) for c in chosen], host_syncs=np.asarray([c[1] for c in chosen], np.int64))
    return Measurement(platform=platform or default_platform(), phase=phase, batch_size=batch_size,
                       repeats=repeats, rotate=rotate, systems=systems, schedule=schedule)
