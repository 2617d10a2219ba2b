"""PaDIR's live axes: a spec sweeping an axis that a setting silences is refused in one line; names, rows and
cells carry only the axes that act; the glancing ratios are axes of their own; checkpoint folders of the
built-in suites keep their names."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from bench import families
from bench.cli import main
from bench.families import load_suite as load_spec
from bench.plan import expand
from bench.report.names import display_names
from bench.rows import SCHEMA_VERSION, Row, columns
from narbench_core.errors import UserError
from grid_fakes import fake_spec

SPEC = fake_spec("live", test=["test"], ar_decoders=["greedy"], padir_iterations=[1, 4], max_test_sentences=10,
                 length_hyps=[1])


def padir(tmp_path, extra: str):
    path = tmp_path / "live.toml"
    path.write_text(SPEC + extra)
    return path


@pytest.mark.parametrize("extra, line", [
    ("glancing = [true]\nunmask_rate = [0.15, 0.3]\n",
     "padir.unmask_rate: glancing = true silences it (stage 1 keeps a glanced number of reference tokens instead), "
     "so 0.15 and 0.3 give identical systems there; keep one: exclude = [{glancing = true, unmask_rate = [0.3]}]"),
    ('remask = ["stutter", "mask-predict", "none"]\n',
     "padir.remask: iterations = 1 silences it (one pass: nothing is re-masked), so stutter, mask-predict and none "
     'give identical systems there; keep one: exclude = [{iterations = 1, remask = ["mask-predict", "none"]}]'),
    ("glance_end = [0.3, 0.5]\n",
     "padir.glance_end: glancing = false silences it (no glancing pass), so 0.3 and 0.5 give identical systems "
     "there; keep one: exclude = [{glancing = false, glance_end = [0.5]}]"),
    ("glancing = [true]\nunmask_rate = [0.3]\n",
     "padir.unmask_rate: 0.3 acts in no system: glancing = true silences it (stage 1 keeps a glanced number of "
     "reference tokens instead); drop it"),
])
def test_sweeping_a_silenced_axis_is_refused_in_one_line(tmp_path, capsys, extra, line):
    path = padir(tmp_path, extra)
    with pytest.raises(UserError) as err:
        load_spec(path)
    assert str(err.value) == f"{path}: {line}"
    assert main(["plan", "--suite", str(path)]) == 2            # every spec error surfaces in `plan`
    assert capsys.readouterr().err == f"narbench: error: {path}: {line}\n"


def test_a_sweep_excluded_where_the_axis_is_silent_expands(tmp_path):
    plan = expand(load_spec(padir(tmp_path, 'glancing = [false, true]\nunmask_rate = [0.15, 0.3]\n'
                                            'remask = ["stutter", "mask-predict"]\nglance_end = [0.3, 0.5]\n'
                                            'exclude = [{glancing = true, unmask_rate = 0.3}, '
                                            '{glancing = false, glance_end = 0.5}, '
                                            '{iterations = 1, remask = "mask-predict"}]\n')))
    names = [s.name for s in plan.systems if s.family == "padir" and "distill" not in s.name]
    assert names == ["padir-s1-u0.15-k1", "padir-s4-u0.15-k1", "padir-s4-u0.15-k1-remask-mask-predict",
                     "padir-s1-k1-glat", "padir-s4-k1-glat", "padir-s4-k1-remask-mask-predict-glat",
                     "padir-s1-k1-glat0.5-0.5", "padir-s4-k1-glat0.5-0.5",
                     "padir-s4-k1-remask-mask-predict-glat0.5-0.5",
                     "padir-s1-u0.3-k1", "padir-s4-u0.3-k1", "padir-s4-u0.3-k1-remask-mask-predict"]
    info = {s.name: dict(s.info) for s in plan.systems}
    # Rows carry only the axes that act: the rate where glancing silences it, the ratios without glancing,
    # remask at T = 1 are None.
    assert info["padir-s4-k1-glat"]["unmask_rate"] is None and info["padir-s4-k1-glat"]["glance_end"] == 0.3
    assert info["padir-s4-u0.3-k1"]["glance_start"] is None and info["padir-s4-u0.3-k1"]["unmask_rate"] == 0.3
    assert info["padir-s1-u0.15-k1"]["remask"] is None and info["padir-s4-u0.15-k1"]["remask"] == "stutter"
    cells = {c.label for c in plan.train_cells if c.family == "padir" and c.teacher is None}
    assert cells == {"padir fake_task positional_attention True recipe reference stages 2 unmask_rate 0.15 seed 0",
                     "padir fake_task positional_attention True recipe reference stages 2 unmask_rate 0.3 seed 0",
                     "padir fake_task glancing True positional_attention True recipe reference stages 2 seed 0",
                     "padir fake_task glancing True glance_end 0.5 positional_attention True recipe reference "
                     "stages 2 seed 0"}
    family = families.get("padir")
    glat = next(c for c in plan.train_cells if dict(c.axes).get("glance_end") == 0.5)
    _, train = family.configs("tiny", 32, {}, {"steps": 10}, dict(glat.axes))
    assert train.glancing and (train.glance_start, train.glance_end) == (0.5, 0.5)
    assert train.to_dict()["glance_end"] == 0.5 and "glance_start" not in train.to_dict()
    with pytest.raises(UserError, match=r"^unmask_rate has no effect with glancing = true \(stage 1 keeps"):
        family.configs("tiny", 32, {}, {"steps": 10}, {"glancing": True, "unmask_rate": 0.3})
    with pytest.raises(UserError, match=r"^glance_start has no effect with glancing = false"):
        family.configs("tiny", 32, {}, {"steps": 10}, {"glance_start": 0.3})


# The checkpoint folders (models.train.checkpoint_dir_for) of the built-in suites' cells, computed on main before
# the glancing ratios became axes and the silenced rate left the cells (with the task's vocabulary and data
# identity, and a warm start's source, held fixed): cached checkpoints must keep being found.
PINNED = {
    "default": ["bible_de_en-ar-c68b00224461", "bible_de_en-padir-ffe84b5bc1c3",
                "bible_de_en_distilled-padir-8aab413ec836"],
    "dial": ["synthetic_d0-ar-9c523824b984", "synthetic_d0-padir-5722e6b8e352",
             "synthetic_d0_distilled-padir-9670d7cce479", "synthetic_d100-ar-39dd7a970c61",
             "synthetic_d100-padir-61fe3f4fc3b1", "synthetic_d100_distilled-padir-8883021a6e10",
             "synthetic_d50-ar-7dce4dde9074", "synthetic_d50-padir-cb909358ac57",
             "synthetic_d50_distilled-padir-8246c81cedac"],
    "quick": ["synthetic_d100-ar-aa194634bfa9", "synthetic_d100-padir-ba8fe0a7fd53",
              "synthetic_d100_distilled-padir-2b85e18f16d6"],
    # converged changed its plateau rule on 2026-11-29 (issue 52: the whole dev split, a mean of 3 points, a growing
    # patience), so its models are new ones; the committed converged run's were -ar-1f84366a3ac8, -ar-1fed6e4a1328,
    # -padir-4c13b18450f2 and _distilled-padir-f8fb2f5e4e1e. Its AR cap rose from 60,000 to 240,000 on 2026-12-04
    # (the two AR folders were -ar-b7d29ab4c50f and -ar-df15be8fa485): a training under the old cap carries on in the
    # new folder (models.train.seed_source). On 2026-12-04 its rule moved to dev NLL (issue 52; the folders of the
    # dev-BLEU rule with the 240,000 cap: -ar-68798e13d056, -ar-9cac9070d77e, -padir-265a6468dde3,
    # _distilled-padir-6c03310dc068). On 2026-12-05 it moved to dev BLEU smoothed over 9 points (the dev-NLL rule's
    # folders: -ar-23ef1caf6127, -ar-97a51ce693af, -padir-97d1abe8194f, _distilled-padir-841b55fd16aa). On 2026-12-06
    # its patience rose from 4 to 9 evaluations (a patience of 4: -ar-3fdb6d650674, -ar-eac84c139b70,
    # -padir-ab512b2ab8af, _distilled-padir-d90bed8e1255). The PaDIR names here hold their warm start's path fixed.
    "converged": ["bible_de_en-ar-137491ddb2e5", "bible_de_en-ar-82f4c5c5c73f", "bible_de_en-padir-b811a0050f08",
                  "bible_de_en_distilled-padir-222972dc376c"],
    "anchors": ["bible_de_en-ar-5317078f4b91", "bible_de_en-ar-c68b00224461", "bible_de_en-padir-ffe84b5bc1c3",
                "bible_de_en_distilled-padir-8aab413ec836"],
}


@pytest.fixture
def folders(monkeypatch):
    """suite name -> the checkpoint folder name of each of its training cells (identities held fixed)."""
    import models.batching
    import models.train
    import suites.catalog
    from bench.runner import real_configs

    monkeypatch.setattr(models.batching, "task_identity",
                        lambda task, split="train": {"vocab_path": "vocab", "vocab_hash": "v", "data": task})
    monkeypatch.setattr(models.train, "_source_identity", lambda path: {"from": str(path)})
    monkeypatch.setattr(suites.catalog, "task_info", lambda task: SimpleNamespace(
        vocabulary=SimpleNamespace(vocab_size=8000)))

    def names(suite: str) -> list[str]:
        spec = load_spec(suite)
        out = []
        for cell in expand(spec).train_cells:
            model, train = real_configs(spec, cell)
            init = Path("/src") / cell.warm_start.family if cell.warm_start else None
            out.append(models.train.checkpoint_dir_for(cell.task + ("_distilled" if cell.teacher else ""),
                                                       model, train, init).name)
        return sorted(out)
    return names


@pytest.mark.parametrize("suite", sorted(PINNED))
def test_checkpoint_folders_of_the_built_in_suites_keep_their_names(folders, suite):
    assert folders(suite) == PINNED[suite]


def test_the_grid_suite_trains_only_new_padir_models(folders):
    grid, default = load_spec("grid-de-en"), load_spec("default")
    assert grid.distill == default.distill and grid.budget("ar") == default.budget("ar")
    assert grid.budget("padir") == default.budget("padir") and grid.max_test_sentences == 200
    names = folders("grid-de-en")
    assert set(PINNED["default"]) <= set(names)          # its AR model and the default's two PaDIR models: cached
    assert len(names) == 1 + 10 and sum("-padir-" in n for n in names) == 10
    plan = expand(grid)
    assert not any("-u0" in s.name for s in plan.systems if s.family == "padir" and "glat" in s.name)
    padir_systems = [s for s in plan.systems if s.family == "padir"]
    assert len(padir_systems) == 10 * 7                   # T = 1, 2, 4, 10 at k = 1; k 3 and Mask-Predict at T = 4
    assert {dict(s.info)["iterations"] for s in padir_systems if dict(s.info)["length_hyps"] == 3} == {4}


def test_default_names_drop_the_silenced_rate():
    names = {s.name for s in expand(load_spec("default")).systems}
    assert {"padir-s4-distill-lb1-init-ar-glat-lenoff", "padir-s4-distill-k1-lb1-init-ar-glat-lenoff"} <= names
    assert not any("-u0.15" in n for n in names)


def old_row(system: str, **values) -> Row:
    """A rows.jsonl record as narbench wrote it before the glancing ratios existed (read back with Row.load)."""
    record = {c.name: None for c in columns() if c.name not in ("glance_start", "glance_end")}
    record.update(schema_version=SCHEMA_VERSION, system=system, test_set="t", family="padir", paradigm="nar",
                  decoder=f"refine:{values['iterations']}", **values)
    record["steps"] = record.pop("iterations")            # older still: the column before its rename
    return Row.load(record)


def test_rows_written_before_still_load_and_name_only_live_axes():
    common = dict(unmask_rate=0.15, glancing=True, length_hyps=1, length_bonus=1, remask="stutter", start="random",
                  positional_attention=True, stages=2, init="ar", recipe="reference", length_predictor="offset")
    rows = [old_row("padir-s1-u0.15-k1-lb1-init-ar-glat-lenoff", iterations=1, distill=False, **common),
            old_row("padir-s4-u0.15-distill-k1-lb1-init-ar-glat-lenoff", iterations=4, distill=True, **common)]
    assert rows[0].iterations == 1 and rows[0].glance_start is None and rows[0].unmask_rate == 0.15
    family = families.get("padir")
    assert family.live_values(rows[0])["unmask_rate"] is None        # silenced by glancing: not an axis
    assert family.live_values(rows[0])["remask"] is None             # T = 1
    assert family.live_values(rows[1])["remask"] == "stutter"
    assert display_names(rows) == {"padir-s1-u0.15-k1-lb1-init-ar-glat-lenoff": "PaDIR T=1, raw",
                                   "padir-s4-u0.15-distill-k1-lb1-init-ar-glat-lenoff": "PaDIR T=4, distilled"}
    assert family.point_label(rows[1]) == "T=4 k1 lb1 init ar glat lenoff"
