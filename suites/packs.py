"""Task packs: a task's splits, references and vocabulary as plain files, read without TensorFlow or seqio.

``narbench data pack TASK --out DIR`` writes (``models.packing``, from the seqio task: the only step that needs
TensorFlow)::

    DIR/pack.json            what the pack holds: the task, its languages, split sizes, the vocabulary's
                             name and digest, each split's identity (models.batching.task_identity) and digests
                             of every file below
    DIR/vocab.model          the task's SentencePiece vocabulary
    DIR/<split>.jsonl.gz     one line per sentence: {"source": ..., "references": [...]} (every reference stream)
    DIR/<split>.npz          the split's token ids as the seqio task makes them (models.batching.TokenPairs)

A process given the pack (``NARBENCH_PACKS``, or ``narbench --pack DIR <command>``) reads the task
through ``suites.catalog`` from these files: training, distillation, learning curves, timing and scoring import no
TensorFlow or seqio. Its first use installs the vocabulary and the token arrays where the data root keeps them
(``vocab/<name>``, ``tokens/<key>.npz``) under the names a seqio run gives them, so checkpoints trained from a pack
have the same cache keys as checkpoints trained from the task itself, and either finds the other's.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from narbench_core.digest import file_digest
from narbench_core.errors import UserError
from narbench_core.io import gunzip_prefix, parse_jsonl
from suites.taskinfo import SPLITS

MANIFEST = "pack.json"
VOCAB = "vocab.model"
FORMAT = 1


def text_file(split: str) -> str:
    return f"{split}.jsonl.gz"


def tokens_file(split: str) -> str:
    return f"{split}.npz"


@dataclass(frozen=True, eq=False)
class Pack:
    """A pack folder, its manifest checked (hashed by identity: ``suites.catalog`` caches by the pack it opened)."""

    path: Path
    manifest: dict

    @property
    def task(self) -> str:
        return self.manifest["task"]

    def text(self, split: str) -> tuple[list[str], list[list[str]]]:
        """``(sources, references)`` of a split, references in sacrebleu's layout (``tasks.load_text``'s)."""
        rows = self._rows(split)
        streams = self.manifest["references"][split]
        refs = [[row["references"][k] for row in rows] for k in range(streams)]
        return [row["source"] for row in rows], refs

    def _rows(self, split: str) -> list[dict]:
        path = self.path / text_file(split)
        data, whole = gunzip_prefix(path)
        if not whole:
            raise UserError(f"{path} is cut off or damaged; write the pack again with `narbench data pack`")
        rows = parse_jsonl(data, path)
        if len(rows) != self.manifest["splits"][split]:
            raise UserError(f"{path} holds {len(rows)} sentences, pack.json says {self.manifest['splits'][split]}; "
                            "write the pack again with `narbench data pack`")
        return rows

    def install(self, root: Path) -> Path:
        """Put the vocabulary and token arrays where the data root ``root`` keeps them (kept if already there with
        the same bytes); returns the vocabulary's path there."""
        recorded = Path(self.manifest["identity"]["train"]["vocab_path"])
        vocab = root / (Path("vocab") / recorded.name if recorded.is_absolute() else recorded)
        _place(self.path / VOCAB, vocab, self.manifest["files"][VOCAB])
        for split in SPLITS:
            name = self.manifest["tokens"].get(split)
            if name:
                _place(self.path / tokens_file(split), root / "tokens" / name,
                       self.manifest["files"][tokens_file(split)], same=_same_arrays)
        return vocab


def _same_arrays(a: Path, b: Path) -> bool:
    """Whether two ``.npz`` files hold the same arrays (a pack's are compressed, a data root's cache is not)."""
    import zipfile

    import numpy as np

    try:
        with np.load(a) as x, np.load(b) as y:
            return set(x.files) == set(y.files) and all(np.array_equal(x[k], y[k]) for k in x.files)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):          # a damaged copy: replaced
        return False


def _place(source: Path, target: Path, digest: str, same=None) -> None:
    """Copy ``source`` (checked against its ``digest``) to ``target`` unless ``target`` already holds it."""
    if target.is_file() and (file_digest(target) == digest or (same is not None and same(source, target))):
        return
    if file_digest(source) != digest:
        raise UserError(f"{source} does not match its digest in pack.json; write the pack again with "
                        "`narbench data pack`")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".packing")
    shutil.copyfile(source, tmp)
    tmp.replace(target)


def open_pack(path: str | Path) -> Pack:
    """The pack at ``path``; a missing or damaged one is one ``UserError`` naming the fix."""
    path = Path(path)
    manifest_file = path / MANIFEST
    if not manifest_file.is_file():
        raise UserError(f"{path} is not a task pack (no {MANIFEST}); write one with `narbench data pack TASK --out "
                        f"{path}`")
    try:
        manifest = json.loads(manifest_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"{manifest_file} is not valid JSON ({err}); write the pack again with `narbench data pack`")
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise UserError(f"{manifest_file}: pack format {manifest.get('format') if isinstance(manifest, dict) else '?'}"
                        f", this narbench reads {FORMAT}; write the pack again with `narbench data pack`")
    missing = [name for name in manifest["files"] if not (path / name).is_file()]
    if missing:
        raise UserError(f"the pack {path} lacks {', '.join(missing)}; write it again with `narbench data pack`")
    return Pack(path, manifest)

