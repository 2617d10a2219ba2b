"""Writing a task pack (``suites.packs`` reads it): the seqio task's text, vocabulary and token ids as plain files."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

import numpy as np

from narbench_core.digest import file_digest
from narbench_core.errors import UserError
from narbench_core.io import write_gzip_lines, write_text
from models.batching import load_task_tokens, task_identity, token_cache_path
from suites.packs import FORMAT, MANIFEST, VOCAB, text_file, tokens_file
from suites.taskinfo import SPLITS


def write_pack(task: str, out: str | Path, note: Callable[[str], None] = lambda line: None) -> Path:
    """Write the pack of ``task`` (a built-in or suite task; WMT's own splits import TensorFlow) to ``out``, whole
    or not at all."""
    from suites import tasks

    info = tasks.task_info(task)
    if tasks.source_task(task) != task:
        raise UserError(f"{task} is a distilled task; pack {tasks.source_task(task)} and distil from the pack")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; give a folder")
    if out.is_dir() and any(out.iterdir()) and not (out / MANIFEST).is_file():
        raise UserError(f"--out {out} is a folder with other files in it; give an empty or new folder")
    work = out.with_name(out.name + ".packing")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    manifest = {"format": FORMAT, "task": task, "source_lang": info.source_lang, "target_lang": info.target_lang,
                "family": info.family, "valid_targets": tasks.valid_targets(task, "dev") is not None,
                "splits": {}, "references": {}, "identity": {}, "tokens": {}, "files": {}}
    shutil.copyfile(info.vocab_path, work / VOCAB)
    for split in SPLITS:
        sources, refs = tasks.load_text(task, split)
        manifest["splits"][split] = len(sources)
        manifest["references"][split] = len(refs)
        write_gzip_lines(work / text_file(split), (json.dumps(
            {"source": s, "references": [r[i] for r in refs]}, ensure_ascii=False) + "\n"
            for i, s in enumerate(sources)))
        manifest["identity"][split] = task_identity(task, split)
        if sources:
            pairs = load_task_tokens(task, split)
            with open(work / tokens_file(split), "wb") as f:         # compressed: a third of the cache's size
                np.savez_compressed(f, inputs=pairs.inputs, input_offsets=pairs.input_offsets, targets=pairs.targets,
                                    target_offsets=pairs.target_offsets)
            manifest["tokens"][split] = token_cache_path(task, split).name
        note(f"{split}: {len(sources):,} sentences")
    manifest["files"] = {p.name: file_digest(p) for p in sorted(work.iterdir())}
    write_text(work / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    if out.exists():
        shutil.rmtree(out)
    work.replace(out)
    return out
