"""Benchmark plumbing: fake decoders from tests/bench/fakes.py, and a terminal summary of latency percentiles.

Run with ``pytest tests/benchmarks --benchmark-enable --benchmark-only`` (the default ``addopts`` run each benchmark
body once, untimed, so its checks count in the test suite).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))  # for `import fakes`
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))  # for `import tiny_models`

from tiny_models import ONE_LAYER  # noqa: E402

_ROWS = pytest.StashKey[list]()


def pytest_configure(config):
    config.stash[_ROWS] = []


UNTIMED_PRESET = "tiny"   # the model of a benchmark that runs untimed (the test suite): the same checks, a fraction of the compile


@pytest.fixture(scope="session")
def bench_preset(request) -> str:
    """The preset a model benchmark builds: its subject (`small`) when timed (``--benchmark-enable``), else
    ``UNTIMED_PRESET``: the test suite runs each benchmark once for its checks, and compiling `small` was most
    of their time (2026-11-29: 68 s of the suite's cold run)."""
    return "small" if request.config.getoption("benchmark_enable", False) else UNTIMED_PRESET


@pytest.fixture(scope="session")
def bench_overrides(request) -> dict:
    """Model settings over ``bench_preset``'s: none when timed; untimed, one layer a side (``ONE_LAYER``: the same
    code paths, compiled sooner)."""
    return {} if request.config.getoption("benchmark_enable", False) else dict(ONE_LAYER)


@pytest.fixture
def latency_rows(request) -> list:
    """Benchmarks append ``(benchmark name, system, LatencySummary, extra dict)`` for the summary."""
    return request.config.stash[_ROWS]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    rows = config.stash.get(_ROWS, [])
    if not rows:
        return
    tr = terminalreporter
    tr.write_sep("-", "narbench latency (ms, per sentence, via bench.measure.timing)")
    tr.write_line(f"{'benchmark':<44} {'system':<18} {'n':>4} {'p50':>9} {'p90':>9} {'p99':>9} "
                  f"{'mean':>9} {'compile_s':>9} {'speedup':>8}")
    for bench_name, system, s, extra in rows:
        p99 = f"{s.p99:9.3f}" if s.p99_reliable else f"{s.p99:8.3f}*"
        speedup = extra.get("speedup_p50_vs_first")
        tr.write_line(f"{bench_name[:44]:<44} {system[:18]:<18} {s.n:>4} {s.p50:9.3f} {s.p90:9.3f} {p99} "
                      f"{s.mean:9.3f} {extra.get('compile_s', float('nan')):9.2f} "
                      f"{'' if speedup is None else f'{speedup:8.2f}'}")
    tr.write_line("* n too small for a trustworthy p99 (fewer than 459 samples, MLPerf LoadGen rule)")
