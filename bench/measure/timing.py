"""The one timing protocol for every decoder (the timer yields durations; statistics live in bench.measure.stats).

Protocol
1. ``warmup(decoders, batch_size)``: every shape bucket of ``decoder.warmup_inputs`` is run once
   (run + block + finish), so compilation never lands in a measured round; the seconds it took are
   returned per decoder and reported apart as ``compile_s``.
2. ``measure(decoders, sources, ...)``: the sources are cut into consecutive batches, and the batches
   into turns of ``turn`` batches; for each turn every system decodes all of its batches, back to back,
   before the next turn starts (A, B, C, then A, B, C on the next turn), so machine drift hits all
   systems alike and latencies are paired per sentence. With ``rotate=True`` the order shifts by one
   system per turn (A B C, B C A, C A B ...) to cancel order effects. A turn of more than one batch
   starts with one untimed call on its first batch: the system then decodes its timed batches with its
   own code, weights and thread pool warm in the caches, as it would alone, instead of finding them
   evicted by the systems that ran before it (with one batch a turn, every call starts cold).
3. Phases: ``end_to_end`` (the paper's measure) times prepare + run + ``jax.block_until_ready`` +
   finish; ``device`` times run + ``block_until_ready`` only (prepare and finish still run, untimed).
4. Phases (``narbench_core.phases``): inside each timed window a recorder splits the time into
   tokenize (``prepare``), encode and host_sync (marked by the decoder inside ``run``/``finish``),
   passes (up to the end of ``block_until_ready``) and detokenize (the rest of ``finish``); the
   phases partition the window, so they add up to its time. Blocking waits are counted.
5. A batch's wall time is every one of its sentences' latency (what each sentence waited).
   ``repeats > 1`` runs the whole interleaved schedule again; per-sentence latency is the median
   over repeats (raw times are kept).
6. Where a system runs: the schedule drives ``TimedSystem``s. ``InProcess`` times a decoder of this
   process; ``bench.measure.workers.Worker`` one in a worker process of its own (the suite runner's default),
   which times its own calls by ``time_call`` and sends the results back.
7. The solo check (``solo_batches``): the sampled batches are cut into chunks of ``turn`` batches, and
   the chunks' solo rounds are spread evenly through the schedule (after every few turns). In a solo
   round each system in turn (rotated per round) runs one untimed call, then its chunk back to back,
   with no other system in between; ``SystemTiming.solo_ms``. Spread out, the check sees the machine
   at the same moments as the schedule does: a solo phase at the end would compare a minute of the
   machine's speed against the whole run, and a shared 2-core VM drifts by 15-40% within minutes.
Clock: ``time.perf_counter_ns`` (injectable for tests); Python's cyclic GC is paused inside each timed
window and runs between windows. Nothing here computes percentiles.
"""
from __future__ import annotations

import contextlib
import gc
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol, Sequence

import numpy as np

from bench.measure.decoder import Decoder
from narbench_core import phases
from narbench_core.errors import UserError

PHASES = ("end_to_end", "device")
Clock = Callable[[], int]  # returns nanoseconds


def default_platform() -> str:
    """JAX's default backend (``cpu``, ``gpu``, ``tpu``), recorded in every row."""
    import jax

    return jax.default_backend()


def block_until_ready(outputs):
    """``jax.block_until_ready(outputs)`` where this process has loaded JAX. JAX is not imported here: a process
    that never loaded it holds no JAX array to wait for, and a timing worker whose decoders are not JAX's
    (CTranslate2, ONNX Runtime, the tests' fakes) starts without it (1.5-4 s of each worker's start on a 2-core
    AMD EPYC VM, 2026-12-03)."""
    jax = sys.modules.get("jax")
    return outputs if jax is None else jax.block_until_ready(outputs)


def resolve_platform(requested: str | None) -> str:
    """The platform to time on: ``requested`` (``--platform``) if this machine has it, else the default."""
    if not requested:
        return default_platform()
    import jax

    try:
        jax.devices(requested)
    except RuntimeError:
        raise UserError(f"platform {requested!r} is not available here (default backend: "
                        f"{default_platform()}); drop --platform or pass --platform {default_platform()}") from None
    return requested


def _device_scope(platform: str | None):
    """Where this process's JAX decoders run; none to place where JAX is not loaded once they are built."""
    if platform is None or "jax" not in sys.modules or platform == default_platform():
        return contextlib.nullcontext()
    import jax

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
    return warm_up([InProcess(d, clock) for d in decoders], batch_size, platform)


def warm_up(systems: Sequence["TimedSystem"], batch_size: int = 1, platform: str | None = None) -> dict[str, float]:
    """Warm up timed systems one after another (so each compile is timed alone); seconds per system."""
    _check_decoders(systems)
    with _device_scope(platform):
        return {s.name: s.warmup(batch_size) for s in systems}


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
    solo_ms: np.ndarray | None = None     # [n_sentences] float64: its batch's time when the system ran alone
                                          # (the solo check); NaN for sentences outside the sample


