"""BLEURT from a real checkpoint directory named by the user (``--bleurt-checkpoint`` or ``$NARBENCH_BLEURT``).

Checkpoint layout (google-research/bleurt): a folder holding
- ``bleurt_config.json``: ``max_seq_length`` and either ``vocab_file`` + ``do_lower_case`` (WordPiece,
  BLEURT / BLEURT-base) or ``sp_model`` (SentencePiece prefix: ``<sp_model>.model``; BLEURT-20);
- a TF SavedModel (``saved_model.pb`` + ``variables/``) whose ``serving_default`` signature takes
  ``input_ids``, ``input_mask``, ``segment_ids`` (int64 ``[batch, max_seq_length]``) and returns
  ``predictions`` (``[batch]``).
Encoding as BERT sentence pairs: ``[CLS] reference [SEP] candidate [SEP]``; the pair is truncated
by popping the last token of the longer side until it fits ``max_seq_length - 3``; segment 0 covers
[CLS], reference and the first [SEP], segment 1 the candidate and the last [SEP]; zero padding.
Without a checkpoint the column is None and reports print :data:`NO_CHECKPOINT`; never a stand-in.
"""
from __future__ import annotations

import json
import os
import unicodedata
from pathlib import Path
from typing import Sequence

import numpy as np

from narbench_core.errors import UserError
from narbench_core.io import read_lines

ENV_VAR = "NARBENCH_BLEURT"
CONFIG_FILE = "bleurt_config.json"
NO_CHECKPOINT = "no BLEURT checkpoint"


def resolve_checkpoint(path: str | os.PathLike | None = None) -> Path | None:
    """The checkpoint folder from the flag, else ``$NARBENCH_BLEURT``, else None."""
    chosen = path or os.environ.get(ENV_VAR)
    return Path(chosen).expanduser() if chosen else None


# ------------------------------------------------------------------------------------ WordPiece

def _is_punctuation(ch: str) -> bool:
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def _is_cjk(cp: int) -> bool:
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF
            or 0x2A700 <= cp <= 0x2B73F or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF
            or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


class WordPieceTokenizer:
    """BERT tokenization: basic split (clean, CJK chars, lower-case + strip accents, punctuation),
    then greedy longest-match-first WordPiece with ``##`` continuations."""

    def __init__(self, vocab_file: Path, do_lower_case: bool, max_chars_per_word: int = 100):
        lines = read_lines(vocab_file)
        self.vocab = {tok.strip(): i for i, tok in enumerate(lines) if tok.strip()}
        for special in ("[CLS]", "[SEP]", "[UNK]"):
            if special not in self.vocab:
                raise UserError(f"BLEURT vocab {vocab_file} lacks {special}; point --bleurt-checkpoint at an "
                                "unmodified BLEURT checkpoint")
        self.do_lower_case = do_lower_case
        self.max_chars = max_chars_per_word

    def _basic(self, text: str) -> list[str]:
        cleaned = []
        for ch in text:
            cp = ord(ch)
            if cp == 0 or cp == 0xFFFD or (unicodedata.category(ch).startswith("C") and ch not in "\t\n\r"):
                continue
            cleaned.append(" " if ch.isspace() else (f" {ch} " if _is_cjk(cp) else ch))
        tokens = []
        for token in "".join(cleaned).split():
            if self.do_lower_case:
                token = "".join(c for c in unicodedata.normalize("NFD", token.lower())
                                if unicodedata.category(c) != "Mn")
            current = ""
            for ch in token:
                if _is_punctuation(ch):
                    if current:
                        tokens.append(current)
                    tokens.append(ch)
                    current = ""
                else:
                    current += ch
            if current:
                tokens.append(current)
        return tokens

    def _wordpiece(self, word: str) -> list[str]:
        if len(word) > self.max_chars:
            return ["[UNK]"]
        pieces, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.vocab:
                    break
                end -= 1
            if end == start:
                return ["[UNK]"]
            pieces.append(piece)
            start = end
        return pieces

    def tokenize(self, text: str) -> list[str]:
        return [p for w in self._basic(text) for p in self._wordpiece(w)]

    def convert_tokens_to_ids(self, tokens: list[str]) -> list[int]:
        unk = self.vocab["[UNK]"]
        return [self.vocab.get(t, unk) for t in tokens]


class SentencePieceTokenizer:
    """BLEURT-20 style: SentencePiece pieces; [CLS]/[SEP] looked up as pieces of the model."""

    def __init__(self, model_prefix: Path):
        import sentencepiece as spm

        self.sp = spm.SentencePieceProcessor(model_file=str(model_prefix) + ".model")

    def tokenize(self, text: str) -> list[str]:
        return self.sp.encode(text, out_type=str)

    def convert_tokens_to_ids(self, tokens: list[str]) -> list[int]:
        return [self.sp.piece_to_id(t) for t in tokens]


