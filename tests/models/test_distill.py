"""Distillation: a seeded sample across the training split with a held-aside slice (pure), the cache
key, and end to end on a registered task: a (briefly trained) tiny AR teacher trained through the real
data pipeline decodes the sample into a cached, resumable TSV exposed as ``<task>_distilled`` with its
``distill.json`` record, on which PaDIR then trains."""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from narbench_core.digest import file_digest
from narbench_core.errors import UserError
from models import checkpoint, distill
from models.config import preset
from models.train import TrainConfig, checkpoint_dir_for, train
from tiny_models import ONE_LAYER

TASK = "synthetic_d0"


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    from suites.tasks import get_vocabulary

    config = preset("tiny", kind="ar", vocab_size=get_vocabulary(TASK).vocab_size, **ONE_LAYER)
    cfg = TrainConfig(steps=3, batch_tokens=1024, warmup_steps=1, checkpoint_every=3)
    shutil.rmtree(checkpoint_dir_for(TASK, config, cfg), ignore_errors=True)   # hermetic re-runs
    out = train(TASK, config, cfg, progress=False)
    assert out == checkpoint_dir_for(TASK, config, cfg)           # hash-keyed default folder
    meta = checkpoint.read_meta(out)
    assert meta["complete"] and meta["vocab_path"] and meta["batching"]["examples"] > 1000
    return out