@dataclass(frozen=True)
class Measurement:
    """What one ``measure`` call produced: per-system timings plus the schedule that was run."""

    platform: str
    phase: str
    batch_size: int
    repeats: int
    rotate: bool
    turn: int
    systems: dict[str, SystemTiming]
    schedule: list[tuple[int, int, str]] = field(default_factory=list)  # (repeat, batch, system) in run order
    solo_batches: list[int] = field(default_factory=list)               # batches timed again alone

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
class Timed:
    """One timed call: its window, its outputs, its phases (which add up to it) and its blocking waits."""
    elapsed_ns: int
    hypotheses: list[str]
    passes: np.ndarray                # [batch] int
    phase_ms: dict[str, float]
    syncs: int


def time_call(decoder: Decoder, sources: list[str], phase: str, clock: Clock = time.perf_counter_ns) -> Timed:
    """One decoder call on ``sources`` timed by the protocol (``phase``: end_to_end or device)."""
    if phase == "end_to_end":
        with _gc_paused(), phases.recording(clock) as rec:
            prepared = decoder.prepare(sources)
            rec.mark(phases.TOKENIZE)
            outputs = decoder.run(prepared)
            block_until_ready(outputs)
            rec.mark(phases.PASSES)
            rec.sync()
            result = decoder.finish(outputs, prepared)
            rec.mark(phases.DETOKENIZE)
    else:  # device
        prepared = decoder.prepare(sources)
        with _gc_paused(), phases.recording(clock) as rec:
            outputs = decoder.run(prepared)
            block_until_ready(outputs)
            rec.mark(phases.PASSES)
            rec.sync()
        result = decoder.finish(outputs, prepared)
    return Timed(rec.last - rec.start, list(result.hypotheses), np.asarray(result.passes).reshape(-1),
                 dict(rec.ms), rec.syncs)


def warm_up_decoder(decoder: Decoder, batch_size: int, clock: Clock = time.perf_counter_ns) -> float:
    """Every warm-up shape bucket of ``decoder`` once (run + block + finish); returns the seconds taken."""
    start = clock()
    for prepared in decoder.warmup_inputs(batch_size):
        outputs = decoder.run(prepared)
        block_until_ready(outputs)
        decoder.finish(outputs, prepared)
    return (clock() - start) / 1e9


class TimedSystem(Protocol):
    """What the schedule drives: a named system that warms up and times one call. ``InProcess`` wraps a
    decoder in this process; ``bench.measure.workers.Worker`` runs one in a process of its own."""

    name: str

    def warmup(self, batch_size: int) -> float: ...

    def timed(self, sources: list[str], phase: str) -> Timed: ...


@dataclass
class InProcess:
    """A decoder timed in the calling process (tests, the latency map, ``[timing] isolate = false``)."""

    decoder: Decoder
    clock: Clock = time.perf_counter_ns

    @property
    def name(self) -> str:
        return self.decoder.name

    def warmup(self, batch_size: int) -> float:
        return warm_up_decoder(self.decoder, batch_size, self.clock)

    def timed(self, sources: list[str], phase: str) -> Timed:
        return time_call(self.decoder, sources, phase, self.clock)


def measure(decoders: Sequence[Decoder], sources: Sequence[str], batch_size: int = 1,
            phase: str = "end_to_end", repeats: int = 1, rotate: bool = True,
            clock: Clock = time.perf_counter_ns, platform: str | None = None,
            on_batch: Callable[[int, int], None] | None = None, turn: int = 1) -> Measurement:
    """Time decoders of this process interleaved on the same sentences (see module docstring)."""
    _check_decoders(decoders)
    return measure_systems([InProcess(d, clock) for d in decoders], sources, batch_size, phase, repeats, rotate,
                           platform, on_batch, turn=turn)


