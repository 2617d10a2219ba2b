"""Grid expansion and running with fakes: unique training cells, teachers first, rows and resume."""
from __future__ import annotations

import gzip
import json

import pytest

from bench import store as st
from narbench_core.errors import UserError
from narbench_core.io import write_jsonl
from bench.families import load_suite as load_spec
from bench.plan import expand
from bench.runner import Runner
from bench.rows import CORE, SCHEMA_VERSION
from bench.verify import verify_run
from grid_fakes import STEP_COST, FakeFactory, fake_deps, fake_spec

pytestmark = pytest.mark.usefixtures("fixed_peaks")     # tests/bench/conftest.py

SPEC = fake_spec("gridtest", test=["test", "test+refs", "dev"], ar_decoders=["greedy", "beam:3"],
                 padir_iterations=[1, 4], max_test_sentences=20, length_hyps=[3])


@pytest.fixture
def spec(tmp_path):
    path = tmp_path / "gridtest.toml"
    path.write_text(SPEC)
    return load_spec(path)


def new_store(tmp_path, spec, **kw):
    return st.open_run(tmp_path / "results", spec.name, spec.spec_hash(), spec.to_toml(), "narbench run", **kw)[0]


def test_expand_unique_cells_and_teacher_first(spec):
    plan = expand(spec)
    kinds = [(c.family, c.teacher is not None) for c in plan.train_cells]
    assert kinds == [("ar", False), ("padir", True), ("padir", False)]    # needing nothing, needed by none: last
    distilled = plan.train_cells[1]
    assert distilled.teacher == plan.train_cells[0]
    assert plan.train_cells.index(distilled.teacher) < plan.train_cells.index(distilled)
    names = [s.name for s in plan.systems]
    assert names == ["ar-greedy", "ar-beam3", "padir-s1-u0.15-k3", "padir-s4-u0.15-k3",
                     "padir-s1-u0.15-distill-k3", "padir-s4-u0.15-distill-k3"]
    assert len(plan.eval_cells) == 6 * 3
    assert len({c.key for c in plan.eval_cells}) == len(plan.eval_cells)
    # Systems differing only in decode-time axes share one trained model.
    assert plan.systems[2].cell is plan.systems[3].cell


def test_cells_no_other_needs_train_after_the_chains():
    plan = expand(load_spec("anchors"))
    assert [(c.family, dict(c.axes).get("layers"), bool(c.sources)) for c in plan.train_cells] == [
        ("ar", None, False), ("padir", None, True), ("padir", None, True), ("ar", "6-1", False)]


def test_ablation_expansion_trains_each_model_once():
    plan = expand(load_spec("ablation"))
    # per task: the AR model, the 6-1 AR with and without distillation, PaDIR x rate, distill, pos, init
    assert len(plan.train_cells) == len(set(plan.train_cells)) == 6 * (3 + 2 * 2 * 2 * 2)
    assert len(plan.systems) == 6 * 118              # 134 less Mask-Predict at T = 1 (re-masks nothing: excluded)
    for i, cell in enumerate(plan.train_cells):
        for source in (cell.teacher, cell.warm_start):
            if source is not None:
                assert plan.train_cells.index(source) < i


def test_padir_names_follow_design(tmp_path):
    path = tmp_path / "names.toml"
    path.write_text(SPEC.replace("length_hyps = [3]", 'length_hyps = [5, 3]\nremask = ["mask-predict"]\n'
                                 'start = ["mask"]\npositional_attention = [false]\nstages = [1]\nunmask_rate = [0.5]'))
    names = {s.name for s in expand(load_spec(path)).systems}
    assert {"padir-s4-u0.5-distill-remask-mask-predict-start-mask-nopos-st1",
            "padir-s1-u0.5-k3-start-mask-nopos-st1"} <= names           # T = 1 re-masks nothing: no remask part
    default = {s.name for s in expand(load_spec("default")).systems}
    assert {"padir-s4-distill-lb1-init-ar-glat-lenoff", "padir-s4-distill-k1-lb1-init-ar-glat-lenoff"} <= default