def test_sample_is_seeded_spans_the_split_and_holds_a_slice_aside():
    n = 1000
    picked, held = distill.sample_indices(n, 50, 20, seed=0)
    assert len(picked) == 50 and len(held) == 20 and not set(picked) & set(held)
    assert list(picked) == sorted(picked) and list(held) == sorted(held)
    # Not a prefix: every quarter of the split (for the Bible: its books in canonical order) is drawn from.
    assert all(((picked >= q * n // 4) & (picked < (q + 1) * n // 4)).any() for q in range(4))
    again, held_again = distill.sample_indices(n, 50, 20, seed=0)
    assert np.array_equal(again, picked) and np.array_equal(held_again, held)
    other, other_held = distill.sample_indices(n, 50, 20, seed=1)
    assert not np.array_equal(other, picked) and not np.array_equal(other_held, held)
    # By default (and when asked for more than there is) all but the held-aside slice.
    everything, held = distill.sample_indices(n, None, 20, seed=0)
    assert len(everything) == n - 20 and sorted(set(everything) | set(held)) == list(range(n))
    assert np.array_equal(distill.sample_indices(n, 5000, 20, seed=0)[0], everything)
    with pytest.raises(UserError, match="not more than the 20 held aside"):
        distill.sample_indices(20, None, 20, seed=0)


def test_cache_key_covers_decoder_sample_and_seed(tmp_path):
    checkpoint.write_meta(tmp_path, {"kind": "ar", "complete": True, "task": TASK, "steps_done": 3})
    base = distill.distill_dir_for(tmp_path, TASK, "beam:5", 100, seed=0)
    assert base.name.startswith(f"{TASK}-")
    assert distill.distill_dir_for(tmp_path, TASK, "beam:05", 100, seed=0) == base       # canonical form
    changed = [distill.distill_dir_for(tmp_path, TASK, "greedy", 100, seed=0),
               distill.distill_dir_for(tmp_path, TASK, "beam:4", 100, seed=0),
               distill.distill_dir_for(tmp_path, TASK, "beam:5", 200, seed=0),
               distill.distill_dir_for(tmp_path, TASK, "beam:5", None, seed=0),
               distill.distill_dir_for(tmp_path, TASK, "beam:5", 100, seed=1),
               distill.distill_dir_for(tmp_path, TASK, "beam:5", 100, seed=0, heldout=10),
               distill.distill_dir_for(tmp_path, TASK, "beam:5", 100, seed=0, length_penalty=1.0),
               distill.distill_dir_for(tmp_path, "synthetic_d50", "beam:5", 100, seed=0)]
    assert len({base, *changed}) == 1 + len(changed)
    checkpoint.write_meta(tmp_path, {"kind": "ar", "complete": True, "task": TASK, "steps_done": 4})
    assert distill.distill_dir_for(tmp_path, TASK, "beam:5", 100, seed=0) != base       # another teacher
    for bad in ("refine:4", "sampling", "beam:0"):
        with pytest.raises(UserError, match="greedy\" or \"beam:K"):
            distill.distill_dir_for(tmp_path, TASK, bad)


def test_cache_key_names_a_ct2_teacher_and_keeps_the_jax_names(tmp_path):
    from narbench_core.digest import json_digest

    meta = {"kind": "ar", "complete": True, "task": TASK, "steps_done": 3}
    checkpoint.write_meta(tmp_path, meta)
    jax = distill.distill_dir_for(tmp_path, TASK, "beam:5", None, seed=0, engine="jax")
    # The key the caches were named by before the teacher had a choice of engine: unchanged for jax.
    teacher = {k: meta.get(k) for k in ("task", "model_config", "train_config", "vocab_hash", "data", "steps_done")}
    key = {"teacher": teacher, "task": TASK, "decoder": "beam:5", "length_penalty": 0.6, "max_examples": None,
           "heldout": 500, "seed": 0}
    assert jax.name == f"{TASK}-{json_digest(key, 12)}"
    assert distill.distill_dir_for(tmp_path, TASK, "beam:5", None, seed=0) == jax
    assert distill.distill_dir_for(tmp_path, TASK, "beam:5", None, seed=0, engine="ct2") != jax
    with pytest.raises(UserError, match="unknown distillation engine 'onnx'; use one of jax, ct2"):
        distill.distill_dir_for(tmp_path, TASK, "beam:5", engine="onnx")


class TickingClock:
    """Stands in for ``distill``'s ``time`` module: ``perf_counter`` advances one second per call, so
    the record's seconds are exact and never read the wall clock."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += 1.0
        return self.now


@pytest.mark.slow
def test_distill_samples_records_caches_resumes_and_registers(teacher, monkeypatch, capsys):
    from suites import tasks

    n, held_n = 20, 16
    settings = dict(decoder="beam:2", max_examples=n, seed=0, heldout=held_n)
    run = dict(settings, batch_size=4, chunk_size=8, progress=False)
    shutil.rmtree(distill.distill_dir_for(teacher, TASK, **settings), ignore_errors=True)
    monkeypatch.setattr(distill, "time", TickingClock())
    done = distill.distill(teacher, TASK, **run)
    assert done.task == f"{TASK}_distilled" and done.folder == distill.distill_dir_for(teacher, TASK, **settings)
    sources, refs = tasks.load_text(TASK, "train")
    picked, held = distill.sample_indices(len(sources), n, held_n, 0)
    lines = (done.folder / distill.TSV_NAME).read_text(encoding="utf-8").splitlines()
    assert [line.split("\t")[0] for line in lines] == [sources[i] for i in picked]   # the sample, in the split's order
    assert not {sources[i] for i in held} & {line.split("\t")[0] for line in lines}  # held aside: not distilled
    dist_sources, dist_refs = tasks.load_text(done.task, "train")
    assert dist_sources == [sources[i] for i in picked] and dist_refs[0] == [line.split("\t")[1] for line in lines]
    assert tasks.load_text(done.task, "test") == tasks.load_text(TASK, "test")
    # The whole dev split too, by the same teacher: the targets the distilled model's dev NLL is measured on; its
    # dev BLEU stays against the human references.
    dev_sources, dev_refs = tasks.load_text(TASK, "dev")
    dev_lines = (done.folder / distill.DEV_NAME).read_text(encoding="utf-8").splitlines()
    assert [line.split("\t")[0] for line in dev_lines] == dev_sources
    teacher_dev = distill.dev_targets(done.folder / distill.TSV_NAME, dev_sources)
    assert teacher_dev == [line.split("\t")[1] for line in dev_lines] and teacher_dev != dev_refs[0]
    from models import curves
    dev = curves.dev_set(done.task, 50)
    picked_dev = [dev_sources.index(x) for x in dev.sources]
    assert dev.references == tuple(dev_refs[0][i] for i in picked_dev)
    assert dev.targets == dev.nll_targets == tuple(teacher_dev[i] for i in picked_dev)
    assert curves.dev_set(TASK, 50).targets == dev.references          # the task itself: its references

    # The record: written with the TSV, every field plausible.
    record = json.loads((done.folder / distill.RECORD_NAME).read_text())
    assert record == done.record and set(distill.RECORD_FIELDS) <= set(record)
    assert record["examples"] == n and record["teacher_decoder"] == "beam:2" and record["heldout"] == held_n
    assert record["dev_examples"] == len(dev_sources) and record["dev_seconds"] == 1.0
    assert record["dev_tsv"]["sha256"] == file_digest(done.folder / distill.DEV_NAME)
    assert record["teacher_engine"] == "jax"
    assert 0.0 <= record["teacher_bleu"] <= 100.0 and record["bleu_tokenize"] == "13a"
    words = lambda texts: sum(len(t.split()) for t in texts)  # noqa: E731
    assert record["length_ratio"] == pytest.approx(words(dist_refs[0]) / words([refs[0][i] for i in picked]))
    # Fake seconds, one per clock read: each of the 3 chunks of 8 decodes between two reads (1 s each)
    # and reads once more to save its progress; with the start and the end the run took 1 + 9 + 1 reads.
    assert record["sentences_per_second"] == n / 3
    assert record["seconds"] == 10.0

    # Cached: a second call decodes nothing.
    import models.decoders
    monkeypatch.setattr(models.decoders, "load_decoder", lambda *a, **k: pytest.fail("decoded again"))
    assert distill.distill_task(teacher, TASK, **run) == done.task

    # The cache is what it says: the teacher's weights and train.tsv's size and digest are recorded; a record from
    # before the digests adopts them without decoding.
    tsv = done.folder / distill.TSV_NAME
    assert record["teacher_params_digest"] == checkpoint.params_digest(teacher)
    assert record["train_tsv"] == {"bytes": tsv.stat().st_size, "sha256": file_digest(tsv)}
    legacy = {k: v for k, v in record.items() if k not in ("teacher_params_digest", "train_tsv")}
    (done.folder / distill.RECORD_NAME).write_text(json.dumps(legacy))
    assert distill.distill(teacher, TASK, **run).record == record
    monkeypatch.undo()

    # A train.tsv cut off or replaced, or other teacher weights, is found (without decoding); a cut-off one is one
    # line on stderr and distilled again, whole.
    good = tsv.read_bytes()
    tsv.write_bytes(good.replace(b"\t", b"\tX", 1)[:-1])                      # same size, other content
    assert "not the one it recorded" in distill.cache_damage(done.folder, teacher)
    tsv.write_bytes(good)
    monkeypatch.setattr(checkpoint, "params_digest", lambda d: "other")
    assert "other weights" in distill.cache_damage(done.folder, teacher)
    monkeypatch.undo()
    assert distill.cache_damage(done.folder, teacher) is None
    # A dev.tsv cut off is decoded again (said on stderr); one missing or of other sources is refused in one line.
    dev_tsv = done.folder / distill.DEV_NAME
    good_dev = dev_tsv.read_bytes()
    dev_tsv.write_bytes(good_dev[:len(good_dev) // 2])
    with pytest.raises(UserError, match="other dev sources"):
        distill.dev_targets(tsv, dev_sources)
    capsys.readouterr()
    assert distill.distill(teacher, TASK, **run).record["dev_tsv"] == record["dev_tsv"]
    assert "has a dev.tsv that is not the one it recorded" in capsys.readouterr().err
    assert dev_tsv.read_bytes() == good_dev
    with pytest.raises(UserError, match="other dev sources"):
        distill.dev_targets(tsv, dev_sources[1:])
    dev_tsv.rename(dev_tsv.with_suffix(".aside"))
    with pytest.raises(UserError, match="no teacher outputs for the dev split"):
        distill.dev_targets(tsv, dev_sources)
    dev_tsv.with_suffix(".aside").rename(dev_tsv)
    tsv.write_bytes(good[:len(good) // 2])
    capsys.readouterr()
    again = distill.distill(teacher, TASK, **run)
    assert f"distillation {done.folder} has a train.tsv of" in capsys.readouterr().err
    assert tsv.read_bytes() == good and again.record["train_tsv"] == record["train_tsv"]

    # Resumable: with one finished chunk (and its time) on disk only the missing ones are decoded, then
    # the held-aside slice with the same teacher decoder; the record counts the earlier run's time.
    (done.folder / distill.TSV_NAME).unlink()
    (done.folder / distill.RECORD_NAME).unlink()
    decoded, specs = [], []
    real = models.decoders.load_decoder

    def counting(checkpoint_dir, spec, **kwargs):
        specs.append(spec)
        dec = real(checkpoint_dir, spec, **kwargs)
        prepare = dec.prepare
        dec.prepare = lambda batch: decoded.extend(batch) or prepare(batch)
        return dec
    monkeypatch.setattr(models.decoders, "load_decoder", counting)
    monkeypatch.setattr(distill, "time", TickingClock())
    first = picked[np.argsort([len(sources[i]) for i in picked], kind="stable")][:8]
    (done.folder / "part-00000.tsv").write_text("".join(f"{i}\tx\tcached {i}\n" for i in first), encoding="utf-8")
    (done.folder / distill.TIMING_NAME).write_text(json.dumps({"decoded": 8, "decode_seconds": 1000.0,
                                                               "seconds": 2000.0}))
    resumed = distill.distill(teacher, TASK, **run)
    assert specs == ["beam:2"]                     # one teacher decodes the chunks, the held-aside pairs and dev
    assert len(decoded) == n - 8 + held_n + len(dev_sources)
    assert set(decoded[n - 8:n - 8 + held_n]) == {sources[i] for i in held} and set(decoded[-len(dev_sources):]) == set(
        dev_sources)
    assert sum(line.split("\t")[1].startswith("cached ") for line in
               (done.folder / distill.TSV_NAME).read_text(encoding="utf-8").splitlines()) == 8
    # The earlier run's 1,000 s decoding 8 sentences, plus 1 s per chunk for the 2 missing chunks; its
    # 2,000 s in all plus this run's 7 (start, 3 reads per chunk, end).
    assert resumed.record["sentences_per_second"] == n / 1002.0 and resumed.record["seconds"] == 2007.0
    assert resumed.record["teacher_bleu"] == record["teacher_bleu"]
    assert not list(done.folder.glob("part-*")) and not (done.folder / distill.TIMING_NAME).exists()
    monkeypatch.undo()

    # The CTranslate2 engine as the teacher: its own cache, its decoder, the record names it.
    pytest.importorskip("ctranslate2", reason="the ct2 extra is part of the dev extras")
    from models import ct2

    ct2_settings = dict(settings, decoder="greedy", engine="ct2")
    shutil.rmtree(distill.distill_dir_for(teacher, TASK, **ct2_settings), ignore_errors=True)
    engines = []
    real_ct2 = ct2.load_decoder
    monkeypatch.setattr(ct2, "load_decoder", lambda *a, **k: engines.append("ct2") or real_ct2(*a, **k))
    by_ct2 = distill.distill(teacher, TASK, **dict(run, **ct2_settings))
    assert engines == ["ct2"] and by_ct2.folder != done.folder
    assert by_ct2.record["teacher_engine"] == "ct2" and by_ct2.record["examples"] == n
    assert by_ct2.record["sentences_per_second"] > 0 and 0.0 <= by_ct2.record["teacher_bleu"] <= 100.0
    ct2_lines = (by_ct2.folder / distill.TSV_NAME).read_text(encoding="utf-8").splitlines()
    assert [line.split("\t")[0] for line in ct2_lines] == [sources[i] for i in picked]
    assert by_ct2.record["teacher_parallel_batches"] == (os.cpu_count() or 1)
    monkeypatch.undo()
    # a batch per worker, three at a time, gives what one batch at a time gives
    chosen = [sources[i] for i in picked]
    one, three = (distill._decode(ct2.load_decoder(teacher, "greedy", threads=1, parallel_batches=p), chosen, 3)
                  for p in (1, 3))
    assert one == three == [line.split("\t")[1] for line in ct2_lines]

    # PaDIR trains on the distilled task through the same pipeline.
    config = preset("tiny", kind="padir", vocab_size=tasks.get_vocabulary(TASK).vocab_size, **ONE_LAYER)
    cfg = TrainConfig(steps=2, batch_tokens=512, warmup_steps=1)
    shutil.rmtree(checkpoint_dir_for(done.task, config, cfg), ignore_errors=True)
    out = train(done.task, config, cfg, progress=False)
    meta = checkpoint.read_meta(out)
    assert meta["complete"] and meta["task"] == done.task and meta["batching"]["examples"] == n


class _Workers:
    """A decoder whose ``run`` hands a batch to workers of its own (as CTranslate2's ``inter_threads``): it counts
    the batches run and not yet finished."""
    def __init__(self, parallel_batches=None):
        if parallel_batches:
            self.parallel_batches = parallel_batches
        self.in_flight = self.most = 0

    def prepare(self, sources):
        return list(sources)

    def run(self, prepared):
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        return [s.upper() for s in prepared]

    def finish(self, outputs, prepared):
        from narbench_core.outputs import DecodeOutput

        self.in_flight -= 1
        return DecodeOutput(outputs, np.ones(len(outputs), np.int64))


@pytest.mark.parametrize("parallel, most", [(None, 1), (1, 2), (2, 3)])
def test_decode_keeps_one_batch_more_in_flight_than_the_decoder_runs_at_a_time(parallel, most):
    sources = [f"s{i} " + "x" * (i % 5) for i in range(11)]
    decoder = _Workers(parallel)
    assert distill._decode(decoder, sources, batch_size=2) == [s.upper().strip() for s in sources]
    assert decoder.most == most and decoder.in_flight == 0


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


def test_a_distilled_record_registers_the_distillation_of_its_training_text():
    """`narbench continue` on a distilled model runs in a process that did not distill: the record's task
    (`<task>_distilled`) is registered from the distillation whose train.tsv is the text the record names
    (its `data` fingerprint), among others of the same task; none holding it is one line naming the fix."""
    from models.batching import task_identity
    from narbench_core.paths import subdir
    from suites import catalog, tasks

    name = catalog.distilled_name(TASK)
    before = catalog.distilled_train(name) if name in tasks.known_tasks() else None
    sources, refs = tasks.load_text(TASK, "train")
    folders, data = [], {}
    try:
        for tag in ("a", "b"):
            folder = subdir("distill") / f"{TASK}-registers-{tag}-{os.getpid()}"
            folder.mkdir()
            folders.append(folder)
            (folder / distill.TSV_NAME).write_text("".join(f"{s}\t{t} {tag}\n" for s, t in zip(sources[:20], refs[0])),
                                                   encoding="utf-8")
            (folder / distill.RECORD_NAME).write_text(json.dumps({"task": TASK}), encoding="utf-8")
            catalog.register_distilled_task(TASK, folder / distill.TSV_NAME)
            data[tag] = task_identity(name)["data"]
        assert data["a"] != data["b"]
        for tag, folder in (("a", folders[0]), ("b", folders[1]), ("a", folders[0])):
            distill.register_trained_task({"task": name, "data": data[tag]})
            assert catalog.distilled_train(name) == folder / distill.TSV_NAME
        with pytest.raises(UserError, match="no distillation under .* holds the training text .* run its suite's"):
            distill.register_trained_task({"task": name, "data": "0" * 16})
        distill.register_trained_task({"task": TASK, "data": "anything"})        # not distilled: nothing to do
        assert catalog.distilled_train(TASK) is None
    finally:
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
        if before is not None:
            catalog.register_distilled_task(TASK, before)
        else:                                               # as the test found it: not registered
            tasks._SPECS.pop(name, None)
            if tasks._IN_SEQIO.pop(name, None) is not None:
                import seqio
                seqio.TaskRegistry.remove(name)
