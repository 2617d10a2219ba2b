"""bench.runner.real_deps hands its options to the real trainer (models.train.train, patched here)."""
from __future__ import annotations

import pytest

from bench import runner


@pytest.mark.parametrize("options, wait", [({}, False), ({"wait_for_lease": True}, True)])
def test_the_real_trainer_waits_for_a_held_checkpoint_folder_only_when_asked(monkeypatch, options, wait):
    calls = []
    monkeypatch.setattr("models.train.train", lambda *args, **kwargs: calls.append(kwargs) or "ckpt")
    assert runner.real_deps(**options).train("task", "model", "training", progress=False) == "ckpt"
    assert [c["wait_for_lease"] for c in calls] == [wait]
