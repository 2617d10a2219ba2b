"""The paper's corpora through TensorFlow Datasets: WMT14 de-en, WMT16 ro-en, WMT17 zh-en.

Data is never downloaded here (``download=False``): it must already be built in the TFDS data
directory (``$TFDS_DATA_DIR``, or ``~/tensorflow_datasets``, or ``data_dir=``). Where it is not, a
one-line ``UserError`` says how to provide it. Splits: ``train``; ``dev`` = TFDS ``validation``
(newstest2013 / newsdev2016 / newsdev2017); ``test`` = newstest2014 / newstest2016 / newstest2017.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

from narbench_core.digest import text_digest
from narbench_core import paths
from narbench_core.errors import UserError
from narbench_core.io import atomic_open

# pair (foreign language) -> TFDS name
DATASETS = {
    "de": "wmt14_translate/de-en",
    "ro": "wmt16_translate/ro-en",
    "zh": "wmt17_translate/zh-en",
}
YEARS = {"de": 14, "ro": 16, "zh": 17}
SPLITS = {"train": "train", "dev": "validation", "test": "test"}   # narbench -> TFDS


def data_dir(override: str | os.PathLike | None = None) -> str:
    """The TFDS data directory used: ``override``, else ``$TFDS_DATA_DIR``, else TFDS's default."""
    if override:
        return str(override)
    if os.environ.get("TFDS_DATA_DIR"):
        return os.environ["TFDS_DATA_DIR"]
    import tensorflow_datasets as tfds

    return str(tfds.core.constants.DATA_DIR)


def _builder(pair: str, data_dir_: str | None):
    import tensorflow_datasets as tfds

    if pair not in DATASETS:
        raise UserError(f"unknown WMT pair {pair!r}; choose from {', '.join(DATASETS)}")
    return tfds.builder(DATASETS[pair], data_dir=data_dir(data_dir_))


def is_available(pair: str, data_dir_: str | None = None) -> bool:
    """Whether the TFDS data for ``pair`` is built (nothing is downloaded). Where no version of it is built at all
    (no ``<data dir>/<name>/<version>/dataset_info.json``), says so without importing TensorFlow, which takes
    seconds (``narbench tasks`` asks this of every WMT pair)."""
    if pair in DATASETS and "://" not in (root := data_dir(data_dir_)):
        if not any((Path(root) / DATASETS[pair]).glob("*/dataset_info.json")):
            return False
    import tensorflow as tf

    builder = _builder(pair, data_dir_)
    return tf.io.gfile.exists(os.path.join(builder.data_dir, "dataset_info.json"))


def _require(pair: str, data_dir_: str | None):
    builder = _builder(pair, data_dir_)
    if not is_available(pair, data_dir_):
        name = DATASETS[pair]
        raise UserError(
            f"TFDS data for {name} not found in {data_dir(data_dir_)}; set TFDS_DATA_DIR to a folder "
            f"where it is built, or build it there (network, several GB) with `python -c \"import "
            f"tensorflow_datasets as t; t.builder('{name}').download_and_prepare()\"`")
    return builder


def _tfds_split(split: str) -> str:
    if split not in SPLITS:
        raise UserError(f"unknown split {split!r}; choose from {', '.join(SPLITS)}")
    return SPLITS[split]


def split_sizes(pair: str, data_dir_: str | None = None) -> dict[str, int] | None:
    """Examples per split, or None when the data is not built."""
    if not is_available(pair, data_dir_):
        return None
    info = _builder(pair, data_dir_).info
    return {ours: info.splits[theirs].num_examples for ours, theirs in SPLITS.items()}


def load_dataset(pair: str, split: str, to_english: bool, shuffle_files: bool = False,
                 seed: int | None = None, data_dir_: str | None = None):
    """A ``tf.data.Dataset`` of ``{"inputs", "targets"}`` strings for one direction."""
    import tensorflow as tf

    builder = _require(pair, data_dir_)
    read_config = None
    if seed is not None:
        import tensorflow_datasets as tfds

        read_config = tfds.ReadConfig(shuffle_seed=seed)
    ds = builder.as_dataset(split=_tfds_split(split), shuffle_files=shuffle_files,
                            read_config=read_config)
    src, tgt = (pair, "en") if to_english else ("en", pair)
    return ds.map(lambda ex: {"inputs": ex[src], "targets": ex[tgt]},
                  num_parallel_calls=tf.data.AUTOTUNE)


def iter_pairs(pair: str, split: str, limit: int | None = None,
               data_dir_: str | None = None) -> Iterator[tuple[str, str]]:
    """(foreign, english) strings of one split, in TFDS order, at most ``limit``."""
    ds = load_dataset(pair, split, to_english=True, data_dir_=data_dir_)
    if limit is not None:
        ds = ds.take(limit)
    for ex in ds.as_numpy_iterator():
        yield ex["inputs"].decode("utf-8"), ex["targets"].decode("utf-8")


def write_train_sample(pair: str, n: int = 1_000_000, data_dir_: str | None = None) -> Path:
    """The first ``n`` training pairs as ``foreign<TAB>english`` lines (vocabulary training input)."""
    builder = _require(pair, data_dir_)
    # keyed by where the data lives and what it holds, so rebuilt data gives a new sample
    ident = f"{builder.data_dir}|{builder.info.version}|{builder.info.splits['train'].num_examples}"
    digest = text_digest(ident, 10)
    path = paths.subdir("corpora") / "wmt" / DATASETS[pair].replace("/", "_") / f"train-{n}-{digest}.tsv"
    if path.exists():
        return path
    import tensorflow as tf

    # eager even when first needed inside a tf.data map (a lazily built vocabulary)
    with atomic_open(path, "w") as f, tf.init_scope():
        for fo, en in iter_pairs(pair, "train", limit=n, data_dir_=data_dir_):
            f.write(" ".join(fo.split()) + "\t" + " ".join(en.split()) + "\n")
    return path
