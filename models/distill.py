"""Sequence-level distillation: the AR teacher decodes a seeded sample of a task's training sources.

The sample: a seeded permutation of the training split (``sample_indices``); its first ``heldout``
pairs are held aside and never distilled, the next ``max_examples`` (None: all the rest) are. So the
distilled set is a uniform sample across the whole split, not its first verses (the Bible's training
split runs from Genesis to Revelation in order), and it does not depend on the order of the split's
lines beyond their index.

The teacher decodes with ``decoder`` (``greedy`` or ``beam:K``) in batches of ``batch_size`` sources
sorted by length (similar lengths share a batch and a shape bucket), in narbench's JAX decoder
(``engine = "jax"``) or in the checkpoint's CTranslate2 export (``engine = "ct2"``, the ``ct2`` extra;
on all cores). Outputs are cached in ``distill/<task>-<hash>/``; the hash covers the teacher (its
configs, data and steps), the task, the decoder, the engine (when not jax: the caches written before
there was a choice keep their names), the length penalty, the sample size, the held-aside size and the
seed. The folder holds

- ``train.tsv``: ``source\\tteacher output`` per distilled pair, in the split's order;
- ``dev.tsv``: the same for the task's whole dev split (``_decode_dev``; a cache from before it existed gets it on
  its first use): a distilled model's dev NLL is measured against these, its training targets' kind, not against
  the human references;
- ``distill.json``: the record (``RECORD_FIELDS`` and the settings): the teacher's BLEU on the
  held-aside pairs against their human references (sacrebleu corpus BLEU, ``zh`` tokenizer for
  Chinese targets, else ``13a``; training pairs the teacher itself was trained on, so it says how
  closely the distilled targets follow the human ones, not how well the teacher translates new text),
  the distilled/reference length ratio in words over the distilled set, the engine, the decoding
  throughput and the wall time (counting every resumed part); and what the cache is of: the teacher's
  parameter digest (``models.checkpoint.params_digest``) and ``train.tsv``'s size and sha256.

A cache is what it says or it is made again: a ``train.tsv`` cut off or replaced, or a teacher whose
weights are no longer those that decoded it (the folder's hash names the teacher's settings and steps,
not its weights), is one line on stderr and distilled again. A cache written before these digests were
recorded adopts them on its first use.

Decoding goes in chunks of ``chunk_size`` sources, each written atomically as ``part-NNNNN.tsv`` (and
the time spent so far to ``timing.json``), so an interrupted run resumes at its first missing chunk.
``suites.catalog.register_distilled_task`` then exposes ``train.tsv`` as the task
``<task>_distilled``: "distillation on/off" is a choice of task.

The batch size (``narbench_core.defaults.DISTILL_BATCH_SIZE``) was measured on this machine (the numbers
are in docs/experiments.md): larger greedy batches gave fewer sentences per second, since every row of a batch
decodes until its longest row ends and a few rows never emit EOS.
"""
from __future__ import annotations

import collections
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from narbench_core.digest import file_digest, json_digest
from narbench_core import defaults, langs
from narbench_core.errors import UserError
from narbench_core.io import read_lines, write_json, write_lines
from models import checkpoint

TSV_NAME = "train.tsv"
DEV_NAME = "dev.tsv"
RECORD_NAME = "distill.json"
TIMING_NAME = "timing.json"
RECORD_FIELDS = ("examples", "teacher_decoder", "teacher_engine", "teacher_bleu", "length_ratio",
                 "sentences_per_second", "seconds")


@dataclass(frozen=True)
class Distillation:
    task: str          # the registered distilled task, ``<task>_distilled``
    folder: Path       # ``distill/<task>-<hash>``
    record: dict       # ``distill.json``


def _clean(text: str) -> str:
    """One TSV field: no tabs or line breaks."""
    return " ".join(text.replace("\t", " ").split())


def teacher_decoder(decoder: str) -> str:
    """``decoder`` in canonical form (``greedy`` or ``beam:K``); anything else is a ``UserError``."""
    from models.decoders import parse_spec

    fix = 'use decoder = "greedy" or "beam:K" (e.g. beam:5) for the distillation teacher'
    try:
        parsed = parse_spec(decoder)
    except UserError:
        raise UserError(f"unknown distillation decoder {decoder!r}; {fix}") from None
    if parsed.algorithm == "greedy":
        return "greedy"
    if parsed.algorithm == "beam":
        return f"beam:{parsed.k}"
    raise UserError(f"distillation decoder {decoder!r} is not an AR search; {fix}")


