"""The results store: one folder per run, written so that a kill at any moment leaves whole files.

Layout (docs/results_format.md, the public contract)::

    <out>/<suite>/latest                 one line: the run_id of the last finished run
    <out>/<suite>/<run_id>/spec.toml     the fully resolved suite spec
                          /env.json      device, CPU, threads, versions, git commit, date, seeds
                          /run.json      status (running|finished), spec hash, command, times
                          /rows.jsonl    one object per (system, test_set)
                          /samples.jsonl one object per (system, test_set, sentence)
                          /curves.jsonl  one object per learning-curve point of each trained model
                          /distill.json  the distillation record (models.distill), keyed by task when
                                         the run distils several tasks (or seeds)

``run_id`` is the UTC date-time plus the first 8 hex digits of the spec hash. Re-running the same
spec reuses the newest *unfinished* run folder of that hash (so it resumes); ``narbench run`` never
modifies a finished run (only ``narbench eval`` adds new test sets to one). Every file is written
whole by ``narbench_core.io`` (temp name in the same folder, fsync, rename); appends rewrite the file
the same way.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.rows import SCHEMA_VERSION, Row
from narbench_core.errors import UserError
from narbench_core.io import read_jsonl, write_json, write_jsonl, write_text
from narbench_core.runs import LATEST, make_run_id, utc_now

CURVES = "curves.jsonl"
SAMPLE_FIELDS = ("system", "test_set", "index", "source", "reference", "hypothesis", "latency_ms", "passes")

ROWS, SAMPLES, ENV, SPEC, RUN, DISTILL = (
    "rows.jsonl", "samples.jsonl", "env.json", "spec.toml", "run.json", "distill.json")


# --------------------------------------------------------------------------------------- run folder


@dataclass
class RunStore:
    """One run folder. Cells are keyed by ``(system, test_set)``."""

    path: Path
    allow_finished: bool = False   # `narbench eval` adds test sets to a finished run

    @property
    def run_id(self) -> str:
        return self.path.name

    @property
    def info(self) -> dict:
        file = self.path / RUN
        return json.loads(file.read_text()) if file.is_file() else {}

    @property
    def finished(self) -> bool:
        return self.info.get("status") == "finished"

    def rows(self) -> list[Row]:
        return [Row.load(r, str(self.path / ROWS)) for r in read_jsonl(self.path / ROWS)]

    def samples(self) -> list[dict]:
        return read_jsonl(self.path / SAMPLES)

    def done_keys(self) -> set[tuple[str, str]]:
        return {r.key for r in self.rows()}

    def save_cells(self, rows: list[Row], samples: list[dict]) -> None:
        """Add (or replace) finished cells: samples are written first, then rows.

        A row's presence marks its cell finished, so a kill between the two writes leaves samples
        without a row, which the next run simply recomputes.
        """
        if self.finished and not self.allow_finished:
            raise UserError(f"run {self.path} is finished and is never modified; start a new run")
        keys = {r.key for r in rows}
        old_samples = [s for s in self.samples() if (s["system"], s["test_set"]) not in keys]
        write_jsonl(self.path / SAMPLES, old_samples + list(samples))
        old_rows = [r for r in self.rows() if r.key not in keys]
        write_jsonl(self.path / ROWS, [dict(r) for r in old_rows + list(rows)])

    def save_distill(self, key: str, record: dict, keyed: bool) -> None:
        """Copy a distillation's record to ``distill.json``: the record itself, or with ``keyed`` (the run
        distils several tasks or seeds) one entry per ``key`` beside the others."""
        file = self.path / DISTILL
        if keyed:
            record = {**(json.loads(file.read_text()) if file.is_file() else {}), key: record}
        write_json(file, record)

    def curves(self) -> list[dict]:
        """``curves.jsonl``: learning-curve points of the run's trained models (``bench.measure.learning``)."""
        return read_jsonl(self.path / CURVES)

    def save_curve(self, model: str, records: list[dict]) -> None:
        """Set the curve points of ``model`` (replacing any it had)."""
        if self.finished and not self.allow_finished:
            raise UserError(f"run {self.path} is finished and is never modified; start a new run")
        write_jsonl(self.path / CURVES, [r for r in self.curves() if r["model"] != model] + list(records))

    def update_info(self, **changes: Any) -> None:
        write_json(self.path / RUN, {**self.info, **changes, "updated": utc_now().isoformat()})

    def write_env(self, env: dict) -> None:
        write_json(self.path / ENV, env)

    def env(self) -> dict:
        file = self.path / ENV
        return json.loads(file.read_text()) if file.is_file() else {}

    def spec_text(self) -> str:
        file = self.path / SPEC
        return file.read_text(encoding="utf-8") if file.is_file() else ""

    def spec_settings(self) -> dict[str, int]:
        """The recorded spec's settings that the figures depend on: bootstrap resamples and seed."""
        import tomllib

        spec = tomllib.loads(self.spec_text())
        if "bootstrap_resamples" not in spec or not spec.get("seeds"):
            raise UserError(f"{self.path / SPEC} is missing or incomplete; the run folder is damaged: re-run "
                            "the suite with `narbench run --force`")
        return {"bootstrap_resamples": int(spec["bootstrap_resamples"]), "seed": int(spec["seeds"][0])}


