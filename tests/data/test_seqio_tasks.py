"""Tasks: registration is cheap and needs no seqio; as seqio Tasks, datasets are tokenized with EOS;
text/metrics/distillation."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import seqio

from narbench_core.errors import UserError
from suites import tasks

tasks.register_with_seqio()          # this module reads the tasks through seqio too

NAMES = ["bible_de_en", "bible_en_de", "bible_ro_en", "bible_en_ro", "bible_zh_en", "bible_en_zh",
         "wmt14_de_en", "wmt14_en_de", "wmt16_ro_en", "wmt16_en_ro", "wmt17_zh_en", "wmt17_en_zh",
         "synthetic_d0", "synthetic_d50", "synthetic_d100"]


def test_all_tasks_registered():
    known = tasks.known_tasks()
    # Other tests may have registered `<task>_distilled` tasks and suites' own file tasks in this
    # process: those come after the built-in ones.
    assert known[:len(NAMES)] == NAMES
    assert all(name.endswith(tasks.DISTILLED_SUFFIX) or tasks.task_info(name).family == "files"
               for name in known[len(NAMES):])
    assert set(NAMES) <= set(seqio.TaskRegistry.names())


def test_registration_downloads_and_trains_nothing(tmp_path):
    """A fresh process on an empty data root: import, task_info and get Task objects only."""
    code = ("import json, seqio, suites.tasks as t\n"
            "infos = [t.task_info(n) for n in t.known_tasks()]\n"
            "t.register_with_seqio()\n"
            "[seqio.get_mixture_or_task(n).output_features for n in t.known_tasks()]\n"
            "print(json.dumps({i.name: i.splits['test'] for i in infos}))\n")
    env = dict(os.environ, NARBENCH_DATA=str(tmp_path / "root"), TFDS_DATA_DIR=str(tmp_path / "tfds"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300, check=True)
    splits = json.loads(out.stdout.strip().splitlines()[-1])
    assert splits["bible_de_en"] is None and splits["wmt14_de_en"] is None
    assert splits["synthetic_d0"] == 500
    files = [p for p in (tmp_path / "root").rglob("*") if p.is_file()]
    assert files == []


def _examples(name, split, n):
    task = seqio.get_mixture_or_task(name)
    ds = task.get_dataset(sequence_length=None, split=split, shuffle=False)
    return task, list(ds.take(n).as_numpy_iterator())


@pytest.mark.parametrize("name", ["synthetic_d50", "bible_de_en"])
def test_get_dataset_shapes_and_eos(name, bible_de_vocab):
    task, examples = _examples(name, "test", 4)
    vocab = task.output_features["targets"].vocabulary
    sources, refs = tasks.load_text(name, "test")
    assert len(examples) == 4
    for i, ex in enumerate(examples):
        assert {"inputs", "targets", "inputs_pretokenized", "targets_pretokenized"} <= set(ex)
        for key in ("inputs", "targets"):
            ids = ex[key]
            assert ids.ndim == 1 and ids.dtype == np.int32
            assert ids[-1] == 1 and (ids[:-1] > 1).all()           # EOS once, at the end; no pad
            assert vocab.decode(ids[:-1].tolist()) == ex[f"{key}_pretokenized"].decode()
        assert ex["inputs_pretokenized"].decode() == sources[i]
        assert ex["targets_pretokenized"].decode() == refs[0][i]


@pytest.mark.parametrize("name, split", [("synthetic_d50", "dev"), ("bible_de_en", "dev"), ("bible_en_zh", "test")])
def test_token_ids_from_text_are_the_ids_seqio_gives(name, split, bible_de_vocab, tmp_path, monkeypatch):
    """``load_task_tokens`` encodes a split's text with the SentencePiece model (seqio's pipeline took 13 s of a
    cold smoke run's 160 for synthetic_d0's training split): every example's ids equal seqio's, whole splits,
    Chinese too; WMT's own splits are the ones left to seqio."""
    from models.batching import _seqio_tokens, load_task_tokens

    monkeypatch.setattr("models.batching.token_cache_path", lambda task, split: tmp_path / f"{task}-{split}.npz")
    assert tasks.tokens_follow_text(name, split)
    ours = load_task_tokens(name, split)
    inputs, targets = _seqio_tokens(name, split)
    assert len(inputs) == len(ours) == tasks.task_info(name).splits[split] > 0
    assert [list(ours.input(i)) for i in range(len(ours))] == [list(x) for x in inputs]
    assert [list(ours.target(i)) for i in range(len(ours))] == [list(y) for y in targets]
    assert not tasks.tokens_follow_text("wmt14_de_en", "train") and not tasks.tokens_follow_text("wmt14_de_en", "test")


