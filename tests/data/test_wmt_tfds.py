"""WMT through TFDS: read a locally built dataset (a few pairs written in TFDS's on-disk format under
the real name `wmt14_translate/de-en`), and fail with one line where none is built."""
from __future__ import annotations

import numpy as np
import pytest
import seqio

from narbench_core.errors import UserError
from suites import tasks, wmt

tasks.register_with_seqio()          # WMT's own splits stream from TFDS through seqio


def _build_tiny_wmt14(data_dir):
    import tensorflow_datasets as tfds

    class TinyWmt14(tfds.core.GeneratorBasedBuilder, skip_registration=True):
        name = "wmt14_translate"
        VERSION = tfds.core.Version("1.0.0")
        BUILDER_CONFIGS = [tfds.core.BuilderConfig(name="de-en")]

        def _info(self):
            return tfds.core.DatasetInfo(builder=self, supervised_keys=("de", "en"),
                                         features=tfds.features.Translation(languages=["de", "en"]))

        def _split_generators(self, dl_manager):
            return {s: self._generate_examples(s, n)
                    for s, n in (("train", 6), ("validation", 2), ("test", 3))}

        def _generate_examples(self, split, n):
            for i in range(n):
                yield f"{split}{i}", {"de": f"Das Haus {split} Nummer {i}.",
                                      "en": f"The house {split} number {i}."}

    TinyWmt14(data_dir=str(data_dir), config="de-en").download_and_prepare()


@pytest.fixture
def tiny_tfds(tmp_path, monkeypatch):
    """TFDS_DATA_DIR with a tiny wmt14 de-en; afterwards the wmt14 tasks get a fresh vocabulary."""
    _build_tiny_wmt14(tmp_path / "tfds")
    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "tfds"))
    monkeypatch.setenv("NARBENCH_DATA", str(tmp_path / "root"))
    yield tmp_path / "tfds"
    tasks._VOCABS.pop("wmt-de-en", None)
    for name in ("wmt14_de_en", "wmt14_en_de"):
        tasks._register(tasks._SPECS[name])


def test_reads_locally_built_tfds_data(tiny_tfds):
    assert wmt.is_available("de") and not wmt.is_available("ro")
    assert wmt.split_sizes("de") == {"train": 6, "dev": 2, "test": 3}
    assert tasks.task_info("wmt14_en_de").splits == {"train": 6, "dev": 2, "test": 3}
    src, refs = tasks.load_text("wmt14_en_de", "test")
    assert sorted(src) == [f"The house test number {i}." for i in range(3)]
    assert [s.replace("The house", "Das Haus").replace("number", "Nummer") for s in src] == refs[0]
    assert sorted(tasks.load_text("wmt14_de_en", "dev")[0]) == ["Das Haus validation Nummer 0.",
                                                                "Das Haus validation Nummer 1."]
    ds = seqio.get_mixture_or_task("wmt14_de_en").get_dataset(split="test", shuffle=False)
    examples = list(ds.as_numpy_iterator())
    assert len(examples) == 3
    vocab = tasks.get_vocabulary("wmt14_de_en")
    for ex in examples:
        assert ex["targets"][-1] == 1 and ex["inputs"].dtype == np.int32
        assert vocab.decode(ex["targets"][:-1].tolist()) == ex["targets_pretokenized"].decode()
        assert ex["targets_pretokenized"].decode().startswith("The house test")


def test_missing_pair_is_a_one_line_error(tiny_tfds):
    with pytest.raises(UserError) as excinfo:
        list(wmt.iter_pairs("zh", "test"))
    message = str(excinfo.value)
    assert "\n" not in message and "wmt17_translate/zh-en" in message and str(tiny_tfds) in message


def test_a_pair_with_no_version_built_is_missing_without_importing_tensorflow(tmp_path):
    """``narbench tasks`` asks of every WMT pair whether it is built: where no version of it is, the answer
    costs no TensorFlow import (seconds); where another version is built, TFDS itself decides."""
    import subprocess
    import sys

    old = tmp_path / "tfds" / "wmt14_translate" / "de-en" / "0.0.1"       # a version TFDS's builder is not at
    old.mkdir(parents=True)
    (old / "dataset_info.json").write_text("{}")
    probe = ("import sys; from suites import wmt; print(wmt.is_available(sys.argv[1], sys.argv[2]), "
             "'tensorflow' in sys.modules)")
    ask = lambda pair: subprocess.run([sys.executable, "-c", probe, pair, str(tmp_path / "tfds")], check=True,
                                      capture_output=True, text=True).stdout.split()
    assert ask("ro") == ["False", "False"]
    assert ask("de") == ["False", "True"]