def open_run(out_root: Path, suite: str, spec_hash: str, spec_toml: str, command: str,
             force: bool = False, now: datetime | None = None) -> tuple[RunStore, bool]:
    """The run folder for this spec: the newest unfinished one of the same hash, else a new one.

    ``force`` always starts a new folder. Returns ``(store, resumed)``.
    """
    suite_dir = Path(out_root) / suite
    if not force:
        for candidate in sorted(suite_dir.glob(f"*-{spec_hash[:8]}"), reverse=True):
            store = RunStore(candidate)
            info = store.info
            if info.get("spec_hash") == spec_hash and info.get("status") != "finished":
                for stale in candidate.glob(".*.tmp"):  # temp files of a write that was killed
                    stale.unlink()
                store.update_info(command=command, resumed_at=utc_now().isoformat())
                return store, True
    run_id = make_run_id(spec_hash, now)
    path = suite_dir / run_id
    n = 1
    while path.exists():  # two starts within one second
        n += 1
        path = suite_dir / f"{run_id}.{n}"
    path.mkdir(parents=True)
    store = RunStore(path)
    write_text(path / SPEC, spec_toml)
    store.update_info(schema_version=SCHEMA_VERSION, suite=suite, run_id=path.name, spec_hash=spec_hash,
                      status="running", command=command, started=utc_now().isoformat())
    return store, False


def finish_run(store: RunStore) -> None:
    """Mark the run finished and point ``<suite>/latest`` at it (atomically)."""
    store.update_info(status="finished", finished=utc_now().isoformat())
    write_text(store.path.parent / LATEST, store.run_id + "\n")


def resolve_run_dir(arg: str | Path) -> Path:
    """A run folder from a run folder, a suite folder (its ``latest``) or a ``latest`` file."""
    path = Path(arg)
    if path.is_file() and path.name == LATEST:
        path = path.parent
    if path.is_dir() and not (path / ROWS).exists() and not (path / RUN).exists() and (path / LATEST).is_file():
        path = path / (path / LATEST).read_text().strip()
    if not path.is_dir() or not ((path / RUN).is_file() or (path / ROWS).is_file()):
        raise UserError(f"{arg} is not a run folder; pass results/<suite>/<run_id> or results/<suite> "
                        "(its latest run), e.g. from `narbench run`")
    return path


# ------------------------------------------------------------------------------------------ loaders

def load_rows(run_dir: str | Path):
    """``rows.jsonl`` of a run as a pandas DataFrame (one row per system and test set)."""
    import pandas as pd

    return pd.DataFrame([dict(r) for r in RunStore(resolve_run_dir(run_dir)).rows()])


def load_samples(run_dir: str | Path):
    """``samples.jsonl`` of a run as a pandas DataFrame (one row per system, test set, sentence)."""
    import pandas as pd

    return pd.DataFrame(read_jsonl(resolve_run_dir(run_dir) / SAMPLES))
