"""Training budgets and learning curves on fakes: rows carry each model's budget, the run folder gets
curves.jsonl, a `match` budget resolves its steps from the AR model's record, the rule and the report."""
from __future__ import annotations

import json

import numpy as np
import pytest

from bench import report, store as st
from bench.measure import learning
from bench.report import plots
from bench.families import load_suite
from bench.plan import expand
from bench.runner import Runner
from bench.rows import CORE, SCHEMA_VERSION, Row
from fakes import saved_figures
from grid_fakes import STEP_COST, TOKENS_PER_STEP, FakeStepCost, fake_deps, fake_row, fake_spec, fake_train_record
from narbench_core.errors import UserError

pytestmark = pytest.mark.usefixtures("fixed_peaks")     # tests/bench/conftest.py

SPEC = fake_spec("budgets", test=["test"], ar_decoders=["greedy"], padir_iterations=[2], max_test_sentences=10)


def load(tmp_path, text: str, name: str = "budgets.toml"):
    path = tmp_path / name
    path.write_text(text)
    return load_suite(path)


def run(tmp_path, spec, deps=None):
    store, _ = st.open_run(tmp_path / "results", spec.name, spec.spec_hash(), spec.to_toml(), "narbench run")
    deps = deps or fake_deps(tmp_path / "ckpt")
    Runner(spec, deps, store, progress=False).run()
    return store, deps


def models(spec) -> tuple[str, str, str]:
    """The labels of the AR model, the PaDIR one and the distilled PaDIR one."""
    cells = expand(spec).train_cells
    pick = lambda family, distilled: next(c.label for c in cells  # noqa: E731
                                          if c.family == family and (c.teacher is not None) == distilled)
    return pick("ar", False), pick("padir", False), pick("padir", True)


def padir_calls(deps) -> list[dict]:
    return [json.loads(key)[2] for task, key in deps.train.calls if json.loads(key)[1]["family"] == "padir"]


def test_rows_carry_the_budget_of_their_model_and_the_run_gets_curves(tmp_path):
    spec = load(tmp_path, SPEC)
    AR_MODEL, PADIR_MODEL, DISTILLED_MODEL = models(spec)
    store, _ = run(tmp_path, spec)
    rows = {r.system: r for r in store.rows()}
    ar, padir, distilled = rows["ar-greedy"], rows["padir-s2-u0.15"], rows["padir-s2-u0.15-distill"]
    assert (ar.model, ar.train_steps, ar.train_tokens) == (AR_MODEL, 5, 5 * TOKENS_PER_STEP)
    assert (ar.train_seconds, ar.train_flops) == (5 * STEP_COST["ar"]["seconds"], 5 * STEP_COST["ar"]["flops"])
    assert padir.train_flops == 5 * STEP_COST["padir"]["flops"] and padir.model == PADIR_MODEL
    assert ar.distill_seconds is None and padir.distill_seconds is None
    assert distilled.distill_seconds == 2.0 and distilled.model == DISTILLED_MODEL
    assert (ar.dev_length_exact, ar.dev_length_within2) == (None, None)      # no length predictor
    assert (padir.dev_length_exact, padir.dev_length_within2) == (0.25, 0.75)
    assert ar.warm_start_seconds is None
    # The fake AR curve rises by 2 BLEU per fifth, the PaDIR ones are flat.
    assert ar.still_improving is True and padir.still_improving is False and distilled.still_improving is False
    points = store.curves()
    assert len(points) == 3 * 5 and all(set(p) == {*learning.FIELDS, "eval_seconds"} for p in points)
    assert {p["eval_seconds"] for p in points} == {0.1}            # each point's own evaluation time, copied
    assert [p["step"] for p in points if p["model"] == AR_MODEL] == [1, 2, 3, 4, 5]
    assert {p["family"] for p in points if p["model"] == PADIR_MODEL} == {"padir"}
    # Re-running a finished grid (or resuming one) replaces a model's points, never duplicates them.
    store.save_curve(AR_MODEL, learning.records(AR_MODEL, "ar", [{"step": 9, "seconds": 1.0, "dev_nll": 2.0,
                                                                "dev_bleu": 5.0}]))
    assert [p["step"] for p in store.curves() if p["model"] == AR_MODEL] == [9]
    assert len(store.curves()) == 2 * 5 + 1