def solo_sample(n_sentences: int, batch_size: int, sentences: int, seed: int) -> list[int]:
    """The batches the solo check times again: a seeded sample holding about ``sentences`` sentences."""
    n_batches = len(batches(n_sentences, batch_size))
    k = min(n_batches, max(0, -(-sentences // batch_size)))
    rng = np.random.default_rng(seed)
    return sorted(int(b) for b in rng.choice(n_batches, size=k, replace=False)) if k else []


def measure_systems(systems: Sequence[TimedSystem], sources: Sequence[str], batch_size: int = 1,
                    phase: str = "end_to_end", repeats: int = 1, rotate: bool = True,
                    platform: str | None = None, on_batch: Callable[[int, int], None] | None = None,
                    solo_batches: Sequence[int] = (), turn: int = 1) -> Measurement:
    """The schedule (see module docstring) over timed systems, ``turn`` batches a turn, with the solo
    check's rounds on ``solo_batches`` spread through it (step 7). ``on_batch(done, total)`` is called
    after every turn's round of systems (outside the timed windows), with the sentences timed so far
    over all repeats, e.g. to move a progress bar."""
    _check_decoders(systems)
    if phase not in PHASES:
        raise UserError(f"unknown timing phase {phase!r}; choose one of {list(PHASES)}")
    if batch_size < 1:
        raise UserError(f"batch size must be >= 1, got {batch_size}; pass --batch-size 1 or more")
    if repeats < 1:
        raise UserError(f"repeats must be >= 1, got {repeats}")
    if turn < 1:
        raise UserError(f"a turn must hold >= 1 batch, got {turn}; set [timing] turn = 1 or more")
    sources = list(sources)
    if not sources:
        raise UserError("no sentences to time; the test set is empty")
    n, k = len(sources), len(systems)
    ranges = batches(n, batch_size)
    raw = np.zeros((k, repeats, n), dtype=np.float64)                # [system, repeat, sentence] ms
    hyps: list[list[str | None]] = [[None] * n for _ in range(k)]
    passes = np.zeros((k, n), dtype=np.int64)
    calls: list[list[list[tuple[dict[str, float], int] | None]]] = [
        [[None] * n for _ in range(repeats)] for _ in range(k)]           # [system][repeat][sentence]
    solo = np.full((k, n), np.nan)                                         # [system, sentence] ms
    schedule: list[tuple[int, int, str]] = []

    def call(s: int, idx: range) -> Timed:
        timed = systems[s].timed([sources[i] for i in idx], phase)
        if len(timed.hypotheses) != len(idx):
            raise ValueError(f"decoder {systems[s].name!r} returned {len(timed.hypotheses)} "
                             f"hypotheses for {len(idx)} sources")
        return timed

    def run_turn(s: int, batch_ids: Sequence[int], warm: bool) -> Iterator[tuple[int, range, Timed]]:
        """System ``s`` decodes ``batch_ids`` back to back, after one untimed call on the first if ``warm``."""
        if warm:
            call(s, ranges[batch_ids[0]])                                  # untimed: the caches are its own
        for b in batch_ids:
            yield b, ranges[b], call(s, ranges[b])

    with _device_scope(platform):
        turns = [range(t, min(t + turn, len(ranges))) for t in range(0, len(ranges), turn)]   # batch indices
        chunks = [list(solo_batches[c:c + turn]) for c in range(0, len(solo_batches), turn)]   # a solo round each
        total = repeats * len(turns)
        solo_after: dict[int, list[int]] = {}                              # turn (over repeats) -> solo rounds
        for r in range(len(chunks)):
            solo_after.setdefault(max(0, (r + 1) * total // len(chunks) - 1), []).append(r)

        for rep in range(repeats):
            for t, batch_ids in enumerate(turns):
                offset = (t + rep) % k if rotate else 0
                for j in range(k):
                    s = (j + offset) % k
                    for b, idx, timed in run_turn(s, batch_ids, warm=turn > 1):
                        schedule.append((rep, b, systems[s].name))
                        raw[s, rep, idx.start:idx.stop] = timed.elapsed_ns / 1e6
                        calls[s][rep][idx.start:idx.stop] = [(timed.phase_ms, timed.syncs)] * len(idx)
                        if rep == 0:
                            hyps[s][idx.start:idx.stop] = timed.hypotheses
                            passes[s, idx.start:idx.stop] = timed.passes
                for r in solo_after.get(rep * len(turns) + t, ()):
                    for j in range(k):
                        s = (j + r) % k if rotate else j
                        for _, idx, timed in run_turn(s, chunks[r], warm=True):
                            solo[s, idx.start:idx.stop] = timed.elapsed_ns / 1e6
                if on_batch is not None:
                    on_batch(rep * n + ranges[batch_ids[-1]].stop, repeats * n)
    out = {}
    for s, system in enumerate(systems):
        per_sentence = np.median(raw[s], axis=0)  # [n_sentences]
        middle = np.argsort(raw[s], axis=0, kind="stable")[(repeats - 1) // 2]   # [n_sentences] repeat index
        chosen = [calls[s][int(r)][j] for j, r in enumerate(middle)]
        out[system.name] = SystemTiming(
            name=system.name, latencies_ms=per_sentence, raw_ms=raw[s].copy(),
            hypotheses=[str(h) for h in hyps[s]], passes=passes[s].copy(),
            phase_ms=[dict(c[0]) for c in chosen], host_syncs=np.asarray([c[1] for c in chosen], np.int64),
            solo_ms=solo[s].copy() if len(solo_batches) else None)
    return Measurement(platform=platform or default_platform(), phase=phase, batch_size=batch_size,
                       repeats=repeats, rotate=rotate, turn=turn, systems=out, schedule=schedule,
                       solo_batches=list(solo_batches))
