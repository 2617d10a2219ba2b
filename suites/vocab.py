"""Joint SentencePiece (unigram) vocabularies, trained on a task's training split, cached by hash.

Ids in every vocabulary: 0 = pad, 1 = EOS, 2 = unk, 3 = ``<mask>`` (a user-defined symbol); no BOS.
A model lives at ``vocab/<name>-<hash>.model`` where the hash covers the training files' contents and
the settings, so changing either trains a new one and an unchanged one is reused.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import re
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

from narbench_core.digest import file_digest, json_digest
from narbench_core import paths
from narbench_core.errors import UserError
from narbench_core.io import iter_lines, write_bytes
from narbench_core.tokens import EOS_ID, MASK_ID, MASK_PIECE, PAD_ID, UNK_ID


@dataclass(frozen=True)
class VocabSettings:
    vocab_size: int = 8000                # paper: 32k; CPU default 8k
    character_coverage: float = 1.0       # < 1.0 for Chinese (rare characters fall back to bytes)
    byte_fallback: bool = False
    max_sentences: int = 2_000_000        # SentencePiece samples at most this many lines
    seed: int = 0

    @classmethod
    def for_languages(cls, langs: Sequence[str], vocab_size: int, **kw) -> "VocabSettings":
        """Settings for a joint vocabulary over ``langs`` (high coverage + byte fallback for zh)."""
        if "zh" in langs:
            kw.setdefault("character_coverage", 0.9995)
            kw.setdefault("byte_fallback", True)
        return cls(vocab_size=vocab_size, **kw)


def vocab_key(files: Sequence[Path], settings: VocabSettings, fields: Sequence[int] | None) -> str:
    """Hash of (data file hashes, settings, selected columns)."""
    return json_digest({"files": [file_digest(Path(f)) for f in files],
                        "settings": dataclasses.asdict(settings),
                        "fields": list(fields) if fields is not None else None,
                        "format": 1}, 16)


def _sentences(files: Sequence[Path], fields: Sequence[int] | None) -> Iterator[str]:
    """Every line of every file; with ``fields``, those tab-separated columns, one sentence each."""
    for path in files:
        for line in iter_lines(path):
            cols = line.split("\t")
            for text in (cols if fields is None else [cols[i] for i in fields]):
                if text:
                    yield text


class _Ticker:
    """An elapsed-time progress bar for a step that reports no progress of its own."""

    def __init__(self, desc: str, enabled: bool):
        from tqdm import tqdm

        self._bar = tqdm(desc=desc, unit="s", disable=None if enabled else True, leave=False,
                         bar_format="{desc}: {elapsed}")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(0.5):
            self._bar.refresh()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._bar.close()


def model_path(name: str, files: Sequence[Path], settings: VocabSettings,
               fields: Sequence[int] | None = None) -> Path:
    """Where the model for these files and settings lives (whether trained yet or not)."""
    return paths.subdir("vocab") / f"{name}-{vocab_key(files, settings, fields)}.model"


@contextlib.contextmanager
def _as_user_error(settings: VocabSettings):
    """SentencePiece's fixable failures as one-line UserErrors."""
    try:
        yield
    except RuntimeError as err:
        found = re.search(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)", str(err))
        if found:
            raise UserError(
                f"vocabulary size {found[1]} is below the {found[2]} characters the corpus needs; "
                f"use a vocabulary size of at least {int(found[2]) + 100} or a lower "
                f"character_coverage") from None
        raise


def train_vocabulary(name: str, files: Sequence[Path], settings: VocabSettings,
                     fields: Sequence[int] | None = None, progress: bool = True) -> Path:
    """Train (or reuse) the SentencePiece model for ``files``; returns the ``.model`` path."""
    path = model_path(name, files, settings, fields)
    if path.exists():
        return path
    from narbench_core import lock

    # One builder at a time on a shared data root: a second process waits for the first's model, and uses it.
    with lock.hold(path.parent, f"building the vocabulary {path.name}", wait=True):
        if path.exists():
            return path
        return _train(name, path, files, settings, fields, progress)


