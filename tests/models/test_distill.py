"""Distillation end to end on a registered task: a (briefly trained) tiny AR teacher trained through
the real data pipeline beam-decodes training sources into a cached, resumable TSV exposed as
``<task>_distilled``, on which PaDIR then trains."""
from __future__ import annotations

import shutil

import pytest

from narbench_core.errors import UserError
from models import checkpoint, distill
from models.config import preset
from models.train import TrainConfig, checkpoint_dir_for, train

TASK = "synthetic_d0"


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    from suites.tasks import get_vocabulary

    config = preset("tiny", kind="ar", vocab_size=get_vocabulary(TASK).vocab_size)
    cfg = TrainConfig(steps=3, batch_tokens=1024, warmup_steps=1, checkpoint_every=3)
    shutil.rmtree(checkpoint_dir_for(TASK, config, cfg), ignore_errors=True)   # hermetic re-runs
    out = train(TASK, config, cfg, progress=False)
    assert out == checkpoint_dir_for(TASK, config, cfg)           # hash-keyed default folder
    meta = checkpoint.read_meta(out)
    assert meta["complete"] and meta["vocab_path"] and meta["batching"]["examples"] > 1000
    return out


@pytest.mark.slow
def test_distill_caches_resumes_and_registers(teacher, monkeypatch):
    from suites import tasks

    n = 20
    shutil.rmtree(distill.distill_dir_for(teacher, TASK, beam_size=2, max_examples=n), ignore_errors=True)
    name = distill.distill_task(teacher, TASK, beam_size=2, batch_size=4, max_examples=n,
                                chunk_size=8, progress=False)
    assert name == f"{TASK}_distilled"
    folder = distill.distill_dir_for(teacher, TASK, beam_size=2, max_examples=n)
    lines = (folder / distill.TSV_NAME).read_text(encoding="utf-8").splitlines()
    sources, _ = tasks.load_text(TASK, "train")
    assert [line.split("\t")[0] for line in lines] == sources[:n]   # the split's order
    dist_sources, dist_refs = tasks.load_text(name, "train")
    assert dist_sources == sources[:n] and dist_refs[0] == [line.split("\t")[1] for line in lines]
    assert tasks.load_text(name, "test") == tasks.load_text(TASK, "test")

    # Cached: a second call decodes nothing.
    import models.decoders
    monkeypatch.setattr(models.decoders, "load_decoder", lambda *a, **k: pytest.fail("decoded again"))
    assert distill.distill_task(teacher, TASK, beam_size=2, batch_size=4, max_examples=n,
                                chunk_size=8, progress=False) == name
    monkeypatch.undo()

    # Resumable: with one finished chunk on disk only the missing ones are decoded.
    (folder / distill.TSV_NAME).unlink()
    decoded = []
    real = models.decoders.load_decoder

    def counting(*args, **kwargs):
        dec = real(*args, **kwargs)
        prepare = dec.prepare
        dec.prepare = lambda batch: decoded.extend(batch) or prepare(batch)
        return dec
    monkeypatch.setattr(models.decoders, "load_decoder", counting)
    part = folder / "part-00000.tsv"
    part.write_text("".join(f"{i}\tx\tcached {i}\n" for i in sorted(
        sorted(range(n), key=lambda i: len(sources[i]))[:8])), encoding="utf-8")
    distill.distill_task(teacher, TASK, beam_size=2, batch_size=4, max_examples=n, chunk_size=8,
                         progress=False)
    assert len(decoded) == n - 8
    assert sum(line.split("\t")[1].startswith("cached ") for line in
               (folder / distill.TSV_NAME).read_text(encoding="utf-8").splitlines()) == 8
    monkeypatch.undo()

    # PaDIR trains on the distilled task through the same pipeline.
    config = preset("tiny", kind="padir", vocab_size=tasks.get_vocabulary(TASK).vocab_size)
    cfg = TrainConfig(steps=2, batch_tokens=512, warmup_steps=1)
    shutil.rmtree(checkpoint_dir_for(name, config, cfg), ignore_errors=True)
    out = train(name, config, cfg, progress=False)
    meta = checkpoint.read_meta(out)
    assert meta["complete"] and meta["task"] == name and meta["batching"]["examples"] == n


def test_teacher_must_be_a_finished_ar_checkpoint(tmp_path):
    with pytest.raises(UserError, match="no teacher checkpoint"):
        distill.distill_dir_for(tmp_path, TASK)
    checkpoint.write_meta(tmp_path, {"kind": "padir", "complete": True})
    with pytest.raises(UserError, match="needs an AR checkpoint"):
        distill.distill_dir_for(tmp_path, TASK)
    checkpoint.write_meta(tmp_path, {"kind": "ar", "complete": False})
    with pytest.raises(UserError, match="not finished"):
        distill.distill_dir_for(tmp_path, TASK)


# -- the CLI on the same teacher -------------------------------------------------------------------
def _run_cli(argv, stdin_text=""):
    import io
    import sys

    from bench.cli import main

    out, err = io.StringIO(), io.StringIO()
    old = sys.stdin, sys.stdout, sys.stderr
    sys.stdin, sys.stdout, sys.stderr = io.StringIO(stdin_text), out, err
    try:
        code = main(argv)
    finally:
        sys.stdin, sys.stdout, sys.stderr = old
    return code, out.getvalue(), err.getvalue()


@pytest.mark.slow
def test_translate_cli(teacher, tmp_path):
    from suites import tasks

    sources = tasks.load_text(TASK, "test")[0][:5] + [""]
    code, out, err = _run_cli(["translate", "--checkpoint", str(teacher), "--decoder", "greedy",
                               "--batch-size", "4"], "\n".join(sources) + "\n")
    assert code == 0, err
    assert len(out.splitlines()) == len(sources)                  # same count and order, empty line too
    src = tmp_path / "src.txt"
    src.write_text("\n".join(sources[:3]) + "\n", encoding="utf-8")
    code, out2, _ = _run_cli(["translate", "--checkpoint", str(teacher), "--decoder", "beam:1",
                              "--source-file", str(src)])
    assert code == 0 and out2.splitlines() == out.splitlines()[:3]   # beam 1 == greedy


@pytest.mark.parametrize("argv, message", [
    (["--checkpoint", "/nonexistent/ckpt", "--decoder", "greedy"], "no checkpoint"),
    (["--checkpoint", "TEACHER", "--decoder", "refine:0"], "must be >= 1"),
    (["--checkpoint", "TEACHER", "--decoder", "refine:4"], "needs a PaDIR checkpoint"),
    (["--checkpoint", "TEACHER", "--decoder", "greedy", "--source-file", "/nonexistent.txt"], "not found"),
    (["--checkpoint", "TEACHER", "--decoder", "greedy", "--remask", "stutter"], "['remask'] do not apply to an AR checkpoint"),
    (["--checkpoint", "TEACHER", "--decoder", "beam:2", "--length-hyps", "3"], "['length_hyps'] do not apply"),
])
def test_translate_cli_errors(teacher, argv, message):
    argv = [str(teacher) if a == "TEACHER" else a for a in argv]
    code, out, err = _run_cli(["translate", *argv], "a b c\n")
    assert code == 2 and out == ""
    assert err.startswith("narbench: error:") and message in err and len(err.strip().splitlines()) == 1
