"""bench.measure.stats: percentiles vs numpy, order-statistics CIs (exact ranks, simulated coverage), paired speedup."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from scipy.stats import binom

from bench.measure import stats


def test_min_samples_follows_loadgen_rule():
    assert stats.min_samples(0.99) == 459  # LoadGen early stopping, zero overlatency queries
    assert stats.min_samples(0.90) == 44
    assert stats.min_samples(0.50) == 7
    for q in (0.5, 0.9, 0.99):
        n = stats.min_samples(q)
        assert q**n <= 0.01 < q**(n - 1)


@given(st.lists(st.floats(0.01, 1e4, allow_nan=False), min_size=1, max_size=300))
@settings(max_examples=60, deadline=None)
def test_summary_matches_numpy(values):
    s = stats.summarize(values)
    x = np.asarray(values)
    assert s.n == x.size
    np.testing.assert_allclose([s.p50, s.p90, s.p99], np.percentile(x, [50, 90, 99]))
    assert s.mean == pytest.approx(x.mean())
    assert (s.min, s.max) == (x.min(), x.max())
    assert s.min <= s.p50 <= s.p90 <= s.p99 <= s.max


def test_ci_none_when_too_few_samples():
    rng = np.random.default_rng(0)
    small = stats.summarize(rng.exponential(size=100))
    assert small.p50_ci is not None and small.p90_ci is not None
    assert small.p99_ci is None and not small.p99_reliable
    big = stats.summarize(rng.exponential(size=459))
    assert big.p99_ci is not None and big.p99_reliable
    assert stats.summarize([1.0, 2.0, 3.0]).p50_ci is None      # below 7 samples


def test_ranks_match_hand_computed_binomial():
    # n = 20, median, 95%: P(K <= 5) = 0.0207 <= 0.025 < P(K <= 6) = 0.0577 -> l = 6;
    # P(K <= 13) = 0.9423 < 0.975 <= P(K <= 14) = 0.9793 -> u = 15 (the textbook [x_(6), x_(15)]).
    assert stats.order_statistic_ranks(20, 0.5) == (6, 15)
    assert stats.coverage(20, 0.5, (6, 15)) == pytest.approx(binom.cdf(14, 20, 0.5) - binom.cdf(5, 20, 0.5))
    assert stats.coverage(20, 0.5, (6, 15)) >= 0.95
    x = np.arange(1, 21, dtype=float)[::-1]  # unsorted input
    assert stats.quantile_ci(x, 0.5) == (6.0, 15.0)


@given(n=st.integers(7, 3000), q=st.sampled_from([0.5, 0.9, 0.99]))
@settings(max_examples=80, deadline=None)
def test_ranks_are_tight_and_cover(n, q):
    ranks = stats.order_statistic_ranks(n, q)
    if ranks is None:
        assert q**n > 0.025 or (1 - q)**n > 0.025
        return
    low, high = ranks
    assert 1 <= low < high <= n
    assert stats.coverage(n, q, ranks) >= 0.95 - 1e-12
    # Tight: moving either end inwards drops that tail's guarantee below alpha/2.
    assert binom.cdf(low, n, q) > 0.025
    assert binom.cdf(high - 2, n, q) < 0.975


@pytest.mark.parametrize("q,n", [(0.5, 51), (0.9, 200), (0.99, 600)])
def test_ci_covers_true_quantile_at_nominal_rate(q, n):
    """Simulated lognormal latencies: the CI covers the true quantile in ~>=95% of seeded trials."""
    rng = np.random.default_rng(1234)
    true_q = math.exp(0.5 * _norm_ppf(q))  # lognormal(0, 0.5)
    trials, hits, ranks = 800, 0, stats.order_statistic_ranks(n, q)
    for _ in range(trials):
        ci = stats.quantile_ci(rng.lognormal(0.0, 0.5, size=n), q)
        hits += ci[0] <= true_q <= ci[1]
    expected = stats.coverage(n, q, ranks)
    rate = hits / trials
    # Binomial sampling error of the rate over 800 trials is ~0.008; allow 4 sigma.
    assert abs(rate - expected) < 4 * math.sqrt(expected * (1 - expected) / trials) + 1e-9
    assert rate >= 0.93


def _norm_ppf(q):
    from scipy.stats import norm

    return float(norm.ppf(q))


def test_paired_speedup_on_hand_data():
    base = [10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0]
    system = [5.0, 10.0, 10.0, 40.0, 100.0, 20.0, 35.0]
    # ratios: 2, 2, 3, 1, 0.5, 3, 2 -> sorted 0.5 1 2 2 2 3 3 -> median 2
    result = stats.paired_speedup(base, system)
    assert result.n == 7 and result.median == 2.0
    assert result.share_faster == pytest.approx(5 / 7)
    # n = 7, q = 0.5: ranks (1, 7) (P(K=0) = 1/128 <= 0.025; P(K<=6) = 127/128 >= 0.975)
    assert result.ci == (0.5, 3.0)
    np.testing.assert_allclose(stats.paired_ratios(base, system), [2, 2, 3, 1, 0.5, 3, 2])


def test_paired_speedup_is_paired_not_ratio_of_medians():
    base = np.array([1.0, 100.0] * 10)
    system = base / 3.0  # 3x faster on every sentence despite very different lengths
    result = stats.paired_speedup(base, system)
    assert result.median == pytest.approx(3.0) and result.ci == pytest.approx((3.0, 3.0))


def test_bad_samples_raise():
    with pytest.raises(ValueError):
        stats.summarize([])
    with pytest.raises(ValueError):
        stats.summarize([1.0, float("nan")])
    with pytest.raises(ValueError):
        stats.paired_speedup([1.0, 2.0], [1.0])
    with pytest.raises(ValueError):
        stats.paired_speedup([1.0, 0.0], [1.0, 1.0])
