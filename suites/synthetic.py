"""Synthetic translation with a dial for target-side dependency (multimodality).

A fixed random lexicon maps each source word to one target word *per mode*; each mode also has its
own word order. An example draws its source words and then one mode uniformly at random:

- ``dependency = 0``: one mode, so the target is a deterministic function of the source
  (word-by-word lexicon + a fixed reordering: adjacent words swapped).
- ``dependency = 1``: ``max_modes`` modes, each an equally valid translation (other words, other
  order). Every target position depends on the mode chosen by the others: predicting positions
  independently mixes modes (wrong words, repeated or missing ones), as the paper's theory predicts.

Examples are generated on the fly from ``(seed, split, index)``: any size, deterministic per seed,
and the source of example ``i`` does not depend on the dial (only its target does).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from narbench_core.digest import json_digest
from narbench_core import paths
from narbench_core.errors import UserError
from narbench_core.io import write_lines

SPLIT_IDS = {"train": 0, "dev": 1, "test": 2}
_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"


@dataclass(frozen=True)
class SyntheticConfig:
    dependency: float = 0.0   # the dial in [0, 1]: 0 = one valid target, 1 = max_modes valid targets
    max_modes: int = 3
    n_words: int = 40         # source vocabulary; the target has n_words words per mode
    min_len: int = 4          # words per sentence, inclusive range
    max_len: int = 12
    train_size: int = 50_000
    dev_size: int = 500
    test_size: int = 500
    seed: int = 0

    def __post_init__(self):
        if not 0.0 <= self.dependency <= 1.0:
            raise UserError(f"synthetic dependency must be in [0, 1], got {self.dependency}")
        if self.max_modes < 1 or self.n_words < 2 or not 1 <= self.min_len <= self.max_len:
            raise UserError("synthetic config needs max_modes >= 1, n_words >= 2, 1 <= min_len <= max_len")

    @classmethod
    def with_modes(cls, modes: int, **kw) -> "SyntheticConfig":
        """The config whose dial gives exactly ``modes`` valid targets per source."""
        max_modes = kw.pop("max_modes", max(modes, 1))
        dependency = 0.0 if max_modes == 1 else (modes - 1) / (max_modes - 1)
        return cls(dependency=dependency, max_modes=max_modes, **kw)

    @property
    def modes(self) -> int:
        """Number of equally valid targets per source: 1 at dependency 0, max_modes at 1."""
        return 1 + int(self.dependency * (self.max_modes - 1) + 0.5)

    def split_size(self, split: str) -> int:
        return {"train": self.train_size, "dev": self.dev_size, "test": self.test_size}[split]

    def key(self) -> str:
        """Hash of the config (names cached files)."""
        return json_digest(dataclasses.asdict(self), 12)


def _order(mode: int, length: int) -> np.ndarray:
    """Position permutation of ``mode``: target position j holds source word order[j]."""
    idx = np.arange(length)
    if mode == 0:                                  # swap adjacent pairs: 1 0 3 2 ...
        swapped = idx.copy()
        swapped[: length - length % 2] = idx[: length - length % 2].reshape(-1, 2)[:, ::-1].ravel()
        return swapped
    if mode == 1:                                  # reversed
        return idx[::-1]
    return np.roll(idx, -(mode - 2))               # identity, then rotations


class SyntheticTranslation:
    """Generator of one synthetic translation task."""

    def __init__(self, config: SyntheticConfig):
        self.config = config

    @cached_property
    def _lexicon(self) -> tuple[list[str], np.ndarray]:
        """Source words [n_words] and target words [max_modes, n_words] (all distinct).

        Depends only on (seed, n_words, max_modes), so every dial setting shares it.
        """
        c = self.config
        rng = np.random.default_rng([c.seed, 1])
        need = c.n_words * (1 + c.max_modes)
        words: list[str] = []
        seen = set()
        while len(words) < need:
            n_syll = 2 if len(words) < c.n_words else 3     # source: 2 syllables, target: 3
            w = "".join(_CONSONANTS[rng.integers(len(_CONSONANTS))] + _VOWELS[rng.integers(len(_VOWELS))]
                        for _ in range(n_syll))
            if w not in seen:
                seen.add(w)
                words.append(w)
        src = words[: c.n_words]
        tgt = np.array(words[c.n_words:], dtype=object).reshape(c.max_modes, c.n_words)
        return src, tgt

    @property
    def source_words(self) -> list[str]:
        return self._lexicon[0]

    def _draw(self, split: str, index: int) -> tuple[np.ndarray, int]:
        c = self.config
        rng = np.random.default_rng([c.seed, 2, SPLIT_IDS[split], index])
        length = int(rng.integers(c.min_len, c.max_len + 1))
        src = rng.integers(0, c.n_words, size=length)      # [length] word ids
        mode = int(rng.random() * c.modes)                 # uniform over the valid modes
        return src, mode

    def _render(self, src: np.ndarray, mode: int) -> str:
        tgt_words = self._lexicon[1][mode]
        return " ".join(tgt_words[src[j]] for j in _order(mode, len(src)))

    def example(self, split: str, index: int) -> tuple[str, str]:
        """(source, target) of example ``index`` of ``split``."""
        src, mode = self._draw(split, index)
        return " ".join(self.source_words[i] for i in src), self._render(src, mode)

    def examples(self, split: str, n: int | None = None) -> Iterator[tuple[str, str]]:
        """The first ``n`` examples of ``split`` (default: the split size)."""
        if split not in SPLIT_IDS:
            raise UserError(f"unknown split {split!r}; choose from {', '.join(SPLIT_IDS)}")
        for i in range(self.config.split_size(split) if n is None else n):
            yield self.example(split, i)

    @cached_property
    def _source_index(self) -> dict[str, int]:
        return {w: i for i, w in enumerate(self.source_words)}

    def _parse(self, source: str) -> np.ndarray:
        try:
            return np.array([self._source_index[w] for w in source.split()], dtype=np.int64)
        except KeyError as err:
            raise ValueError(f"not a source sentence of this task (unknown word {err})") from None

    def valid_targets(self, source: str) -> list[str]:
        """Every equally valid target of ``source``, one per mode (all distinct)."""
        src = self._parse(source)
        return [self._render(src, m) for m in range(self.config.modes)]

    def any_valid_accuracy(self, sources: Sequence[str], hypotheses: Sequence[str]) -> float:
        """Share of hypotheses equal to one of their source's valid targets."""
        if len(sources) != len(hypotheses):
            raise ValueError("sources and hypotheses differ in length")
        if not sources:
            return 0.0
        hits = sum(" ".join(h.split()) in self.valid_targets(s) for s, h in zip(sources, hypotheses))
        return hits / len(sources)

    def split_file(self, split: str, n: int | None = None) -> Path:
        """Where ``write_split`` puts the first ``n`` examples (whether written yet or not)."""
        n = self.config.split_size(split) if n is None else n
        return paths.subdir("corpora") / "synthetic" / self.config.key() / f"{split}-{n}.tsv"

    def write_split(self, split: str, n: int | None = None) -> Path:
        """The first ``n`` examples as ``source<TAB>target`` lines in a cached file (for vocabularies)."""
        path = self.split_file(split, n)
        if not path.exists():
            write_lines(path, (f"{s}\t{t}" for s, t in self.examples(split, n)))
        return path


# The registered dial settings: task name -> config.
TASKS = {
    "synthetic_d0": SyntheticConfig(dependency=0.0),
    "synthetic_d50": SyntheticConfig(dependency=0.5),
    "synthetic_d100": SyntheticConfig(dependency=1.0),
}
