"""Every corpus as a task (cheaply, without seqio), and as a seqio Task on demand (``register_with_seqio``).

Names: ``bible_{de,ro,zh}_en``, ``bible_en_{de,ro,zh}``, ``wmt14_de_en``, ``wmt14_en_de``,
``wmt16_ro_en``, ``wmt16_en_ro``, ``wmt17_zh_en``, ``wmt17_en_zh``, ``synthetic_d0/d50/d100``; plus
the file-backed tasks a suite spec declares (``register_file_task``, the text in ``suites/files.py``).
Splits everywhere: ``train``, ``dev``, ``test``. Features ``inputs``/``targets`` (SentencePiece ids,
EOS appended) plus ``inputs_pretokenized``/``targets_pretokenized``; metrics BLEU and chrF.

Registration downloads nothing and trains nothing: data sources read their corpus on first use
(``bible.prepare`` runs then) and each vocabulary is trained when first needed (``LazyVocabulary``).
Importing seqio loads TensorFlow (~5-10 s a process), which only WMT's own splits need (their text streams from
TFDS through seqio); so the tasks live here as specs, their text, vocabularies and sizes are read without seqio,
and ``register_with_seqio()`` adds them (and every task registered after) to seqio's registry when asked.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from narbench_core import langs
from narbench_core.errors import UserError
from narbench_core.io import iter_lines
from suites import bible, files, synthetic, vocab, wmt
from suites.taskinfo import (DISTILLED_SUFFIX, SPLITS, TaskInfo, distilled_name, read_tsv,  # noqa: F401 (API)
                             source_task)

# Vocabulary sizes per family (the paper uses 32k; 8k is the CPU default for the Bible).
VOCAB_SIZES = {"bible": 8000, "wmt": 32000, "synthetic": 256}
SYNTHETIC_VOCAB_SENTENCES = 5_000


@dataclass(frozen=True)
class _Spec:
    """What a registered task is made of (internal)."""

    name: str
    family: str              # "bible" | "wmt" | "synthetic" | "files"
    source_lang: str
    target_lang: str
    pair: str = ""           # the foreign language of bible/wmt tasks
    synthetic: synthetic.SyntheticConfig | None = None
    files: files.FileTask | None = None   # a suite's own parallel text files
    distilled_train: str | None = None   # TSV of distilled training pairs
    base: str | None = None              # the task a distilled task derives from

    @property
    def to_english(self) -> bool:
        return self.target_lang == "en"

    @property
    def vocab_key(self) -> str:
        if self.family == "synthetic":
            return "synthetic-" + _vocab_config(self.synthetic).key()
        if self.family == "files":
            return f"files-{self.files.name}-{self.files.digest()}"
        return f"{self.family}-{self.pair}-en"


_SPECS: dict[str, _Spec] = {}
_VOCABS: dict[str, vocab.LazyVocabulary] = {}
_IN_SEQIO: dict[str, _Spec] = {}     # the specs seqio's registry holds, once register_with_seqio was called
_SEQIO_ON = False                    # register_with_seqio was called in this process


# ------------------------------------------------------------------------------------ vocabularies
def _vocab_config(cfg: synthetic.SyntheticConfig) -> synthetic.SyntheticConfig:
    """Every dial setting of one synthetic language shares the vocabulary of its most-modes setting."""
    return dataclasses.replace(cfg, dependency=1.0)


def _vocab_inputs(spec: _Spec) -> tuple[str, list[Path], vocab.VocabSettings, tuple[int, ...]]:
    """(name, files, settings, columns) of the vocabulary; prepares the training text if needed."""
    size = spec.files.vocab_size if spec.family == "files" else VOCAB_SIZES[spec.family]
    if spec.family == "bible":
        if not bible.split_path(spec.pair, "train").exists():
            bible.prepare(pairs=(spec.pair,))
        settings = vocab.VocabSettings.for_languages([spec.pair, "en"], size)
        return f"bible_{spec.pair}_en", [bible.split_path(spec.pair, "train")], settings, (1, 2)
    if spec.family == "wmt":
        settings = vocab.VocabSettings.for_languages([spec.pair, "en"], size)
        name = f"wmt{wmt.YEARS[spec.pair]}_{spec.pair}_en"
        return name, [wmt.write_train_sample(spec.pair)], settings, (0, 1)
    if spec.family == "files":
        settings = vocab.VocabSettings.for_languages([spec.source_lang, spec.target_lang], size)
        return spec.files.name, [_clean_train_tsv(spec.files)], settings, (0, 1)
    gen = synthetic.SyntheticTranslation(_vocab_config(spec.synthetic))
    path = gen.write_split("train", SYNTHETIC_VOCAB_SENTENCES)
    return spec.vocab_key, [path], vocab.VocabSettings(vocab_size=size), (0, 1)


def _clean_train_tsv(task: files.FileTask) -> Path:
    """The training pairs of a file task as one clean ``source<TAB>target`` file under the data root
    (the vocabulary's input, whatever the layout of the user's files), keyed by the files' hash."""
    from narbench_core import paths
    from narbench_core.io import write_text

    path = paths.subdir("files") / f"{task.name}-{task.digest()}.train.tsv"
    if not path.exists():
        sources, refs = files.load_split(task, "train")
        write_text(path, "".join(f"{s}\t{t}\n" for s, t in zip(sources, refs[0])))
    return path


def _peek_path(spec: _Spec) -> Path | None:
    """The cached model path if the training text already exists (never prepares or trains)."""
    if spec.family == "bible" and not bible.split_path(spec.pair, "train").exists():
        return None
    if spec.family == "wmt":
        return None  # would need a pass over the TFDS training data
    if spec.family == "synthetic":
        gen = synthetic.SyntheticTranslation(_vocab_config(spec.synthetic))
        if not gen.split_file("train", SYNTHETIC_VOCAB_SENTENCES).exists():
            return None
    if spec.family == "files":
        from narbench_core import paths

        if not (paths.subdir("files") / f"{spec.files.name}-{spec.files.digest()}.train.tsv").exists():
            return None
    return vocab.model_path(*_vocab_inputs(spec))


def _vocabulary(spec: _Spec) -> vocab.LazyVocabulary:
    key = spec.vocab_key
    if key not in _VOCABS:
        build = lambda: vocab.train_vocabulary(*_vocab_inputs(spec))  # noqa: E731
        _VOCABS[key] = vocab.LazyVocabulary(build, key, peek=lambda: _peek_path(spec))
    return _VOCABS[key]


# ------------------------------------------------------------------------------------------ text
def _synthetic_text(cfg: synthetic.SyntheticConfig, split: str) -> tuple[list[str], list[list[str]]]:
    gen = synthetic.SyntheticTranslation(cfg)
    sources, own = map(list, zip(*gen.examples(split))) if cfg.split_size(split) else ([], [])
    others: list[list[str]] = [[] for _ in range(cfg.modes - 1)]
    for s, t in zip(sources, own if cfg.modes > 1 else []):
        rest = [v for v in gen.valid_targets(s) if v != t]
        for k, v in enumerate(rest):
            others[k].append(v)
    return sources, [own] + others


# The texts of the tasks `_cacheable` keeps in memory, by (task, split). Registering a task forgets its own texts
# and its distilled task's, no other: a distillation registered mid-run once dropped every task's, and a synthetic
# training split (50,000 pairs drawn one by one) took 2.5 s to draw again (2-core AMD EPYC VM, 2026-12-03).
_TEXTS: dict[tuple[str, str], tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]] = {}


def _forget_texts(name: str) -> None:
    for key in [key for key in _TEXTS if key[0] in (name, distilled_name(name))]:
        del _TEXTS[key]


def _load_text_raw(name: str, split: str) -> tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]:
    spec = _spec(name)
    if split not in SPLITS:
        raise UserError(f"unknown split {split!r} for {name}; choose from {', '.join(SPLITS)}")
    if spec.distilled_train is not None:
        if split == "train":
            src, tgt = read_tsv(Path(spec.distilled_train))
            return tuple(src), (tuple(tgt),)
        src, refs = load_text(spec.base, split)
        return tuple(src), tuple(tuple(r) for r in refs)
    if spec.family == "synthetic":
        src, refs = _synthetic_text(spec.synthetic, split)
    elif spec.family == "files":
        src, refs = files.load_split(spec.files, split)
    elif spec.family == "bible":
        pairs = bible.load_split(spec.pair, split)
        foreign, english = [p[0] for p in pairs], [p[1] for p in pairs]
        src, own = (foreign, english) if spec.to_english else (english, foreign)
        extra = bible.extra_references(split, pair=spec.pair, target=spec.target_lang)
        refs = [own] + list(extra.values())
    else:
        pairs = list(wmt.iter_pairs(spec.pair, split))
        foreign, english = [p[0] for p in pairs], [p[1] for p in pairs]
        src, refs = (foreign, [english]) if spec.to_english else (english, [foreign])
    return tuple(src), tuple(tuple(r) for r in refs)


