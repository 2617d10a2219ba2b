"""narbench_core.probe: the one timing protocol, on fake runs whose seconds the test sets (no clock)."""
from __future__ import annotations

import pytest

from narbench_core import probe


class Fake:
    """``run(n)``: records ``(name, n)`` in a shared log and returns ``seconds(n)``."""

    def __init__(self, name: str, log: list, seconds):
        self.name, self.log, self.seconds = name, log, seconds

    def __call__(self, n: int) -> float:
        self.log.append((self.name, n))
        return self.seconds(n)


def test_a_probe_is_warmed_then_grown_until_a_run_is_long_enough_then_sized_to_sample_s():
    log: list = []
    per_iteration = probe.seconds_per_iteration({"a": Fake("a", log, lambda n: 1e-3 * n)}, sample_s=0.05, rounds=3)
    # untimed warm-up, 1 (1 ms < sample_s / 4), grown to 25 (25 ms: long enough), then 50 = 25 x 50 / 25 ms
    assert [n for _, n in log] == [1, 1, 25, 50, 50, 50]
    assert per_iteration == {"a": pytest.approx(1e-3)}


def test_a_probe_slower_than_sample_s_runs_one_iteration():
    log: list = []
    assert probe.loop_length(Fake("a", log, lambda n: 2.0 * n), sample_s=0.05) == 1
    assert log == [("a", 1), ("a", 1)]


def test_growth_stops_after_its_steps_and_sizes_from_the_last_run():
    """A run whose time grows slowly with its length: the length comes from the last (n, seconds) timed."""
    log: list = []
    seconds = lambda n: 1e-4 * n ** 0.25  # noqa: E731
    length = probe.loop_length(Fake("a", log, seconds), sample_s=0.05)
    assert len(log) == 2 + probe.GROWTH_STEPS
    last = log[-1][1]
    assert length == round(last * 0.05 / seconds(last))


def test_every_probe_is_sized_before_the_rounds_which_interleave_in_the_given_order():
    log: list = []
    runs = {"a": Fake("a", log, lambda n: 0.02 * n), "b": Fake("b", log, lambda n: 0.1 * n)}
    probe.seconds_per_iteration(runs, sample_s=0.05, rounds=3)
    sizing, rounds = log[:4], log[4:]
    assert sizing == [("a", 1), ("a", 1), ("b", 1), ("b", 1)]
    assert rounds == [("a", 2), ("b", 1)] * 3          # a: 0.05 / 0.02 s -> 2 iterations; b: one


def test_each_figure_is_the_median_round_divided_by_the_length():
    log: list = []
    timed = iter([4.0, 4.0, 0.5, 0.9, 0.1, 0.3, 0.7])   # warm-up, sizing (length 8 / 4 = 2), five rounds
    per_iteration = probe.seconds_per_iteration({"a": Fake("a", log, lambda n: next(timed))}, sample_s=8.0, rounds=5)
    assert [n for _, n in log] == [1, 1, 2, 2, 2, 2, 2]
    assert per_iteration == {"a": pytest.approx(0.5 / 2)}  # the median round, 0.5 s, over its 2 iterations


def test_an_even_number_of_rounds_takes_the_mean_of_the_middle_two():
    timed = iter([1.0, 1.0, 4.0, 1.0, 3.0, 2.0])      # warm-up, sizing (length 1), then four rounds
    assert probe.seconds_per_iteration({"a": lambda n: next(timed)}, sample_s=0.05, rounds=4) == {"a": 2.5}


def test_rounds_must_be_at_least_one():
    with pytest.raises(ValueError, match="rounds"):
        probe.seconds_per_iteration({"a": lambda n: 1.0}, rounds=0)
