"""Where a task's data comes from: a pack given for it (``suites.packs``: plain files), else the built-in and suite
tasks (``suites.tasks``: text, vocabularies and sizes without seqio; seqio and TensorFlow only for WMT's own splits,
which stream from TFDS).

Training, distillation, learning curves, timing and scoring ask this module for a task's languages, text,
vocabulary and distilled variant, so a process whose tasks all come from packs needs neither the corpora nor TFDS.
Packs are given by ``NARBENCH_PACKS`` (pack folders separated by ``os.pathsep``; ``narbench --pack DIR <command>``
sets it), so Ray workers and timing workers, which inherit the environment, read the same packs.
"""
from __future__ import annotations

import functools
import os
from pathlib import Path

from narbench_core.errors import UserError
from narbench_core.io import iter_lines
from suites.taskinfo import (DISTILLED_SUFFIX, SPLITS, TaskInfo, distilled_name, read_tsv,  # noqa: F401 (API)
                             source_task)

PACKS_ENV = "NARBENCH_PACKS"


# ------------------------------------------------------------------------------------------- packs
_DISTILLED: dict[str, Path] = {}          # a packed task's distilled variant -> its train.tsv


def use_packs(paths) -> None:
    """Add pack folders to this process's packs (and its children's: the environment carries them)."""
    known = [p for p in os.environ.get(PACKS_ENV, "").split(os.pathsep) if p]
    added = [str(Path(p).absolute()) for p in paths if str(Path(p).absolute()) not in known]
    if added:
        value = os.pathsep.join(known + added)
        _packs(value)                             # a missing or damaged pack fails here, in one line, and is not kept
        os.environ[PACKS_ENV] = value


def packs() -> dict:
    """Task name -> its ``suites.packs.Pack``, from ``NARBENCH_PACKS``."""
    return _packs(os.environ.get(PACKS_ENV, ""))


@functools.lru_cache(maxsize=8)
def _packs(value: str) -> dict:
    from suites.packs import open_pack

    out: dict = {}
    for folder in (p for p in value.split(os.pathsep) if p):
        pack = open_pack(folder)
        if pack.task in out and out[pack.task].path != pack.path:
            raise UserError(f"two packs of task {pack.task} ({out[pack.task].path}, {pack.path}); give one")
        out[pack.task] = pack
    return out


def _pack_of(name: str):
    return packs().get(source_task(name))


def packed(name: str) -> bool:
    """Whether ``name`` (or the task it was distilled from) is read from a pack."""
    return _pack_of(name) is not None


def _check_known(name: str, pack) -> None:
    if name != pack.task and name not in _DISTILLED:
        raise UserError(f"task {name!r} is not known yet: its distillation registers it (run the suite, or "
                        f"`narbench train --distill`)")


@functools.lru_cache(maxsize=8)
def _pack_vocabulary(pack, root: str):
    from suites.sentencepiece_text import SentencePieceText

    return SentencePieceText(pack.install(Path(root)))


def _tasks():
    from suites import tasks

    return tasks


# ------------------------------------------------------------------------------------------ the API
def task_info(name: str) -> TaskInfo:
    """Languages, family, split sizes and vocabulary of a task (never downloads or trains)."""
    pack = _pack_of(name)
    if pack is None:
        return _tasks().task_info(name)
    from narbench_core.paths import data_root

    _check_known(name, pack)
    m = pack.manifest
    splits = dict(m["splits"])
    if name in _DISTILLED:
        splits["train"] = sum(1 for _ in iter_lines(_DISTILLED[name]))
    return TaskInfo(name, m["source_lang"], m["target_lang"], m["family"], splits,
                    _pack_vocabulary(pack, str(data_root())))


def load_text(name: str, split: str) -> tuple[list[str], list[list[str]]]:
    """``(sources, references)`` of one split (``suites.tasks.load_text``)."""
    pack = _pack_of(name)
    if pack is None:
        return _tasks().load_text(name, split)
    _check_known(name, pack)
    if split not in SPLITS:
        raise UserError(f"unknown split {split!r} for {name}; choose from {', '.join(SPLITS)}")
    if name in _DISTILLED and split == "train":
        sources, targets = read_tsv(_DISTILLED[name])
        return sources, [targets]
    sources, refs = _pack_text(pack, split)
    return list(sources), [list(r) for r in refs]


@functools.lru_cache(maxsize=16)
def _pack_text(pack, split: str) -> tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]:
    sources, refs = pack.text(split)
    return tuple(sources), tuple(tuple(r) for r in refs)


def valid_targets(name: str, split: str) -> list[list[str]] | None:
    """Every correct output of each source of a split, for tasks that know them all; else None."""
    pack = _pack_of(name)
    if pack is None:
        return _tasks().valid_targets(name, split)
    if not pack.manifest["valid_targets"]:
        return None
    _, refs = load_text(pack.task, split)
    return [list(targets) for targets in zip(*refs)]


def tokens_follow_text(name: str, split: str) -> bool:
    """Whether a split's token ids are its ``load_text`` pairs encoded by the task's SentencePiece model (with
    EOS): a pack's always; a seqio task's where its dataset is that text (``suites.tasks.tokens_follow_text``)."""
    return packed(name) or _tasks().tokens_follow_text(name, split)


def get_vocabulary(name: str):
    """The task's SentencePiece vocabulary."""
    return task_info(name).vocabulary if packed(name) else _tasks().get_vocabulary(name)


def is_known(name: str) -> bool:
    """Whether ``name`` is a task this process can read (a distilled one: once its distillation registered it)."""
    pack = _pack_of(name)
    if pack is not None:
        return name == pack.task or name in _DISTILLED
    return name in _tasks().known_tasks()


def distilled_train(name: str) -> Path | None:
    """The distillation's ``train.tsv`` behind a distilled task (None for every other task)."""
    pack = _pack_of(name)
    if pack is None:
        return _tasks().distilled_train(name)
    _check_known(name, pack)
    return _DISTILLED.get(name)


def register_distilled_task(base_task: str, train_tsv: Path) -> str:
    """Register ``<base_task>_distilled``: its training split from ``train_tsv`` (``source<TAB>target`` lines
    written by the distillation), its other splits and vocabulary as ``base_task``."""
    pack = packs().get(base_task)
    if pack is None:
        return _tasks().register_distilled_task(base_task, train_tsv)
    train_tsv = Path(train_tsv)
    if not train_tsv.is_file():
        raise UserError(f"distilled training file {train_tsv} not found; run the distillation first")
    name = distilled_name(base_task)
    _DISTILLED[name] = train_tsv
    return name
