"""Fixtures for bench/ tests. Fake decoders live in ``fakes.py`` (import them: ``from fakes import ...``)."""
from __future__ import annotations

import pytest

from fakes import FakeClock, JittedDecoder


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(scope="session")
def jitted_pair() -> list[JittedDecoder]:
    """An "ar"-like (8 passes) and a "nar"-like (2 passes) jitted decoder sharing shapes."""
    return [JittedDecoder("ar-fake", passes=8, family="ar"), JittedDecoder("nar-fake", passes=2, family="nar")]