def test_length_bonus_is_a_decoding_axis(tmp_path):
    path = tmp_path / "bonus.toml"
    path.write_text(SPEC.replace("length_hyps = [3]", "length_hyps = [3]\nlength_bonus = [0, 2]"))
    plan = expand(load_spec(path))
    systems = {s.name: s for s in plan.systems}
    assert {"padir-s1-u0.15-k3", "padir-s1-u0.15-k3-lb2"} <= set(systems)
    bonus = systems["padir-s1-u0.15-k3-lb2"]
    assert dict(bonus.options)["length_bonus"] == 2 and dict(bonus.info)["length_bonus"] == 2
    assert bonus.cell == systems["padir-s1-u0.15-k3"].cell         # decoding only: one trained model
    path.write_text(SPEC.replace("length_hyps = [3]", "length_hyps = [3]\nlength_bonus = [1.5]"))
    with pytest.raises(UserError, match="length_bonus"):
        load_spec(path)


def test_exclude_drops_combinations_and_their_unused_models(tmp_path):
    path = tmp_path / "exclude.toml"
    path.write_text(SPEC.replace("length_hyps = [3]", "length_hyps = [1, 3]\n"
                                 "exclude = [{distill = false, length_hyps = 1}, {iterations = 1, length_hyps = 3}]"))
    plan = expand(load_spec(path))
    assert [s.name for s in plan.systems if s.family == "padir"] == [
        "padir-s4-u0.15-k3", "padir-s1-u0.15-distill-k1", "padir-s4-u0.15-distill-k1", "padir-s4-u0.15-distill-k3"]
    path.write_text(SPEC.replace("length_hyps = [3]", "length_hyps = [1, 3]\n"
                                 "exclude = [{distill = false, length_hyps = 1}, {iterations = [1, 2], length_hyps = 3}]"))
    assert [s.name for s in expand(load_spec(path)).systems if s.family == "padir"] == [
        "padir-s4-u0.15-k3", "padir-s1-u0.15-distill-k1", "padir-s4-u0.15-distill-k1", "padir-s4-u0.15-distill-k3"]
    path.write_text(SPEC.replace("length_hyps = [3]", "length_hyps = [1, 3]\nexclude = [{distill = false}]"))
    plan = expand(load_spec(path))
    assert [c.family for c in plan.train_cells] == ["ar", "padir"]         # the raw-data model is not trained
    for bad, message in (("[{foo = 1}]", "not an axis"), ('[{length_hyps = "one"}]', "expected a int"),
                         ('[{length_hyps = [1, "3"]}]', "expected a int"), ("[{length_hyps = []}]", "non-empty list"),
                         ("[{stages = 2}]", "every system"), ("{distill = false}", "list of tables")):
        path.write_text(SPEC.replace("length_hyps = [3]", f"length_hyps = [1, 3]\nexclude = {bad}"))
        with pytest.raises(UserError, match=message):
            load_spec(path)


def test_length_predictor_axis_names_and_configures_its_cells(tmp_path):
    from bench import families

    path = tmp_path / "length.toml"
    path.write_text(SPEC.replace("length_hyps = [3]", 'length_hyps = [3]\nlength_predictor = ["absolute", "offset"]'))
    plan = expand(load_spec(path))
    names = {s.name for s in plan.systems}
    assert {"padir-s1-u0.15-k3", "padir-s1-u0.15-k3-lenoff", "padir-s4-u0.15-distill-k3-lenoff"} <= names
    padir = families.get("padir")
    cells = {dict(c.axes).get("length_predictor"): c for c in plan.train_cells if c.family == "padir"}
    assert set(cells) == {None, "offset"}                  # the default axis value stays out of the identity
    model, _ = padir.configs("tiny", 32, {}, {"steps": 10}, dict(cells["offset"].axes))
    assert model.length_offset and model.length_token
    model, _ = padir.configs("tiny", 32, {}, {"steps": 10}, dict(cells[None].axes))
    assert not model.length_offset


