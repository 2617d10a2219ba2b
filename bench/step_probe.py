"""``narbench plan --probe``: time a train step of each model a suite still has to train, on this machine.

A plan's seconds per step otherwise come from other trainings (``bench.estimate``): the same model shape
trained before, perhaps while the machine did other work, or another size scaled by its work per token (its
matrices: the step's other costs do not scale so). A probe compiles the cell's train step for every
batch shape its data has and times a few steps of each (``models.train.seconds_per_step``: the machine
probes' protocol, weighted by how many batches of each shape an epoch has), on the task's own training data;
cells of one family, task, model shape, batch tokens and work per step share one probe (a distilled model
steps as its raw twin does). Each probe is written under the data root (``bench.estimate.probe_file``: one
JSON record per key, the newest kept) with the machine it ran on, and the estimator prefers it to every
measure but a partial training's own rate.

A probe is a timing: it refuses to start while another narbench process of this data root is busy (training,
timing) and not stopped (``kill -STOP`` pauses one), and a probe during which other processes took more than
``defaults.BUSY_SHARE`` of the CPU is reported and not kept.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from bench import estimate as est
from bench import families
from narbench_core import defaults
from narbench_core.errors import UserError


@dataclass(frozen=True)
class Wanted:
    """A probe a plan needs: its key (``bench.estimate.probe_key``), the first cell that asked and its configs."""

    key: tuple
    label: str
    model_config: Any
    train_config: Any


def wanted(shown: Any, locator: Any) -> tuple[list[Wanted], list[str]]:
    """The probes ``shown`` (a ``bench.preview.Preview``) needs: one per key of its cells still to train or of
    unknown budget (a partial training has its own rate), and why each cell that cannot be probed yet cannot
    (its task's data or vocabulary is not prepared: ``locator.not_ready``)."""
    from bench.preview import TO_TRAIN, UNKNOWN, cell_shape

    spec, out, skipped = shown.spec, {}, []
    for preview in shown.cells:
        cell = preview.cell
        fam = families.get(cell.family)
        if preview.state not in (TO_TRAIN, UNKNOWN) or not fam.trains:
            continue
        why = locator.not_ready(cell.task)
        if why is not None:
            skipped.append(f"{cell.label}: {why}")
            continue
        key = est.probe_key(cell.family, cell.task, cell_shape(spec, cell), spec.budget(cell.family).batch_tokens,
                            fam.train_work(dict(cell.axes)))
        out.setdefault(key, Wanted(key, cell.label, *locator.configs(spec, cell)))
    return list(out.values()), skipped


def run_probes(todo: Iterable[Wanted], measure: Callable[[str, Any, Any], float], data_root: Path,
               machine: dict, now: Callable[[], str], others: Callable[[], list[Any]],
               snapshot: Callable[[], Any], share: Callable[[Any, Any], dict | None],
               log: Callable[[str], None] = lambda line: print(line, file=sys.stderr)) -> list[est.Probe]:
    """Probe each of ``todo`` with ``measure(task, model_config, train_config) -> seconds a step`` and keep the
    ones the machine let run alone (see the module docstring); ``others()`` lists the busy narbench processes
    that can take CPU, ``snapshot``/``share`` read the machine's load around each probe
    (``bench.measure.load``, this process's pid)."""
    from narbench_core.io import write_json

    todo = list(todo)
    busy = others()
    if todo and busy:
        raise UserError(f"another narbench process is busy on this machine ({busy[0].describe()}): a probe now "
                        "would time a shared machine; wait for it, pause it (kill -STOP <pid>, then -CONT), "
                        "or plan without --probe")
    kept = []
    for i, want in enumerate(todo, 1):
        log(f"narbench plan: probing {want.label} ({i}/{len(todo)}): compiling its train step for each batch "
            "shape, then timing a few steps of each")
        before = snapshot()
        family, task, shape, batch_tokens, work = want.key
        seconds = float(measure(task, want.model_config, want.train_config))
        load = share(before, snapshot())
        others_share = None if load is None else float(load["others"])
        probe = est.Probe(family, task, want.label, shape, batch_tokens, work, seconds, now(), dict(machine),
                          others_share)
        if others_share is not None and others_share > defaults.BUSY_SHARE:
            log(f"narbench plan: not kept: other processes took {others_share:.0%} of the CPU while it ran "
                f"({seconds:.3f} s a step); probe again on a quiet machine")
            continue
        write_json(est.probe_file(data_root, probe.key), probe.to_json())
        log(f"narbench plan: {seconds:.3f} s a step")
        kept.append(probe)
    return kept


def probe_plan(shown: Any, locator: Any, measure: Callable[[str, Any, Any], float] | None = None) -> list[est.Probe]:
    """Probe what ``shown`` still has to train, on this machine (the real trainer's step unless ``measure``), and
    keep the probes under ``locator.data_root`` (a ``bench.preview.Locator``)."""
    from bench.measure import load
    from narbench_core import lock
    from narbench_core.runs import utc_now

    if locator.data_root is None:
        raise UserError("no data root to keep probes under; set NARBENCH_DATA")
    todo, skipped = wanted(shown, locator)
    for why in skipped:
        print(f"narbench plan: not probed: {why}", file=sys.stderr)
    if measure is None:
        from models.train import seconds_per_step as measure
    with lock.busy("probing train steps"):
        return run_probes(todo, measure, Path(locator.data_root), est.this_machine(),
                          lambda: utc_now().isoformat(timespec="seconds"),
                          lambda: lock.others(stopped_too=False),
                          lambda: load.snapshot([os.getpid()]), load.share)