def load_text(name: str, split: str) -> tuple[list[str], list[list[str]]]:
    """``(sources, references)`` of one split, references in sacrebleu's layout:
    ``references[k][i]`` is the k-th reference of sentence i; ``references[0]`` is the task's own
    target, further streams are extra references (Bible: KJV/BBE or Schlachter; synthetic: the
    other valid targets)."""
    if not _cacheable(name, split):
        src, refs = _load_text_raw(name, split)
    else:
        if (name, split) not in _TEXTS:
            _TEXTS[name, split] = _load_text_raw(name, split)
        src, refs = _TEXTS[name, split]
    return list(src), [list(r) for r in refs]


def valid_targets(name: str, split: str) -> list[list[str]] | None:
    """Every correct output of each source of a split (``out[i]``: sentence i's), for tasks that know
    them all (the synthetic dial: one target per mode); None for tasks whose references are examples."""
    base = _spec(source_task(name))
    if base.family != "synthetic":
        return None
    _, refs = load_text(base.name, split)
    return [list(targets) for targets in zip(*refs)]


def _cacheable(name: str, split: str) -> bool:
    """Small texts are kept in memory; WMT texts (millions of pairs) are read each time."""
    spec = _spec(name)
    if spec.distilled_train is not None:
        return split == "train" or _cacheable(spec.base, split)
    return spec.family != "wmt"


def get_vocabulary(name: str) -> vocab.LazyVocabulary:
    """The task's joint SentencePiece vocabulary (trained on first use)."""
    return _vocabulary(_spec(name))


# ------------------------------------------------------------------------------------- metrics
def _metric_fns(target_lang: str) -> list[Callable]:
    import sacrebleu

    tokenize = langs.bleu_tokenizer(target_lang)

    def bleu(targets, predictions):
        return {"bleu": sacrebleu.corpus_bleu(list(predictions), [list(targets)], tokenize=tokenize).score}

    def chrf(targets, predictions):
        return {"chrf": sacrebleu.corpus_chrf(list(predictions), [list(targets)]).score}

    return [bleu, chrf]


# ------------------------------------------------------------------------------------ sources
def _lazy_source(dataset_fn, sizes: Callable[[], dict | None]):
    """A seqio FunctionDataSource whose split sizes are looked up when asked (None if unknown)."""
    import seqio

    class LazySource(seqio.FunctionDataSource):
        def num_input_examples(self, split: str) -> int | None:
            found = sizes()
            return None if found is None else found.get(split)

    return LazySource(dataset_fn=dataset_fn, splits=SPLITS)


def split_sizes(name: str) -> dict[str, int | None]:
    """Examples per split; None where the data is not prepared / not found (never downloads)."""
    spec = _spec(name)
    if spec.distilled_train is not None:
        return {**split_sizes(spec.base), "train": sum(1 for _ in iter_lines(spec.distilled_train))}
    if spec.family == "synthetic":
        return {s: spec.synthetic.split_size(s) for s in SPLITS}
    if spec.family == "files":
        return {s: files.count_lines(spec.files.files(s)) for s in SPLITS}
    if spec.family == "wmt":
        sizes = wmt.split_sizes(spec.pair)
        return {s: (sizes[s] if sizes else None) for s in SPLITS}
    out = {}
    for s in SPLITS:
        path = bible.split_path(spec.pair, s)
        out[s] = sum(1 for _ in iter_lines(path)) if path.exists() else None
    return out


