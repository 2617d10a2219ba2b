"""System families are plug-ins: a family defined here registers itself and runs through grid and report.

The toy family has its own spec section (``[toy] temperatures = [...]``), its own training budget, a
row column of its own (``temperature``), its own decoder loader, plot labels and order. Nothing in
``bench/`` is edited for it.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench import families, report, store as st
from bench.families import Context, Family, System, TrainCell
from bench.plan import expand
from bench.runner import Runner
from bench.columns import Column, fixed
from bench.verify import verify_run
from narbench_core.errors import UserError
from suites.spec import list_of, number
from grid_fakes import FakeFactory, fake_deps, fake_spec

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class ToySection:
    temperatures: tuple[float, ...] = (1.0,)


class ToyFamily(Family):
    name, label, paradigm, model_kind = "toy", "Toy", "nar", "padir"
    columns = (Column("temperature", "temp.", fixed(1), doc="the toy family's own axis"),)

    def __init__(self):
        self.loaded: list[str] = []

    def parse(self, table) -> ToySection:
        section = ToySection(table.get("temperatures", list_of(number(0.0), "numbers"), ToySection.temperatures))
        table.done()
        return section

    def expand(self, section: ToySection, ctx: Context) -> list[System]:
        cell = TrainCell(ctx.task, self.name, ctx.seed)
        return [System(f"toy-t{t:g}", self.name, "refine:2", cell, tuple(sorted(ctx.shapes.items())),
                       (("temperature", t), ("hypotheses", 1), ("decoder", "refine:2"), ("variant", None)))
                for t in section.temperatures]

    def load_decoder(self, checkpoint_dir, spec, **options):
        self.loaded.append(options["name"])
        return FACTORY("toy", checkpoint_dir, spec, **options)

    def sort_key(self, row) -> tuple:
        return (-row.temperature,)

    def point_label(self, row) -> str:
        return f"t={row.temperature:g}"

    def style(self, row) -> dict:
        return {"color": "#2e8b57", "marker": "^", "label": "Toy"}


FACTORY = FakeFactory()
SPEC = fake_spec("famtest", test=["test"], ar_decoders=["greedy"], padir_iterations=[2], max_test_sentences=12) + (
    "\n[toy]\ntemperatures = [0.5, 2.0]\n\n[train.toy]\nsteps = 3\nbatch_tokens = 64\nlearning_rate = 1e-3\n"
    "warmup_steps = 1\n")


@pytest.fixture
def toy(fixed_peaks):
    family = families.register(ToyFamily())
    yield family
    families.unregister("toy")


def _deps(tmp_path):
    deps = fake_deps(tmp_path / "ckpt", FACTORY)
    deps.load_decoder = lambda family, ckpt, spec, **o: (families.get(family).load_decoder(ckpt, spec, **o)
                                                          if family == "toy" else FACTORY(family, ckpt, spec, **o))
    return deps


def test_a_registered_family_runs_through_grid_and_report(tmp_path, toy):
    path = tmp_path / "famtest.toml"
    path.write_text(SPEC)
    spec = families.load_suite(path)
    plan = expand(spec)
    toys = [s for s in plan.systems if s.family == "toy"]
    assert [s.name for s in toys] == ["toy-t0.5", "toy-t2"] and all(s.baseline == "ar-greedy" for s in toys)
    assert TrainCell("fake_task", "toy", 0) in plan.train_cells

    run, _ = st.open_run(tmp_path / "results", spec.name, spec.spec_hash(), spec.to_toml(), "narbench run")
    Runner(spec, _deps(tmp_path), run, progress=False).run()
    assert sorted(toy.loaded) == ["toy-t0.5", "toy-t2"]
    rows = {r.system: r for r in run.rows()}
    assert rows["toy-t2"].family == "toy" and rows["toy-t2"].paradigm == "nar" and rows["toy-t2"].temperature == 2.0
    assert rows["ar-greedy"].temperature is None and rows["toy-t2"].iterations is None   # other families' columns
    assert rows["toy-t2"].speedup_p50_vs_ar is not None
    assert verify_run(run.path) == []

    report.write_report(run.path)
    board = (run.path / "leaderboard.md").read_text()
    # A family without its own name parts is shown by its label and the system id.
    assert "| Toy toy-t2 |" in board and "| Toy toy-t0.5 | `toy-t0.5` |" in board
    table = (run.path / "table.md").read_text()
    order = [ln.split("|")[1].strip() for ln in table.split("## fake_task:test:")[1].splitlines()
             if ln.startswith("| ") and "System" not in ln]
    assert order[-2:] == ["toy-t2", "toy-t0.5"]          # families in registry order, then the family's own
    assert report.markdown_table(run.rows(), ["system", "temperature"])[0] == "| System | temp. |"


def test_unknown_family_sections_and_duplicates_fail(tmp_path):
    path = tmp_path / "famtest.toml"
    path.write_text(SPEC)
    with pytest.raises(UserError, match="toy: unknown key"):   # no toy family registered here
        families.load_suite(path)
    families.register(fam := ToyFamily())
    try:
        with pytest.raises(ValueError, match="registered already"):
            families.register(ToyFamily())
        assert families.get("toy") is fam
    finally:
        families.unregister("toy")
    with pytest.raises(UserError, match="unknown system family 'toy'"):
        families.get("toy")


def test_bench_never_branches_on_a_family():
    """Outside bench/families/, no module compares with a family's name or kind, nor assumes what the
    non-AR side is (its rows are whatever families the registry holds); the AR paradigm (the baseline
    side of every comparison) may be named."""
    names = {"padir", "nar", "kind"}
    offenders = []
    for path in (ROOT / "bench").rglob("*.py"):
        if path.parent.name == "families":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Compare):
                consts = [c.value for c in ast.walk(node) if isinstance(c, ast.Constant)]
                if any(c in names for c in consts):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []
