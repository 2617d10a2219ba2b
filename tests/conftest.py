"""Shared test set-up: a private data root per session and JAX's persistent compilation cache."""
from __future__ import annotations

import os

# Tests never touch the user's data root unless NARBENCH_TEST_DATA points at a shared one (CI caches
# the Bible wheel and vocabularies there between steps).
os.environ.setdefault("NARBENCH_DATA", os.environ.get("NARBENCH_TEST_DATA", "/tmp/narbench-test-data"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _compilation_cache():
    from narbench_core.paths import enable_compilation_cache

    return enable_compilation_cache()