def _dataset_fn(name: str):
    def dataset_fn(split, shuffle_files, seed=None):
        import tensorflow as tf

        spec = _spec(name)
        _vocabulary(spec).model_path()   # build the vocabulary here, eagerly, not inside tf.data
        own_data = not (spec.distilled_train and split == "train")
        if spec.family == "wmt" and own_data:
            return wmt.load_dataset(spec.pair, split, spec.to_english, shuffle_files, seed)
        if spec.family == "synthetic" and own_data:     # no extra references needed here
            pairs = list(synthetic.SyntheticTranslation(spec.synthetic).examples(split))
            sources, targets = [p[0] for p in pairs], [p[1] for p in pairs]
        else:
            sources, refs = load_text(name, split)
            targets = refs[0]
        return tf.data.Dataset.from_tensor_slices(
            {"inputs": tf.constant(sources, tf.string), "targets": tf.constant(targets, tf.string)})

    return dataset_fn


def tokens_follow_text(name: str, split: str) -> bool:
    """Whether the split's seqio dataset is its ``load_text`` pairs (the sources and first references, as
    ``_dataset_fn`` builds it), so that its token ids are the SentencePiece model's ids of that text plus EOS:
    every family's splits but WMT's own, which seqio streams from TFDS."""
    spec = _spec(name)
    return not (spec.family == "wmt" and not (spec.distilled_train and split == "train"))


def _register(spec: _Spec) -> None:
    _SPECS[spec.name] = spec
    if _SEQIO_ON:
        _register_in_seqio(spec)


def _register_in_seqio(spec: _Spec) -> None:
    import seqio

    if spec.name in seqio.TaskRegistry.names():
        seqio.TaskRegistry.remove(spec.name)
    voc = _vocabulary(spec).seqio_vocabulary()
    seqio.TaskRegistry.add(
        spec.name,
        source=_lazy_source(_dataset_fn(spec.name), lambda: split_sizes(spec.name)),
        output_features={"inputs": seqio.Feature(voc, add_eos=True),
                         "targets": seqio.Feature(voc, add_eos=True)},
        preprocessors=[seqio.preprocessors.tokenize, seqio.preprocessors.append_eos],
        metric_fns=_metric_fns(spec.target_lang),
    )
    _IN_SEQIO[spec.name] = spec


def register_with_seqio() -> None:
    """Add every task to seqio's registry, and each task registered later as it comes (imports seqio)."""
    global _SEQIO_ON
    _SEQIO_ON = True
    for spec in list(_SPECS.values()):
        if _IN_SEQIO.get(spec.name) is not spec:
            _register_in_seqio(spec)


def seqio_task(name: str):
    """The seqio Task of a registered task (imports seqio)."""
    import seqio

    _spec(name)                                     # an unknown name: the one-line error
    register_with_seqio()
    return seqio.get_mixture_or_task(name)


def _spec(name: str) -> _Spec:
    if name not in _SPECS:
        raise UserError(f"unknown task {name!r}; known tasks: {', '.join(known_tasks())}")
    return _SPECS[name]


def known_tasks() -> list[str]:
    """Every registered task name, in a stable order."""
    return list(_SPECS)


def task_info(name: str) -> TaskInfo:
    """Languages, family, split sizes and vocabulary of a task (never downloads or trains)."""
    spec = _spec(name)
    return TaskInfo(name=name, source_lang=spec.source_lang, target_lang=spec.target_lang,
                    family=spec.family, splits=split_sizes(name), vocabulary=_vocabulary(spec))


def register_distilled_task(base_task: str, train_tsv: Path) -> str:
    """Register ``<base_task>_distilled``: train split from ``train_tsv`` (``source<TAB>target``
    lines written by the distillation), other splits and vocabulary as ``base_task``."""
    base = _spec(base_task)
    train_tsv = Path(train_tsv)
    if not train_tsv.is_file():
        raise UserError(f"distilled training file {train_tsv} not found; run the distillation first")
    name = distilled_name(base_task)
    _register(dataclasses.replace(base, name=name, distilled_train=str(train_tsv), base=base_task))
    _forget_texts(name)
    return name