def test_run_writes_every_field_and_verifies(tmp_path, spec):
    deps = fake_deps(tmp_path / "ckpt")
    run = new_store(tmp_path, spec)
    rows = Runner(spec, deps, run, progress=False).run()
    assert len(rows) == 18 and run.done_keys() == {c.key for c in expand(spec).eval_cells}
    for row in run.rows():
        assert {c.name for c in CORE} <= set(row)
        assert row.schema_version == SCHEMA_VERSION
    # Each model trained once, teacher before the distilled student.
    assert len(deps.train.calls) == 3
    assert [t for t, _ in deps.train.calls] == ["fake_task", "fake_task_distilled", "fake_task"]   # raw PaDIR: last
    assert len(deps.distill.calls) == 1
    # One measurement per split: test and test+refs share hypotheses and latencies.
    samples = run.samples()
    assert len(samples) == 18 * 20
    a = {(s["system"], s["index"]): s["latency_ms"] for s in samples if s["test_set"] == "fake_task:test"}
    b = {(s["system"], s["index"]): s["latency_ms"] for s in samples if s["test_set"] == "fake_task:test+refs"}
    assert a == b
    by = {(r["system"], r["test_set"]): r for r in run.rows()}
    assert by[("ar-beam3", "fake_task:test+refs")]["n_references"] == 2
    assert by[("ar-beam3", "fake_task:test")]["bleu"] == pytest.approx(100.0)
    # Fake PaDIR stutters at 1 step, the AR baseline never does.
    assert by[("padir-s1-u0.15-k3", "fake_task:test")]["stutter_per_1k_words"] > 0
    assert by[("ar-greedy", "fake_task:test")]["stutter_per_1k_words"] == 0
    assert by[("ar-greedy", "fake_task:test")]["bleu_delta_vs_ar"] == 0.0
    assert by[("padir-s1-u0.15-k3", "fake_task:test")]["passes_mean"] <= 1
    # Per-phase latency: each sentence's phases add up to its latency; rows carry the phases' p50s.
    for s in samples:
        assert set(s["phase_ms"]) >= {"tokenize", "passes", "detokenize"} and s["host_syncs"] >= 1
        assert sum(s["phase_ms"].values()) == pytest.approx(s["latency_ms"], rel=1e-9)
    assert all(set(r.phase_p50_ms) >= {"tokenize", "passes"} and r.host_syncs >= 1 for r in run.rows())
    assert verify_run(run.path) == []


def test_crash_mid_grid_then_resume_recomputes_only_missing(tmp_path, spec):
    deps = fake_deps(tmp_path / "ckpt", FakeFactory(fail_after=8))
    run = new_store(tmp_path, spec)
    with pytest.raises(RuntimeError, match="simulated crash"):
        Runner(spec, deps, run, progress=False).run()
    # The first split (test + test+refs) finished; files are whole and parseable.
    first = run.rows()
    assert {ts for _, ts in run.done_keys()} == {"fake_task:test", "fake_task:test+refs"}
    assert len(first) == 12
    for name in (st.ROWS, st.SAMPLES):
        raw = (run.path / name).read_bytes()
        for line in (gzip.decompress(raw) if name.endswith(".gz") else raw).decode().splitlines():
            json.loads(line)
    assert not list(run.path.glob(".*.tmp"))

    again, resumed = st.open_run(tmp_path / "results", spec.name, spec.spec_hash(), spec.to_toml(), "narbench run")
    assert resumed and again.path == run.path
    factory = FakeFactory()
    Runner(spec, fake_deps(tmp_path / "ckpt", factory), again, progress=False).run()
    assert sorted(name for name, _ in factory.loads) == sorted(s.name for s in expand(spec).systems)
    assert len(again.rows()) == 18
    kept = {r.key: r for r in again.rows()}
    for row in first:  # finished cells were not recomputed
        assert kept[row.key] == row
    assert verify_run(again.path) == []


