"""What every decoder returns: the one declaration (``bench.measure.decoder`` and ``models`` both use it)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:                       # the core imports only the standard library
    import numpy as np


@dataclass(frozen=True)
class DecodeOutput:
    hypotheses: list[str]   # one detokenized string per source, same order
    passes: np.ndarray      # [batch] int: decoder forward passes actually run for each sentence
