"""Run folders for the theory suites: ``<results>/theory/<name>/<run_id>/`` plus a ``latest`` pointer.

Each folder holds ``config.json``, ``env.json``, ``rows.jsonl`` (one JSON object per cell, each with
``schema_version``, ``experiment``, ``run_id`` and ``env``), ``table.md`` (the page) and PNG plots.
Run ids and the ``latest`` pointer are every results writer's (``narbench_core.runs``); every file is
written by ``narbench_core.io``; ``env.json`` is what the caller captured (``narbench theory`` passes
``bench.measure.env.capture``, the same object as ``narbench run`` writes). The folder is assembled under a hidden temporary name and renamed into place,
so a reader never sees a half-written run; ``latest`` (one line: the run_id) is replaced atomically
afterwards.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
from pathlib import Path
from typing import Any, Mapping

from narbench_core.digest import json_digest
from narbench_core.io import atomic_path, json_default, write_json, write_jsonl, write_text
from narbench_core.runs import LATEST, check_name, make_run_id

SCHEMA_VERSION = 1   # of the theory rows (the suites' rows have their own)


def run_id_for(config: Mapping[str, Any], now: _dt.datetime | None = None) -> str:
    """UTC date-time + 8 hex digits of the config hash, e.g. ``20240501T120000Z-1a2b3c4d``."""
    return make_run_id(json_digest(config, default=json_default), now)


def write_run(results_root: Path, name: str, config: Mapping[str, Any], rows: list[dict], page: str,
              figures: Mapping[str, Any], env: Mapping[str, Any]) -> Path:
    """Write one finished run folder; returns its path. ``figures`` maps file names to matplotlib
    figures; ``page`` is the markdown body (tables), to which a header and the plots are added; ``env``
    is the environment (device, CPU model, threads, versions, git commit, UTC date, seeds)."""
    base = Path(results_root) / "theory" / check_name(name, "theory experiment name")
    base.mkdir(parents=True, exist_ok=True)
    run_id = run_id_for(config)
    final = base / run_id
    n = 2
    while final.exists():  # never overwrite a finished run
        final = base / f"{run_id}-{n}"
        n += 1
    env = dict(env)
    tmp = base / f".{final.name}.{os.getpid()}.tmp"
    tmp.mkdir()                                    # the umask's permissions, like the store's folders
    try:
        write_json(tmp / "config.json", dict(config))
        write_json(tmp / "env.json", env)
        write_jsonl(tmp / "rows.jsonl", ({"schema_version": SCHEMA_VERSION, "experiment": f"theory/{name}",
                                          "run_id": final.name, **row, "env": env} for row in rows))
        for fname, fig in figures.items():
            with atomic_path(tmp / fname, suffix=Path(fname).suffix) as path:
                fig.savefig(path, dpi=120, bbox_inches="tight")
        git = env["git"]
        commit = (git["commit"] or "unknown") + (" (dirty)" if git.get("dirty") else "")
        header = (f"# narbench theory {name}: run {final.name}\n\n"
                  f"{env['date_utc']} · {env['platform']} ({env['cpu_model']}, {env['threads']} threads) · "
                  f"jax {env['versions']['jax']} · python {env['python']} · commit {commit} · "
                  f"seeds {json.dumps(env['seeds'])}\n\n")
        plots = "".join(f"![{f}]({f})\n\n" for f in figures)
        write_text(tmp / "table.md", header + plots + page)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    write_text(base / LATEST, final.name + "\n")
    return final


def latest_run(results_root: Path, name: str) -> Path | None:
    pointer = Path(results_root) / "theory" / name / LATEST
    if not pointer.exists():
        return None
    return pointer.parent / pointer.read_text().strip()