def teacher_engine(engine: str) -> str:
    """``engine`` if narbench can run the teacher there, else a one-line ``UserError``."""
    if engine not in defaults.DISTILL_ENGINES:
        raise UserError(f"unknown distillation engine {engine!r}; use one of {', '.join(defaults.DISTILL_ENGINES)}")
    return engine


def sample_indices(n: int, max_examples: int | None, heldout: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(distilled, held_aside)``: disjoint sorted indices into a split of ``n`` pairs, from one seeded
    permutation: the first ``heldout`` are held aside, the next ``max_examples`` (None: all the rest)
    are distilled (fewer if the split has fewer)."""
    if heldout < 0 or (max_examples is not None and max_examples < 1):
        raise UserError(f"distillation needs heldout >= 0 and max_examples >= 1 (or None), got {heldout} "
                        f"and {max_examples}")
    if n <= heldout:
        raise UserError(f"the training split has {n} pairs, not more than the {heldout} held aside to score the "
                        "teacher; pass a smaller heldout (or a task with more training data)")
    order = np.random.default_rng(seed).permutation(n)
    rest = order[heldout:] if max_examples is None else order[heldout:heldout + max_examples]
    return np.sort(rest), np.sort(order[:heldout])


def distill_dir_for(teacher_dir: str | os.PathLike, task: str, decoder: str = defaults.DISTILL_DECODER,
                    max_examples: int | None = defaults.DISTILL_MAX_EXAMPLES, *,
                    length_penalty: float = defaults.LENGTH_PENALTY, seed: int = 0,
                    heldout: int = defaults.DISTILL_HELDOUT, engine: str = defaults.DISTILL_ENGINE) -> Path:
    """``distill/<task>-<hash>``: the hash names the teacher, the task and the sampling and decoding
    settings (not the batch size)."""
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
    key = {"teacher": teacher, "task": task, "decoder": teacher_decoder(decoder),
           "length_penalty": float(length_penalty), "max_examples": max_examples, "heldout": int(heldout),
           "seed": int(seed)}
    if teacher_engine(engine) != defaults.DISTILL_ENGINE:
        key["engine"] = engine
    return subdir("distill") / f"{task}-{json_digest(key, 12)}"


def distill(teacher_dir: str | os.PathLike, task: str, decoder: str = defaults.DISTILL_DECODER,
            max_examples: int | None = defaults.DISTILL_MAX_EXAMPLES, *,
            length_penalty: float = defaults.LENGTH_PENALTY, seed: int = 0,
            heldout: int = defaults.DISTILL_HELDOUT, engine: str = defaults.DISTILL_ENGINE,
            batch_size: int = defaults.DISTILL_BATCH_SIZE, chunk_size: int = 512,
            progress: bool = True) -> Distillation:
    """Decode the seeded sample of ``task``'s training sources with the AR teacher (cached,
    resumable), score the teacher on the held-aside pairs, write ``distill.json``, register
    ``<task>_distilled`` on the result and return it with its folder and record."""
    from suites import catalog

    decoder = teacher_decoder(decoder)
    if batch_size < 1 or chunk_size < 1:
        raise UserError(f"distillation batch_size and chunk_size must be >= 1, got {batch_size} and {chunk_size}")
    settings = dict(decoder=decoder, max_examples=max_examples, length_penalty=length_penalty, seed=seed,
                    heldout=heldout, engine=teacher_engine(engine))
    out = distill_dir_for(teacher_dir, task, **settings)
    final, record_file = out / TSV_NAME, out / RECORD_NAME
    if final.is_file() and record_file.is_file():
        damage = cache_damage(out, teacher_dir)
        if damage:
            print(f"narbench: distillation {out} {damage}; distilling again", file=sys.stderr)
            record_file.unlink()
            final.unlink()
    if not (final.is_file() and record_file.is_file()):
        _run(teacher_dir, task, out, settings, batch_size, chunk_size, progress)
    _distill_dev(teacher_dir, task, out, settings, batch_size)
    record = json.loads(record_file.read_text(encoding="utf-8"))
    return Distillation(catalog.register_distilled_task(task, final), out, record)


def cache_damage(out: Path, teacher_dir: str | os.PathLike) -> str | None:
    """Why the cached distillation in ``out`` is not what its record says (None: it is): ``train.tsv`` against
    its recorded size and sha256, the teacher's parameters against the digest of those that decoded it. A
    record from before the digests were kept adopts them here."""
    record_file, final = out / RECORD_NAME, out / TSV_NAME
    try:
        record = json.loads(record_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return "has an unreadable distill.json"
    if not isinstance(record, dict):
        return "has an unreadable distill.json"
    teacher = checkpoint.params_digest(teacher_dir)
    if "train_tsv" not in record or "teacher_params_digest" not in record:       # written before the digests
        write_json(record_file, {**record, "teacher_params_digest": teacher, "train_tsv": _tsv_stamp(final)})
        return None
    if record["teacher_params_digest"] != teacher:
        return "was decoded by other weights than its teacher's now"
    size, digest = record["train_tsv"].get("bytes"), record["train_tsv"].get("sha256")
    if final.stat().st_size != size:
        return f"has a train.tsv of {final.stat().st_size:,} bytes, not the {size:,} it recorded (cut off or replaced)"
    if file_digest(final) != digest:
        return "has a train.tsv whose content is not the one it recorded (replaced)"
    return None


def _tsv_stamp(path: Path) -> dict:
    return {"bytes": path.stat().st_size, "sha256": file_digest(path)}


def distill_task(teacher_dir: str | os.PathLike, task: str, decoder: str = defaults.DISTILL_DECODER,
                 max_examples: int | None = defaults.DISTILL_MAX_EXAMPLES, **kwargs: Any) -> str:
    """``distill(...)``, returning only the distilled task's name (``<task>_distilled``)."""
    return distill(teacher_dir, task, decoder, max_examples, **kwargs).task