def encode_pair(reference: str, candidate: str, tokenizer, max_seq_length: int) -> tuple[list[int], list[int], list[int]]:
    """``input_ids, input_mask, segment_ids`` (each ``max_seq_length`` long) of one pair."""
    ref, cand = tokenizer.tokenize(reference), tokenizer.tokenize(candidate)
    while len(ref) + len(cand) > max_seq_length - 3:
        (ref if len(ref) > len(cand) else cand).pop()
    tokens = ["[CLS]", *ref, "[SEP]", *cand, "[SEP]"]
    segments = [0] * (len(ref) + 2) + [1] * (len(cand) + 1)
    ids = tokenizer.convert_tokens_to_ids(tokens)
    pad = max_seq_length - len(ids)
    return ids + [0] * pad, [1] * len(ids) + [0] * pad, segments + [0] * pad


def encode_batch(references: Sequence[str], candidates: Sequence[str], tokenizer, max_seq_length: int):
    """Three int64 arrays ``[batch, max_seq_length]``."""
    triples = [encode_pair(r, c, tokenizer, max_seq_length) for r, c in zip(references, candidates)]
    arr = np.asarray(triples, dtype=np.int64).reshape(len(triples), 3, max_seq_length)  # [batch, 3, len]
    return arr[:, 0], arr[:, 1], arr[:, 2]


# ------------------------------------------------------------------------------------- scorer

def _bad(path: Path, what: str) -> UserError:
    return UserError(f"BLEURT checkpoint {path} {what}; pass --bleurt-checkpoint (or set {ENV_VAR}) to an "
                     "unpacked BLEURT checkpoint folder such as BLEURT-20")


def read_config(path: Path) -> dict:
    """Validated ``bleurt_config.json`` with file entries resolved to absolute paths."""
    if not path.is_dir():
        raise _bad(path, "is not a directory")
    config_path = path / CONFIG_FILE
    if not config_path.is_file():
        raise _bad(path, f"has no {CONFIG_FILE}")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise _bad(path, f"has a malformed {CONFIG_FILE}") from None
    if not isinstance(config, dict) or not isinstance(config.get("max_seq_length"), int) or config["max_seq_length"] < 4:
        raise _bad(path, f"has no integer max_seq_length >= 4 in {CONFIG_FILE}")
    if config.get("sp_model"):
        prefix = path / config["sp_model"]
        if not Path(str(prefix) + ".model").is_file():
            raise _bad(path, f"lacks the SentencePiece model {config['sp_model']}.model")
        config["sp_model"] = prefix
    elif config.get("vocab_file") and config.get("do_lower_case") is not None:
        vocab = path / config["vocab_file"]
        if not vocab.is_file():
            raise _bad(path, f"lacks the vocab file {config['vocab_file']}")
        config["vocab_file"] = vocab
    else:
        raise _bad(path, "names neither sp_model nor vocab_file + do_lower_case in its config")
    if not (path / "saved_model.pb").is_file() or not (path / "variables").is_dir():
        raise _bad(path, "has no TF SavedModel (saved_model.pb + variables/)")
    return config


class BleurtScorer:
    """Loads a BLEURT checkpoint once; :meth:`score` returns one float per (reference, candidate)."""

    def __init__(self, checkpoint: str | os.PathLike):
        self.path = Path(checkpoint).expanduser()
        self.config = read_config(self.path)
        self.max_seq_length = int(self.config["max_seq_length"])
        if self.config.get("sp_model"):
            self.tokenizer = SentencePieceTokenizer(self.config["sp_model"])
        else:
            self.tokenizer = WordPieceTokenizer(self.config["vocab_file"], bool(self.config["do_lower_case"]))
        import tensorflow as tf

        try:
            model = tf.saved_model.load(str(self.path))
        except Exception as err:  # TF raises many types for a corrupt SavedModel
            raise _bad(self.path, f"could not be loaded by TensorFlow ({type(err).__name__})") from None
        if "serving_default" not in model.signatures:
            raise _bad(self.path, "has no serving_default signature")
        self._model = model  # keeps variables alive
        self._predict = model.signatures["serving_default"]
        self._tf = tf

    def score(self, references: Sequence[str], candidates: Sequence[str], batch_size: int = 64) -> list[float]:
        if len(references) != len(candidates):
            raise ValueError(f"{len(references)} references vs {len(candidates)} candidates")
        scores: list[float] = []
        for i in range(0, len(candidates), batch_size):
            ids, mask, segments = encode_batch(references[i:i + batch_size], candidates[i:i + batch_size],
                                               self.tokenizer, self.max_seq_length)
            out = self._predict(input_ids=self._tf.constant(ids), input_mask=self._tf.constant(mask),
                                segment_ids=self._tf.constant(segments))
            if "predictions" not in out:
                raise _bad(self.path, "signature does not return 'predictions'")
            scores.extend(float(v) for v in np.asarray(out["predictions"]).reshape(-1))
        return scores


def load_scorer(checkpoint: str | os.PathLike | None = None) -> BleurtScorer | None:
    """The scorer for the flag / ``$NARBENCH_BLEURT`` checkpoint, or None when neither is set."""
    path = resolve_checkpoint(checkpoint)
    return BleurtScorer(path) if path is not None else None


def corpus_bleurt(scorer: BleurtScorer | None, references: Sequence[str], candidates: Sequence[str],
                  batch_size: int = 64) -> float | None:
    """Mean sentence BLEURT (against one reference stream), or None without a checkpoint."""
    if scorer is None:
        return None
    if not candidates:
        raise ValueError("no candidates to score")
    return float(np.mean(scorer.score(references, candidates, batch_size)))
