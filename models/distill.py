"""Sequence-level distillation: the AR teacher beam-decodes a task's training sources.

The outputs are cached as ``distill/<task>-<hash>/train.tsv`` (``source\\tteacher output`` per line,
in the split's order); the hash covers the teacher (its configs, data and steps) and the decoding
settings. Decoding goes in chunks of sources sorted by length (similar lengths share a batch), each
chunk written atomically as ``part-NNNNN.tsv``, so an interrupted run resumes at its first missing
chunk. ``suites.tasks.register_distilled_task`` then exposes the file as the seqio task
``<task>_distilled``: "distillation on/off" is a choice of task.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from narbench_core import defaults
from narbench_core.errors import UserError
from narbench_core.io import write_lines
from models import checkpoint

TSV_NAME = "train.tsv"


def _clean(text: str) -> str:
    """One TSV field: no tabs or line breaks."""
    return " ".join(text.replace("\t", " ").split())


def distill_dir_for(teacher_dir: str | os.PathLike, task: str, beam_size: int = defaults.DISTILL_BEAM_SIZE,
                    length_penalty: float = defaults.LENGTH_PENALTY,
                    max_examples: int | None = defaults.DISTILL_MAX_EXAMPLES) -> Path:
    """``distill/<task>-<hash>``: the hash names the teacher and the decoding settings."""
    from narbench_core.paths import subdir

    meta = checkpoint.read_meta(Path(teacher_dir))
    if meta is None:
        raise UserError(f"no teacher checkpoint in {teacher_dir}; train an AR model first "
                        "(`narbench train --model ar`) or pass its folder")
    if meta.get("kind") != "ar":
        raise UserError(f"the teacher in {teacher_dir} is a {meta.get('kind')} model; distillation "
                        "needs an AR checkpoint (`narbench train --model ar`)")
    if not meta.get("complete"):
        raise UserError(f"the teacher in {teacher_dir} has not finished training; re-run its "
                        "`narbench train` command first")
    teacher = {k: meta.get(k) for k in ("task", "model_config", "train_config", "vocab_hash", "data",
                                        "steps_done")}
    key = {"teacher": teacher, "task": task, "beam_size": beam_size,
           "length_penalty": length_penalty, "max_examples": max_examples}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return subdir("distill") / f"{task}-{digest}"


def distill_task(teacher_dir: str | os.PathLike, task: str, beam_size: int = defaults.DISTILL_BEAM_SIZE,
                 batch_size: int = 32, max_examples: int | None = defaults.DISTILL_MAX_EXAMPLES, *,
                 length_penalty: float = defaults.LENGTH_PENALTY,
                 chunk_size: int = 512, progress: bool = True) -> str:
    """Beam-decode ``task``'s training sources with the AR teacher (cached, resumable), register
    ``<task>_distilled`` on the result and return that name."""
    from suites import tasks

    out = distill_dir_for(teacher_dir, task, beam_size, length_penalty, max_examples)
    final = out / TSV_NAME
    if not final.is_file():
        sources, _ = tasks.load_text(task, "train")
        if max_examples is not None:
            sources = sources[:max_examples]
        if not sources:
            raise UserError(f"task {task!r} has no training sources to distill")
        _decode_in_chunks(teacher_dir, sources, out, beam_size, batch_size, length_penalty,
                          chunk_size, progress)
        parts = sorted(out.glob("part-*.tsv"))
        hyps: dict[int, str] = {}
        for part in parts:
            for line in part.read_text(encoding="utf-8").splitlines():
                index, _, hyp = line.split("\t", 2)
                hyps[int(index)] = hyp
        if len(hyps) != len(sources):
            raise RuntimeError(f"distillation chunks in {out} cover {len(hyps)} of {len(sources)} "
                               "sources; delete the folder and re-run")
        write_lines(final, (f"{_clean(s)}\t{hyps[i]}" for i, s in enumerate(sources)))
        for part in parts:
            part.unlink()
    return tasks.register_distilled_task(task, final)


def _decode_in_chunks(teacher_dir, sources: list[str], out: Path, beam_size: int, batch_size: int,
                      length_penalty: float, chunk_size: int, progress: bool) -> None:
    """Write ``part-NNNNN.tsv`` files (``index\\tsource\\thypothesis``), skipping existing ones."""
    from models.decoders import load_decoder
    from tqdm.auto import tqdm

    out.mkdir(parents=True, exist_ok=True)
    order = np.argsort([len(s) for s in sources], kind="stable")          # similar lengths together
    chunks = [order[i:i + chunk_size] for i in range(0, len(order), chunk_size)]
    todo = [(k, ids) for k, ids in enumerate(chunks) if not (out / f"part-{k:05d}.tsv").is_file()]
    if not todo:
        return
    decoder = load_decoder(teacher_dir, f"beam:{beam_size}", length_penalty=length_penalty,
                           name="teacher")
    decoder.warmup_inputs(batch_size)     # registers the batch size: the last batch pads up to it
    done = len(sources) - sum(len(ids) for _, ids in todo)
    with tqdm(total=len(sources), initial=done, disable=not progress, unit="sent",
              desc=f"distill {Path(out).name} (beam {beam_size})", dynamic_ncols=True) as bar:
        for k, ids in todo:
            lines = []
            for start in range(0, len(ids), batch_size):
                batch = [sources[i] for i in ids[start:start + batch_size]]
                prepared = decoder.prepare(batch)
                result = decoder.finish(decoder.run(prepared), prepared)
                lines.extend(f"{i}\t{_clean(sources[i])}\t{_clean(h)}"
                             for i, h in zip(ids[start:start + batch_size], result.hypotheses))
                bar.update(len(batch))
            write_lines(out / f"part-{k:05d}.tsv", lines)