@pytest.mark.parametrize("match, cap, steps", [("flops", 100, 2), ("seconds", 100, 3), ("flops", 1, 1)])
def test_a_matched_budget_resolves_its_steps_from_the_ar_model(tmp_path, match, cap, steps):
    # AR: 5 steps at 1e9 FLOPs / 0.5 s; PaDIR: 2.5e9 FLOPs / 0.8 s per step -> floor(5e9 / 2.5e9) = 2 steps,
    # floor(2.5 / 0.8) = 3 steps; the budget's steps cap it.
    spec = load(tmp_path, SPEC.replace("[train.padir]\nsteps = 5", f'[train.padir]\nmatch = "{match}"\nsteps = {cap}'))
    store, deps = run(tmp_path, spec)
    assert [c["steps"] for c in padir_calls(deps)] == [steps, steps]
    assert all("match" not in c for c in padir_calls(deps))
    assert sorted(deps.step_cost.calls) == [(match, "fake_task", "padir"), (match, "fake_task_distilled", "padir")]
    rows = {r.system: r for r in store.rows()}
    assert rows["padir-s2-u0.15"].train_steps == steps and rows["padir-s2-u0.15-distill"].train_steps == steps
    assert rows["ar-greedy"].train_steps == 5
    if match == "flops" and cap > steps:
        assert rows["padir-s2-u0.15"].train_flops <= rows["ar-greedy"].train_flops
        assert rows["padir-s2-u0.15"].train_flops > rows["ar-greedy"].train_flops - STEP_COST["padir"]["flops"]
    resolved = store.info["matched_budgets"][models(spec)[1]]
    assert (resolved["match"], resolved["steps"], resolved["per_step"]) == (match, steps, STEP_COST["padir"][match])
    # A resumed run keeps the resolution: nothing is measured again, the same model is trained.
    deps.step_cost = FakeStepCost()
    rows_file = store.path / st.ROWS
    rows_file.write_text("")
    Runner(spec, deps, store, progress=False).run()
    assert deps.step_cost.calls == [] and [c["steps"] for c in padir_calls(deps)][-2:] == [steps, steps]


def test_matched_budgets_are_validated(tmp_path):
    with pytest.raises(UserError, match="train.padir.match: expected one of flops, seconds"):
        load(tmp_path, SPEC.replace("[train.padir]\n", '[train.padir]\nmatch = "tokens"\n'))
    spec = load(tmp_path, SPEC.replace("[train.ar]\n", '[train.ar]\nmatch = "flops"\n'))
    with pytest.raises(UserError, match="train.ar: match"):
        run(tmp_path, spec)
    spec = load(tmp_path, SPEC.replace("[train.padir]\nsteps = 5", '[train.padir]\nmatch = "flops"\nsteps = 5'))
    deps = fake_deps(tmp_path / "ckpt2")
    deps.train_record = lambda path: {"steps_done": 5}                 # an AR model trained before train_flops
    with pytest.raises(UserError, match="records no train_flops"):
        run(tmp_path / "old", spec, deps)


def test_new_budget_keys_leave_other_specs_and_configs_alone(tmp_path):
    plain = load(tmp_path, SPEC)
    assert all("match" not in b and "eval_every" not in b for b in plain.to_dict()["train"].values())
    matched = load(tmp_path, SPEC.replace("[train.padir]\n", '[train.padir]\nmatch = "seconds"\neval_every = 3\n'),
                   "matched.toml")
    assert matched.spec_hash() != plain.spec_hash()
    assert matched.to_dict()["train"]["padir"]["match"] == "seconds"
    kwargs = matched.budget("padir").train_kwargs()
    assert "match" not in kwargs and kwargs["eval_every"] == 3


def test_families_default_to_five_curve_points():
    from bench import families

    family = families.get("padir")
    budget = {"steps": 1500, "batch_tokens": 2048, "learning_rate": 3e-2, "warmup_steps": 10}
    _, train_config = family.configs("tiny", 64, {}, budget, {})
    assert train_config.eval_every == 300
    _, train_config = family.configs("tiny", 64, {}, {**budget, "eval_every": 0}, {})
    assert train_config.eval_every == 0


