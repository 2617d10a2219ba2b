"""Length-bucketed training batches: tokenize a split once (cached on disk), then padded numpy batches.

Each example goes to the smallest bucket length ``L`` that holds both its source and its target;
a bucket's batches have a fixed shape ``[batch_tokens // L, L]`` (rounded to a multiple of the data
shards), so the train step compiles once per bucket. The order is a pure function of
``(seed, step)``: epoch ``e`` shuffles every bucket and the list of batches with
``default_rng([seed, e])``, and ``batch(step)`` picks batch ``step % batches_per_epoch`` of epoch
``step // batches_per_epoch`` -- a resumed run sees exactly the batches of an uninterrupted one.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from narbench_core.digest import file_digest
from narbench_core.defaults import TRAIN_BUCKETS
from narbench_core.io import atomic_path
from narbench_core.tokens import EOS_ID


@dataclass(frozen=True)
class TokenPairs:
    """Tokenized (source, target) pairs stored flat: example i is ``x[offsets[i]:offsets[i+1]]``."""

    inputs: np.ndarray           # [total source tokens] int32
    input_offsets: np.ndarray    # [n + 1] int64
    targets: np.ndarray          # [total target tokens] int32
    target_offsets: np.ndarray   # [n + 1] int64

    @classmethod
    def from_lists(cls, inputs: Sequence[Sequence[int]], targets: Sequence[Sequence[int]]
                   ) -> "TokenPairs":
        if len(inputs) != len(targets):
            raise ValueError(f"{len(inputs)} sources but {len(targets)} targets")

        def flat(seqs):
            lens = np.array([len(s) for s in seqs], dtype=np.int64)
            offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
            values = (np.concatenate([np.asarray(s, dtype=np.int32) for s in seqs])
                      if len(seqs) else np.zeros(0, np.int32))
            return values.astype(np.int32), offsets
        x, xo = flat(inputs)
        y, yo = flat(targets)
        return cls(x, xo, y, yo)

    def __len__(self) -> int:
        return len(self.input_offsets) - 1

    @property
    def input_lengths(self) -> np.ndarray:
        return np.diff(self.input_offsets)

    @property
    def target_lengths(self) -> np.ndarray:
        return np.diff(self.target_offsets)

    def input(self, i: int) -> np.ndarray:
        return self.inputs[self.input_offsets[i]:self.input_offsets[i + 1]]

    def target(self, i: int) -> np.ndarray:
        return self.targets[self.target_offsets[i]:self.target_offsets[i + 1]]

    def fingerprint(self) -> str:
        """sha256 (16 hex) of the token arrays: names the data in checkpoint hashes."""
        h = hashlib.sha256()
        for a in (self.inputs, self.input_offsets, self.targets, self.target_offsets):
            h.update(np.ascontiguousarray(a).tobytes())
        return h.hexdigest()[:16]

    def save(self, path: Path) -> None:
        """Atomic ``.npz`` write (temp file + rename)."""
        with atomic_path(path, suffix=".tmp.npz") as tmp:
            np.savez(tmp, inputs=self.inputs, input_offsets=self.input_offsets,
                     targets=self.targets, target_offsets=self.target_offsets)

    @classmethod
    def load(cls, path: Path) -> "TokenPairs":
        with np.load(path) as z:
            return cls(z["inputs"], z["input_offsets"], z["targets"], z["target_offsets"])


def _truncate(seq: np.ndarray, max_length: int) -> np.ndarray:
    """Cut to ``max_length`` keeping a final EOS when the sequence had one."""
    if len(seq) <= max_length:
        return seq
    out = seq[:max_length].copy()
    if seq[-1] == EOS_ID:
        out[-1] = EOS_ID
    return out


class BucketedBatches:
    """Deterministic, seeded, length-bucketed padded batches over a ``TokenPairs``.

    ``batch(step)`` -> ``{"inputs": [B, L] int32, "targets": [B, L] int32}`` (0 = pad). Rows that
    only fill up a bucket's last batch are all padding (zero loss weight).
    """

    def __init__(self, data: TokenPairs, batch_tokens: int, max_length: int = 128,
                 buckets: Sequence[int] = TRAIN_BUCKETS, seed: int = 0, num_shards: int = 1):
        if len(data) == 0:
            raise ValueError("no training examples")
        buckets = tuple(sorted(b for b in buckets if b < max_length)) + (max_length,)
        self.data, self.seed, self.buckets = data, seed, buckets
        in_len, tgt_len = data.input_lengths, data.target_lengths
        self.truncated_inputs = int((in_len > max_length).sum())
        self.truncated_targets = int((tgt_len > max_length).sum())
        self.max_length = max_length
        longest = np.minimum(np.maximum(in_len, tgt_len), max_length)
        which = np.searchsorted(np.array(buckets), longest)          # [n] bucket index
        self.members = {b: np.flatnonzero(which == k) for k, b in enumerate(buckets)}
        self.members = {b: m for b, m in self.members.items() if len(m)}
        # Rows per batch: about batch_tokens padded tokens, a multiple of the data shards.
        self.rows = {b: max(num_shards, (batch_tokens // b) // num_shards * num_shards)
                     for b in self.members}
        self.batches_per_epoch = sum(-(-len(m) // self.rows[b]) for b, m in self.members.items())
        self._plan_epoch, self._plan = None, None

    # -- order ---------------------------------------------------------------------------------
    def _epoch_plan(self, epoch: int) -> list[tuple[int, np.ndarray]]:
        """[(bucket length, example ids (-1 = padding row))] for one epoch, shuffled by seed."""
        if self._plan_epoch != epoch:
            rng = np.random.default_rng([self.seed, epoch])
            plan = []
            for b, members in self.members.items():
                ids = rng.permutation(members)
                rows = self.rows[b]
                fill = -len(ids) % rows
                ids = np.concatenate([ids, np.full(fill, -1, dtype=ids.dtype)])
                plan.extend((b, chunk) for chunk in ids.reshape(-1, rows))
            order = rng.permutation(len(plan))
            self._plan, self._plan_epoch = [plan[i] for i in order], epoch
        return self._plan

    def batch(self, step: int) -> dict[str, np.ndarray]:
        """The padded batch trained at ``step`` (0-based)."""
        epoch, index = divmod(int(step), self.batches_per_epoch)
        return self._assemble(*self._epoch_plan(epoch)[index])

    def _assemble(self, length: int, ids: np.ndarray) -> dict[str, np.ndarray]:
        inputs = np.zeros((len(ids), length), np.int32)     # [B, L]
        targets = np.zeros((len(ids), length), np.int32)    # [B, L]
        for row, i in enumerate(ids):
            if i < 0:
                continue
            x = _truncate(self.data.input(i), length)
            y = _truncate(self.data.target(i), length)
            inputs[row, :len(x)] = x
            targets[row, :len(y)] = y
        return {"inputs": inputs, "targets": targets}

    # -- facts ---------------------------------------------------------------------------------
    def shapes(self) -> list[tuple[int, int]]:
        """Every batch shape ``(B, L)``, shortest first (one train-step compile each)."""
        return [(self.rows[b], b) for b in sorted(self.members)]

    def batches_per_shape(self) -> list[tuple[tuple[int, int], int]]:
        """``((B, L), batches of that shape in an epoch)`` for every batch shape, shortest first."""
        return [((self.rows[b], b), -(-len(self.members[b]) // self.rows[b])) for b in sorted(self.members)]

    def example_batch(self, length: int) -> dict[str, np.ndarray]:
        """A batch of bucket ``length`` (its first examples, unshuffled), for warm-up compiles."""
        rows = self.rows[length]
        ids = self.members[length][:rows]
        return self._assemble(length, np.concatenate([ids, np.full(rows - len(ids), -1, ids.dtype)]))

    def stats(self) -> dict:
        """Padding shares (target and source side), truncation counts and batch counts."""
        tgt = np.minimum(self.data.target_lengths, self.max_length)
        src = np.minimum(self.data.input_lengths, self.max_length)
        padded = sum(-(-len(m) // self.rows[b]) * self.rows[b] * b for b, m in self.members.items())
        return {
            "examples": len(self.data),
            "batches_per_epoch": self.batches_per_epoch,
            "target_tokens_per_epoch": int(tgt.sum()),
            "padded_tokens_per_epoch": int(padded),
            "target_padding_share": round(1.0 - tgt.sum() / padded, 4),
            "source_padding_share": round(1.0 - src.sum() / padded, 4),
            "truncated_inputs": self.truncated_inputs,
            "truncated_targets": self.truncated_targets,
            "shapes": [list(s) for s in self.shapes()],
        }


# -- tokenized task splits, cached on disk -----------------------------------------------------------
def _text_fingerprint(task: str, split: str) -> str:
    """sha256 (16 hex) of the split's text pairs: a cache key that changes with the data."""
    from suites import catalog

    sources, references = catalog.load_text(task, split)
    h = hashlib.sha256()
    for source, target in zip(sources, references[0]):   # references[0]: the task's own targets
        h.update(source.encode())
        h.update(b"\t")
        h.update(target.encode())
        h.update(b"\n")
    return h.hexdigest()[:16]


