"""Running a latency map: time every missing cell into its run folder, keep the machine rates the cost
model needs, fit the model and write the report (:func:`write_outputs`, after every cell).

Cells run cheapest first and each finished cell is saved whole, so an interrupted map resumes where
it stopped (the same settings, hence the same :meth:`MapSpec.spec_hash`, open the same folder).
"""
from __future__ import annotations

import dataclasses
import json
import shutil
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from bench import store as st
from bench.latency_map.cells import (COST_METHOD, DecoderFactory, cell_rows, device_fields, part_costs,
                                     random_weight_decoders, recost, time_cell)
from bench.latency_map.model import FEATURES, CostModel, apply_model
from bench.latency_map.report import plot_crossover, render
from bench.latency_map.spec import MODEL, PLOT, RATES, ROWS, SUITE, TABLE, MapSpec, read_rows
from narbench_core import lock
from narbench_core.errors import UserError
from narbench_core.io import write_jsonl, write_text

if TYPE_CHECKING:      # jax-importing modules load on first use, so `narbench --help` stays light
    from bench import costs


def run_map(spec: MapSpec, out_root: Path, command: str, factory: DecoderFactory | None = None,
            peaks: costs.MachinePeaks | None = None, env: dict | None = None, platform: str | None = None,
            progress: bool = True, force: bool = False, rates: costs.MachineRates | None = None,
            model: CostModel | None = None, cost_model: bool = True, resume_from: Path | None = None) -> Path:
    """Time every missing cell into ``<out_root>/speedmap/<run_id>/rows.jsonl`` (resuming an unfinished
    run of the same settings, or ``resume_from``: see :func:`adopt`), then fit the cost model and write the
    table and the plot. Without ``cost_model`` no machine rates are measured and no model is fitted (a map on
    a GPU host's short lease: its minutes go to the cells; every roofline and projection column is still
    there)."""
    if spec.calibrate and model is not None:      # before any cell is timed
        raise UserError("a map fits its own cost model on its calibration sizes or is scored by another map's "
                        "(--cost-model), not both")
    if resume_from is not None:
        if force:
            raise UserError("--resume-from goes on with a map and --force starts a new one; keep one")
        adopt(Path(resume_from), spec, Path(out_root), env)
    run, resumed = st.open_run(Path(out_root), SUITE, spec.spec_hash(), spec.to_toml(), command, force=force,
                               report=TABLE)
    try:
        return _run_held(run, spec, factory, peaks, env, platform, progress, rates, model, cost_model)
    finally:
        run.release()


def adopt(source: Path, spec: MapSpec, out_root: Path, env: dict | None) -> Path:
    """Copy an unfinished map timed elsewhere (a GPU run committed under results/, say) into
    ``<out_root>/speedmap/`` so that this map resumes it, timing only its missing cells: the same settings,
    timed on this kind of machine (``check_same_machine``). A copy already there is resumed as it is (it may
    be further along). Refused in one line otherwise, before anything is copied or timed."""
    from bench.measure import env as benv

    flag = f"--resume-from {source}"
    store = st.RunStore(source)
    info = store.info if source.is_dir() else {}
    if info.get("suite") != SUITE or not info.get("run_id"):
        raise UserError(f"{flag}: not a latency map's run folder (no run.json of suite {SUITE}); name a folder "
                        "that holds a map's rows.jsonl and run.json")
    suite_dir = out_root / SUITE
    dest = suite_dir / info["run_id"]        # its own name, whatever the folder is called: the map finds it
    if dest.exists():                        # adopted by an earlier command: resumed (and checked) like any map
        return dest
    if info.get("spec_hash") != spec.spec_hash():
        raise UserError(f"{flag}: its settings (its spec.toml) differ from this command's; give the same "
                        "--sizes, --lengths, --batches and timing options as it was run with")
    rows = read_rows(source / ROWS)
    done = {(r["size"], r["target_length"], r["batch_size"]) for r in rows}
    if all(c.key in done for c in spec.cells()):
        raise UserError(f"{flag}: every cell of it is timed already; nothing to resume")
    if env is not None:
        benv.check_same_machine(store.env(), env, timed=bool(rows),
                                fix="go on with it on that kind of machine, or drop --resume-from to start a new map")
    newer = [d.name for d in suite_dir.glob(f"*-{spec.spec_hash()[:8]}") if d.name > dest.name]
    if newer:
        raise UserError(f"{flag}: {suite_dir} holds a newer map of these settings ({max(newer)}), which would be "
                        "resumed instead; drop --resume-from, or give another --out")
    suite_dir.mkdir(parents=True, exist_ok=True)
    shutil.copytree(source, dest)
    return dest


