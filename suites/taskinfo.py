"""What every task reader gives (``suites.catalog`` for packs and seqio tasks alike, ``suites.tasks`` for seqio):
a task's description, and the names and file of its distilled variant."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from narbench_core.errors import UserError
from narbench_core.io import iter_lines

SPLITS = ("train", "dev", "test")
DISTILLED_SUFFIX = "_distilled"   # the one place that spells a distilled task's name


@dataclass(frozen=True)
class TaskInfo:
    name: str
    source_lang: str
    target_lang: str
    family: str
    splits: dict            # split -> number of examples, or None where unknown (data not prepared)
    vocabulary: Any         # seqio.SentencePieceVocabulary, or (packs) suites.sentencepiece_text.SentencePieceText

    @property
    def vocab_path(self) -> Path:
        """The SentencePiece model file (trains the vocabulary on first access)."""
        return Path(self.vocabulary.sentencepiece_model_file)


def distilled_name(task: str) -> str:
    """The name of ``task`` with its training targets replaced by a teacher's outputs."""
    return task + DISTILLED_SUFFIX


def source_task(name: str) -> str:
    """The task a (possibly distilled) task was made from: its dev/test splits and vocabulary."""
    return name.removesuffix(DISTILLED_SUFFIX)


def read_tsv(path: Path) -> tuple[list[str], list[str]]:
    """The ``source<TAB>target`` lines of a distillation's ``train.tsv``."""
    sources, targets = [], []
    for n, line in enumerate(iter_lines(path), 1):
        cols = line.split("\t")
        if len(cols) != 2:
            raise UserError(f"{path}:{n}: expected `source<TAB>target`; re-run the distillation")
        sources.append(cols[0])
        targets.append(cols[1])
    return sources, targets
