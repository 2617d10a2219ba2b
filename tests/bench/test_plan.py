"""`narbench plan`: what a suite expands to (its cells, which are cached, its systems per test set) and an
estimate of the work left, from costs measured before, without training or timing anything."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from bench import estimate, preview, store as st
from bench.cli import main
from bench.families import load_suite as load_spec
from bench.runner import Runner
from grid_fakes import STEP_COST, fake_deps, fake_locator, fake_spec

pytestmark = pytest.mark.usefixtures("fixed_peaks")     # tests/bench/conftest.py

SPEC = fake_spec("plantest", test=["test", "test+refs"], ar_decoders=["greedy"], padir_iterations=[1, 4],
                 max_test_sentences=20, length_hyps=[3])
MACHINE = {"cpu_model": "Test CPU", "threads": 2}
PADIR = "padir fake_task positional_attention True recipe reference stages 2 unmask_rate"


@pytest.fixture
def measured(tmp_path):
    """A finished fake run of SPEC (its models cached by the fake trainer) measured on MACHINE."""
    path = tmp_path / "plantest.toml"
    path.write_text(SPEC)
    spec = load_spec(path)
    deps = fake_deps(tmp_path / "ckpt")
    run, _ = st.open_run(tmp_path / "results", spec.name, spec.spec_hash(), spec.to_toml(), "narbench run")
    run.write_env(MACHINE)
    Runner(spec, deps, run, progress=False).run()
    st.finish_run(run)
    return tmp_path, deps, run


def test_plan_shows_what_is_cached_the_systems_and_an_estimate(measured):
    tmp_path, deps, run = measured
    path = tmp_path / "more.toml"
    path.write_text(SPEC.replace('name = "plantest"', 'name = "more"') + "unmask_rate = [0.15, 0.5]\n")
    spec = load_spec(path)
    shown = preview.preview(spec, fake_locator(deps), estimate.Measured.collect(tmp_path / "results", None, MACHINE))
    assert {c.cell.label: c.state for c in shown.cells} == {
        "ar fake_task seed 0": "cached", f"{PADIR} 0.15 seed 0": "cached", f"{PADIR} 0.15 distill seed 0": "cached",
        f"{PADIR} 0.5 seed 0": "to train", f"{PADIR} 0.5 distill seed 0": "to train"}
    assert [d.state for d in shown.distillations] == ["cached"]
    assert deps.train.calls and len(deps.train.calls) == 3          # the preview trained nothing more
    # Each new model: 5 steps at the 0.8 s a step the fake PaDIR models took, plus 5 dev points at the 0.1 s
    # each of their curve points took.
    new = [c for c in shown.cells if c.state == "to train"]
    assert [c.estimate.seconds for c in new] == [pytest.approx(5 * STEP_COST["padir"]["seconds"] + 5 * 0.1)] * 2
    assert new[0].estimate.how == ("5 steps x 0.80 s (median of 2 measured: 0.80 s a step) + 5 dev points of 200 "
                                   "sentences x 0.1 s")
    assert sorted(c.systems for c in new) == [["padir-s1-u0.5-distill-k3", "padir-s4-u0.5-distill-k3"],
                                              ["padir-s1-u0.5-k3", "padir-s4-u0.5-k3"]]
    # One timed measurement serves test and test+refs: every system once on 20 sentences and the solo check's.
    [split] = shown.splits
    assert split.test_sets == ["fake_task:test", "fake_task:test+refs"] and split.sentences == 20
    assert len(split.systems) == 1 + 2 * 2 * 2
    row = {r.system: r for r in run.rows() if r.test_set == "fake_task:test"}
    cost, seconds = split.costs["ar-greedy"]
    assert cost.latency_ms == pytest.approx(row["ar-greedy"].latency_mean_ms) and cost.how == "measured (1 run)"
    assert seconds == pytest.approx(cost.compile_s + (20 + 20) * cost.latency_ms / 1000)
    assert not split.costs["padir-s4-u0.5-k3"][0].how.startswith("measured")
    assert split.costs["padir-s4-u0.15-k3"][0].how == "measured (1 run)"
    totals = shown.totals()
    assert totals["training"] == pytest.approx(9.0) and totals["distillation"] == 0.0
    assert totals["timing"] == pytest.approx(sum(sec for _, sec in split.costs.values()))
    assert totals["total"] == pytest.approx(9.0 + totals["timing"])
    text = preview.render_text(shown)
    assert "Training cells (5: 3 cached, 2 to train)" in text
    assert f"  to train  {PADIR} 0.5 seed 0\n" in text and f"  cached    {PADIR} 0.15 seed 0\n" in text
    assert "fake_task:test and fake_task:test+refs: 9 systems in 2 worker processes, 20 sentences, timed once" in text
    assert f"\n  training      {'9 s':>12s}  (2 models; per cell above)\n" in text
    assert "from 1 runs under the results folder" in text
    # A training that stopped part way is resumed, not started again.
    Path(new[0].folder).mkdir(parents=True)
    (Path(new[0].folder) / "narbench.json").write_text(json.dumps({"steps_done": 3}))
    again = preview.preview(spec, fake_locator(deps), estimate.Measured())
    assert [(c.state, c.note) for c in again.cells if c.cell == new[0].cell] == [("partial", "resumes at step 3")]
    assert again.totals()["training"] is None                   # nothing measured: unknown, not zero
    # Only the rest of it is counted: 2 steps and 2 dev points.
    resumed = preview.preview(spec, fake_locator(deps), estimate.Measured.collect(tmp_path / "results", None, MACHINE))
    [partial] = [c for c in resumed.cells if c.cell == new[0].cell]
    assert partial.estimate.seconds == pytest.approx(2 * STEP_COST["padir"]["seconds"] + 2 * 0.1)
    assert partial.estimate.how.startswith("2 more steps (stops at step 5) x 0.80 s")


def _plateau_config(**kw):
    from models.train import TrainConfig

    return TrainConfig(**{"steps": 60_000, "until": "plateau", "schedule": "wsd", "eval_every": 500, "patience": 4,
                          "min_delta": 0.2, **kw})


def _curve(*bleus: float, every: int = 500) -> list[dict]:
    return [{"step": every * (i + 1), "dev_bleu": b} for i, b in enumerate(bleus)]


def test_a_partial_training_stops_where_its_rule_says_or_at_the_earliest_it_can():
    cfg = _plateau_config()
    rising = [10.0 + 0.5 * i for i in range(15)] + [17.76, 17.31]        # best 17.76 at 8,000; then one below
    # Not fired: the rule can fire 4 evaluations after the best (10,000) at the earliest, then a 20% decay.
    assert estimate.progress(cfg, 8500, _curve(*rising)) == estimate.Progress(8500, 12_000, False,
                                                                             pytest.approx(17.96))
    # A new best at 9,000 puts it off; a rise of 0.2 or less does not.
    assert estimate.progress(cfg, 9000, _curve(*rising, 18.0)).stop == 11_000 + 2_200
    assert estimate.progress(cfg, 9000, _curve(*rising, 17.9)).stop == 12_000
    # Fired at 10,000: exact.
    fired = estimate.progress(cfg, 10_500, _curve(*rising, 17.0, 17.5, 17.2, 17.1))
    assert (fired.stop, fired.exact) == (12_000, True)
    # No plateau can fire before the latest decay start (10,000 / 1.2): it runs to its cap.
    assert estimate.progress(_plateau_config(steps=10_000), 8500, _curve(*rising)) == estimate.Progress(
        8500, 10_000, True, None)
    assert estimate.progress(_plateau_config(until="steps", schedule="cosine"), 10, []) == estimate.Progress(
        10, 60_000, True, None)
    # A smoothed rule (the mean of the last 3 points): its best is 8,500's (17.0 + 17.76 + 17.31) / 3, so it fires 4
    # evaluations later at the earliest; the next point must lift the mean past that best + 0.2 to put it off.
    smoothed = estimate.progress(_plateau_config(smooth=3), 8500, _curve(*rising))
    assert smoothed == estimate.Progress(8500, 10_500 + 2_100, False, pytest.approx(3 * (52.07 / 3 + 0.2) - 35.07))
    # A growing patience (half the evaluations so far) and a first step push the earliest stop out.
    assert estimate.progress(_plateau_config(patience_share=0.5), 8500, _curve(*rising)).stop == 16_000 + 3_200
    assert estimate.progress(_plateau_config(min_steps=20_000), 8500, _curve(*rising)).stop == 20_000 + 4_000


def test_a_rule_on_dev_nll_is_replayed_with_a_falling_signal():
    """The same curve read as dev NLL (the rise above as a fall): the same earliest stop, and the threshold is the
    NLL the next point must fall under; the plan says so."""
    from suites.spec import TrainBudget

    cfg = _plateau_config(signal="dev_nll")
    falling = [{"step": p["step"], "dev_nll": 20.0 - p["dev_bleu"]}
               for p in _curve(*[10.0 + 0.5 * i for i in range(15)], 17.76, 17.31)]
    assert estimate.progress(cfg, 8500, falling) == estimate.Progress(8500, 12_000, False, pytest.approx(20 - 17.96))
    assert estimate.progress(cfg, 9000, falling + [{"step": 9000, "dev_nll": 1.9}]).stop == 11_000 + 2_200
    assert estimate.progress(cfg, 9000, falling + [{"step": 9000, "dev_nll": 2.1}]).stop == 12_000
    budget = TrainBudget(steps=60_000, batch_tokens=256, learning_rate=1e-2, warmup_steps=4, signal="dev_nll")
    assert (estimate._stays(budget, estimate.progress(cfg, 8500, falling))
            == "dev NLL falls no more: the next point over 2.040")


def test_a_plateau_is_estimated_from_the_nearest_models_the_rule_stopped():
    from suites.spec import TrainBudget

    small, tiny = (("d_model", 256),), (("d_model", 64),)

    budget = TrainBudget(steps=60_000, batch_tokens=2048, learning_rate=0.03, warmup_steps=100, eval_every=500,
                         until="plateau", schedule="wsd", patience=4, min_delta=0.2)

    def rule(b):
        return estimate.plateau_rule(b.train_kwargs(), 500)

    def model(task, shape, steps):
        return estimate.TrainedModel("x", "ar", task, shape, 2048, 1.0, None, steps, 1.0, "plateau", rule=rule(budget))

    def how(*trained, resumed_at=None):
        measured = estimate.Measured(trained=[model("other", small, 3000), *trained])
        return estimate.train_estimate(measured, "ar", "bible", small, "a", budget, {}, resumed_at).how
    assert how().startswith("3,000 steps (plateau: the median stop of 1 measured on other tasks, cap 60,000)")
    # a stop read from a run on another machine counts (steps do not depend on it), said so
    away = estimate.Measured(trained=[model("other", small, 3000)], elsewhere=[model("bible", small, 9000)])
    assert estimate.train_estimate(away, "ar", "bible", small, "a", budget, {}).how.startswith(
        "9,000 steps (plateau: the median stop of 1 measured (1 on other machines), cap 60,000)")
    assert how(model("bible", tiny, 4000)).startswith("4,000 steps (plateau: the median stop of 1 measured "
                                                      "of another model shape")
    assert how(model("bible", small, 8400), model("bible", tiny, 4000)).startswith("8,400 steps (plateau: the "
                                                                                   "median stop of 1 measured, ")
    # Of other shapes, the nearest's stops (a larger model trains longer to its plateau), not every shape's median.
    sized = {d: (("d_model", d), ("d_ff", 4 * d), ("num_encoder_layers", 2)) for d in (64, 128, 256)}
    three = estimate.Measured(trained=[model("bible", sized[64], 4000), model("bible", sized[64], 4400),
                                       model("bible", sized[128], 9000)])
    assert estimate.train_estimate(three, "ar", "bible", sized[256], "a", budget, {}).how.startswith(
        "9,000 steps (plateau: the median stop of 1 measured of another model shape")
    # A rule on dev NLL is estimated from stops by rules on dev NLL first, whatever their shape; from the others only
    # where there are none, said so.
    import dataclasses

    nll = dataclasses.replace(budget, signal="dev_nll", min_delta=0.02)
    by_nll = dataclasses.replace(model("bible", tiny, 37000), rule=rule(nll))
    measured = estimate.Measured(trained=[model("bible", small, 8400), by_nll])
    assert estimate.train_estimate(measured, "ar", "bible", small, "a", nll, {}, None).how.startswith(
        "37,000 steps (plateau: the median stop of 1 measured of another model shape, cap 60,000)")
    assert estimate.train_estimate(estimate.Measured(trained=[model("bible", small, 8400)]), "ar", "bible", small,
                                   "a", nll, {}, None).how.startswith(
        "8,400 steps (plateau: the median stop of 1 measured under a rule on another signal, cap 60,000)")
    # A training under the rule still under way past another rule's stops is the estimate, a floor, said so (not
    # one under another rule or task, nor one short of those stops); past the stops of its own rule it is a note.
    running = dataclasses.replace(model("bible", tiny, 58000), rule=rule(nll), stopped_by="cap", complete=False)
    for others, past in [([running], True), ([dataclasses.replace(running, rule=rule(budget))], False),
                         ([dataclasses.replace(running, task="other")], False),
                         ([dataclasses.replace(running, steps=8000)], False)]:
        how_ = estimate.train_estimate(estimate.Measured(trained=[model("bible", small, 8400), *others]), "ar", "bible",
                                       small, "a", nll, {}, None).how
        assert how_.startswith("58,000 steps (plateau: at least 58,000, as far as a training of this family under "
                               "this rule has run and not stopped; the median stop of 1 measured under a rule on "
                               "another signal is 8,400; cap 60,000)" if past else
                               "8,400 steps (plateau: the median stop of 1 measured under a rule on another signal, "
                               "cap 60,000)")
    beyond_cap = dataclasses.replace(running, steps=75000)
    assert estimate.train_estimate(estimate.Measured(trained=[model("bible", small, 8400), beyond_cap]), "ar", "bible",
                                   small, "a", nll, {}, None).how.startswith("60,000 steps (plateau: at least 60,000")
    same_rule = estimate.Measured(trained=[by_nll, running])
    assert estimate.train_estimate(same_rule, "ar", "bible", small, "a", nll, {}, None).how.startswith(
        "37,000 steps (plateau: the median stop of 1 measured of another model shape; a training of this family "
        "under this rule has run 58,000 steps and not stopped, cap 60,000)")
    # Rules on one signal differ by more than it (a mean of 9 points, another rise): the stops of the same rule come
    # first, whatever their shape; then another rule's on the signal, said so; its running training is a floor there.
    nine = dataclasses.replace(budget, smooth=9, min_delta=0.25)
    by_nine = dataclasses.replace(model("bible", tiny, 30600), rule=rule(nine))
    assert estimate.train_estimate(estimate.Measured(trained=[model("bible", small, 8400), by_nine]), "ar", "bible",
                                   small, "a", nine, {}, None).how.startswith(
        "30,600 steps (plateau: the median stop of 1 measured of another model shape, cap 60,000)")
    assert estimate.train_estimate(estimate.Measured(trained=[model("bible", small, 8400), by_nll]), "ar", "bible",
                                   small, "a", nine, {}, None).how.startswith(
        "8,400 steps (plateau: the median stop of 1 measured under another rule on its signal, cap 60,000)")
    nine_running = dataclasses.replace(running, rule=rule(nine), steps=21000)
    assert estimate.train_estimate(estimate.Measured(trained=[model("bible", small, 8400), nine_running]), "ar",
                                   "bible", small, "a", nine, {}, None).how.startswith(
        "21,000 steps (plateau: at least 21,000, as far as a training of this family under this rule has run and not "
        "stopped; the median stop of 1 measured under another rule on its signal is 8,400; cap 60,000)")
    # A checkpoint record leaves out the fields at their defaults; a spec says "all" for the whole dev split.
    assert estimate.plateau_rule({"smooth": 9, "min_delta": 0.25, "dev_sentences": 0}, 500) == estimate.plateau_rule(
        {"signal": "dev_bleu", "smooth": 9, "min_delta": 0.25, "patience": 3, "dev_sentences": "all"}, 500)
    assert estimate.plateau_rule({"smooth": 9}, 500) != estimate.plateau_rule({"smooth": 9}, 250)
    # Resumed: the measured stop when it is later than the earliest the rule can stop it, else the earliest.
    assert how(model("bible", small, 8400), resumed_at=(1000, _curve(1.0, 2.0))).startswith("7,400 more steps")
    assert how(model("bible", small, 8400), resumed_at=(8500, _curve(*[float(i) for i in range(17)]))).startswith(
        "4,100 more steps (plateau: step 12,600 at the earliest, if dev BLEU rises no more: the next point under "
        "16.20; cap 60,000)")
    # A resumed training runs at its own rate so far: its checkpoint's record (1.5 s a step over 1,000 steps)
    # before models of the same cell label, task and batch tokens (1.0 s).
    own = estimate.TrainedModel("checkpoints/own", "ar", "bible", small, 2048, 1.0, None, 1000, 1.5, "cap")
    same_cell = dataclasses.replace(model("bible", small, 8400), label="a")
    resumed = estimate.train_estimate(estimate.Measured(trained=[same_cell, own]), "ar", "bible", small, "a",
                                      budget, {}, (1000, _curve(1.0, 2.0)), "checkpoints/own")
    assert resumed.how.startswith(
        "7,400 more steps (plateau: the median stop of 1 measured, cap 60,000) x 1.50 s (its own rate so far)")
    first = estimate.train_estimate(estimate.Measured(trained=[own]), "ar", "bible", small, "a", budget, {},
                                    (1000, _curve(1.0, 2.0)), "checkpoints/own")
    assert first.seconds is not None and " x 1.50 s (its own rate so far)" in first.how   # none of its shape before
    # With no plateau measured the cap bounds a new training; a resumed one is at least its earliest stop.
    capped = estimate.Measured(trained=[dataclasses.replace(model("bible", small, 9000), stopped_by="cap")])
    fresh = estimate.train_estimate(capped, "ar", "bible", small, "a", budget, {})
    resumed = estimate.train_estimate(capped, "ar", "bible", small, "a", budget, {}, (1000, _curve(1.0, 2.0)))
    assert fresh.how.startswith("60,000 steps (plateau: the cap, an upper bound)")
    assert resumed.how.startswith("2,600 more steps (plateau: step 3,600 at the earliest")


def test_dev_points_are_scaled_by_the_sentences_each_decodes(monkeypatch):
    """A measured training's dev points decoded 200 sentences in 10 s each: a cell whose points decode 1,000 takes
    50 s a point, one of the whole dev split its split's size (the task's catalog's; a task it does not know:
    unscaled)."""
    from suites.spec import TrainBudget

    monkeypatch.setattr(estimate, "_dev_split_size", {"bible": 1007}.get)

    small = estimate.model_shape("small")

    def budget(dev_sentences):
        return TrainBudget(steps=1000, batch_tokens=2048, learning_rate=0.03, warmup_steps=100, eval_every=500,
                           dev_sentences=dev_sentences)

    def model(task, dev_sentences):
        return estimate.TrainedModel("x", "ar", task, small, 2048, 1.0, None, 7000, 2.0, "cap",
                                     eval_seconds_per_point=10.0,
                                     rule=estimate.plateau_rule(budget(dev_sentences).train_kwargs(), 500))

    def got(task, measured_sentences, cell_sentences):
        measured = estimate.Measured(trained=[model(task, measured_sentences)])
        return estimate.train_estimate(measured, "ar", task, small, "a", budget(cell_sentences), {})
    same = got("nowhere", 200, 200)
    assert same.seconds == pytest.approx(1000 * 2.0 + 2 * 10.0) and "2 dev points of 200 sentences x 10.0 s" in same.how
    assert got("nowhere", 200, 1000).seconds == pytest.approx(1000 * 2.0 + 2 * 50.0)
    unknown = got("nowhere", 200, 0)                # the whole split of a task nobody knows: left as measured
    assert unknown.seconds == pytest.approx(1000 * 2.0 + 2 * 10.0) and "dev points x 10.0 s" in unknown.how
    whole = got("bible", 200, 0)
    assert whole.seconds == pytest.approx(1000 * 2.0 + 2 * 10.0 * 1007 / 200)
    assert "2 dev points of 1,007 sentences x 50.4 s" in whole.how
    assert got("bible", 5000, 0).seconds == pytest.approx(1000 * 2.0 + 2 * 10.0)   # 5,000 of a 1,007 split: all


def test_a_size_never_measured_takes_the_nearest_size_scaled_by_work_per_token():
    from suites.spec import TrainBudget

    small, mini, medium = (estimate.model_shape(p) for p in ("small", "mini", "medium"))
    measured = estimate.Measured(trained=[estimate.TrainedModel("x", "ar", "bible", small, 2048, 1.0, None, 7000, 2.0,
                                                                "plateau")])
    budget = TrainBudget(steps=10_000, batch_tokens=2048, learning_rate=0.03, warmup_steps=100)
    for shape in (mini, medium):
        got = estimate.train_estimate(measured, "ar", "bible", shape, "a", budget, {}, vocab_size=8000)
        ratio = estimate.token_work(shape, 8000) / estimate.token_work(small, 8000)
        assert got.seconds == pytest.approx(10_000 * 2.0 * ratio)
        assert f"x {ratio:.2f} work per token" in got.how and "no model of this size measured here" in got.how
    low, high = (estimate.token_work(s, 8000) / estimate.token_work(small, 8000) for s in (mini, medium))
    assert 0.2 < low < 0.5 < 2.0 < high < 6.0              # the presets sit about 4x apart
    assert estimate.train_estimate(measured, "padir", "bible", small, "a", budget, {}).seconds is None


def test_plan_command_prints_json_and_leaves_other_machines_out(measured, monkeypatch, capsys):
    tmp_path, deps, run = measured
    monkeypatch.setattr(preview, "real_locator", lambda: fake_locator(deps))
    monkeypatch.setattr(estimate, "this_machine", lambda: MACHINE)
    args = ["plan", "--suite", str(tmp_path / "plantest.toml"), "--results", str(tmp_path / "results")]
    assert main(args + ["--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {c["state"] for c in out["cells"]} == {"cached"} and out["distillations"][0]["state"] == "cached"
    # Everything cached: no training left; the timing estimate is the sum of each system's, from the fake run's rows.
    split = out["test_sets"][0]
    assert out["estimate"]["training_seconds"] == 0.0
    assert split["worker_processes"] == 2                    # the AR family's and the PaDIR family's
    assert all(s["how"] == "measured (1 run)" for s in split["systems"])
    assert out["estimate"]["timing_seconds"] == pytest.approx(split["seconds"])
    assert split["seconds"] == pytest.approx(sum(s["seconds"] for s in split["systems"]))
    assert out["estimate"]["sources"]["runs"] == [f"plantest/{run.run_id}"]
    assert [s["system"] for s in out["test_sets"][0]["systems"]][:2] == ["ar-greedy", "padir-s1-u0.15-k3"]
    assert main(args + ["--leave-out", f"plantest/{run.run_id}"]) == 0
    text = capsys.readouterr().out
    assert f"\n  timing        {'unknown':>12s}  (5 systems in 1 measurement" in text
    assert "5 not estimated: nothing comparable was timed" in text and "from 0 runs under the results folder" in text
    monkeypatch.setattr(estimate, "this_machine", lambda: {"cpu_model": "Other CPU", "threads": 64})
    assert main(args) == 0
    assert "(1 runs from other machines left out, but for where plateau rules stopped their models)" in (
        capsys.readouterr().out)


def test_a_plateau_at_another_peak_learning_rate_is_scaled_where_both_peaks_were_measured(tmp_path):
    """A lower peak stops later (the scale suite's tiny AR: 3.4x the steps at 1e-2 as at 3e-2): stops at another
    peak count only where none at the cell's own exists, scaled by the ratio of the two peaks' stops at a shape that
    has both, else as they are; either said so. A model whose peak nothing says counts as at any."""
    import dataclasses

    from suites.spec import TrainBudget

    small, tiny = (("d_model", 256),), (("d_model", 64),)
    budget = TrainBudget(steps=60_000, batch_tokens=2048, learning_rate=0.01, warmup_steps=100, eval_every=500,
                         until="plateau", schedule="wsd", patience=4, min_delta=0.2)
    rule = estimate.plateau_rule(budget.train_kwargs(), 500)

    def model(shape, steps, peak, task="bible"):
        return estimate.TrainedModel("x", "ar", task, shape, 2048, 1.0, None, steps, 1.0, "plateau", rule=rule,
                                     learning_rate=peak)

    def how(*trained):
        return estimate.train_estimate(estimate.Measured(trained=list(trained)), "ar", "bible", small, "a", budget,
                                       {}).how
    assert how(model(small, 8400, 0.03)).startswith(
        "8,400 steps (plateau: the median stop of 1 measured at another peak learning rate (0.03), cap 60,000)")
    pair = (model(tiny, 4000, 0.03), model(tiny, 12000, 0.01))
    assert how(model(small, 8400, 0.03), *pair).startswith(
        "25,200 steps (plateau: the median stop of 1 measured at peak learning rate 0.03, x 3.00: the ratio of the "
        "stops at 0.01 and 0.03 measured at another model shape, cap 60,000)")
    assert how(model(small, 30000, 0.03), *pair).startswith("60,000 steps")             # the cap bounds it
    # of other peaks, the nearest (by ratio); a pair on another task serves where the task has none, said so
    assert how(model(small, 8400, 0.03), model(small, 900, 1.0)).startswith("8,400 steps")
    away = [dataclasses.replace(m, task="other") for m in pair]
    assert how(model(small, 8400, 0.03), *away).startswith(
        "25,200 steps (plateau: the median stop of 1 measured at peak learning rate 0.03, x 3.00: the ratio of the "
        "stops at 0.01 and 0.03 measured at another model shape on other, cap 60,000)")
    same_shape = [dataclasses.replace(m, task="other", shape=small) for m in pair]
    assert how(model(small, 8400, 0.03), *same_shape).startswith(
        "25,200 steps (plateau: the median stop of 1 measured at peak learning rate 0.03, x 3.00: the ratio of the "
        "stops at 0.01 and 0.03 measured at this shape on other, cap 60,000)")
    # the cell's own peak first, at its shape and then at the nearest other; an unknown peak matches any
    assert how(model(small, 8400, 0.03), model(small, 20000, 0.01), *pair).startswith(
        "20,000 steps (plateau: the median stop of 1 measured, cap 60,000)")
    assert how(model(tiny, 12000, 0.01)).startswith("12,000 steps (plateau: the median stop of 1 measured of another "
                                                    "model shape, cap 60,000)")
    assert how(model(small, 8400, None)).startswith("8,400 steps (plateau: the median stop of 1 measured, cap")
    # a training at another peak still under way is no floor for this one
    running = dataclasses.replace(model(small, 50000, 0.03), stopped_by="cap", complete=False)
    nll = dataclasses.replace(budget, signal="dev_nll", min_delta=0.02)
    assert estimate.train_estimate(estimate.Measured(trained=[model(small, 8400, 0.01), dataclasses.replace(
        running, rule=estimate.plateau_rule(nll.train_kwargs(), 500))]), "ar", "bible", small, "a",
        nll, {}).how.startswith("8,400 steps (plateau: the median stop of 1 measured under a rule on another signal")
    # read from a checkpoint record's train config
    folder = tmp_path / "checkpoints" / "ckpt"
    folder.mkdir(parents=True)
    (folder / "narbench.json").write_text(json.dumps({
        "kind": "ar", "task": "fake_task", "model_config": {"d_model": 8}, "steps_done": 10, "train_seconds": 5.0,
        "train_config": {"learning_rate": 0.01}}))
    assert [m.learning_rate for m in estimate.Measured.collect(None, tmp_path, MACHINE).trained] == [0.01]


def test_a_run_on_another_cpu_of_the_same_name_is_left_out(measured):
    """Cloud VMs give several CPU generations one name: a run counts as measured here by its CPU signature (family,
    model, ISA) where both sides have one, by the name where the run is older than the signature."""
    tmp_path, _, run = measured
    name, results = f"plantest/{run.run_id}", tmp_path / "results"
    signature = "Test CPU (family 6 model 167; avx2 fma avx512f)"
    run.write_env({**run.env(), "cpu_signature": signature})
    rows = [json.loads(line) for line in (run.path / "rows.jsonl").read_text().splitlines()]
    (run.path / "rows.jsonl").write_text("".join(json.dumps({**r, "stopped_by": "plateau"}) + "\n" for r in rows))
    here = estimate.Measured.collect(results, None, {**MACHINE, "cpu_signature": signature})
    assert here.runs == [name] and len(here.trained) == 3 and here.elsewhere == []       # AR, PaDIR raw, distilled
    other = estimate.Measured.collect(results, None, {**MACHINE, "cpu_signature": signature.replace("167", "207")})
    assert (other.runs, other.skipped, other.trained) == ([], [name], [])
    # its models' plateau stops still count (a step count does not depend on the machine), its seconds do not
    assert sorted((m.family, m.steps) for m in other.elsewhere) == sorted((m.family, m.steps) for m in here.trained)
    assert estimate.Measured.collect(results, None, MACHINE).runs == [name]     # no signature here: by the name
    assert estimate.Measured.collect(results, None, {**MACHINE, "threads": 4}).skipped == [name]


def test_a_cell_with_its_training_under_another_cap_beside_it_starts_from_there(measured):
    """``models.train.seed_source`` names where the training starts: the plan counts only the rest."""
    from models.train import SeedSource

    tmp_path, deps, _ = measured
    path = tmp_path / "more.toml"
    path.write_text(SPEC.replace('name = "plantest"', 'name = "more"') + "unmask_rate = [0.15, 0.5]\n")
    spec = load_spec(path)
    source = tmp_path / "ckpt" / "under-another-cap"
    source.mkdir(parents=True)
    (source / "curve.jsonl").write_text("".join(json.dumps({"step": s, "dev_bleu": 1.0}) + "\n" for s in range(1, 5)))

    def seed_source(task, model_config, train_config, init_from=None):
        return SeedSource(source, 3, 4, False) if model_config.get("unmask_rate") == 0.5 and not init_from else None

    locator = dataclasses.replace(fake_locator(deps), seed_source=seed_source)
    shown = preview.preview(spec, locator, estimate.Measured.collect(tmp_path / "results", None, MACHINE))
    [cell] = [c for c in shown.cells if c.cell.label == f"{PADIR} 0.5 seed 0"]
    assert (cell.state, cell.note) == (
        "partial", f"starts from step 3 of {preview._portable(source)}, the same training under another cap (4 steps)")
    assert cell.estimate.how.startswith("2 more steps (stops at step 5) x 0.80 s")
    assert cell.estimate.seconds == pytest.approx(2 * STEP_COST["padir"]["seconds"] + 2 * 0.1)


def test_a_training_carried_on_under_another_cap_is_measured_once(tmp_path):
    """Its copy holds its steps and seconds so far: the folder it started from is not counted beside it."""
    for name, record in (("old-cap", {"steps_done": 100, "train_seconds": 50.0}),
                         ("new-cap", {"steps_done": 300, "train_seconds": 180.0,
                                      "seeded_from": {"checkpoint": "old-cap", "step": 100, "steps": 120}})):
        (tmp_path / "checkpoints" / name).mkdir(parents=True)
        (tmp_path / "checkpoints" / name / "narbench.json").write_text(json.dumps({
            "kind": "ar", "task": "fake_task", "model_config": {"d_model": 8}, "train_config": {}, **record}))
    [model] = estimate.Measured.collect(None, tmp_path, MACHINE).trained
    assert model.source.endswith("new-cap") and model.seconds_per_step == pytest.approx(0.6)


# -- narbench plan --probe ---------------------------------------------------------------------------------------

WHEN = "2026-12-05T10:00:00+00:00"


def _probe(**kw) -> estimate.Probe:
    fields = dict(family="ar", task="bible", label="a", shape=estimate.model_shape("small"), batch_tokens=2048,
                  work=1.0, seconds_per_step=0.5, measured_at=WHEN, machine=MACHINE)
    return estimate.Probe(**{**fields, **kw})


def test_a_probe_replaces_other_measures_but_not_a_partial_trainings_own_rate():
    from suites.spec import TrainBudget

    small = estimate.model_shape("small")
    budget = TrainBudget(steps=1000, batch_tokens=2048, learning_rate=0.03, warmup_steps=100)
    trained = estimate.TrainedModel("ckpt/x", "ar", "bible", small, 2048, 1.0, None, 7000, 2.0, "cap")

    def got(probes, **kw):
        return estimate.train_estimate(estimate.Measured(trained=[trained], probes=probes), "ar", "bible", small, "a",
                                       budget, {}, **kw)
    assert got([]).seconds == pytest.approx(1000 * 2.0)
    probed = got([_probe()])
    assert probed.seconds == pytest.approx(1000 * 0.5)
    assert "x 0.50 s (probed here on 2026-12-05: `narbench plan --probe`)" in probed.how
    # another batch size, work per step, shape or family is another step
    for other in (_probe(batch_tokens=4096), _probe(work=2.0), _probe(shape=estimate.model_shape("mini")),
                  _probe(family="padir")):
        assert got([other]).seconds == pytest.approx(1000 * 2.0)
    # the newest probe of the same task first
    newer = _probe(seconds_per_step=0.4, measured_at="2026-12-06T10:00:00+00:00")
    assert got([_probe(), newer]).seconds == pytest.approx(400.0)
    assert got([_probe(), _probe(task="wmt", seconds_per_step=0.3, measured_at="2026-12-07")]).seconds == 500.0
    other_task = got([_probe(task="wmt", seconds_per_step=0.3)])               # another task's step, said so
    assert other_task.seconds == pytest.approx(300.0) and "(probed here on 2026-12-05, on wmt's data:" in other_task.how
    # a probe alone is enough for the steps (nothing says what a dev point takes: none counted, and said so)
    alone = estimate.train_estimate(estimate.Measured(probes=[_probe()]), "ar", "bible", small, "a",
                                    TrainBudget(steps=1000, batch_tokens=2048, learning_rate=0.03, warmup_steps=100,
                                                eval_every=500), {})
    assert alone.seconds == pytest.approx(500.0) and "2 dev points (not measured)" in alone.how
    # a partial training's own steps so far are nearer still
    own = got([_probe()], resumed_at=(600, []), checkpoint="ckpt/x")
    assert own.seconds == pytest.approx(400 * 2.0) and "its own rate so far" in own.how


def test_probes_are_read_from_the_data_root_for_this_machine_only(tmp_path):
    from narbench_core.io import write_json

    here, there = _probe(), _probe(task="wmt", machine={"cpu_model": "Other CPU", "threads": 2})
    for p in (here, there):
        write_json(estimate.probe_file(tmp_path, p.key), p.to_json())
    (tmp_path / estimate.PROBES_DIR / "ar-damaged.json").write_text("{not json")
    assert estimate.read_probes(tmp_path, MACHINE) == [here]
    assert estimate.read_probes(tmp_path, {**MACHINE, "threads": 4}) == []
    assert estimate.Measured.collect(None, tmp_path, MACHINE).probes == [here]
    again = _probe(seconds_per_step=0.7, measured_at="2026-12-06T10:00:00+00:00")   # the same key: replaces it
    write_json(estimate.probe_file(tmp_path, again.key), again.to_json())
    assert estimate.read_probes(tmp_path, MACHINE) == [again]


def test_plan_probe_times_each_step_still_to_train_once_and_the_plan_then_reads_it(measured, monkeypatch):
    """The two new PaDIR models (raw and distilled) step alike: one probe, on the cell's task, kept under the data
    root; the plan then counts their steps at the probed rate. A suite with nothing to train probes nothing."""
    from bench import step_probe
    from bench.measure import load

    tmp_path, deps, run = measured
    path = tmp_path / "more.toml"
    path.write_text(SPEC.replace('name = "plantest"', 'name = "more"') + "unmask_rate = [0.15, 0.5]\n")
    results, data = tmp_path / "results", tmp_path / "data"
    locator = dataclasses.replace(fake_locator(deps), data_root=data)
    monkeypatch.setattr(estimate, "this_machine", lambda: MACHINE)
    monkeypatch.setattr(load, "snapshot", lambda pids: None)          # the machine's load: not read here
    calls = []

    def measure(task, model_config, train_config):
        calls.append(task)
        return 0.25

    shown = preview.preview(load_spec(path), locator, estimate.Measured.collect(results, None, MACHINE))
    kept = step_probe.probe_plan(shown, locator, measure)
    assert calls == ["fake_task"] and [p.label for p in kept] in ([f"{PADIR} 0.5 seed 0"],
                                                                   [f"{PADIR} 0.5 distill seed 0"])
    assert kept[0].machine == MACHINE and kept[0].others_cpu_share is None
    again = preview.preview(load_spec(path), locator, estimate.Measured.collect(results, data, MACHINE))
    new = [c for c in again.cells if c.state == "to train"]
    assert [c.estimate.seconds for c in new] == [pytest.approx(5 * 0.25 + 5 * 0.1)] * 2
    assert "5 steps x 0.25 s (probed here on" in new[0].estimate.how
    assert "and 1 train steps probed here (`narbench plan --probe`)" in preview.render_text(again)
    cached = preview.preview(load_spec(tmp_path / "plantest.toml"), locator,
                             estimate.Measured.collect(results, data, MACHINE))
    assert step_probe.probe_plan(cached, locator, measure) == [] and calls == ["fake_task"]
    # a task whose data is not prepared cannot be probed: said, and nothing measured
    unready = dataclasses.replace(locator, not_ready=lambda task: f"{task}'s data is not prepared")
    todo, skipped = step_probe.wanted(shown, unready)
    assert todo == [] and sorted(skipped) == [f"{PADIR} 0.5 distill seed 0: fake_task's data is not prepared",
                                              f"{PADIR} 0.5 seed 0: fake_task's data is not prepared"]


def test_a_probe_starts_only_on_a_machine_no_narbench_process_shares_and_keeps_only_a_quiet_measure(tmp_path):
    from bench import step_probe
    from narbench_core import lock
    from narbench_core.errors import UserError

    want = step_probe.Wanted(estimate.probe_key("ar", "bible", estimate.model_shape("small"), 2048, 1.0), "a",
                             None, None)
    calls, lines = [], []

    def measure(*args):
        calls.append(args)
        return 0.5

    def probe(others, share):
        return step_probe.run_probes([want], measure, tmp_path, MACHINE, lambda: WHEN, lambda: others,
                                     lambda: "snapshot", lambda a, b: share, lines.append)
    training = lock.Holder("host", 4321, "training checkpoints/x", WHEN)
    with pytest.raises(UserError, match=r"another narbench process is busy .*training checkpoints/x.*kill -STOP"):
        probe([training], None)
    assert calls == []
    assert probe([], {"others": 0.30}) == [] and not (tmp_path / estimate.PROBES_DIR).exists()
    assert lines[-1] == ("narbench plan: not kept: other processes took 30% of the CPU while it ran (0.500 s a step); "
                         "probe again on a quiet machine")
    [kept] = probe([], {"others": 0.01})
    assert kept.others_cpu_share == 0.01 and estimate.read_probes(tmp_path, MACHINE) == [kept]
    assert lines[-1] == "narbench plan: 0.500 s a step"


def test_plan_command_with_probe_prints_the_estimate_from_the_probes(measured, monkeypatch, capsys):
    import models.train
    from bench.measure import load

    tmp_path, deps, run = measured
    path = tmp_path / "more.toml"
    path.write_text(SPEC.replace('name = "plantest"', 'name = "more"') + "unmask_rate = [0.15, 0.5]\n")
    monkeypatch.setattr(preview, "real_locator", lambda: dataclasses.replace(fake_locator(deps), data_root=tmp_path))
    monkeypatch.setattr(estimate, "this_machine", lambda: MACHINE)
    monkeypatch.setattr(load, "snapshot", lambda pids: None)
    monkeypatch.setattr(models.train, "seconds_per_step", lambda task, model_config, train_config: 0.125)
    assert main(["plan", "--suite", str(path), "--results", str(tmp_path / "results"), "--probe"]) == 0
    captured = capsys.readouterr()
    assert "narbench plan: 0.125 s a step" in captured.err
    assert captured.out.count("5 steps x 0.12 s (probed here on") == 2
    assert "and 1 train steps probed here" in captured.out
    assert len(estimate.read_probes(tmp_path, MACHINE)) == 1
