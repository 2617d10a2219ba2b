"""Pure statistics over latency samples (no I/O, no timing): summaries, percentile CIs, paired speedups.

Conventions
- Point percentiles use numpy's default (linear interpolation between order statistics), so every
  figure can be recomputed from ``samples.jsonl`` with ``np.percentile``.
- Percentile confidence intervals are distribution-free, from order statistics: the number of
  samples below the true q-quantile is Binomial(n, q), so ``[x_(l), x_(u)]`` (1-based ranks) covers
  it with probability ``F(u-1) - F(l-1)`` (F = binomial CDF). We take the largest ``l`` with
  ``F(l-1) <= alpha/2`` and the smallest ``u`` with ``F(u-1) >= 1 - alpha/2``: coverage >= 1 - alpha.
- Minimum sample count (:func:`min_samples`): MLPerf LoadGen's early-stopping rule of thumb: a
  q-percentile needs at least the ``n`` for which even zero samples above the estimate would bound
  it at 99% confidence, ``q**n <= 0.01`` -> p50: 7, p90: 44, p99: 459 samples. Below that (or below
  what the binomial interval itself needs) a CI is ``None`` and reports say "n too small".
- Paired speedup: per sentence ``baseline_ms / system_ms``; the point estimate is the median of the
  paired ratios and its CI the order-statistics CI of that median (the same binomial rule, q = 0.5),
  which assumes only that sentences are independent. No bootstrap is involved.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

DEFAULT_CONFIDENCE = 0.95
LOADGEN_CONFIDENCE = 0.99  # MLPerf LoadGen's early-stopping confidence level


def min_samples(q: float, confidence: float = LOADGEN_CONFIDENCE) -> int:
    """Smallest n with ``q**n <= 1 - confidence`` (LoadGen rule of thumb; q=0.99 -> 459)."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"quantile must be in (0, 1), got {q}")
    # Tiny epsilon guards against float noise making an exact power land just above the bound.
    return max(1, math.ceil(math.log(1.0 - confidence) / math.log(q) - 1e-9))


def _as_sample(values: Sequence[float] | np.ndarray) -> np.ndarray:
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"expected a 1-D sample, got shape {x.shape}")
    if x.size == 0:
        raise ValueError("empty sample")
    if not np.all(np.isfinite(x)):
        raise ValueError("sample contains NaN or inf")
    return x


def _binom_cdf(k, n: int, q: float):
    """The binomial CDF, SciPy's; imported here, not with the module (every narbench process imports this one,
    few compute a CI, and SciPy's statistics take a second to import)."""
    from scipy.stats import binom

    return binom.cdf(k, n, q)


def order_statistic_ranks(n: int, q: float, confidence: float = DEFAULT_CONFIDENCE) -> tuple[int, int] | None:
    """1-based ranks ``(l, u)`` of the order-statistics CI for the q-quantile, or None if n is too small."""
    alpha = 1.0 - confidence
    ks = np.arange(0, n + 1)
    cdf = _binom_cdf(ks, n, q)  # cdf[k] = P(K <= k), K = #samples below the true quantile
    # l: largest rank >= 1 with P(K <= l-1) <= alpha/2.
    lower_ok = np.nonzero(cdf[:n] <= alpha / 2)[0]  # candidates for l-1 in 0..n-1
    # u: smallest rank <= n with P(K <= u-1) >= 1 - alpha/2.
    upper_ok = np.nonzero(cdf[:n] >= 1 - alpha / 2)[0]
    if lower_ok.size == 0 or upper_ok.size == 0:
        return None
    return int(lower_ok[-1]) + 1, int(upper_ok[0]) + 1


def coverage(n: int, q: float, ranks: tuple[int, int]) -> float:
    """Exact coverage probability of ``[x_(l), x_(u)]`` for the q-quantile (continuous distributions)."""
    low, high = ranks
    return float(_binom_cdf(high - 1, n, q) - _binom_cdf(low - 1, n, q))


def quantile_ci(values: Sequence[float] | np.ndarray, q: float, confidence: float = DEFAULT_CONFIDENCE,
                enforce_min_samples: bool = True) -> tuple[float, float] | None:
    """Distribution-free CI of the q-quantile, or None when n is too small (see module docstring)."""
    x = np.sort(_as_sample(values))
    n = x.size
    if enforce_min_samples and n < min_samples(q):
        return None
    ranks = order_statistic_ranks(n, q, confidence)
    if ranks is None:
        return None
    return float(x[ranks[0] - 1]), float(x[ranks[1] - 1])


@dataclass(frozen=True)
class LatencySummary:
    """Summary of one latency sample (milliseconds). CIs are None when n is too small."""

    n: int
    p50: float
    p90: float
    p99: float
    mean: float
    min: float
    max: float
    p50_ci: tuple[float, float] | None
    p90_ci: tuple[float, float] | None
    p99_ci: tuple[float, float] | None
    confidence: float

    @property
    def p99_reliable(self) -> bool:
        """True when n meets the minimum count for a p99 (reports print "n too small" otherwise)."""
        return self.n >= min_samples(0.99)


def summarize(values: Sequence[float] | np.ndarray, confidence: float = DEFAULT_CONFIDENCE) -> LatencySummary:
    """n, p50, p90, p99, mean, min, max and order-statistics CIs of a latency sample."""
    x = _as_sample(values)
    p50, p90, p99 = (float(v) for v in np.percentile(x, [50, 90, 99]))
    return LatencySummary(
        n=int(x.size), p50=p50, p90=p90, p99=p99, mean=float(x.mean()),
        min=float(x.min()), max=float(x.max()),
        p50_ci=quantile_ci(x, 0.50, confidence), p90_ci=quantile_ci(x, 0.90, confidence),
        p99_ci=quantile_ci(x, 0.99, confidence), confidence=confidence,
    )


@dataclass(frozen=True)
class PairedSpeedup:
    """Per-sentence speedup of a system over a baseline (ratios > 1: the system is faster)."""

    n: int
    median: float                      # median of baseline_ms / system_ms over sentences
    ci: tuple[float, float] | None     # order-statistics CI of that median (None if n too small)
    share_faster: float                # fraction of sentences where the system was faster
    confidence: float


def paired_ratios(baseline_ms: Sequence[float] | np.ndarray, system_ms: Sequence[float] | np.ndarray) -> np.ndarray:
    """``baseline / system`` per sentence; both samples must be aligned sentence by sentence."""
    base, system = _as_sample(baseline_ms), _as_sample(system_ms)
    if base.shape != system.shape:
        raise ValueError(f"paired samples differ in length: {base.size} vs {system.size}")
    if np.any(base <= 0) or np.any(system <= 0):
        raise ValueError("latencies must be positive for a ratio")
    return base / system


def paired_speedup(baseline_ms: Sequence[float] | np.ndarray, system_ms: Sequence[float] | np.ndarray,
                   confidence: float = DEFAULT_CONFIDENCE) -> PairedSpeedup:
    """Median paired speedup with its order-statistics CI (see module docstring)."""
    ratios = paired_ratios(baseline_ms, system_ms)
    return PairedSpeedup(
        n=int(ratios.size), median=float(np.median(ratios)),
        ci=quantile_ci(ratios, 0.5, confidence),
        share_faster=float(np.mean(ratios > 1.0)), confidence=confidence,
    )