def register_file_task(task: files.FileTask) -> str:
    """Register a suite's own task (``[[tasks]]`` with ``files``) like the built-in ones; registering it again
    with other files or settings replaces it."""
    known = _SPECS.get(task.name)
    if known is not None and known.files is None:
        raise UserError(f"task name {task.name!r} is built in; give your data another name")
    if task.name.endswith(DISTILLED_SUFFIX):
        raise UserError(f"task name {task.name!r} ends in {DISTILLED_SUFFIX!r}, which marks distilled tasks; rename it")
    if known is None or known.files != task:
        _register(_Spec(task.name, "files", task.source_lang, task.target_lang, files=task))
        _forget_texts(task.name)
    return task.name


def distilled_train(name: str) -> Path | None:
    """The distillation's ``train.tsv`` behind a distilled task (None for every other task)."""
    spec = _spec(name)
    return Path(spec.distilled_train) if spec.distilled_train else None


def file_task(name: str) -> files.FileTask | None:
    """The files behind a registered task (None for built-in and distilled tasks)."""
    spec = _spec(name)
    return None if spec.distilled_train else spec.files


# ------------------------------------------------------------------------------------ statistics
def _sample(name: str, split: str, limit: int | None) -> tuple[list[str], list[str]]:
    """(sources, targets) of a split; with ``limit``, at most that many, evenly spaced where cheap."""
    spec = _spec(name)
    own_data = not (spec.distilled_train and split == "train")
    if spec.family == "synthetic" and own_data:
        pairs = list(synthetic.SyntheticTranslation(spec.synthetic).examples(split, limit and min(
            limit, spec.synthetic.split_size(split))))
        return [p[0] for p in pairs], [p[1] for p in pairs]
    if spec.family == "wmt" and own_data:           # streaming: the first `limit` pairs
        pairs = list(wmt.iter_pairs(spec.pair, split, limit=limit))
        fo, en = [p[0] for p in pairs], [p[1] for p in pairs]
        return (fo, en) if spec.to_english else (en, fo)
    sources, refs = load_text(name, split)
    step = max(1, len(sources) // limit) if limit else 1
    return sources[::step][:limit], refs[0][::step][:limit]


def summary(values: list[int]) -> dict:
    import numpy as np

    if not values:
        return {"mean": None, "p50": None, "p95": None, "max": None}
    a = np.asarray(values)
    return {"mean": float(a.mean()), "p50": float(np.percentile(a, 50)),
            "p95": float(np.percentile(a, 95)), "max": int(a.max())}


def task_stats(name: str, splits=SPLITS, limit: int | None = None,
               tokens: bool | None = None) -> dict[str, dict]:
    """Per split: ``size``, ``sampled`` and length summaries (mean/p50/p95/max) of sources and
    targets in words (``source_words``, ``target_words``) and, when ``tokens`` (default: only if
    the vocabulary is already trained), in SentencePiece tokens without EOS (``*_tokens``).
    Raises ``UserError`` where the data is missing (e.g. TFDS not built)."""
    spec = _spec(name)
    voc = _vocabulary(spec)
    if tokens is None:
        tokens = voc.is_built()
    sizes = split_sizes(name)
    out = {}
    for split in splits:
        src, tgt = _sample(name, split, limit)
        row = {"size": sizes[split] if sizes[split] is not None else len(src), "sampled": len(src),
               "source_words": summary([langs.text_length(t, spec.source_lang) for t in src]),
               "target_words": summary([langs.text_length(t, spec.target_lang) for t in tgt])}
        if tokens:
            sp = voc.tokenizer
            row["source_tokens"] = summary([len(x) for x in sp.encode(src)])
            row["target_tokens"] = summary([len(x) for x in sp.encode(tgt)])
        out[split] = row
    return out


def _register_all() -> None:
    for pair in bible.PAIRS:
        _register(_Spec(f"bible_{pair}_en", "bible", pair, "en", pair=pair))
        _register(_Spec(f"bible_en_{pair}", "bible", "en", pair, pair=pair))
    for pair, year in wmt.YEARS.items():
        _register(_Spec(f"wmt{year}_{pair}_en", "wmt", pair, "en", pair=pair))
        _register(_Spec(f"wmt{year}_en_{pair}", "wmt", "en", pair, pair=pair))
    for name, cfg in synthetic.TASKS.items():
        _register(_Spec(name, "synthetic", "src", "tgt", synthetic=cfg))


_register_all()