def register_trained_task(meta: dict) -> None:
    """Make the task a checkpoint record (``meta``) trained on known to this process: a distilled task
    (``<task>_distilled``) is registered from the distillation under the data root whose ``train.tsv`` is the
    text the record names (its ``data`` fingerprint, ``models.batching.task_identity``). A process that did not
    distill (``narbench continue`` on a distilled model) knows only the tasks a suite registers. Any other task:
    nothing to do."""
    from models.batching import task_identity
    from narbench_core.paths import subdir
    from suites import catalog

    task = meta.get("task") or ""
    base = catalog.source_task(task)
    if base == task:
        return
    try:
        if catalog.distilled_train(task) is not None and task_identity(task)["data"] == meta.get("data"):
            return
    except UserError:                                # not registered yet
        pass
    for record_file in sorted(subdir("distill").glob(f"*/{RECORD_NAME}")):
        tsv = record_file.parent / TSV_NAME
        try:
            record = json.loads(record_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if record.get("task") != base or not tsv.is_file():
            continue
        catalog.register_distilled_task(base, tsv)
        if task_identity(task)["data"] == meta.get("data"):
            return
    raise UserError(f"no distillation under {subdir('distill')} holds the training text {task} was trained on "
                    f"(data {meta.get('data')}): run its suite's distillation again (`narbench run --suite ... "
                    f"--train-only`), or `narbench train --distill --teacher <its AR checkpoint>`")


def _run(teacher_dir, task: str, out: Path, settings: dict, batch_size: int, chunk_size: int,
         progress: bool) -> None:
    """Decode the missing chunks and the held-aside pairs, then write the record and ``train.tsv``."""
    import sacrebleu

    from narbench_core.paths import portable
    from suites import catalog

    start = time.perf_counter()
    sources, refs = catalog.load_text(task, "train")
    picked, held = sample_indices(len(sources), settings["max_examples"], settings["heldout"], settings["seed"])
    out.mkdir(parents=True, exist_ok=True)
    timing = _read_timing(out)
    decoder = load_teacher(teacher_dir, settings["decoder"], settings["engine"], settings["length_penalty"])
    decoder.warmup_inputs(batch_size)     # registers the batch size: a short last batch pads up to it
    decoded, decode_s = _decode_in_chunks(decoder, sources, picked, out, batch_size, chunk_size, progress,
                                          timing, start)
    hyps: dict[int, str] = {}
    parts = sorted(out.glob("part-*.tsv"))
    for part in parts:
        for line in read_lines(part):
            index, _, hyp = line.split("\t", 2)
            hyps[int(index)] = hyp
    if sorted(hyps) != picked.tolist():
        raise RuntimeError(f"distillation chunks in {out} cover {len(hyps)} sources, not the {len(picked)} "
                           "sampled ones; delete the folder and re-run")

    target_lang = catalog.task_info(task).target_lang
    tokenize = langs.bleu_tokenizer(target_lang)
    held_hyps = _decode(decoder, [sources[i] for i in held], batch_size) if len(held) else []
    teacher_bleu = (sacrebleu.corpus_bleu(held_hyps, [[refs[0][i] for i in held]], tokenize=tokenize).score
                    if len(held) else None)
    ref_words = sum(langs.text_length(refs[0][i], target_lang) for i in picked)
    hyp_words = sum(langs.text_length(hyps[i], target_lang) for i in picked)
    record = {
        "task": task, "teacher": portable(teacher_dir), "examples": len(picked),
        "max_examples": settings["max_examples"], "heldout": len(held), "seed": settings["seed"],
        "teacher_decoder": settings["decoder"], "teacher_engine": settings["engine"], "length_penalty": settings["length_penalty"],
        "batch_size": batch_size, "teacher_parallel_batches": int(getattr(decoder, "parallel_batches", 1)),
        "teacher_bleu": teacher_bleu, "bleu_tokenize": tokenize,
        "length_ratio": hyp_words / ref_words if ref_words else None,
        "sentences_per_second": decoded / decode_s if decode_s > 0 else None,
        "seconds": timing["seconds"] + time.perf_counter() - start,
        "teacher_params_digest": checkpoint.params_digest(teacher_dir),
    }
    record.update(_decode_dev(decoder, task, out, batch_size))
    write_lines(out / TSV_NAME, (f"{_clean(sources[i])}\t{hyps[i]}" for i in picked.tolist()))
    write_json(out / RECORD_NAME, {**record, "train_tsv": _tsv_stamp(out / TSV_NAME)})   # the record last: whole
    for part in parts:
        part.unlink()
    (out / TIMING_NAME).unlink(missing_ok=True)


def _distill_dev(teacher_dir, task: str, out: Path, settings: dict, batch_size: int) -> None:
    """A cache's ``dev.tsv`` (``_decode_dev``) where it has none, or not the one its record names (said on stderr):
    caches from before it existed get it on their first use."""
    record_file, dev = out / RECORD_NAME, out / DEV_NAME
    record = json.loads(record_file.read_text(encoding="utf-8"))
    if record.get("dev_tsv", False) is None or (dev.is_file() and record.get("dev_tsv") == _tsv_stamp(dev)):
        return
    if dev.is_file() or "dev_tsv" in record:
        print(f"narbench: distillation {out} has a dev.tsv that is not the one it recorded; decoding it again",
              file=sys.stderr)
    decoder = load_teacher(teacher_dir, settings["decoder"], settings["engine"], settings["length_penalty"])
    decoder.warmup_inputs(batch_size)
    write_json(record_file, {**record, **_decode_dev(decoder, task, out, batch_size)})


def _decode_dev(decoder, task: str, out: Path, batch_size: int) -> dict:
    """Write ``dev.tsv``: the teacher's outputs for the whole dev split of ``task``, one ``source\\tteacher output``
    line per dev pair in the split's order, the targets a distilled model's dev NLL is measured on
    (``dev_targets``), as its training targets are the teacher's. Returns the record's fields for it: its stamp
    (``dev_tsv``; None for an empty dev split, which has no file), its sentences and seconds."""
    from suites import catalog

    sources, _ = catalog.load_text(task, "dev")
    if not sources:
        return {"dev_tsv": None}
    start = time.perf_counter()
    hyps = _decode(decoder, sources, batch_size)
    write_lines(out / DEV_NAME, (f"{_clean(s)}\t{h}" for s, h in zip(sources, hyps)))
    return {"dev_examples": len(sources), "dev_seconds": time.perf_counter() - start,
            "dev_tsv": _tsv_stamp(out / DEV_NAME)}


def dev_targets(train_tsv: str | os.PathLike, sources: list[str] | tuple[str, ...]) -> list[str]:
    """The teacher's outputs for ``sources``, the dev split's sources in its order, from the ``dev.tsv`` beside a
    distillation's ``train.tsv``; a one-line ``UserError`` where it is missing or decoded other sources."""
    dev = Path(train_tsv).parent / DEV_NAME
    fix = "run the distillation again (the suite's run, or `narbench train --distill`): it decodes them"
    if not dev.is_file():
        raise UserError(f"distillation {dev.parent} has no teacher outputs for the dev split ({DEV_NAME}), which a "
                        f"distilled model's dev NLL is measured on; {fix}")
    pairs = [line.split("\t", 1) for line in read_lines(dev)]
    if len(pairs) != len(sources) or any(len(p) != 2 or p[0] != _clean(s) for p, s in zip(pairs, sources)):
        raise UserError(f"{dev} holds the teacher's outputs for other dev sources than the task's ({len(pairs)} "
                        f"lines, {len(sources)} sources); delete it and {fix}")
    return [target for _, target in pairs]


def load_teacher(teacher_dir, decoder: str, engine: str, length_penalty: float):
    """The teacher's decoder: narbench's JAX AR decoder, or the checkpoint's CTranslate2 export (exported on
    first use; float32, so it searches as the JAX decoder does) decoding a batch per core, each on one thread:
    on a 2-core Intel Xeon that was 4.1x the sentences a second of one batch at a time on both cores, with the
    same outputs (docs/experiments.md, "The teacher's threads")."""
    name = f"teacher {decoder}" + ("" if engine == defaults.DISTILL_ENGINE else f" ({engine})")
    if engine == "ct2":
        from models import ct2

        return ct2.load_decoder(teacher_dir, decoder, length_penalty=length_penalty, name=name, threads=1,
                                parallel_batches=os.cpu_count() or 1)
    from models.decoders import load_decoder

    return load_decoder(teacher_dir, decoder, length_penalty=length_penalty, name=name)


def _read_timing(out: Path) -> dict:
    """The time and sentences of chunks an interrupted run finished (``timing.json``), else zeros."""
    file = out / TIMING_NAME
    if file.is_file() and any(out.glob("part-*.tsv")):
        return json.loads(file.read_text(encoding="utf-8"))
    return {"seconds": 0.0, "decoded": 0, "decode_seconds": 0.0}


def _decode(decoder, sources: list[str], batch_size: int) -> list[str]:
    """Hypotheses for ``sources`` (same order), decoded in batches of similar lengths; one batch at a time, or
    for a decoder that runs ``parallel_batches`` at a time, one more than that in flight (run, not yet finished:
    2,048 sentences on 2 workers, 486-487 sentences a second against 455-474 with 2 and 468-493 with 4)."""
    order = np.argsort([len(s) for s in sources], kind="stable")
    hyps: list[str] = [""] * len(sources)
    in_flight: collections.deque = collections.deque()      # (source indices, prepared, run's outputs), oldest first
    parallel = getattr(decoder, "parallel_batches", None)
    depth = int(parallel) + 1 if parallel else 1             # one more than run at a time: a worker never waits

    def finish_oldest() -> None:
        ids, prepared, outputs = in_flight.popleft()
        for i, h in zip(ids, decoder.finish(outputs, prepared).hypotheses):
            hyps[i] = _clean(h)

    for start in range(0, len(order), batch_size):
        ids = order[start:start + batch_size]
        prepared = decoder.prepare([sources[i] for i in ids])
        in_flight.append((ids, prepared, decoder.run(prepared)))
        if len(in_flight) >= depth:
            finish_oldest()
    while in_flight:
        finish_oldest()
    return hyps


def _decode_in_chunks(decoder, sources: list[str], picked: np.ndarray, out: Path, batch_size: int,
                      chunk_size: int, progress: bool, timing: dict, start: float) -> tuple[int, float]:
    """Write ``part-NNNNN.tsv`` files (``index\\tsource\\thypothesis``) for the missing chunks of the
    sampled sources (sorted by length); returns the sentences decoded and the seconds it took, this
    run's plus those of an interrupted one (``timing.json``). The first batch of each shape compiles it:
    that time counts."""
    from tqdm.auto import tqdm

    order = picked[np.argsort([len(sources[i]) for i in picked], kind="stable")]   # similar lengths together
    chunks = [order[i:i + chunk_size] for i in range(0, len(order), chunk_size)]
    todo = [(k, ids) for k, ids in enumerate(chunks) if not (out / f"part-{k:05d}.tsv").is_file()]
    decoded, decode_s = int(timing["decoded"]), float(timing["decode_seconds"])
    done = len(order) - sum(len(ids) for _, ids in todo)
    with tqdm(total=len(order), initial=done, disable=not progress, unit="sent",
              desc=f"distill {out.name} ({decoder.name})", dynamic_ncols=True) as bar:
        for k, ids in todo:
            t0 = time.perf_counter()
            hyps = _decode(decoder, [sources[i] for i in ids], batch_size)
            decode_s += time.perf_counter() - t0
            decoded += len(ids)
            write_lines(out / f"part-{k:05d}.tsv", (f"{i}\t{_clean(sources[i])}\t{h}" for i, h in zip(ids, hyps)))
            write_json(out / TIMING_NAME, {"decoded": decoded, "decode_seconds": decode_s,
                                           "seconds": timing["seconds"] + time.perf_counter() - start})
            bar.update(len(ids))
    return decoded, decode_s