@pytest.mark.parametrize("points, expected", [
    ([(100, 10.0), (200, 12.0), (300, 13.0), (400, 13.2), (500, 13.8)], True),     # +0.6 over steps 400-500
    ([(100, 10.0), (200, 12.0), (300, 13.0), (400, 13.2), (500, 13.6)], False),    # +0.4
    ([(100, 10.0), (200, 12.0), (300, 13.0), (400, 13.0), (500, 13.5)], False),    # exactly 0.5 is not more
    ([(500, 13.8), (300, 13.0), (100, 10.0), (400, 13.2), (200, 12.0)], True),     # any order
    ([(100, 10.0), (300, 11.0), (500, 12.1)], True),        # at step 400 interpolated 11.5: +0.6
    ([(100, 10.0), (300, 11.0), (500, 12.0)], False),       # +0.5
    ([(100, 20.0), (300, 11.0), (500, 12.0)], False),       # falling before the last fifth does not count
    ([(450, 1.0), (500, 9.0)], None),                       # no point at or before step 400
    ([], None),
])
def test_still_improving_rule(points, expected):
    assert learning.still_improving([{"step": s, "dev_bleu": b} for s, b in points]) is expected


def test_the_dev_swing_is_the_spread_of_successive_differences_at_the_peak_rate():
    points = [{"step": 500 * (i + 1), "dev_bleu": b} for i, b in enumerate(
        [1.0, 5.0, 9.0, 10.0, 12.0, 11.0, 13.0, 12.0, 14.0, 30.0])]
    # Decay from 4,500: the points of 2,250-4,500 (12, 11, 13, 12, 14): differences -1, 2, -1, 2.
    assert learning.dev_swing(points, 4500) == pytest.approx(float(np.std([-1, 2, -1, 2], ddof=1)))
    # No decay: from half the last step on (2,500-5,000), the last point's jump included.
    assert learning.dev_swing(points, None) == pytest.approx(float(np.std([-1, 2, -1, 2, 16], ddof=1)))
    # A curve that only climbs steadily does not swing; under 3 points says nothing.
    assert learning.dev_swing([{"step": s, "dev_bleu": s / 100} for s in range(100, 1100, 100)], None) == 0.0
    assert learning.dev_swing(points[:2], None) is None
    nll = [{"step": s, "dev_nll": v} for s, v in ((1, 3.0), (2, 2.0), (3, 1.5), (4, 1.25))]
    assert learning.dev_swing(nll, None, key="dev_nll") == pytest.approx(float(np.std([-0.5, -0.25], ddof=1)))


def test_a_continuation_past_the_plateau_is_compared_with_the_swing():
    stopped = [{"step": s, "dev_bleu": b, "dev_nll": n} for s, b, n in
               ((2, 10.0, 3.0), (4, 12.0, 2.9), (6, 11.0, 2.85), (8, 13.0, 2.8), (10, 15.5, 2.7))]
    continued = stopped[:4] + [{"step": 20, "dev_bleu": 17.25, "dev_nll": 2.5}]
    assert learning.past_plateau(stopped, 8, continued) == (
        f"dev BLEU 17.25 at step 20 continued, 15.50 at step 10 stopped (+1.75; dev NLL 2.500 vs 2.700); its dev BLEU "
        f"swings by {float(np.std([-1, 2], ddof=1)):.2f} between evaluations at the peak rate: a rise beyond that "
        "means the rule stopped it early")
    assert "an unknown swing" in learning.past_plateau(stopped, 4, continued)
    # With the final models' paired dev BLEU difference: the verdict is by its 95% interval.
    for final, verdict in (((900, 1.75, (0.5, 3.0)), "the rule stopped it early"),
                           ((900, 0.25, (-0.5, 1.0)), "within the dev set's noise: the rule did not stop it early"),
                           ((900, -1.5, (-2.5, -0.5)), "the continued model is worse")):
        line = learning.past_plateau(stopped, 8, continued, final)
        low, high = final[2]
        assert line.endswith(f"between evaluations at the peak rate; the final models on the 900 dev sentences: "
                             f"{final[1]:+.2f} BLEU, 95% CI [{low:+.2f}, {high:+.2f}] (paired bootstrap): {verdict}")


def test_report_draws_learning_curves_and_a_budget_table(tmp_path):
    spec = load(tmp_path, SPEC)
    AR_MODEL, PADIR_MODEL, DISTILLED_MODEL = models(spec)
    store, _ = run(tmp_path, spec)
    st.finish_run(store)
    written = report.write_report(store.path)
    png = store.path / "learning_curves.png"
    assert png in written and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    board = (store.path / "leaderboard.md").read_text()
    assert "| train steps | train s | still improving |" in board             # FLOPs: in table.md's budgets
    ar_line = next(ln for ln in board.splitlines() if "| AR greedy |" in ln)
    assert ar_line.endswith("| 5 | 2 | yes |")
    assert "![learning_curves.png](learning_curves.png)" in board and "[curves.jsonl](curves.jsonl)" in board
    table = (store.path / "table.md").read_text().split("## Training budgets")[1].split("##")[0]
    lines = [ln for ln in table.splitlines() if ln.startswith("| ") and "| model |" not in ln]
    # The swings of dev BLEU and dev NLL (the fake curves' NLL is flat); no rule fired, so no best signal.
    assert lines == [f"| {AR_MODEL} | AR | 5 | 1.00k | 2 | 5.00G | 100% | – | – | 0.00 | 0.000 | yes | – | – |",
                     f"| {PADIR_MODEL} | PaDIR | 5 | 1.00k | 4 | 12.50G | 250% | – | – | 0.00 | 0.000 | no | 0.250 "
                     "| 0.750 |",
                     f"| {DISTILLED_MODEL} | PaDIR | 5 | 1.00k | 4 | 12.50G | 250% | – | 2 | 0.00 | 0.000 | no | 0.250 "
                     "| 0.750 |"]


def test_curve_points_say_which_came_after_the_learning_rate_decay_started(tmp_path):
    spec = load(tmp_path, SPEC)
    AR_MODEL, PADIR_MODEL, _ = models(spec)
    deps = fake_deps(tmp_path / "ckpt")
    deps.train_record = lambda path: {**fake_train_record(path), "decay_start": 3}      # every model: 5 steps
    store, _ = run(tmp_path, spec, deps)
    ar = [(p["step"], p["decaying"]) for p in store.curves() if p["model"] == AR_MODEL]
    assert ar == [(1, False), (2, False), (3, False), (4, True), (5, True)]
    assert all("decaying" in p for p in store.curves())
    # The rows say where the decay began and the plateau before it (AR's dev BLEU: 2, 4, 6 up to step 3).
    row = next(r for r in store.rows() if r.model == AR_MODEL)
    assert (row.decay_start, row.plateau_dev_bleu) == (3, 6.0)
    st.finish_run(store)
    report.write_report(store.path)
    budgets = (store.path / "table.md").read_text().split("## Training budgets")[1].split("##")[0]
    assert "| decay from step | dev BLEU at plateau |" in budgets and f"| {AR_MODEL} | AR | 5 |" in budgets
    assert "| 3 | 6.00 |" in budgets


def test_the_plateau_is_the_best_dev_bleu_up_to_the_decay():
    points = [{"step": 500, "dev_bleu": 10.0}, {"step": 1000, "dev_bleu": 12.5}, {"step": 1500, "dev_bleu": 11.0},
              {"step": 2000, "dev_bleu": 15.0}]
    assert learning.plateau_bleu(points, 1500) == 12.5
    assert learning.plateau_bleu(points, 1000) == 12.5
    assert learning.plateau_bleu(points, None) is None
    assert learning.plateau_bleu(points, 100) is None


@pytest.mark.parametrize("record, started", [
    ({"decay_start": 7000, "steps_done": 8400, "stopped_by": "plateau"}, 7000),
    ({"decay_start": 50000, "steps_done": 7500, "stopped_by": "cap"}, None),         # stopped before its decay
    ({"decay_start": 50000, "steps_done": 50000}, None),
    ({"decay_start": None, "steps_done": 1500}, None),                                # cosine
    ({"steps_done": 5}, None)])                                                       # a record from before wsd
def test_the_decay_started_only_where_training_went_past_its_start(record, started):
    assert learning.decay_started(record) == started


def test_plot_learning_curves_rings_where_the_decay_started(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    rising = [{"step": s, "seconds": float(s), "dev_nll": 5 - s / 10, "dev_bleu": float(s)} for s in (10, 20, 30, 40)]
    points = (learning.records("a", "ar", rising, decay_start=20) + learning.records("b", "padir", rising[:2])
              + learning.records("c", "padir", rising, decay_start=40))                  # c: no point after 40
    assert [p["decaying"] for p in points if p["model"] == "a"] == [False, False, True, True]
    assert all("decaying" not in p for p in points if p["model"] == "b")
    with saved_figures() as figures:
        plots.plot_learning_curves(points, tmp_path / "lc.png")
    bleu_ax, nll_ax = figures["lc.png"].axes
    rings = [line for line in bleu_ax.get_lines() if line.get_label() == plots.DECAY_MARK]
    assert [(list(r.get_xdata()), list(r.get_ydata())) for r in rings] == [([20.0], [20.0])]   # only a's
    assert [list(r.get_ydata()) for r in nll_ax.get_lines() if r.get_label() == plots.DECAY_MARK] == [[3.0]]
    legend = [t.get_text() for t in figures["lc.png"].legends[0].get_texts()]
    assert legend == ["a", "b", "c", plots.DECAY_MARK]                             # one entry for every ring


def test_plot_learning_curves_from_points(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    points = (learning.records("a", "ar", [{"step": s, "seconds": s * 0.5, "dev_nll": 5 - s / 10, "dev_bleu": s}
                                         for s in (10, 20, 30)])
              + learning.records("b", "padir", [{"step": 5, "seconds": 1.0, "dev_nll": 6.0, "dev_bleu": 0.5}]))
    with saved_figures() as figures:
        plots.plot_learning_curves(points, tmp_path / "lc.png")
    assert (tmp_path / "lc.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [ax.get_ylabel() for ax in figures["lc.png"].axes] == ["dev BLEU", "dev NLL per target token"]
    for ax in figures["lc.png"].axes:
        assert ax.get_xlabel() == "training seconds (train steps only)"
        lines = {line.get_label(): list(line.get_xdata()) for line in ax.get_lines()}
        assert lines == {"a": [5.0, 10.0, 15.0], "b": [1.0]}              # seconds, one line per model


def test_rows_written_before_the_budget_columns_still_load():
    record = dict(fake_row("ar-greedy"))
    added = [c.name for c in CORE if c.optional]
    assert {"train_steps", "train_flops", "still_improving", "model"} <= set(added)
    for name in added:
        del record[name]
    row = Row.load({**record, "schema_version": SCHEMA_VERSION})
    assert row.train_flops is None and row.still_improving is None
    del record["bleu"]
    with pytest.raises(UserError, match="lacks columns"):
        Row.load(record)


def test_a_rule_on_dev_nll_reports_its_best_and_swing(tmp_path):
    """A model stopped by the rule on dev NLL: its rows carry the rule's best NLL (the record's) and the NLL swing
    at the peak rate, and the budget table shows both."""
    spec = load(tmp_path, SPEC)
    AR_MODEL, _, _ = models(spec)
    deps = fake_deps(tmp_path / "ckpt")
    deps.train_record = lambda path: {**fake_train_record(path), "stopped_by": "plateau", "decay_start": 4,
                                      "best_dev_nll": 3.6}
    store, _ = run(tmp_path, spec, deps)
    st.finish_run(store)
    row = next(r for r in store.rows() if r["model"] == AR_MODEL)
    assert row["best_dev_nll"] == 3.6 and row["dev_nll_swing"] == pytest.approx(0.0, abs=1e-12)
    report.write_report(store.path)
    table = (store.path / "table.md").read_text().split("## Training budgets")[1].split("##")[0]
    assert "| best dev NLL | dev NLL swing |" in table
    assert "| 3.600 | 0.000 |" in next(ln for ln in table.splitlines() if ln.startswith(f"| {AR_MODEL} |"))