def test_keyboard_interrupt_mid_measurement_keeps_whole_files(tmp_path, spec):
    # 6 warm-ups + 6 x (20 timed runs + an untimed one for each of the 2 turns of 10 batches) + the solo
    # check's 2 rounds (6 x (an untimed call + 10 batches) each) for the first split, then 6 warm-ups and
    # 10 runs of the second.
    factory = FakeFactory(interrupt_after_runs=6 + 6 * 22 + 6 * 22 + 6 + 10)
    run = new_store(tmp_path, spec)
    with pytest.raises(KeyboardInterrupt):
        Runner(spec, fake_deps(tmp_path / "ckpt", factory), run, progress=False).run()
    assert len(run.rows()) == 12 and len(run.samples()) == 12 * 20
    factory = FakeFactory()
    Runner(spec, fake_deps(tmp_path / "ckpt", factory), run, progress=False).run()
    assert len(factory.loads) == 6 and len(run.rows()) == 18
    assert verify_run(run.path) == []


def test_partial_split_resume_pairs_with_stored_baseline(tmp_path, spec):
    run = new_store(tmp_path, spec)
    Runner(spec, fake_deps(tmp_path / "ckpt"), run, progress=False).run()
    # Drop two PaDIR cells of one test set, as if the run had died after the others.
    dropped = {("padir-s4-u0.15-k3", "fake_task:test"), ("padir-s1-u0.15-distill-k3", "fake_task:test")}
    rows = [dict(r) for r in run.rows() if r.key not in dropped]
    write_jsonl(run.path / st.ROWS, rows)
    factory = FakeFactory()
    Runner(spec, fake_deps(tmp_path / "ckpt", factory), run, progress=False).run()
    assert sorted(n for n, _ in factory.loads) == sorted(n for n, _ in dropped)
    by = {(r["system"], r["test_set"]): r for r in run.rows()}
    for key in dropped:
        assert by[key]["speedup_p50_vs_ar"] is not None and by[key]["baseline_timed_together"] is False
    assert len(run.rows()) == 18
    assert verify_run(run.path) == []


def test_train_only_trains_every_model_and_times_nothing_until_run_again(tmp_path, spec):
    """`narbench run --train-only`: trainings in the background now, the timing later on a quiet machine."""
    run = new_store(tmp_path, spec)
    factory = FakeFactory()
    assert Runner(spec, fake_deps(tmp_path / "ckpt", factory), run, progress=False, train_only=True).run() == []
    trained = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert trained and factory.loads == [] and run.rows() == []               # nothing timed, nothing loaded
    board = json.loads((run.path / st.CELLS).read_text())["cells"]
    assert {c["state"] for c in board if c["kind"] != "evaluate"} == {"done"}
    assert [c["state"] for c in board if c["kind"] == "evaluate"] == ["pending"] * 2
    Runner(spec, fake_deps(tmp_path / "ckpt", factory), run, progress=False).run()
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == trained   # the same models, none again
    assert len(run.rows()) == 18 and verify_run(run.path) == []


def test_timing_only_runner_returns_rows_without_quality(tmp_path, spec):
    rows = Runner(spec, fake_deps(tmp_path / "ckpt"), None, score=False, progress=False).run()
    assert len(rows) == 18
    assert all(r.bleu is None and r.chrf is None and r.latency_p50_ms > 0 for r in rows)


def test_verify_run_catches_tampering(tmp_path, spec):
    run = new_store(tmp_path, spec)
    Runner(spec, fake_deps(tmp_path / "ckpt"), run, progress=False).run()
    rows = [dict(r) for r in run.rows()]
    rows[0]["bleu"] += 0.5
    write_jsonl(run.path / st.ROWS, rows)
    samples = run.samples()
    target = next(s for s in samples if s["system"] == rows[1]["system"] and s["test_set"] == rows[1]["test_set"])
    target["latency_ms"] *= 100
    write_jsonl(run.path / st.SAMPLES, samples)
    rows[2]["length_ratio"] *= 2
    rows[3]["length_ratio"] = None       # a row written before the column: nothing to compare
    write_jsonl(run.path / st.ROWS, rows)
    problems = verify_run(run.path)
    assert any("bleu =" in p and rows[0]["system"] in p for p in problems)
    assert any("latency_" in p and rows[1]["system"] in p for p in problems)
    assert any("length_ratio =" in p and rows[2]["system"] in p for p in problems)
    assert not any(rows[3]["system"] in p and rows[3]["test_set"] in p for p in problems)