def _train(name: str, path: Path, files: Sequence[Path], settings: VocabSettings, fields: Sequence[int] | None,
           progress: bool) -> Path:
    import sentencepiece as spm

    n_lines = sum(1 for _ in _sentences(files, fields))
    if progress:
        print(f"narbench: training SentencePiece vocabulary {path.name} ({settings.vocab_size} "
              f"pieces, {n_lines} sentences) ...", file=sys.stderr)
    spm.set_random_generator_seed(settings.seed)
    model = io.BytesIO()
    start = time.perf_counter()
    with _Ticker(f"sentencepiece {name}", progress), _as_user_error(settings):
        spm.SentencePieceTrainer.train(
            sentence_iterator=_sentences(files, fields), model_writer=model,
            model_type="unigram", vocab_size=settings.vocab_size, hard_vocab_limit=False,
            character_coverage=settings.character_coverage, byte_fallback=settings.byte_fallback,
            input_sentence_size=settings.max_sentences, shuffle_input_sentence=True,
            pad_id=PAD_ID, eos_id=EOS_ID, unk_id=UNK_ID, bos_id=-1,
            user_defined_symbols=[MASK_PIECE],
            normalization_rule_name="identity",   # keep the text as cleaned (e.g. full-width 。)
            num_threads=os.cpu_count() or 1, minloglevel=2,
        )
    write_bytes(path, model.getvalue())
    if progress:
        print(f"narbench: vocabulary trained in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return path


def load_vocabulary(model_file: str | Path):
    """A seqio vocabulary for a trained model (checks the narbench id layout). Imports seqio (TensorFlow)."""
    import seqio

    vocab = seqio.SentencePieceVocabulary(str(model_file))
    sp = vocab.tokenizer
    assert (sp.pad_id(), sp.eos_id(), sp.unk_id(), sp.bos_id()) == (PAD_ID, EOS_ID, UNK_ID, -1)
    assert sp.piece_to_id(MASK_PIECE) == MASK_ID, "expected <mask> at id 3"
    return vocab


class LazyVocabulary:
    """A SentencePiece vocabulary whose model is trained on first use, without seqio.

    ``build()`` returns the model path; it runs once, when a property or encode/decode first needs the model, so
    registering tasks stays cheap. Encoding and decoding are ``suites.sentencepiece_text.SentencePieceText``'s
    (seqio's contract, without importing seqio and TensorFlow: ~5-10 s a process); ``seqio_vocabulary()`` gives
    the seqio vocabulary a seqio Task's features need, trained by the same ``build``.
    """

    def __init__(self, build: Callable[[], Path], key: str,
                 peek: Callable[[], Path | None] | None = None):
        self._build = build
        self._peek = peek              # the model path if already trained (no training), else None
        self._key = key                # identifies the vocabulary before it is built
        self._path = ""                # the model file, once built
        self._root: str | None = None  # the data root the model file was resolved under
        self._text = None              # SentencePieceText of the model file
        self._seqio = None             # seqio's vocabulary of this one (seqio_vocabulary)
        self._built_lock = threading.Lock()

    def model_path(self) -> str:
        from narbench_core.paths import data_root
        from suites.sentencepiece_text import SentencePieceText

        with self._built_lock:
            # Built once per data root; again if the file went (the data root moved, or was cleaned meanwhile)
            # or the root changed (``NARBENCH_DATA`` set anew): the old root's path would leak into records.
            root = str(data_root(create=False))        # read at every encode/decode: no mkdir
            if not self._path or not os.path.isfile(self._path) or self._root != root:
                self._path, self._root, self._text = str(self._build()), root, None
            if self._text is None:                      # built, or unpickled (the processor is not pickled)
                self._text = SentencePieceText(self._path)    # checks the id layout
        return self._path

    def load_model(self) -> None:
        """Train the model if it is not yet (seqio's name for it)."""
        self.model_path()

    def is_built(self) -> bool:
        """Whether the model exists (in this process or in the cache); never trains."""
        if self._path:
            return True
        try:
            found = self._peek() if self._peek else None
        except Exception:  # data not prepared yet
            return False
        return bool(found and Path(found).exists())

    def _loaded(self):
        self.model_path()
        return self._text

    @property
    def sentencepiece_model_file(self) -> str:
        return self.model_path()

    @property
    def tokenizer(self):
        """The SentencePiece processor."""
        return self._loaded().tokenizer

    @property
    def vocab_size(self) -> int:
        return self._loaded().vocab_size

    eos_id, unk_id, pad_id = EOS_ID, UNK_ID, PAD_ID

    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` without EOS."""
        return self._loaded().encode(text)

    def decode(self, ids) -> str:
        """Text of ``ids`` up to the first EOS (ids past the vocabulary read as unk)."""
        return self._loaded().decode(ids)

    def seqio_vocabulary(self):
        """This vocabulary as a ``seqio.SentencePieceVocabulary`` (for a seqio Task's features): its model is this
        one's, trained on first use. Imports seqio."""
        if self._seqio is None:
            self._seqio = _seqio_lazy_class()(self)
        return self._seqio

    def __getstate__(self):
        state = dict(self.__dict__)
        for name in ("_built_lock", "_text", "_seqio"):
            state.pop(name, None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state, _built_lock=threading.Lock(), _text=None, _seqio=None)

    def __eq__(self, other):
        if isinstance(other, LazyVocabulary):
            return self._key == other._key
        return NotImplemented

    def __hash__(self):
        return hash(self._key)

    def __str__(self) -> str:
        return f"LazyVocabulary({self._key}: {self._path or 'not built yet'})"


_SEQIO_LAZY = None


def _seqio_lazy_class():
    """The seqio vocabulary class backed by a ``LazyVocabulary`` (made on first use: it imports seqio)."""
    global _SEQIO_LAZY
    if _SEQIO_LAZY is None:
        import seqio

        class SeqioLazyVocabulary(seqio.SentencePieceVocabulary):
            """seqio's SentencePiece vocabulary of a ``LazyVocabulary``'s model, trained when first needed."""

            def __init__(self, lazy: LazyVocabulary):
                self.lazy = lazy
                super().__init__(sentencepiece_model_file="")

            @property
            def sentencepiece_model_file(self) -> str:
                return self.lazy.model_path()

            def _model_context(self):
                path = self.lazy.model_path()
                if self._sentencepiece_model_file != path:          # a new data root: seqio's cache is stale
                    self._sentencepiece_model_file = path
                    self._model = None
                return super()._model_context()

            def __eq__(self, other):
                if isinstance(other, SeqioLazyVocabulary):
                    return self.lazy == other.lazy
                return isinstance(other, seqio.SentencePieceVocabulary) and (
                    other.sentencepiece_model_file == self.sentencepiece_model_file)

            def __hash__(self):
                return hash(self.lazy)

        _SEQIO_LAZY = SeqioLazyVocabulary
    return _SEQIO_LAZY
