"""One process at a time trains into a checkpoint folder, and a training is registered as busy (for a run
timing on the same machine)."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from models import checkpoint
from models.batching import TokenPairs
from models.train import TrainConfig, train
from narbench_core import lock
from narbench_core.paths import subdir
from narbench_core.tokens import EOS_ID


@pytest.fixture(scope="module")
def copy_data(tiny_vocab, toy_sentences) -> TokenPairs:
    ids = [list(tiny_vocab.encode(s))[:15] + [EOS_ID] for s in toy_sentences]
    return TokenPairs.from_lists(ids, ids)


def config(steps: int) -> TrainConfig:
    return TrainConfig(steps=steps, batch_tokens=128, learning_rate=1e-2, warmup_steps=1, max_length=16,
                       buckets=(16,), checkpoint_every=1000)


def busy_entries() -> list[dict]:
    return [json.loads(p.read_text()) for p in subdir(lock.BUSY_DIR).glob("*.json")]


def test_a_checkpoint_folder_another_process_trains_is_refused(tmp_path, ar_config, copy_data, second_process):
    out = tmp_path / "ckpt"
    out.mkdir()
    other = second_process("hold", out)
    with pytest.raises(lock.Locked) as err:
        train("toy", ar_config, config(2), out, progress=False, data=copy_data)
    assert f"{out} is in use by narbench pid {other.pid} on " in str(err.value) and "\n" not in str(err.value)
    assert checkpoint.read_meta(out) is None                      # nothing trained into the other's folder


def test_training_holds_its_folder_and_is_registered_busy(tmp_path, ar_config, copy_data):
    out = tmp_path / "ckpt"
    seen = []
    train("toy", ar_config, config(1), out, progress=False, data=copy_data,
          on_step=lambda step, metrics: seen.append((lock.read_holder(out), busy_entries())))
    (holder, busy), = seen
    assert (holder.pid, holder.what) == (os.getpid(), "training ckpt")
    assert [e["what"] for e in busy if e["pid"] == os.getpid()] == ["training ckpt"]
    assert lock.read_holder(out) is None and all(e["pid"] != os.getpid() for e in busy_entries())
    assert checkpoint.read_meta(out)["complete"]


def test_a_driver_waiting_for_a_checkpoint_another_process_trains_reuses_it_once_finished(
        tmp_path, ar_config, copy_data, monkeypatch, capsys):
    out, finished = tmp_path / "ckpt", tmp_path / "finished"
    train("toy", ar_config, config(1), out, progress=False, data=copy_data)
    record = checkpoint.read_meta(out)
    out.rename(finished)                          # the other driver's training, finished at the first pause
    out.mkdir()
    other = lock.Holder("elsewhere.example", 1, "training ckpt", "2020-01-01T00:00:00+00:00")
    (out / lock.LOCK_FILE).write_text(other.dumps())            # ... which holds the folder now

    def other_finishes(seconds):
        shutil.rmtree(out)
        finished.rename(out)

    monkeypatch.setattr(lock, "_pause", other_finishes)
    capsys.readouterr()
    steps = []
    assert train("toy", ar_config, config(1), out, progress=False, data=copy_data, wait_for_lease=True,
                 on_step=lambda step, metrics: steps.append(step)) == out
    assert steps == [] and checkpoint.read_meta(out) == record   # reused, not trained again
    assert capsys.readouterr().err == f"narbench: waiting for {out}: in use by {other.describe()}\n"
    assert lock.read_holder(out) is None