def test_multi_ref_without_extra_references_is_a_user_error(tmp_path, spec):
    from narbench_core.errors import UserError

    deps = fake_deps(tmp_path / "ckpt")
    deps.load_text = lambda task, split: (["a b"], [["A B"]])
    with pytest.raises(UserError, match="no extra references"):
        Runner(spec, deps, new_store(tmp_path, spec), progress=False).run()


RECORD_FIELDS = ("examples", "teacher_decoder", "teacher_bleu", "length_ratio", "sentences_per_second", "seconds")


def test_run_folder_gets_the_distillation_record(tmp_path, spec):
    deps = fake_deps(tmp_path / "ckpt")
    run = new_store(tmp_path, spec)
    Runner(spec, deps, run, progress=False).run()
    # The suite's [distill] settings and its seed reach the distiller; its record is copied verbatim.
    assert deps.distill.settings == [{**spec.distill.kwargs(), "seed": 0}]
    record = json.loads((run.path / st.DISTILL).read_text())
    assert record["task"] == "fake_task" and record["teacher_decoder"] == spec.distill.decoder
    assert set(RECORD_FIELDS) <= set(record)


def test_several_distillations_are_keyed_by_task_and_seed(tmp_path):
    path = tmp_path / "seeds.toml"
    path.write_text(SPEC.replace("seeds = [0]", "seeds = [0, 3]"))
    spec = load_spec(path)
    deps = fake_deps(tmp_path / "ckpt")
    run = new_store(tmp_path, spec)
    Runner(spec, deps, run, progress=False).run()
    records = json.loads((run.path / st.DISTILL).read_text())
    assert sorted(records) == ["fake_task-seed0", "fake_task-seed3"]
    assert [records[k]["seed"] for k in sorted(records)] == [0, 3]
    assert all(set(RECORD_FIELDS) <= set(r) for r in records.values())


def test_warm_started_cells_train_after_their_source(tmp_path):
    path = tmp_path / "warm.toml"
    path.write_text(SPEC.replace("length_hyps = [3]", 'length_hyps = [3]\ninit = ["random", "ar"]\n'
                                 'recipe = ["reference", "plain"]'))
    spec = load_spec(path)
    plan = expand(spec)
    warm = [c for c in plan.train_cells if c.warm_start is not None]
    assert len(warm) == 4 and all(c.warm_start == plan.train_cells[0] for c in warm)   # the AR cell
    names = {s.name for s in plan.systems}
    assert {"padir-s1-u0.15-k3-init-ar", "padir-s4-u0.15-distill-k3-init-ar-recipe-plain"} <= names
    deps = fake_deps(tmp_path / "ckpt")
    run = new_store(tmp_path, spec)
    Runner(spec, deps, run, progress=False).run()
    rows = {r.system: r for r in run.rows()}
    assert rows["padir-s1-u0.15-k3-init-ar"].init == "ar" and rows["padir-s1-u0.15-k3"].init == "random"
    assert rows["padir-s1-u0.15-k3"].recipe == "reference"
    ar_seconds = rows["ar-greedy"].train_seconds
    assert ar_seconds == STEP_COST["ar"]["seconds"] * rows["ar-greedy"].train_steps   # the fakes' cost, no clock
    assert rows["padir-s1-u0.15-k3-init-ar"].warm_start_seconds == ar_seconds
    assert rows["padir-s1-u0.15-k3"].warm_start_seconds is None
    assert len(deps.train.calls) == 1 + 8                 # the AR model, then 2 x 2 x 2 PaDIR models
    assert verify_run(run.path) == []


