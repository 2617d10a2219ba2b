"""Fixtures for bench/ tests. Fake decoders live in ``fakes.py`` (import them: ``from fakes import ...``)."""
from __future__ import annotations

import contextlib
import io

import pytest

from fakes import FakeClock, JittedDecoder
from narbench_core import defaults


@pytest.fixture(scope="session", autouse=True)
def _few_ar_trials():
    """sacrebleu's approximate randomization with 200 trials, not 10,000, in every row the tests compute
    (its p-values equal sacrebleu's at any count: tests/bench/test_quality.py)."""
    trials = pytest.MonkeyPatch()
    trials.setattr(defaults, "AR_TRIALS", 200)
    yield
    trials.undo()


@pytest.fixture
def fixed_peaks(monkeypatch):
    """Made-up machine peaks (``bench.costs.machine_peaks``) instead of measuring this machine's; a module that times
    fake suites uses it for every test (``pytestmark = pytest.mark.usefixtures("fixed_peaks")``). ``bench.costs`` is
    imported here, not at a module's top: it loads JAX, which a timing worker that unpickles a test module's
    decoder does not need."""
    from bench.costs import MachinePeaks

    peaks = MachinePeaks("test", 1e11, 1e10, "2024-01-01T00:00:00+00:00", 8, 8)
    monkeypatch.setattr("bench.costs.machine_peaks", lambda: peaks)
    return peaks


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(scope="session")
def jitted_pair() -> list[JittedDecoder]:
    """An "ar"-like (8 passes) and a "nar"-like (2 passes) jitted decoder sharing shapes."""
    return [JittedDecoder("ar-fake", passes=8, family="ar"), JittedDecoder("nar-fake", passes=2, family="nar")]


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory):
    """`narbench run --suite smoke` once per session, on the session's data root: (exit code, stderr, the
    results root). The end-to-end test checks it; the Ray executor's test compares its own run with it."""
    from bench.cli import main

    out = tmp_path_factory.mktemp("smoke") / "results"
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["run", "--suite", "smoke", "--out", str(out), "--no-progress"])
    return code, err.getvalue(), out
