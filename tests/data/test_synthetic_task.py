"""The synthetic translation generator: deterministic per seed; the dial sets the number of modes."""
from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st

from narbench_core.errors import UserError
from suites.synthetic import TASKS, SyntheticConfig, SyntheticTranslation

dials = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
seeds = st.integers(min_value=0, max_value=2**31 - 1)


@settings(max_examples=25, deadline=None)
@given(seed=seeds, dependency=dials, index=st.integers(0, 10_000))
def test_examples_are_deterministic_per_seed(seed, dependency, index):
    cfg = SyntheticConfig(dependency=dependency, seed=seed)
    a, b = SyntheticTranslation(cfg), SyntheticTranslation(dataclasses.replace(cfg))
    assert a.example("train", index) == b.example("train", index)
    assert list(a.examples("test", 5)) == list(b.examples("test", 5))


def test_seeds_and_splits_differ():
    a = list(SyntheticTranslation(SyntheticConfig(seed=0)).examples("train", 20))
    b = list(SyntheticTranslation(SyntheticConfig(seed=1)).examples("train", 20))
    test = list(SyntheticTranslation(SyntheticConfig(seed=0)).examples("test", 20))
    assert a != b and a != test


@settings(max_examples=30, deadline=None)
@given(seed=seeds, low=dials, high=dials, index=st.integers(0, 1000))
def test_the_dial_sets_the_number_of_valid_targets(seed, low, high, index):
    low, high = sorted((low, high))
    lo = SyntheticTranslation(SyntheticConfig(dependency=low, seed=seed, max_modes=4))
    hi = SyntheticTranslation(SyntheticConfig(dependency=high, seed=seed, max_modes=4))
    src, tgt = lo.example("dev", index)
    assert hi.example("dev", index)[0] == src                     # the dial never changes sources
    v_lo, v_hi = lo.valid_targets(src), hi.valid_targets(src)
    assert len(set(v_lo)) == len(v_lo) == lo.config.modes         # distinct, one per mode
    assert len(v_hi) == hi.config.modes >= lo.config.modes
    assert v_hi[: len(v_lo)] == v_lo                              # more modes add targets
    assert tgt in v_lo and hi.example("dev", index)[1] in v_hi


def test_dial_ends():
    assert SyntheticConfig(dependency=0.0, max_modes=5).modes == 1
    assert SyntheticConfig(dependency=1.0, max_modes=5).modes == 5
    assert SyntheticConfig.with_modes(3, max_modes=4).modes == 3
    assert [c.modes for c in TASKS.values()] == [1, 2, 3]


def test_at_zero_the_target_is_a_function_of_the_source():
    gen = SyntheticTranslation(SyntheticConfig(dependency=0.0))
    lexicon: dict[str, str] = {}
    for s, t in gen.examples("train", 500):
        assert gen.valid_targets(s) == [t]
        # word by word with adjacent words swapped: a source word always gives the same target word
        w = s.split()
        swapped = [w[i ^ 1] if (i ^ 1) < len(w) else w[i] for i in range(len(w))]
        for a, b in zip(swapped, t.split()):
            assert lexicon.setdefault(a, b) == b
    assert len(set(lexicon.values())) == len(lexicon)


def test_modes_are_equally_likely_and_mixing_them_is_invalid():
    gen = SyntheticTranslation(SyntheticConfig(dependency=1.0, min_len=6, max_len=6))
    counts = Counter()
    for s, t in gen.examples("train", 900):
        counts[gen.valid_targets(s).index(t)] += 1
    assert set(counts) == {0, 1, 2} and min(counts.values()) > 240
    s, _ = gen.example("test", 0)
    a, b = (v.split() for v in gen.valid_targets(s)[:2])
    mixed = " ".join(a[:3] + b[3:])            # positions predicted independently, modes mixed
    assert mixed not in gen.valid_targets(s)
    assert gen.any_valid_accuracy([s, s, s], [" ".join(a), " ".join(b), mixed]) == pytest.approx(2 / 3)


def test_any_size_and_length():
    gen = SyntheticTranslation(SyntheticConfig(min_len=30, max_len=40, train_size=7))
    pairs = list(gen.examples("train"))
    assert len(pairs) == 7
    assert all(30 <= len(s.split()) == len(t.split()) <= 40 for s, t in pairs)


def test_bad_configs_and_sources():
    with pytest.raises(UserError):
        SyntheticConfig(dependency=1.5)
    with pytest.raises(UserError):
        SyntheticConfig(min_len=5, max_len=2)
    with pytest.raises(ValueError):
        SyntheticTranslation(SyntheticConfig()).valid_targets("not a source")
