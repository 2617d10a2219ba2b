"""Run folders for the theory suites: ``<results>/theory/<name>/<run_id>/`` plus a ``latest`` pointer.

Each folder holds ``config.json``, ``env.json``, ``rows.jsonl`` (one JSON object per cell, each with
``schema_version``, ``experiment``, ``run_id`` and ``env``), ``table.md`` (the page) and PNG plots.
The folder is assembled under a hidden temporary name and renamed into place, so a reader never sees
a half-written run; ``latest`` (one line: the run_id) is replaced atomically afterwards.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping

SCHEMA_VERSION = 1


def environment(seeds: Mapping[str, Any]) -> dict:
    """The same ``env.json`` object as ``narbench run`` writes (bench.env.capture): device, CPU model,
    threads, library versions, git commit with its dirty flag, UTC date and seeds."""
    from bench.env import capture

    return capture(seeds=dict(seeds))


def atomic_write_text(path: Path, text: str) -> None:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def run_id_for(config: Mapping[str, Any], now: _dt.datetime | None = None) -> str:
    """UTC date-time + 8 hex digits of the config hash, e.g. ``20240501T120000Z-1a2b3c4d``."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    digest = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:8]
    return f"{now:%Y%m%dT%H%M%SZ}-{digest}"


def write_run(results_root: Path, name: str, config: Mapping[str, Any], rows: list[dict], page: str,
              figures: Mapping[str, Any], seeds: Mapping[str, Any]) -> Path:
    """Write one finished run folder; returns its path. ``figures`` maps file names to matplotlib
    figures; ``page`` is the markdown body (tables), to which a header and the plots are added."""
    base = Path(results_root) / "theory" / name
    base.mkdir(parents=True, exist_ok=True)
    run_id = run_id_for(config)
    final = base / run_id
    n = 2
    while final.exists():  # never overwrite a finished run
        final = base / f"{run_id}-{n}"
        n += 1
    env = environment(seeds)
    tmp = Path(tempfile.mkdtemp(dir=base, prefix=f".{final.name}.", suffix=".tmp"))
    try:
        (tmp / "config.json").write_text(json.dumps(dict(config), indent=2, default=str) + "\n")
        (tmp / "env.json").write_text(json.dumps(env, indent=2) + "\n")
        with open(tmp / "rows.jsonl", "w", encoding="utf-8") as f:
            for row in rows:
                full = {"schema_version": SCHEMA_VERSION, "experiment": f"theory/{name}",
                        "run_id": final.name, **row, "env": env}
                f.write(json.dumps(full, default=_json_default) + "\n")
        for fname, fig in figures.items():
            fig.savefig(tmp / fname, dpi=120, bbox_inches="tight")
        git = env["git"]
        commit = (git["commit"] or "unknown") + (" (dirty)" if git.get("dirty") else "")
        header = (f"# narbench theory {name}: run {final.name}\n\n"
                  f"{env['date_utc']} · {env['platform']} ({env['cpu_model']}, {env['threads']} threads) · "
                  f"jax {env['versions']['jax']} · python {env['python']} · commit {commit} · "
                  f"seeds {json.dumps(env['seeds'])}\n\n")
        plots = "".join(f"![{f}]({f})\n\n" for f in figures)
        (tmp / "table.md").write_text(header + plots + page)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    atomic_write_text(base / "latest", final.name + "\n")
    return final


def latest_run(results_root: Path, name: str) -> Path | None:
    pointer = Path(results_root) / "theory" / name / "latest"
    if not pointer.exists():
        return None
    return pointer.parent / pointer.read_text().strip()


def _json_default(obj):
    import numpy as np

    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
