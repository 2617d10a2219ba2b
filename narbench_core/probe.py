"""The one timing protocol for throughput probes (machine peaks and rates, training steps).

A probe is a callable ``run(n) -> seconds`` that does ``n`` iterations of one piece of work and returns
the wall-clock seconds they took (done, not merely dispatched). :func:`seconds_per_iteration` measures a
set of probes the way the timer measures latency:

1. each probe in turn: one untimed ``run(1)`` (compile, first touch), then its length is sized: ``n``
   starts at 1 and grows (at most :data:`GROWTH_STEPS` times) until one run takes at least
   ``sample_s / 4``; the length of the rounds is ``n * sample_s / seconds`` of the last run, at least 1;
2. ``rounds`` rounds, each running every probe once at its length, in the order given;
3. each probe's figure: its median round's seconds divided by its length.

Why sized loops and interleaved rounds rather than the best of a few single calls: docs/experiments.md.
"""
from __future__ import annotations

import statistics
from typing import Callable, Hashable, Mapping, TypeVar

K = TypeVar("K", bound=Hashable)

SAMPLE_S = 0.05      # seconds one timed run of a probe aims at
ROUNDS = 5           # interleaved rounds; a probe's figure is its median round
GROWTH_STEPS = 4     # at most this many longer runs while sizing


def loop_length(run: Callable[[int], float], sample_s: float) -> int:
    """Iterations that make one ``run`` take about ``sample_s`` (step 1 of the module docstring)."""
    run(1)                                                      # compile and first touch, untimed
    n, seconds = 1, run(1)
    for _ in range(GROWTH_STEPS):
        if seconds >= sample_s / 4:
            break
        n = max(2 * n, int(n * sample_s / max(seconds, 1e-6) / 2))
        seconds = run(n)
    return max(1, round(n * sample_s / max(seconds, 1e-9)))   # from the last (n, seconds) timed together


def seconds_per_iteration(runs: Mapping[K, Callable[[int], float]], sample_s: float = SAMPLE_S,
                          rounds: int = ROUNDS) -> dict[K, float]:
    """Median seconds per iteration of each probe, by the protocol of the module docstring."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    lengths = {name: loop_length(run, sample_s) for name, run in runs.items()}
    samples: dict[K, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            samples[name].append(run(lengths[name]) / lengths[name])
    return {name: statistics.median(s) for name, s in samples.items()}