class NoXLAFactory(FakeFactory):
    """CTranslate2 decoders have no XLA program to cost."""

    def __call__(self, family, checkpoint_dir, spec, **options):
        decoder = super().__call__(family, checkpoint_dir, spec, **options)
        if family == "ct2":
            decoder.xla_costs = False
            decoder.lower = None            # costing it would fail loudly
        return decoder


def test_ct2_family_runs_the_ar_model_and_reports_agreement(tmp_path):
    path = tmp_path / "ct2.toml"
    path.write_text(SPEC + '\n[ct2]\ndecoders = ["greedy", "beam:3", "int8:greedy"]\nthreads = 2\n')
    spec = load_spec(path)
    plan = expand(spec)
    ct2 = [s for s in plan.systems if s.family == "ct2"]
    assert [s.name for s in ct2] == ["ct2-greedy", "ct2-beam3", "ct2-int8-greedy"]
    ar_cell = next(s.cell for s in plan.systems if s.name == "ar-greedy")
    assert all(s.cell == ar_cell for s in ct2) and len(plan.train_cells) == len(expand(load_spec_text(tmp_path)).train_cells)
    options = {s.name: dict(s.options) for s in ct2}
    assert options["ct2-int8-greedy"]["quantization"] == "int8" and options["ct2-greedy"]["quantization"] == "float32"
    assert options["ct2-beam3"]["length_penalty"] == 0.6 and "length_penalty" not in options["ct2-greedy"]
    assert options["ct2-greedy"]["threads"] == 2
    deps = fake_deps(tmp_path / "ckpt", NoXLAFactory())
    run = new_store(tmp_path, spec)
    Runner(spec, deps, run, progress=False).run()
    rows = {(r.system, r.test_set): r for r in run.rows()}
    greedy, ar = rows[("ct2-greedy", "fake_task:test")], rows[("ar-greedy", "fake_task:test")]
    assert (greedy.family, greedy.paradigm, greedy.model) == ("ct2", "ar", ar.model)   # the AR model itself
    assert greedy.agreement_with_ar_greedy == ar.agreement_with_ar_greedy == 1.0
    assert rows[("padir-s1-u0.15-k3", "fake_task:test")].agreement_with_ar_greedy < 1.0
    assert greedy.flops_per_sentence is None and ar.flops_per_sentence is not None
    assert verify_run(run.path) == []


def test_ct2_threads_axis_names_each_count_and_sets_its_worker_env(tmp_path):
    from bench import families

    path = tmp_path / "ct2.toml"
    path.write_text(SPEC + '\n[ct2]\ndecoders = ["greedy", "int8:greedy"]\nthreads = [1, 2]\n')
    ct2 = [s for s in expand(load_spec(path)).systems if s.family == "ct2"]
    assert [(s.name, dict(s.options)["threads"]) for s in ct2] == [
        ("ct2-greedy-t1", 1), ("ct2-greedy-t2", 2), ("ct2-int8-greedy-t1", 1), ("ct2-int8-greedy-t2", 2)]
    assert families.get("ct2").worker_env(dict(ct2[0].options)) == {"OMP_WAIT_POLICY": "PASSIVE"}   # 1 thread
    assert families.get("ct2").worker_env(dict(ct2[1].options)) == {}                               # 2: spin
    path.write_text(SPEC + '\n[ct2]\nthreads = [1, 1]\n')
    with pytest.raises(UserError, match="threads"):
        load_spec(path)


def load_spec_text(tmp_path):
    path = tmp_path / "plain.toml"
    path.write_text(SPEC)
    return load_spec(path)