def test_bible_references(bible_prepared):
    src, refs = tasks.load_text("bible_de_en", "test")
    assert len(refs) == 3 and all(len(r) == len(src) for r in refs)    # WEB, KJV, BBE
    src_r, refs_r = tasks.load_text("bible_en_de", "test")
    assert src_r == refs[0] and len(refs_r) == 2                      # Elberfelder, Schlachter
    assert refs_r[0] == src
    _, refs_zh = tasks.load_text("bible_en_zh", "dev")
    assert len(refs_zh) == 1


def test_synthetic_references_are_all_valid_targets():
    src, refs = tasks.load_text("synthetic_d100", "test")
    assert len(refs) == 3 and len(src) == 500
    for i in range(20):
        assert len({r[i] for r in refs}) == 3


def test_task_info():
    info = tasks.task_info("synthetic_d0")
    assert (info.family, info.source_lang, info.target_lang) == ("synthetic", "src", "tgt")
    assert info.splits == {"train": 50_000, "dev": 500, "test": 500}
    as_seqio = seqio.get_mixture_or_task("synthetic_d0").output_features["targets"].vocabulary
    assert isinstance(as_seqio, seqio.SentencePieceVocabulary) and as_seqio is info.vocabulary.seqio_vocabulary()
    assert as_seqio.sentencepiece_model_file == info.vocabulary.sentencepiece_model_file
    assert info.vocab_path.exists() and info.vocabulary.vocab_size <= 256
    assert tasks.get_vocabulary("synthetic_d100") is info.vocabulary     # one vocabulary per language


def test_metrics_use_the_zh_tokenizer():
    ref = ["神爱世人，甚至把他的独生子赐给他们。"]
    hyp = ["神爱世人，甚至把他的独生子赐给我们。"]
    zh = {f.__name__: f for f in seqio.get_mixture_or_task("bible_en_zh").metric_fns}
    en = {f.__name__: f for f in seqio.get_mixture_or_task("bible_de_en").metric_fns}
    assert zh["bleu"](ref, ref)["bleu"] == pytest.approx(100)
    assert 0 < zh["bleu"](ref, hyp)["bleu"] < 100          # character-level: a partial match
    assert en["bleu"](ref, hyp)["bleu"] == 0               # 13a: one wrong "word"
    assert en["chrf"](["a b c"], ["a b c"])["chrf"] == pytest.approx(100)


def test_unknown_task_lists_known_ones():
    with pytest.raises(UserError) as excinfo:
        tasks.task_info("bible_fr_en")
    message = str(excinfo.value)
    assert "\n" not in message and "bible_de_en" in message and "synthetic_d100" in message
    with pytest.raises(UserError, match="unknown split"):
        tasks.load_text("synthetic_d0", "validation")


def test_no_tfds_data_is_a_one_line_error(tmp_path, monkeypatch):
    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path))
    assert tasks.task_info("wmt14_de_en").splits == {"train": None, "dev": None, "test": None}
    with pytest.raises(UserError) as excinfo:
        tasks.load_text("wmt16_en_ro", "test")
    message = str(excinfo.value)
    assert "\n" not in message and "wmt16_translate/ro-en" in message and "TFDS_DATA_DIR" in message
    with pytest.raises(UserError):
        seqio.get_mixture_or_task("wmt17_zh_en").get_dataset(split="test", shuffle=False)


