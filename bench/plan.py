"""The plan of a suite: its training cells, systems and evaluation cells, in run order.

Every system comes from a family (``bench.families``): for each task and seed the baseline family
expands first (its greedy system is every speedup's baseline, its cell the distillation teacher),
then every other family with a section in the spec. Training cells are unique; every teacher and
warm-start source precedes the cells that need it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from bench import families
from bench.families import Context, System, TrainCell
from narbench_core.errors import UserError
from suites.spec import SuiteSpec, TestSet


# ------------------------------------------------------------------------------------------ cells

@dataclass(frozen=True)
class EvalCell:
    system: System
    test_set: TestSet

    @property
    def key(self) -> tuple[str, str]:
        return self.system.name, self.test_set.name


@dataclass(frozen=True)
class Plan:
    train_cells: tuple[TrainCell, ...]         # every teacher precedes its students
    systems: tuple[System, ...]
    eval_cells: tuple[EvalCell, ...]


def expand(spec: SuiteSpec) -> Plan:
    """All training cells, systems and evaluation cells of a spec, in run order. On a size axis (several model
    presets) every family expands once per size: its cells carry the size, its systems' names end in it and
    each size's speedups pair with that size's AR greedy."""
    base = families.get(families.BASELINE)            # required: every suite has its section
    order = [base] + [f for f in families.all_families() if f is not base and spec.section(f.name) is not None]
    cells: dict[TrainCell, None] = {}
    systems: list[System] = []
    evals: list[EvalCell] = []
    sizes = spec.model.presets if spec.model.sized else (None,)
    for task in spec.tasks:
        task_systems: list[System] = []
        for size in sizes:
            for seed in spec.seeds:
                sfx = (f"-{size}" if size else "") + (f"-seed{seed}" if len(spec.seeds) > 1 else "")
                ctx = Context(task.train, seed, _sized(TrainCell(task.train, base.name, seed), size),
                              spec.decoder_shapes())
                expanded: list[System] = []
                for family in order:
                    ctx = dataclasses.replace(ctx, earlier=tuple(expanded))
                    for system in family.expand(spec.section(family.name), ctx):
                        system = dataclasses.replace(system, cell=_sized(system.cell, size))
                        expanded.append(system)
                        cells[system.cell] = None
                        task_systems.append(dataclasses.replace(
                            system, name=system.name + sfx, baseline=base.baseline_system + sfx,
                            info=system.info + (("seed", seed),) + ((("size", size),) if size else ())))
        names = [s.name for s in task_systems]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise UserError(f"{spec.source}: suite gives several systems the same name {dupes}; "
                            "remove duplicate axis values")
        systems.extend(task_systems)
        evals.extend(EvalCell(s, ts) for ts in task.test_sets for s in task_systems)
    if base.trains and spec.budget(base.name).match is not None:
        raise UserError(f"{spec.source}: train.{base.name}: match gives a model the {base.label} model's budget; "
                        f"the {base.label} budget itself needs plain steps (drop match)")
    # Stable: on a size axis one size after another, in the spec's order (a size's models are all trained, to be
    # timed and committed, before the next size's start); within it teachers and warm-start sources first, then the
    # cells that need them, then the cells no other needs and that need none (another AR layout): every answer
    # that depends on a chain comes first.
    sources = {s for c in cells for s in c.sources}
    rank = {size: i for i, size in enumerate(sizes)}
    ordered = sorted(cells, key=lambda c: (rank.get(c.preset, 0), 1 if c.sources else 0 if c in sources else 2))
    return Plan(tuple(ordered), tuple(systems), tuple(evals))


def _sized(cell: TrainCell, size: str | None) -> TrainCell:
    return cell.sized(size) if size else cell


def needed_cells(plan: Plan, todo: list[EvalCell]) -> list[TrainCell]:
    """The training cells the evaluation cells ``todo`` need (with their sources), in the plan's order."""
    wanted = {c.system.cell for c in todo}
    wanted |= {source for c in wanted for source in c.sources}
    return [c for c in plan.train_cells if c in wanted]
