"""Where the AR-NAR gap goes (issue 52, item 3): decode-time diagnostics of a run's PaDIR systems.

For each chosen PaDIR system of a finished run (by default every JAX PaDIR system at T = 4, k = 1) the same
trained model decodes the run's test sentences again with one thing changed at a time (``VARIANTS``):

- **as run**: nothing changed; its BLEU must be the row's (the diagnostic reproduces the run);
- **oracle length**: every hypothesis at the reference's length (its first reference, in the model's tokens,
  EOS included) instead of the predicted one;
- **keep repeats**: without the paper's last step, which drops consecutive repeated tokens;
- **k = 1, 3, 5, 10** length hypotheses and **T = 4, 10, 20** iterations (those the system does not run);
- **train fit**: BLEU on ``FIT_SENTENCES`` seeded sentences of the model's own training split (a distilled
  model on its distilled targets), and the same for the AR greedy baseline on its own: underfitting shows as
  a low training BLEU, overfitting as a training BLEU far above the test BLEU.

Each variant's BLEU minus the as-run BLEU is how much of the gap (the system's BLEU minus AR greedy's on the
same sentences) that change closes. Records are diagnostics (``gap.jsonl`` in the run folder, marked
``diagnostic``), never rows: no leaderboard lists them. A test split scored against several references
(``test`` and ``test+refs``) is decoded once and scored against each. ``narbench gap RUN`` runs it and
resumes where it stopped; the report renders ``gap.md`` (and the scale page's per-size tables) from the file.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from bench.rows import Row
from narbench_core.markdown import table

GAP_FILE, GAP_PAGE = "gap.jsonl", "gap.md"
K_VALUES = (1, 3, 5, 10)          # length hypotheses tried
T_VALUES = (4, 10, 20)            # refinement iterations tried
FIT_SENTENCES = 500               # training sentences the fit is measured on
FIT_SEED = 0
BATCH = 1                         # sentences per decoder call: the run's batch, so "as run" gives its outputs
                                  # (PaDIR's random start tokens depend on the batch's shape)


@dataclass(frozen=True)
class Variant:
    """One change to how a system decodes (None: the system's own setting)."""

    name: str
    iterations: int | None = None
    length_hyps: int | None = None
    keep_repeats: bool = False
    oracle: bool = False
    train: bool = False           # decodes training sentences (the fit), not the test set


AS_RUN, FIT = "as run", "train fit"


def variants(iterations: int, length_hyps: int) -> list[Variant]:
    """The variants of a system at T = ``iterations`` with k = ``length_hyps``, in the page's column order."""
    return [Variant(AS_RUN), Variant("oracle length", oracle=True), Variant("keep repeats", keep_repeats=True),
            *(Variant(f"k={k}", length_hyps=k) for k in K_VALUES if k != length_hyps),
            *(Variant(f"T={t}", iterations=t) for t in T_VALUES if t != iterations),
            Variant(FIT, train=True)]


def chosen(rows: Sequence[Row], systems: Sequence[str] = ()) -> list[Row]:
    """The rows to diagnose: ``systems`` by id, else every system at T = 4 and k = 1 whose family can decode
    it with those changed (``Family.diagnosed``: JAX PaDIR)."""
    from bench import families

    diagnosable = [r for r in rows if r.bleu is not None and families.get(r.family).diagnosed(r) is not None]
    if systems:
        from narbench_core.errors import UserError

        known = {r.system for r in diagnosable}
        unknown = [s for s in systems if s not in known]
        if unknown:
            raise UserError(f"{unknown[0]!r} is not a scored PaDIR system of this run; choose from "
                            f"{', '.join(sorted(known)[:12])}")
        return [r for r in diagnosable if r.system in set(systems)]
    return [r for r in diagnosable if r.iterations == 4 and r.hypotheses == 1]


# A decoder as the diagnostic needs it: (row, variant, sources, oracle lengths or None) -> hypotheses
Decode = Callable[[Row, Variant, list[str], "list[int] | None"], list[str]]


def diagnose(rows: Sequence[Row], picked: Sequence[Row], decode: Decode, splits: dict[str, tuple[list[str], dict]],
             fit: Callable[[Row], tuple[list[str], list[str]]], lengths: Callable[[Row, list[str]], list[int]],
             bleu: Callable[[Row, list[str], list[list[str]]], float], done: set[tuple] = frozenset(),
             on_record: Callable[[dict], None] = lambda record: None, progress: Callable[[str], None] = print) -> None:
    """Every variant of every ``picked`` system, once per split: ``splits`` maps each split (``task:split``) to
    its sources and ``{test set: reference streams}``; ``fit`` gives a row's model's training sources and
    targets; ``lengths`` a row's oracle lengths of the given references; ``bleu`` scores hypotheses. Records
    go to ``on_record``; those whose key (``keys``) is in ``done`` are skipped (a resumed diagnostic)."""
    by_key = {r.key: r for r in rows}
    once: dict[tuple[str, str], Row] = {}
    for row in picked:
        once.setdefault((row.system, row.test_set.removesuffix("+refs")), row)
    fitted: set[str] = {system for system, _, variant in done if variant == FIT}
    for (system, split), row in once.items():
        if split not in splits:
            continue
        sources, streams = splits[split]
        for v in variants(row.iterations, row.hypotheses):
            if not v.train and (system, split, v.name) in done:
                continue                                # (the fit: per model below, AR greedy's too)
            if not v.train:
                progress(f"gap: {system} {v.name}")
                first = next(iter(streams.values()))[0]                     # the task's own references
                hyps = decode(row, v, sources, lengths(row, first) if v.oracle else None)
                for test_set, refs in streams.items():
                    on_record(_record(row, v, split, test_set, bleu(row, hyps, refs), len(hyps)))
                continue
            for model in (row, by_key.get((row.baseline_system, row.test_set))):
                if model is None or model.system in fitted:
                    continue
                progress(f"gap: {model.system} {v.name}")
                fitted.add(model.system)
                train_sources, targets = fit(model)
                hyps = decode(model, v, train_sources, None)
                on_record(_record(model, v, split, "train", bleu(model, hyps, [targets]), len(hyps)))


def _record(row: Row, v: Variant, split: str, test_set: str, score: float, n: int) -> dict:
    return {"diagnostic": True, "system": row.system, "family": row.family, "size": row.get("size"),
            "split": split, "test_set": test_set, "variant": v.name, "bleu": score, "sentences": n,
            "iterations": v.iterations or row.iterations, "length_hyps": v.length_hyps or row.hypotheses,
            "keep_repeats": v.keep_repeats, "oracle_length": v.oracle}


def keys(records: Iterable[dict]) -> set[tuple]:
    """What a resumed diagnostic skips: (system, split, variant) of the records so far."""
    return {(r["system"], r["split"], r["variant"]) for r in records}


# ------------------------------------------------------------------------------------------- the page

def gap_table(rows: Sequence[Row], records: Sequence[dict], test_set: str) -> list[str]:
    """One line per diagnosed system on ``test_set``: its BLEU and gap to AR greedy (the rows'), the as-run BLEU
    again, how many BLEU points each variant adds to it, and the training-set BLEU of its model and of AR
    greedy's (``FIT``)."""
    by_key = {r.key: r for r in rows}
    here = [r for r in records if r["test_set"] == test_set]
    fits = {r["system"]: r["bleu"] for r in records if r["variant"] == FIT}
    systems = list(dict.fromkeys(r["system"] for r in here))
    changes = list(dict.fromkeys(r["variant"] for r in here if r["variant"] != AS_RUN))
    lines = []
    for system in systems:
        row = by_key.get((system, test_set))
        if row is None:
            continue
        base = by_key.get((row.baseline_system, test_set))
        got = {r["variant"]: r["bleu"] for r in here if r["system"] == system}
        as_run = got.get(AS_RUN)
        lines.append([system, row.get("size") or "–", f"{row.bleu:.2f}",
                      "–" if base is None else f"{row.bleu - base.bleu:+.2f}", _num(as_run),
                      *("–" if got.get(n) is None or as_run is None else f"{got[n] - as_run:+.2f}" for n in changes),
                      _num(fits.get(system)), _num(fits.get(base.system) if base is not None else None)])
    if not lines:
        return []
    header = ["system", "size", "BLEU", "gap to AR greedy", AS_RUN, *(f"{n}: +BLEU" for n in changes),
              "train BLEU", "train BLEU, AR greedy"]
    return table(header, lines, "ll")


def _num(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def render_gap_page(rows: Sequence[Row], records: Sequence[dict], info: dict) -> str:
    """``gap.md``: a table per test set (``gap_table``) with what its columns mean."""
    sets = list(dict.fromkeys(r["test_set"] for r in records if r["test_set"] != "train"))
    lines = [f"# Where the gap goes ({info.get('suite', '')}, run {info.get('run_id', '')})", "",
             "Decode-time diagnostics of the run's PaDIR systems (`narbench gap`; `bench/gap.py`): the same model "
             "decodes the test sentences again with one change at a time. **as run**: no change (it should equal "
             "the row's BLEU). **oracle length**: every hypothesis at the reference's length instead of the "
             "predicted one. **keep repeats**: without the last step that drops consecutive repeated tokens. "
             "**k=..., T=...**: other numbers of length hypotheses and iterations. Each is given as BLEU added to "
             "the as-run BLEU: of the gap to AR greedy, that much is the length, the repeat step, too few "
             f"hypotheses or iterations. **train BLEU**: on {FIT_SENTENCES} seeded sentences of each model's own "
             "training split (a distilled model's targets are the teacher's outputs); a model far below its "
             "training data underfits. These are diagnostics, not systems: no leaderboard lists them.", ""]
    for ts in sets:
        body = gap_table(rows, records, ts)
        if body:
            lines.extend([f"## {ts}", "", *body, ""])
    return "\n".join(lines)


def write_gap_page(run_dir: Path, rows: Sequence[Row], info: dict) -> list[Path]:
    """``gap.md`` from the run's ``gap.jsonl``, where it has one."""
    from narbench_core.io import read_jsonl, write_text

    path = Path(run_dir) / GAP_FILE
    if not path.is_file():
        return []
    write_text(Path(run_dir) / GAP_PAGE, render_gap_page(rows, read_jsonl(path), info))
    return [Path(run_dir) / GAP_PAGE]


# ------------------------------------------------------------------------------------ the real decoders

def fit_indices(n: int, k: int = FIT_SENTENCES, seed: int = FIT_SEED) -> list[int]:
    """The training sentences the fit is measured on: ``k`` seeded draws without replacement, in order."""
    if n <= k:
        return list(range(n))
    return sorted(int(i) for i in np.random.default_rng(seed).choice(n, size=k, replace=False))


def decode_in_batches(decoder, sources: list[str], lengths: list[int] | None = None,
                      batch_size: int = BATCH) -> list[str]:
    """Hypotheses for ``sources`` in their order, decoded in batches of similar length (``lengths``: the oracle
    lengths of each source, for ``run_at_lengths``)."""
    order = np.argsort([len(s) for s in sources], kind="stable")
    out = [""] * len(sources)
    for start in range(0, len(order), batch_size):
        ids = order[start:start + batch_size]
        prepared = decoder.prepare([sources[i] for i in ids])
        raw = (decoder.run(prepared) if lengths is None
               else decoder.run_at_lengths(prepared, [lengths[i] for i in ids]))
        for i, h in zip(ids, decoder.finish(raw, prepared).hypotheses):
            out[i] = h
    return out


def run_gap(run_dir: str | Path, systems: Sequence[str] = (), progress: bool = True) -> Path:
    """Diagnose a finished run's PaDIR systems (``chosen``) into its ``gap.jsonl`` (resuming), then write
    ``gap.md``; returns the run folder."""
    import tomllib

    from bench import families, runner, store
    from bench.families import parse_suite
    from bench.measure.quality import corpus_bleu
    from models.checkpoint import read_meta
    from narbench_core import langs
    from narbench_core.errors import UserError
    from narbench_core.io import read_jsonl, write_jsonl
    from narbench_core.paths import resolve
    from suites import catalog

    run = store.RunStore(store.resolve_run_dir(run_dir, writes=True), allow_finished=True)
    rows = run.rows()
    picked = chosen(rows, systems)
    if not picked:
        raise UserError(f"{run.path} has no scored JAX PaDIR system at T = 4, k = 1; pass --system with one of its "
                        "PaDIR systems")
    gone = sorted({r.system for r in picked if not (resolve(r.checkpoint) / "narbench.json").is_file()})
    for system in gone:
        print(f"narbench: gap: {system}'s checkpoint is not under this data root; left out (re-run the suite to "
              "train it again)", flush=True)
    picked = [r for r in picked if r.system not in gone]
    if not picked:
        raise UserError(f"none of the chosen systems' checkpoints is under this data root ({', '.join(gone)}); "
                        "run the suite there first, or point NARBENCH_DATA at the data root that trained them")
    spec = parse_suite(tomllib.loads(run.spec_text()), str(run.path / store.SPEC), base_dir=run.path)
    deps = runner.real_deps()
    deps.prepare(spec, [])
    splits: dict[str, tuple[list[str], dict]] = {}
    for row in picked:
        split_name = row.test_set.removesuffix("+refs")
        if split_name in splits:
            continue
        task, _, split = split_name.partition(":")
        names = sorted({r.test_set for r in rows if r.test_set.removesuffix("+refs") == split_name})
        data = runner.load_test_data(spec, deps, task, split, multi_ref=any(n.endswith("+refs") for n in names))
        splits[split_name] = (data.sources, {n: data.references if n.endswith("+refs") else data.references[:1]
                                             for n in names})
    decoders: dict[tuple, object] = {}

    def decoder(row: Row, v: Variant):
        changed = families.get(row.family).diagnosed(row, v.iterations, v.length_hyps, v.keep_repeats)
        spec_text, options = changed or (row.decoder, dict(row.decoder_options or {}))    # AR: as it ran
        key = (row.checkpoint, spec_text, tuple(sorted((k, str(x)) for k, x in options.items())))
        if key not in decoders:
            made = families.get(row.family).load_decoder(resolve(row.checkpoint), spec_text, **options)
            made.warmup_inputs(BATCH)                 # fixes the batch size, as the harness's timing does
            decoders[key] = made
        return decoders[key]

    def decode(row: Row, v: Variant, sources: list[str], lengths: list[int] | None) -> list[str]:
        return decode_in_batches(decoder(row, v), sources, lengths)

    def oracle(row: Row, references: list[str]) -> list[int]:
        vocab = decoder(row, Variant(AS_RUN)).vocab
        return [len(vocab.encode(r)) + 1 for r in references]             # EOS included, as the predictor counts

    def fit(row: Row) -> tuple[list[str], list[str]]:
        task = row.task
        if row.distill:
            teacher = next(r for r in rows if r.key == (row.baseline_system, row.test_set))
            task, _ = deps.distill(resolve(teacher.checkpoint), row.task,
                                   **{**spec.distill.kwargs(), "seed": int(row.seed or 0)}, progress=progress)
        trained_on = read_meta(resolve(row.checkpoint)).get("task", task)
        sources, refs = catalog.load_text(trained_on, "train")
        idx = fit_indices(len(sources))
        return [sources[i] for i in idx], [refs[0][i] for i in idx]

    def bleu(row: Row, hyps: list[str], refs: list[list[str]]) -> float:
        return corpus_bleu(hyps, refs, tokenize=langs.bleu_tokenizer(row.target_lang or "en")).score

    path = run.path / GAP_FILE
    records = read_jsonl(path) if path.is_file() else []

    def save(record: dict) -> None:
        records.append(record)
        write_jsonl(path, records)                    # whole file each time: a kill keeps every finished record

    diagnose(rows, picked, decode, splits, fit, oracle, bleu, keys(records), save,
             progress=(lambda line: print(line, flush=True)) if progress else (lambda line: None))
    write_gap_page(run.path, rows, {"suite": rows[0].suite, "run_id": run.run_id})
    return run.path