@pytest.fixture
def forget_distilled():
    """Unregister the distilled tasks a test adds, so later tests see the standard list."""
    yield
    for name in [n for n in tasks.known_tasks() if n.endswith("_distilled")]:
        seqio.TaskRegistry.remove(name)
        tasks._SPECS.pop(name)
        tasks._IN_SEQIO.pop(name, None)


def test_distilled_task(tmp_path, forget_distilled):
    tsv = tmp_path / "distilled.tsv"
    tsv.write_text("vabe vazu\tteacher one\nbago sego\tteacher two\n", encoding="utf-8")
    name = tasks.register_distilled_task("synthetic_d50", tsv)
    assert name == "synthetic_d50_distilled" and name in seqio.TaskRegistry.names()
    assert tasks.distilled_train(name) == tsv and tasks.distilled_train("synthetic_d50") is None
    src, refs = tasks.load_text(name, "train")
    assert src == ["vabe vazu", "bago sego"] and refs == [["teacher one", "teacher two"]]
    assert tasks.load_text(name, "test") == tasks.load_text("synthetic_d50", "test")
    assert tasks.get_vocabulary(name) is tasks.get_vocabulary("synthetic_d50")
    info = tasks.task_info(name)
    assert info.splits["train"] == 2 and info.family == "synthetic"
    _, examples = _examples(name, "train", 5)
    assert [e["targets_pretokenized"].decode() for e in examples] == ["teacher one", "teacher two"]
    with pytest.raises(UserError, match="not found"):
        tasks.register_distilled_task("synthetic_d50", tmp_path / "missing.tsv")
    bad = tmp_path / "bad.tsv"
    bad.write_text("no tab here\n", encoding="utf-8")
    tasks.register_distilled_task("synthetic_d0", bad)
    with pytest.raises(UserError, match="bad.tsv:1"):
        tasks.load_text("synthetic_d0_distilled", "train")


def test_registering_a_distilled_task_forgets_its_own_texts_and_keeps_the_others(tmp_path, forget_distilled,
                                                                                 monkeypatch):
    """A distillation registered mid-run re-reads its own split, not every task's (a synthetic training split is
    50,000 pairs drawn one by one)."""
    monkeypatch.setattr(tasks, "_TEXTS", {})
    read = []
    raw = tasks._load_text_raw
    monkeypatch.setattr(tasks, "_load_text_raw", lambda name, split: read.append((name, split)) or raw(name, split))
    base = tasks.load_text("synthetic_d50", "dev")
    tsv = tmp_path / "distilled.tsv"
    for target in ("teacher one", "teacher two"):
        tsv.write_text(f"vabe vazu\t{target}\n", encoding="utf-8")
        name = tasks.register_distilled_task("synthetic_d50", tsv)
        assert tasks.load_text(name, "train") == (["vabe vazu"], [[target]])     # the new file, not the cached one
        assert tasks.load_text(name, "dev") == tasks.load_text("synthetic_d50", "dev") == base
    assert read == [("synthetic_d50", "dev"), (name, "train"), (name, "dev"), (name, "train"), (name, "dev")]


def test_tasks_text_and_vocabularies_need_no_seqio(tmp_path):
    """A fresh process reads a task's sizes and text and encodes with its vocabulary without importing seqio or
    TensorFlow (~5-10 s a process: every training, Ray job and CLI command paid it); seqio comes when asked."""
    code = ("import sys\n"
            "from suites import catalog, tasks\n"
            "info = catalog.task_info('synthetic_d0')\n"
            "sources, refs = catalog.load_text('synthetic_d0', 'test')\n"
            "voc = catalog.get_vocabulary('synthetic_d0')\n"
            "assert voc.decode(voc.encode(sources[0]) + [1]) == sources[0]\n"
            "before = sorted({'seqio', 'tensorflow'} & set(sys.modules))\n"
            "tasks.seqio_task('synthetic_d0')\n"
            "print(before, sorted({'seqio', 'tensorflow'} & set(sys.modules)))\n")
    env = dict(os.environ, NARBENCH_DATA=str(tmp_path / "root"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[] ['seqio', 'tensorflow']"