def task_identity(task: str, split: str = "train") -> dict:
    """What names a task's training data: the vocabulary (its file relative to the data root, so a data root
    that moves keeps its caches and records, and its hash) and the text's fingerprint."""
    from narbench_core.paths import portable
    from suites import catalog

    info = catalog.task_info(task)
    return {"vocab_path": portable(info.vocab_path), "vocab_hash": file_digest(info.vocab_path)[:16],
            "data": _text_fingerprint(task, split)}


def token_cache_path(task: str, split: str = "train") -> Path:
    """Where ``load_task_tokens`` caches a split's token ids: keyed by task, split, vocabulary and text hash."""
    from narbench_core.paths import subdir

    ident = task_identity(task, split)
    return subdir("tokens") / f"{task}-{split}-{ident['vocab_hash'][:10]}-{ident['data'][:10]}.npz"


def load_task_tokens(task: str, split: str = "train", progress: bool = False) -> TokenPairs:
    """The task split's ``inputs``/``targets`` token ids (EOS appended, as the seqio task makes them),
    tokenized once and cached (``token_cache_path``). Where the split's seqio dataset is its text
    (``catalog.tokens_follow_text``: every split but WMT's own, and every split of a pack) the SentencePiece
    model encodes that text here, the ids seqio's pipeline gives (tests/data/test_seqio_tasks.py) in a
    fraction of its time; WMT's own splits go through seqio."""
    from suites import catalog

    path = token_cache_path(task, split)
    if path.is_file():
        return TokenPairs.load(path)
    if catalog.tokens_follow_text(task, split):
        tokenizer = catalog.get_vocabulary(task).tokenizer              # the SentencePiece processor
        sources, references = catalog.load_text(task, split)
        inputs = [ids + [EOS_ID] for ids in tokenizer.encode(list(sources))]
        targets = [ids + [EOS_ID] for ids in tokenizer.encode(list(references[0]))]
    else:
        inputs, targets = _seqio_tokens(task, split)
    if not inputs:
        raise ValueError(f"task {task!r} split {split!r} has no examples")
    pairs = TokenPairs.from_lists(inputs, targets)
    pairs.save(path)
    return pairs


def _seqio_tokens(task: str, split: str) -> tuple[list, list]:
    """A seqio task split's token ids (its preprocessors: tokenize, append EOS)."""
    from suites import tasks

    ds = tasks.seqio_task(task).get_dataset(
        sequence_length=None, split=split, shuffle=False, num_epochs=1, use_cached=False)
    inputs, targets = [], []
    for ex in ds.as_numpy_iterator():
        inputs.append(ex["inputs"])
        targets.append(ex["targets"])
    return inputs, targets