def _run_held(run: st.RunStore, spec: MapSpec, factory: DecoderFactory | None, peaks: costs.MachinePeaks | None,
              env: dict | None, platform: str | None, progress: bool, rates: costs.MachineRates | None,
              model: CostModel | None, cost_model: bool = True) -> Path:
    """``run_map`` in the map folder this process holds."""
    from bench import costs
    from bench.measure import env as benv

    rows = read_rows(run.path / ROWS)
    if env is not None and (run.path / st.ENV).is_file():      # resumed: its cells were timed on that machine
        benv.check_same_machine(run.env(), env, timed=bool(rows))
    elif env is not None:
        run.write_env(env)
    cpu = (env or run.env()).get("cpu_model", "unknown")
    device = device_fields(env or run.env())
    peaks = peaks or costs.machine_peaks()
    factory = factory or random_weight_decoders(spec)
    systems = spec.systems()
    if any(r.get("cost_method") != COST_METHOD for r in rows):
        rows = recost(rows, spec, factory, peaks)
        write_jsonl(run.path / ROWS, rows)
    done = {(r["size"], r["target_length"], r["batch_size"]) for r in rows}
    todo = [c for c in spec.cells() if c.key not in done]
    bar = None
    if progress and todo:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(todo), unit="cell", desc="speedmap", dynamic_ncols=True)
    for cell in todo:
        if bar is not None:
            bar.set_postfix_str(f"{cell.size} len {cell.length} batch {cell.batch}, compiling")
        decoders = factory(cell, systems)
        label = f"{cell.size} len {cell.length} batch {cell.batch}"
        on_call = None if bar is None else (lambda done, total: bar.set_postfix_str(f"{label}, call {done}/{total}"))
        with lock.busy("timing the latency map"):
            seen = lock.others()
            timed = time_cell(decoders, cell, spec, platform, on_call=on_call)
            seen += lock.others()
        if run.env() or seen:
            run.write_env(benv.record_concurrent(run.env(), benv.concurrent(seen), "the latency map"))
        parts = part_costs(decoders, systems, cell.batch)
        rows = [r for r in rows if (r["size"], r["target_length"], r["batch_size"]) != cell.key]
        rows += cell_rows(cell, systems, timed, parts, peaks, cpu, device)
        write_jsonl(run.path / ROWS, rows)           # whole file: a kill leaves the previous cells intact
        if cost_model:
            ensure_rates(run.path, rows, rates)
        write_outputs(run.path, spec, model)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    if cost_model:
        ensure_rates(run.path, rows, rates)
    write_outputs(run.path, spec, model)
    st.finish_run(run)
    return run.path


def load_rates(run_dir: Path) -> costs.MachineRates | None:
    from bench import costs

    path = run_dir / RATES
    return costs.MachineRates(**json.loads(path.read_text())) if path.is_file() else None


def ensure_rates(run_dir: Path, rows: Sequence[dict], given: costs.MachineRates | None = None) -> None:
    """``machine_rates.json`` in the run folder covers every GEMM shape, batched dot and layout move of
    ``rows``: the ``given`` rates, else measured here for what they lack (``bench.costs.measure_rates``,
    ``measure_dot_rates``, ``measure_move_rates``: about 1.5 s a rate, ~30 s for a GEMM shape's table)."""
    from bench import costs

    stored = load_rates(run_dir)
    have = given or stored
    shapes = sorted({tuple(r["gemm_dims"]) for r in rows})
    missing = [(d, ff) for d, ff in shapes if have is None or f"{d},{ff}" not in have.gemm]
    if missing:
        fresh = costs.measure_rates(missing)
        have = fresh if have is None else dataclasses.replace(have, gemm={**have.gemm, **fresh.gemm})
    if have is None:             # no rows
        return
    dots = sorted({k for r in rows for part in ("encode_dots", "pass_dots") for k in r.get(part, {})} - set(have.dots))
    now = lambda: datetime.now(timezone.utc).isoformat(timespec="seconds")     # when each table was (last) added
    if dots:
        have = dataclasses.replace(have, dots={**have.dots, **costs.measure_dot_rates(dots)},
                                   measured={**have.measured, "dots": now()})
    if not have.moves:
        have = dataclasses.replace(have, moves=costs.measure_move_rates(), measured={**have.measured, "moves": now()})
    if have != stored:
        write_text(run_dir / RATES, json.dumps(asdict(have), indent=2) + "\n")


def write_outputs(run_dir: Path, spec: MapSpec, model: CostModel | None = None) -> None:
    """Fit the cost model on the calibration sizes (once they have enough timed rows), add its
    predictions to ``rows.jsonl`` and write ``speedmap.md`` and ``crossover.png`` (after every cell,
    so an unfinished map can be read). A map with no calibration sizes fits nothing: it is scored by
    ``model`` (fitted in another map), or by the one it was first given (its ``cost_model.json``)."""
    rows = read_rows(run_dir / ROWS)
    if not rows:
        raise UserError(f"{run_dir} has no timed cells; run `narbench latency --map` until some finish")
    fitted = [r for r in rows if r["size"] in spec.calibrate]
    rates = load_rates(run_dir)
    if model is None and not spec.calibrate and (run_dir / MODEL).is_file():
        model = CostModel.load(run_dir / MODEL)
    if model is None and len(fitted) >= len(FEATURES) and rates:
        model = CostModel.fit(rows, rates, spec.calibrate)
    if model is not None and rates:
        rows = apply_model(rows, model, rates)
        write_jsonl(run_dir / ROWS, rows)
        write_text(run_dir / MODEL, json.dumps(asdict(model), indent=2) + "\n")
    plot_crossover(rows, spec, run_dir / PLOT)
    done = {(r["size"], r["target_length"], r["batch_size"]) for r in rows}
    write_text(run_dir / TABLE, render(rows, spec, model, st.RunStore(run_dir).env(),
                                       run_finished=all(c.key in done for c in spec.cells()), rates=rates))
