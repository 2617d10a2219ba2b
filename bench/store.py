"""The results store: one folder per run, written so that a kill at any moment leaves whole files.

Layout (docs/results_format.md, the public contract)::

    <out>/<suite>/latest                 one line: the run_id of the last finished run
    <out>/<suite>/<run_id>/spec.toml     the fully resolved suite spec
                          /env.json      device, CPU, threads, versions, git commit, date, seeds
                          /run.json      status (running|finished), spec hash, command, times
                          /rows.jsonl    one object per (system, test_set)
                          /samples.jsonl.gz one object per (system, test_set, sentence), gzip
                                         (runs before 2026-11-29: samples.jsonl, plain; read alike, and
                                         written compressed when such a run resumes)
                          /curves.jsonl  one object per learning-curve point of each trained model
                          /distill.json  the distillation record (models.distill), keyed by task when
                                         the run distils several tasks (or seeds)
                          /serving.jsonl one object per LoadGen test of a served system (bench.serving)
                          /serving/      LoadGen's summary and detail logs, <system>/<test>/
                          /serving.md    the serving page (bench.serving.report)
                          /cells.json    the last session's jobs (trainings, distillations, evaluations)
                                         and their states, host, attempt (`narbench status`)
                          /logs/         with --executor ray: each job's output, <job>.<attempt>.log

``run_id`` is the UTC date-time plus the first 8 hex digits of the spec hash. Re-running the same
spec reuses the newest *unfinished* run folder of that hash (so it resumes); a run is finished once
its report is written (``finish_run`` comes after it), and a run marked finished whose report is
missing, or whose ``rows.jsonl`` / samples end in a line cut off mid-write (a gzip cut off), counts as
unfinished: it resumes, the cut line is dropped, the cells it leaves incomplete are computed again and
the report is written. Otherwise ``narbench run`` never modifies a finished run (only ``narbench eval``
adds new test sets to one). Every file is written whole by ``narbench_core.io`` (temp name in the same
folder, fsync, rename); appends rewrite the file the same way.

One process at a time holds a run folder (``narbench_core.lock``): ``open_run`` locks the folder it
returns (``RunStore.release`` unlocks it); ``narbench eval`` and ``report`` hold the folder they write
with ``narbench_core.lock.hold``. A second process is refused with one line naming the holder.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

from bench.rows import SCHEMA_VERSION, Row, paired_test_figures
from narbench_core import lock
from narbench_core.errors import UserError
from narbench_core.io import (gunzip_prefix, parse_jsonl, read_jsonl, write_bytes, write_gzip_lines, write_json, write_jsonl,
                               write_text)
from narbench_core.runs import LATEST, check_name, make_run_id, utc_now

CURVES = "curves.jsonl"
SERVING, SERVING_LOGS = "serving.jsonl", "serving"   # bench.serving: its records and LoadGen's logs
CELLS = "cells.json"           # the driver's view of the run's jobs (bench.executors.Board; `narbench status`)
LOGS = "logs"                  # a Ray run's job logs, <job>.<attempt>.log (bench.executors.raycluster)
SAMPLE_FIELDS = ("system", "test_set", "index", "source", "reference", "hypothesis", "latency_ms", "passes")

ROWS, SAMPLES, ENV, SPEC, RUN, DISTILL = (
    "rows.jsonl", "samples.jsonl.gz", "env.json", "spec.toml", "run.json", "distill.json")
PLAIN_SAMPLES = "samples.jsonl"   # an older run's samples, uncompressed (``RunStore.samples_name``)
REPORT = "leaderboard.md"      # the report page written last (bench.report.write_report)


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
        return _json_object(self.path / RUN)

    @property
    def finished(self) -> bool:
        return self.info.get("status") == "finished"

    def _records(self, name: str) -> list[dict]:
        """A JSON-lines file of the run; one whose last line was cut off mid-write names the fix."""
        path = self.path / name
        if name.endswith(".gz") and path.is_file():              # one decompression when the file is whole
            data, whole = gunzip_prefix(path)
            if whole and (not data or data.endswith(b"\n")):
                return parse_jsonl(data, path)
        if torn_tail(path) is not None:
            command = self.info.get("command", "narbench run")
            raise UserError(f"{path}: its last line was cut off mid-write; re-run `{command}` to drop it and "
                            "compute that cell again")
        return read_jsonl(path)

    def rows(self) -> list[Row]:
        return [Row.load(r, str(self.path / ROWS)) for r in self._records(ROWS)]

    @property
    def samples_name(self) -> str:
        """The run's samples file: ``samples.jsonl.gz``, or an older run's plain ``samples.jsonl``."""
        return PLAIN_SAMPLES if (self.path / PLAIN_SAMPLES).is_file() and not (self.path / SAMPLES).is_file() \
            else SAMPLES

    def samples(self) -> list[dict]:
        return self._records(self.samples_name)

    def cells(self, samples: list[dict] | None = None) -> dict[tuple[str, str], list[dict]]:
        """The samples (the run's unless given) by ``(system, test_set)``, in sentence order."""
        groups: dict[tuple[str, str], list[dict]] = {}
        for s in self.samples() if samples is None else samples:
            groups.setdefault((s["system"], s["test_set"]), []).append(s)
        for g in groups.values():
            g.sort(key=lambda s: s["index"])
        return groups

    def report_rows(self, samples: list[dict] | None = None) -> list[Row]:
        """``rows()``, with sacrebleu's paired tests (``bench.rows.PAIRED_TEST_FIELDS``) computed from the
        samples for rows written before narbench ran them: what the report pages show. ``rows.jsonl``
        is left as it is (``bench.verify.verify_run`` checks the rows that carry the tests)."""
        rows = self.rows()
        if all(r.bleu_p_ar is not None or r.bleu_delta_vs_ar is None for r in rows):
            return rows
        cells = self.cells(samples)
        resamples = self.spec_settings()["bootstrap_resamples"]
        out = []
        for row in rows:
            g, base = cells.get(row.key), cells.get((row.baseline_system, row.test_set))
            if (row.bleu_p_ar is None and row.bleu_delta_vs_ar is not None and g and base
                    and [s["index"] for s in base] == [s["index"] for s in g]):
                row = Row.load({**row, **paired_test_figures([s["hypothesis"] for s in g],
                                                             [s["hypothesis"] for s in base], references(g),
                                                             row.target_lang, resamples)})
            out.append(row)
        return out

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
        (self.path / PLAIN_SAMPLES).unlink(missing_ok=True)       # an older run's plain file, now compressed
        old_rows = [r for r in self.rows() if r.key not in keys]
        write_jsonl(self.path / ROWS, [dict(r) for r in old_rows + list(rows)])

    def serving(self) -> list[dict]:
        """``serving.jsonl``: one record per LoadGen test (``bench.serving.rows``); a column an older run's records
        lack reads as None."""
        from bench.serving.rows import record

        return [record(r) for r in self._records(SERVING)]

    def served_keys(self) -> set[tuple[str, str]]:
        return {(r["system"], r["test_set"]) for r in self.serving()}

    def save_serving(self, records: list[dict]) -> None:
        """Add (or replace) served systems' records, keyed by ``(system, test_set)``; a system's records are
        written together once all of its LoadGen tests ran, so a killed serving run resumes at that system."""
        if self.finished and not self.allow_finished:
            raise UserError(f"run {self.path} is finished and is never modified; start a new run")
        keys = {(r["system"], r["test_set"]) for r in records}
        write_jsonl(self.path / SERVING, [r for r in self.serving() if (r["system"], r["test_set"]) not in keys]
                    + list(records))

    def save_distill(self, key: str, record: dict, keyed: bool) -> None:
        """Copy a distillation's record to ``distill.json``: the record itself, or with ``keyed`` (the run
        distils several tasks or seeds) one entry per ``key`` beside the others."""
        file = self.path / DISTILL
        if keyed:
            record = {**_json_object(file), key: record}
        write_json(file, record)

    def curves(self) -> list[dict]:
        """``curves.jsonl``: learning-curve points of the run's trained models (``bench.measure.learning``)."""
        return self._records(CURVES)

    def save_curve(self, model: str, records: list[dict]) -> None:
        """Set the curve points of ``model`` (replacing any it had)."""
        if self.finished and not self.allow_finished:
            raise UserError(f"run {self.path} is finished and is never modified; start a new run")
        write_jsonl(self.path / CURVES, [r for r in self.curves() if r["model"] != model] + list(records))

    def save_board(self, board: dict) -> None:
        """Set ``cells.json``: every job of this session and its state (``bench.executors.Board``)."""
        write_json(self.path / CELLS, board)

    def board(self) -> dict | None:
        """``cells.json`` (None before a run has one)."""
        return _json_object(self.path / CELLS) if (self.path / CELLS).is_file() else None

    def update_info(self, **changes: Any) -> None:
        write_json(self.path / RUN, {**self.info, **changes, "updated": utc_now().isoformat()})

    def write_env(self, env: dict) -> None:
        write_json(self.path / ENV, env)

    def env(self) -> dict:
        return _json_object(self.path / ENV)

    def spec_table(self) -> dict:
        """The recorded spec, parsed ({} without one); a damaged one is one line naming it."""
        import tomllib

        try:
            return tomllib.loads(self.spec_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
            raise UserError(f"{self.path / SPEC} is damaged ({str(err).splitlines()[0]}); restore it, or delete the run "
                            f"folder {self.path} and re-run its suite") from None

    def spec_text(self) -> str:
        file = self.path / SPEC
        return file.read_text(encoding="utf-8") if file.is_file() else ""

    def incomplete(self, report: str | None = REPORT) -> str | None:
        """Why a run marked finished is not (its ``report`` page is missing, or a JSON-lines file ends in
        a cut-off line), or None."""
        if report is not None and not (self.path / report).is_file():
            return f"its {report} is missing"
        torn = [name for name in (ROWS, self.samples_name, CURVES, SERVING) if torn_tail(self.path / name) is not None]
        return f"the last line of {torn[0]} was cut off" if torn else None

    def repair(self) -> None:
        """Drop a cut-off last line of each JSON-lines file, then the rows whose cell lacks samples (those
        cells are computed again)."""
        for name in (ROWS, self.samples_name, CURVES, SERVING):
            path = self.path / name
            cut = torn_tail(path)
            if cut is not None and name.endswith(".gz"):
                write_gzip_lines(path, [gunzip_prefix(path)[0][:cut]])
            elif cut is not None:
                with open(path, "rb") as f:
                    write_bytes(path, f.read(cut))
        if not (self.path / self.samples_name).is_file():
            return
        have: dict[tuple[str, str], int] = {}
        for s in self.samples():
            key = (s["system"], s["test_set"])
            have[key] = have.get(key, 0) + 1
        rows = self.rows()
        whole = [r for r in rows if r.get("n_sentences") is None or have.get(r.key, 0) == r.get("n_sentences")]
        if len(whole) < len(rows):
            write_jsonl(self.path / ROWS, [dict(r) for r in whole])

    def release(self) -> None:
        """End this process's hold of the run folder (``open_run`` took it)."""
        lock.release(self.path)

    def spec_settings(self) -> dict[str, int]:
        """The recorded spec's settings that the figures depend on: the paired bootstrap's resamples."""
        spec = self.spec_table()
        if "bootstrap_resamples" not in spec or not spec.get("seeds"):
            raise UserError(f"{self.path / SPEC} is missing or incomplete; the run folder is damaged: re-run "
                            "the suite with `narbench run --force`")
        return {"bootstrap_resamples": int(spec["bootstrap_resamples"])}

    def serving_settings(self) -> dict:
        """The recorded spec's ``[serving]`` section with its defaults filled in ({} for a run without one)."""
        import dataclasses

        from suites.spec import ServingSpec

        table = self.spec_table().get("serving")
        if table is None:
            return {}
        before = {"group_by_length": False}      # keys added later: what a run recorded without them did
        return {**dataclasses.asdict(ServingSpec()), **before, **table}


def references(cell: list[dict]) -> list[list[str]]:
    """A cell's reference streams (``references[k][i]``) from its samples in sentence order: each
    sample's ``references``, or its one ``reference`` (samples of single-reference test sets)."""
    if "references" not in cell[0]:
        return [[s["reference"] for s in cell]]
    return [[s["references"][k] for s in cell] for k in range(len(cell[0]["references"]))]


def _json_object(path: Path) -> dict:
    """A run folder's JSON file as a dict ({} when absent); a damaged one is one line naming it and the fix."""
    try:
        value = json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        return {}
    except (ValueError, IsADirectoryError) as err:       # JSONDecodeError and UnicodeDecodeError are ValueErrors
        why = err.msg if isinstance(err, json.JSONDecodeError) else type(err).__name__
        raise UserError(f"{path} is damaged (not valid JSON: {why}); restore it, or delete the run folder "
                        f"{path.parent} and re-run its suite") from None
    if not isinstance(value, dict):
        raise UserError(f"{path} is damaged (not a JSON object); restore it, or delete the run folder {path.parent} "
                        "and re-run its suite")
    return value


def torn_tail(path: Path) -> int | None:
    """Where the whole lines of a JSON-lines file end when its last line was cut off mid-write (no
    newline, not valid JSON, but the start of a record: text opening with ``{`` after a whole line that is
    valid JSON), else None (also for a missing file, and for a damaged one, which ``read_jsonl`` names as
    not valid JSON). For a gzip file (``.gz``) the offset is into its content: a gzip cut off is a cut-off
    line too, its whole lines what can still be read."""
    if str(path).endswith(".gz"):
        return _torn_gzip(Path(path))
    try:
        f = open(path, "rb")
    except (FileNotFoundError, IsADirectoryError):
        return None
    with f:
        end = f.seek(0, os.SEEK_END)
        if end == 0:
            return None
        f.seek(end - 1)
        if f.read(1) == b"\n":
            return None
        pos, tail = end, b""
        while pos > 0 and b"\n" not in tail:
            step = min(1 << 16, pos)
            pos -= step
            f.seek(pos)
            tail = f.read(step) + tail
        cut = tail.rfind(b"\n") + 1           # 0 when the file is one line
        try:
            json.loads(tail[cut:].decode("utf-8"))
            return None
        except ValueError:                     # UnicodeDecodeError is one
            pass
        if not _record_start(tail[cut:]) or (pos + cut > 0 and not _whole_line_before(f, pos + cut)):
            return None                        # not a record cut short: the file is damaged, not torn
        return pos + cut


def _torn_gzip(path: Path) -> int | None:
    """``torn_tail`` of a gzip JSON-lines file: the content is read once; a whole file whose content ends in a
    newline (the usual case) needs no line check."""
    import io

    if not path.is_file():
        return None
    data, whole = gunzip_prefix(path)
    if whole and (not data or data.endswith(b"\n")):
        return None
    cut = data.rfind(b"\n") + 1
    if not whole:                          # cut off: its whole lines are what is left, if they are records
        return cut if cut == 0 or _whole_line_before(io.BytesIO(data), cut) else None
    try:
        json.loads(data[cut:].decode("utf-8"))
        return None
    except ValueError:
        pass
    if not _record_start(data[cut:]) or (cut > 0 and not _whole_line_before(io.BytesIO(data), cut)):
        return None
    return cut


def _record_start(text: bytes) -> bool:
    """``text`` could be a JSON record cut short: it opens with ``{`` and is UTF-8 but for a character cut at its end."""
    if not text.startswith(b"{"):
        return False
    for cut in range(4):
        try:
            text[:len(text) - cut].decode("utf-8")
            return True
        except UnicodeDecodeError:
            continue
    return False


def _whole_line_before(f, end: int) -> bool:
    """The whole line ending at ``end`` (just after its newline) is valid JSON."""
    start = max(0, end - (1 << 20))
    f.seek(start)
    block = f.read(end - start)[:-1]
    line = block[block.rfind(b"\n") + 1:]
    try:
        json.loads(line.decode("utf-8"))
        return True
    except ValueError:
        return False


def open_run(out_root: Path, suite: str, spec_hash: str, spec_toml: str | Callable[[Path], str], command: str,
             force: bool = False, now: datetime | None = None, report: str | None = REPORT,
             doing: str | None = None) -> tuple[RunStore, bool]:
    """The run folder for this spec, locked for this process: the newest unfinished one of the same hash
    (a finished one whose ``report`` page is missing or whose files end in a cut-off line counts as
    unfinished and is repaired), else a new one.

    ``spec_toml`` is the spec's text, or a function of the new run folder giving it. ``force`` always
    starts a new folder. The lock says the process does ``doing`` (default: ``command``, which resumes the run).
    Returns ``(store, resumed)``; ``store.release()`` ends the hold. A folder held by another live process raises
    ``narbench_core.lock.Locked``.
    """
    check_name(suite, "suite name")
    suite_dir = Path(out_root) / suite
    if not force:
        for candidate in sorted(suite_dir.glob(f"*-{spec_hash[:8]}"), reverse=True):
            if candidate.is_symlink():                  # never resumed: its writes would land outside the tree
                print(f"narbench: skipping run folder {candidate}: it is a link (to {os.readlink(candidate)})",
                      file=sys.stderr)
                continue
            store = RunStore(candidate)
            try:
                if not _resumable(store, spec_hash, report):
                    continue
            except UserError as err:                    # a damaged old folder never blocks a new run
                print(f"narbench: skipping a damaged run folder: {err}", file=sys.stderr)
                continue
            lock.acquire(candidate, doing or command)
            try:
                if not _resumable(store, spec_hash, report):   # finished meanwhile by the process that held it
                    store.release()
                    continue
                for stale in candidate.glob(".*.tmp"):   # temp files of a write that was killed (no other
                    stale.unlink()                      # process writes here: this one holds the folder)
                store.repair()
                store.update_info(command=command, resumed_at=utc_now().isoformat(), status="running")
            except BaseException:
                store.release()
                raise
            return store, True
    run_id = make_run_id(spec_hash, now)
    path = suite_dir / run_id
    n = 1
    while True:
        try:
            path.mkdir(parents=True)
            break
        except FileExistsError:                  # two starts within one second
            n += 1
            path = suite_dir / f"{run_id}.{n}"
    lock.acquire(path, doing or command)         # before run.json exists: no other process resumes it
    store = RunStore(path)
    try:
        write_text(path / SPEC, spec_toml if isinstance(spec_toml, str) else spec_toml(path))
        store.update_info(schema_version=SCHEMA_VERSION, suite=suite, run_id=path.name, spec_hash=spec_hash,
                          status="running", command=command, started=utc_now().isoformat())
    except BaseException:
        store.release()
        raise
    return store, False


def _resumable(store: RunStore, spec_hash: str, report: str | None) -> bool:
    """The run folder is this spec's and not finished; a damaged one (a file a resumed run reads cannot be
    parsed) raises a ``UserError`` naming the file."""
    info = store.info
    if info.get("spec_hash") != spec_hash or (info.get("status") == "finished" and store.incomplete(report) is None):
        return False
    store.env(), store.board(), store.spec_table()       # what resuming reads: damaged ones are named now
    return True


def finished_runs(out_root: Path, suite: str, spec_hash: str) -> list[Path]:
    """The finished run folders of this spec in the suite's folder, oldest first (damaged ones left out)."""
    out = []
    for candidate in sorted((Path(out_root) / suite).glob(f"*-{spec_hash[:8]}")):
        try:
            info = RunStore(candidate).info
        except UserError:
            continue
        if info.get("spec_hash") == spec_hash and info.get("status") == "finished":
            out.append(candidate)
    return out


def finish_run(store: RunStore, finished: str | None = None) -> None:
    """Mark the run finished (at ``finished``, an ISO time: the one its report states; default now) and point
    ``<suite>/latest`` at it (atomically): after its report is written."""
    store.update_info(status="finished", finished=finished or utc_now().isoformat())
    write_text(store.path.parent / LATEST, store.run_id + "\n")


def newest_run_dir(suite_dir: Path) -> Path | None:
    """The newest run folder in a suite's folder, finished or not (a run id starts with its UTC start time, so
    names sort by age); None where it holds none."""
    runs = sorted(p for p in suite_dir.iterdir() if p.is_dir() and (p / RUN).is_file()) if suite_dir.is_dir() else []
    return runs[-1] if runs else None


def resolve_run_dir(arg: str | Path, writes: bool = False, newest: bool = False) -> Path:
    """A run folder from a run folder, a suite folder (its ``latest``, the newest finished run; with ``newest``
    its newest run, finished or not: what ``narbench status`` reads) or a ``latest`` file. For a command that
    ``writes`` into it, a run folder that is a link is one line: no command writes through a link out of the
    results tree."""
    path = Path(arg)
    if path.is_file() and path.name == LATEST:
        path = path.parent
    is_suite = path.is_dir() and not (path / ROWS).exists() and not (path / RUN).exists()
    newest_dir = newest_run_dir(path) if is_suite and newest else None
    if newest_dir is not None:
        path = newest_dir
    elif is_suite and (path / LATEST).is_file():
        name = (path / LATEST).read_text(encoding="utf-8", errors="replace").strip()
        if not name or name in (".", "..") or "/" in name or "\\" in name or name.startswith("."):
            raise UserError(f"{path / LATEST} points at {name[:80]!r}, not a run folder of its suite; write the "
                            "name of one of the folders beside it into it, or delete it")
        path = path / name
    if not path.is_dir() or not ((path / RUN).is_file() or (path / ROWS).is_file()):
        unfinished = newest_run_dir(path) if is_suite else None
        if unfinished is not None:
            raise UserError(f"{arg} has no finished run yet (no {LATEST} file); pass one of its run folders, e.g. "
                            f"{unfinished}, or see where it stands: narbench status {arg}")
        raise UserError(f"{arg} is not a run folder; pass results/<suite>/<run_id> or results/<suite> "
                        "(its latest run), e.g. from `narbench run`")
    if writes and path.is_symlink():
        raise UserError(f"{path} is a link (to {os.readlink(path)}); narbench writes only into run folders "
                        "themselves, never through a link: pass the folder it points at")
    return path


# ------------------------------------------------------------------------------------------ loaders

def load_rows(run_dir: str | Path):
    """``rows.jsonl`` of a run as a pandas DataFrame (one row per system and test set)."""
    import pandas as pd

    return pd.DataFrame([dict(r) for r in RunStore(resolve_run_dir(run_dir)).rows()])


def load_samples(run_dir: str | Path):
    """The samples of a run (``samples.jsonl.gz``, or an older run's ``samples.jsonl``) as a pandas DataFrame (one row per system, test set, sentence)."""
    import pandas as pd

    return pd.DataFrame(RunStore(resolve_run_dir(run_dir)).samples())