def test_deep_shallow_ar_layouts_train_with_the_same_budget(tmp_path):
    from bench import families

    path = tmp_path / "ds.toml"
    path.write_text(SPEC.replace('[ar]\ndecoders = ["greedy", "beam:3"]',
                                 '[ar]\ndecoders = ["greedy", "beam:3"]\nlayers = ["6-1"]\nlayers_distill = [false, true]'))
    spec = load_spec(path)
    plan = expand(spec)
    names = [s.name for s in plan.systems if s.family == "ar"]
    assert names == ["ar-greedy", "ar-beam3", "ar-6x1-greedy", "ar-6x1-beam3", "ar-6x1-distill-greedy",
                     "ar-6x1-distill-beam3"]
    cells = {s.name: s.cell for s in plan.systems}
    base = cells["ar-greedy"]
    assert cells["ar-6x1-distill-greedy"].teacher == base and cells["ar-6x1-greedy"].teacher is None
    assert {s.baseline for s in plan.systems} == {"ar-greedy"}
    model, train = families.get("ar").configs("tiny", 32, {}, spec.budget("ar").train_kwargs(),
                                              dict(cells["ar-6x1-greedy"].axes))
    assert (model.num_encoder_layers, model.num_decoder_layers) == (6, 1) and train.steps == spec.budget("ar").steps
    deps = fake_deps(tmp_path / "ckpt")
    run = new_store(tmp_path, spec)
    Runner(spec, deps, run, progress=False).run()
    rows = {(r.system, r.test_set): r for r in run.rows()}
    row = rows[("ar-6x1-distill-greedy", "fake_task:test")]
    assert row.layers == "6-1" and row.distill and row.paradigm == "ar"
    assert rows[("ar-greedy", "fake_task:test")].layers is None
    assert verify_run(run.path) == []


def test_timing_says_which_other_narbench_processes_were_busy(tmp_path, spec, second_process, capsys, monkeypatch):
    """While a run times it is registered as busy, and the other narbench processes busy on the machine
    (here a second process training) go to env.json's concurrent_narbench with one warning line."""
    import os

    from bench.measure import timing
    from narbench_core import lock
    from narbench_core.paths import subdir

    from bench.measure import load

    windows = []                                            # the seconds each load sample was asked for
    sample = load.sample
    monkeypatch.setattr(load, "sample", lambda pids, seconds: windows.append(seconds) or sample(pids, seconds))
    alone = new_store(tmp_path / "alone", spec)
    Runner(spec, fake_deps(tmp_path / "ckpt"), alone, progress=False).run()
    assert alone.env()["concurrent_narbench"] == [] and "narbench process" not in capsys.readouterr().err
    assert windows and set(windows) == {spec.timing.load_sample_s} == {0.1}     # the spec's window, not the default
    monkeypatch.setattr(load, "sample", sample)
    if os.path.exists("/proc/stat"):        # the machine's load from any process, before and during (Linux)
        machines = {m["split"]: m for m in alone.env()["machine_load"]}
        keys = {"seconds", "busy", "narbench", "others", "steal", "load_avg_1m"}
        for m in machines.values():      # during: None when the kernel's tick did not advance (a very short timing)
            assert set(m["before"]) == keys and 0 <= m["before"]["others"] <= m["before"]["busy"] <= 1
            assert m["during"] is None or set(m["during"]) == keys
        assert {r.others_cpu_share for r in alone.rows()} <= {(m["during"] or {}).get("others")
                                                              for m in machines.values()}

    registered = []
    measure = timing.measure_systems

    def spy(*args, **kwargs):
        registered.extend(json.loads(p.read_text()) for p in subdir(lock.BUSY_DIR).glob("*.json"))
        return measure(*args, **kwargs)
    monkeypatch.setattr(timing, "measure_systems", spy)
    other = second_process("busy", "training other-ar-1a2b")
    run = new_store(tmp_path, spec)
    Runner(spec, fake_deps(tmp_path / "ckpt"), run, progress=False).run()
    (entry,) = run.env()["concurrent_narbench"]
    assert (entry["pid"], entry["what"]) == (other.pid, "training other-ar-1a2b") and entry["since"]
    warnings = [line for line in capsys.readouterr().err.splitlines() if "narbench process" in line]
    assert len(warnings) == 1 and f"pid {other.pid}: training other-ar-1a2b" in warnings[0]
    assert any(e["pid"] == os.getpid() and e["what"] == "timing gridtest" for e in registered)
