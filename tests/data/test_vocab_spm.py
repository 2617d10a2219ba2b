"""SentencePiece vocabularies: id layout, exact round trip on corpus text, caching by hash."""
from __future__ import annotations

import pytest

from narbench_core.errors import UserError
from suites import bible, vocab


@pytest.fixture(scope="session")
def zh_subset(bible_prepared, tmp_path_factory):
    """Every 10th zh-en training pair (a small corpus so the vocabulary trains in seconds)."""
    lines = bible.split_path("zh", "train").read_text(encoding="utf-8").splitlines()[::10]
    path = tmp_path_factory.mktemp("spm") / "zh-subset.tsv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def zh_vocab_path(zh_subset):
    settings = vocab.VocabSettings.for_languages(["zh", "en"], 3000)
    return vocab.train_vocabulary("test_zh", [zh_subset], settings, fields=(1, 2), progress=False)


def _check_ids(v):
    sp = v.tokenizer
    assert (sp.pad_id(), sp.eos_id(), sp.unk_id(), sp.bos_id()) == (0, 1, 2, -1)
    assert sp.id_to_piece(3) == "<mask>" and v.eos_id == 1


def test_zh_round_trip_is_exact(zh_vocab_path):
    v = vocab.load_vocabulary(zh_vocab_path)
    _check_ids(v)
    assert v.vocab_size <= 3000
    pairs = bible.load_split("zh", "test")[:300]       # unseen text: rare characters use bytes
    for zh, en in pairs:
        assert v.decode(v.encode(zh)) == zh
        assert v.decode(v.encode(en)) == en
    assert v.decode(v.encode("龘")) == "龘"            # a character not in the corpus


def test_task_vocabulary_round_trip(bible_de_vocab):
    _check_ids(bible_de_vocab)
    assert bible_de_vocab.vocab_size == 8000
    for de, en in bible.load_split("de", "test")[:300]:
        for text in (de, en):
            ids = bible_de_vocab.encode(text)
            assert 2 not in ids                         # no unk on in-domain text
            assert bible_de_vocab.decode(ids) == text
    assert bible_de_vocab.tokenizer.encode("<mask>")[-1] == 3


def test_cached_by_data_and_settings(zh_subset, zh_vocab_path, tmp_path):
    settings = vocab.VocabSettings.for_languages(["zh", "en"], 3000)
    mtime = zh_vocab_path.stat().st_mtime_ns
    again = vocab.train_vocabulary("test_zh", [zh_subset], settings, fields=(1, 2), progress=False)
    assert again == zh_vocab_path and again.stat().st_mtime_ns == mtime     # reused, not retrained
    other = tmp_path / "other.tsv"
    other.write_text(zh_subset.read_text(encoding="utf-8") + "0:0:0\t新\tnew\n", encoding="utf-8")
    assert vocab.model_path("test_zh", [other], settings, (1, 2)) != zh_vocab_path
    bigger = vocab.VocabSettings.for_languages(["zh", "en"], 4000)
    assert vocab.model_path("test_zh", [zh_subset], bigger, (1, 2)) != zh_vocab_path


def test_a_vocabulary_another_process_builds_is_waited_for_not_built_again(zh_subset, zh_vocab_path, second_process,
                                                                          monkeypatch):
    """Two runs on a cold shared data root: the second waited for nothing, built the vocabulary again and then
    failed on a lock (issue 53); now it waits for the first's model and uses it."""
    import shutil
    import threading
    import time

    from narbench_core import defaults

    monkeypatch.setattr(defaults, "LEASE_POLL_S", 0.05)
    settings = vocab.VocabSettings.for_languages(["zh", "en"], 3000)
    path = vocab.model_path("test_wait", [zh_subset], settings, (1, 2))
    path.unlink(missing_ok=True)
    other = second_process("hold", path.parent)                     # the first run, building it
    got = []
    waiting = threading.Thread(target=lambda: got.append(
        vocab.train_vocabulary("test_wait", [zh_subset], settings, fields=(1, 2), progress=False)))
    waiting.start()
    time.sleep(0.5)
    assert waiting.is_alive() and not path.exists()                 # waits; builds nothing meanwhile
    shutil.copyfile(zh_vocab_path, path)                            # the first run's model appears
    mtime = path.stat().st_mtime_ns
    other.stop()
    waiting.join(60)
    assert got == [path] and path.stat().st_mtime_ns == mtime       # used as it was, not trained again
    path.unlink()


def test_too_small_for_chinese_is_a_user_error(zh_subset):
    settings = vocab.VocabSettings.for_languages(["zh", "en"], 500)
    with pytest.raises(UserError, match="vocabulary size 500 is below"):
        vocab.train_vocabulary("test_zh_small", [zh_subset], settings, fields=(1, 2), progress=False)


def test_sentencepiece_text_gives_seqio_vocabulary_ids_and_strings():
    """Decoders built from a checkpoint read their vocabulary without seqio (no TensorFlow in a timing
    worker); ids and strings must be the seqio vocabulary's."""
    from suites import tasks
    from suites.sentencepiece_text import SentencePieceText

    v = tasks.get_vocabulary("synthetic_d50")
    light = SentencePieceText(v.sentencepiece_model_file)
    assert light.vocab_size == v.vocab_size
    sources, refs = tasks.load_text("synthetic_d50", "test")
    for text in sources[:40] + refs[0][:40]:
        ids = list(v.encode(text))
        assert light.encode(text) == ids and light.decode(ids) == v.decode(ids) == text
        tail = ids + [1, 7, 8]                                   # text ends at the first EOS
        assert light.decode(tail) == v.decode(tail) == text
    past = [light.vocab_size + 3, 9, light.vocab_size]           # ids past the vocabulary read as unk
    assert light.decode(past) == v.decode(past)


def test_sentencepiece_text_refuses_a_foreign_model(tmp_path):
    import sentencepiece as spm

    from suites.sentencepiece_text import SentencePieceText

    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(f"word{i} other{i % 7} text" for i in range(200)))
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(tmp_path / "plain"), vocab_size=30,
                                   minloglevel=2)
    with pytest.raises(UserError, match="not a narbench vocabulary"):
        SentencePieceText(tmp_path / "plain.model")


def test_a_lazy_vocabulary_resolves_again_when_the_data_root_changes(zh_vocab_path, tmp_path, monkeypatch):
    """A vocabulary object resolved under one data root kept that root's path after ``NARBENCH_DATA`` changed
    (CI, stop 60): records then named the old root's file, absolute, instead of ``vocab/...`` under the new one."""
    import shutil

    from narbench_core.paths import data_root, portable

    def build():                                    # what train_vocabulary returns: the model under today's root
        target = data_root() / "vocab" / zh_vocab_path.name
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(zh_vocab_path, target)
        return target

    lazy = vocab.LazyVocabulary(build, "test_zh")
    first = lazy.model_path()
    monkeypatch.setenv("NARBENCH_DATA", str(tmp_path / "another" / "root"))
    second = lazy.model_path()
    assert second != first and second.startswith(str(tmp_path / "another" / "root"))
    assert portable(second) == f"vocab/{zh_vocab_path.name}"
    monkeypatch.undo()
    assert lazy.model_path() == first
