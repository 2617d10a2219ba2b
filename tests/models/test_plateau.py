"""Training to the plateau: the stopping rule, the warmup-stable-decay schedule, and a training that
stops where the rule says, killed with SIGKILL on the way and resumed."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import models.train
from models import checkpoint, curves
from models.schedule import decay_steps, latest_decay_start, learning_rate_schedule, stop_state
from models.train import TrainConfig
from narbench_core.errors import UserError


def cfg(**changes) -> TrainConfig:
    base = dict(steps=40, batch_tokens=256, learning_rate=1e-2, min_learning_rate=1e-4, warmup_steps=4,
                max_length=16, buckets=(16,), label_smoothing=0.0, until="plateau", schedule="wsd",
                eval_every=2, patience=2, min_delta=0.5, decay_share=0.5)
    return TrainConfig(**{**base, **changes})


def curve(bleu_at, last: int, every: int = 2) -> list[dict]:
    return [{"step": s, "dev_bleu": bleu_at(s)} for s in range(every, last + 1, every)]


def rises_then_flat(step: int) -> float:
    return 3.0 * min(step, 10)                    # +6 BLEU per evaluation until step 10, then flat


def test_the_rule_fires_after_patience_evaluations_without_a_rise_over_min_delta():
    c = cfg()
    assert stop_state(c, curve(rises_then_flat, 12)).stopped_by == "cap"       # one flat evaluation: waits
    state = stop_state(c, curve(rises_then_flat, 14))                           # two: fires at 14
    assert (state.decay_start, state.stop, state.stopped_by) == (14, 14 + 7, "plateau")
    assert (state.best, state.best_step, state.evals_since_best) == (30.0, 10, 2)
    # Later points (the decay phase) do not move the decision.
    later = stop_state(c, curve(lambda s: 100.0 if s > 14 else rises_then_flat(s), 20))
    assert (later.decay_start, later.stop, later.stopped_by, later.best) == (14, 21, "plateau", 100.0)
    # Rises of at most min_delta over the best do not count as improvements.
    creeping = stop_state(c, curve(lambda s: 0.25 * s / 2, 6))
    assert (creeping.stopped_by, creeping.decay_start, creeping.best_step) == ("plateau", 6, 2)
    assert stop_state(cfg(patience=3), curve(rises_then_flat, 14)).stopped_by == "cap"


def test_a_smoothed_signal_a_growing_patience_and_a_first_step_hold_off_a_noisy_plateau():
    """Issue 52: the converged run's distilled PaDIR model stopped at 4,500 steps on a dev BLEU that swings by 3
    points between evaluations, while it was still climbing. Its curve (every 500 steps, rule patience 4, min_delta 0.2):"""
    from models.schedule import patience_at, signal

    distilled = [14.2, 16.9, 16.6, 18.2, 20.0, 19.4, 18.1, 19.8, 18.8]
    points = [{"step": 500 * (i + 1), "dev_bleu": b} for i, b in enumerate(distilled)]
    rule = dict(steps=60_000, eval_every=500, patience=4, min_delta=0.2, decay_share=0.2)
    assert stop_state(cfg(**rule), points).decay_start == 4500                    # as it fired then
    # The mean of the last 3 points: the signal of 3,000 is (18.2 + 20.0 + 19.4) / 3.
    assert signal(cfg(**rule, smooth=3), points)[5] == (3000, pytest.approx((18.2 + 20.0 + 19.4) / 3))
    assert signal(cfg(**rule, smooth=3), points)[0] == (500, 14.2)               # fewer points at the start
    smoothed = stop_state(cfg(**rule, smooth=3), points)
    assert (smoothed.stopped_by, smoothed.best_step, smoothed.evals_since_best) == ("cap", 3000, 3)
    # A patience that grows with the training: a quarter of 40 evaluations is 10.
    assert [patience_at(cfg(**rule, patience_share=0.25), n) for n in (3, 16, 17, 40)] == [4, 4, 5, 10]
    flat = points + [{"step": 500 * (i + 10), "dev_bleu": 18.0} for i in range(8)]
    assert stop_state(cfg(**rule), flat).decay_start == 4500
    assert stop_state(cfg(**rule, patience_share=0.5), flat).decay_start == 5000   # 5 since the best (2,500) of 10
    # Not before min_steps, however flat.
    assert stop_state(cfg(**rule, min_steps=7000), flat).decay_start == 7000
    # The defaults are the rule as it was: a smooth of 1, no share, no first step.
    assert stop_state(cfg(**rule, smooth=1, patience_share=0.0, min_steps=0), flat) == stop_state(cfg(**rule), flat)


def test_a_rule_on_dev_nll_waits_through_noisy_bleu_and_fires_when_the_nll_stops_falling():
    """The scale suite's tiny AR model at the peak rate (2026-12-04, whole dev split): dev BLEU swung by up to 6.8
    between evaluations while dev NLL fell at every one but one. The BLEU rule (a mean of 3, patience 4) fired at
    6,000; a rule on dev NLL (a fall under its best by more than min_delta is progress) waits while it falls."""
    bleu = [1.45, 6.38, 9.07, 11.95, 8.08, 15.06, 15.32, 16.27, 12.63, 15.35, 18.34, 11.57]
    nll = [4.526, 3.889, 3.577, 3.463, 3.371, 3.299, 3.192, 3.209, 3.141, 3.097, 3.090, 3.085]
    points = [{"step": 500 * (i + 1), "dev_bleu": b, "dev_nll": n} for i, (b, n) in enumerate(zip(bleu, nll))]
    rule = dict(steps=60_000, eval_every=500, patience=4, min_delta=0.2, decay_share=0.2, smooth=3,
                patience_share=0.33)
    assert stop_state(cfg(**rule), points).decay_start == 6000
    by_nll = stop_state(cfg(**{**rule, "min_delta": 0.01}, signal="dev_nll"), points)
    assert (by_nll.stopped_by, by_nll.best_step) == ("cap", 6000)
    assert by_nll.best == pytest.approx((3.097 + 3.090 + 3.085) / 3)          # the smoothed NLL, in nats
    # The NLL no lower from here (BLEU rising): no fall past the best by 0.01 for a third of the evaluations (6 of
    # 18) fires it at 9,000.
    flat = points + [{"step": 6000 + 500 * (i + 1), "dev_bleu": 20.0 + i, "dev_nll": 3.09 + 0.005 * i}
                     for i in range(8)]
    fired = stop_state(cfg(**{**rule, "min_delta": 0.01}, signal="dev_nll"), flat)
    assert (fired.stopped_by, fired.decay_start, fired.best_step) == ("plateau", 9000, 6000)
    # The BLEU rule had fired at 6,000, whatever came after.
    assert stop_state(cfg(**rule), flat).decay_start == 6000


def test_the_progress_bar_shows_the_dev_curve_and_the_plateau():
    from models.train import _dev_note, _record_stop

    c = cfg()
    assert _dev_note(c, stop_state(c, []), []) == ""
    # Waiting: the earliest stop is one more flat evaluation (14, patience 2) and its decay (half of 14).
    waiting = curve(rises_then_flat, 12)
    assert decay_steps(c, 14) == 7
    assert _dev_note(c, stop_state(c, waiting), waiting) == "30.00 (best 30.00 at 10), stops at 21 at the earliest"
    fired = curve(lambda s: rises_then_flat(s) - (s == 14), 16)
    assert _dev_note(c, stop_state(c, fired), fired) == "30.00 (best 30.00 at 10), plateau at 14: decaying"
    # A rule that cannot fire before its latest decay start (26) says no earliest stop.
    assert _dev_note(c, stop_state(c, rising := curve(float, 24)), rising) == "24.00 (best 24.00 at 24)"
    by_nll = cfg(signal="dev_nll")
    falling = [{**p, "dev_nll": 5.0 - p["dev_bleu"] / 10} for p in waiting]
    assert _dev_note(by_nll, stop_state(by_nll, falling), falling) == ("30.00 (nll 2.000, best 2.000 at 10), stops "
                                                                      "at 21 at the earliest")
    # narbench.json names the best by the signal it is of.
    record = {}
    _record_stop(record, stop_state(by_nll, falling), by_nll.signal)
    assert record == {"stopped_by": "cap", "best_step": 10, "decay_start": latest_decay_start(by_nll),
                      "best_dev_nll": 2.0}


def test_without_a_plateau_the_decay_starts_where_it_ends_at_the_cap():
    c = cfg()
    state = stop_state(c, curve(lambda s: float(s), 40))
    assert (state.stopped_by, state.stop, state.decay_start) == ("cap", 40, latest_decay_start(c)) == ("cap", 40, 26)
    # A plateau detected after the latest decay start is the cap's.
    assert stop_state(c, curve(lambda s: min(s, 24.0), 30)).stopped_by == "cap"
    fixed = stop_state(cfg(until="steps"), curve(rises_then_flat, 40))
    assert (fixed.stopped_by, fixed.stop, fixed.decay_start) == ("steps", 40, 26)
    assert stop_state(cfg(until="steps", schedule="cosine"), []).decay_start is None


def test_wsd_warms_up_holds_the_peak_then_decays_linearly_to_the_floor():
    c = cfg(steps=100, warmup_steps=10, decay_share=0.25)
    rate = learning_rate_schedule(c, decay_start=40)
    assert decay_steps(c, 40) == 10
    lr = lambda step: float(rate(step))                        # noqa: E731
    approx = lambda v: pytest.approx(v, rel=1e-5)              # noqa: E731  (float32 rates)
    assert lr(0) == approx(1e-4) and lr(5) == approx((1e-4 + 1e-2) / 2)
    assert lr(10) == lr(25) == lr(39) == approx(1e-2)
    assert lr(45) == approx((1e-2 + 1e-4) / 2) and lr(50) == lr(80) == approx(1e-4)
    assert float(learning_rate_schedule(c)(latest_decay_start(c) - 1)) == approx(1e-2)   # default: latest


@pytest.mark.parametrize("changes,key", [
    (dict(eval_every=0), "eval_every"), (dict(schedule="cosine"), "wsd"), (dict(patience=0), "patience"),
    (dict(min_delta=-0.1), "min_delta"), (dict(until="never"), "until"), (dict(decay_share=1.0), "decay_share"),
    (dict(smooth=0), "smooth"), (dict(patience_share=1.0), "patience_share"), (dict(min_steps=-1), "min_steps"),
    (dict(dev_sentences=-1), "dev_sentences"), (dict(signal="bleu"), "signal"),
])
def test_bad_plateau_settings_name_the_key(changes, key):
    with pytest.raises(UserError, match=key):
        cfg(**changes)


def test_the_plateau_rule_is_part_of_the_identity_and_old_identities_stay():
    assert "until" not in TrainConfig().to_dict() and "eval_every" not in TrainConfig(eval_every=5).to_dict()
    assert cfg().to_dict()["eval_every"] == 2 and cfg().to_dict() != cfg(eval_every=4).to_dict()
    assert cfg().to_dict() != cfg(patience=3).to_dict()
    # The steadier rule's settings (issue 52) change no older identity at their defaults, and do at any other value;
    # the dev sentences are the rule's signal only where a plateau decides.
    assert cfg(smooth=1, patience_share=0.0, min_steps=0, dev_sentences=200).to_dict() == cfg().to_dict()
    assert cfg(signal="dev_bleu").to_dict() == cfg().to_dict()
    for change in (dict(smooth=3), dict(patience_share=0.3), dict(min_steps=500), dict(dev_sentences=0),
                   dict(signal="dev_nll")):
        assert cfg(**change).to_dict() != cfg().to_dict(), change
        assert TrainConfig.from_dict(cfg(**change).to_dict()) == cfg(**change)
    assert TrainConfig(dev_sentences=0).to_dict() == TrainConfig().to_dict()


# ------------------------------------------------------------------------ a training to its plateau

# Builds the same tiny training in this process and in a child process that is killed mid-way.
TRAINING = """
import sys, time
import numpy as np
from models.config import preset
from models.batching import TokenPairs
from models.train import TrainConfig, train
from tiny_models import ONE_LAYER

KILL_AT = int(sys.argv[2]) if __name__ == "__main__" else None

def scorer(params, step):
    if step == KILL_AT:
        print("evaluating", step, flush=True)
        time.sleep(600)                                  # the parent kills us here
    return {"dev_bleu": 3.0 * min(step, 10), "dev_nll": 1.0}

rng = np.random.default_rng(0)
rows = [list(rng.integers(4, 60, size=int(rng.integers(3, 10)))) + [1] for _ in range(200)]
data = TokenPairs.from_lists(rows, rows)
model = preset("tiny", kind="ar", vocab_size=64, dropout_rate=0.0, max_target_length=16, **ONE_LAYER)
config = TrainConfig(steps=40, batch_tokens=256, learning_rate=1e-2, min_learning_rate=1e-4, warmup_steps=4,
                     max_length=16, buckets=(16,), label_smoothing=0.0, until="plateau", schedule="wsd",
                     eval_every=2, patience=2, min_delta=0.5, decay_share=0.5, checkpoint_every=4)

def run(out):
    return train("toy", model, config, out, progress=False, data=data, dev=scorer)

if __name__ == "__main__":
    run(sys.argv[1])
"""


def _training():
    space: dict = {"__name__": "training"}
    exec(TRAINING, space)
    return space["run"]


def _outcome(out) -> tuple:
    meta = checkpoint.read_meta(out)
    return (meta["steps_done"], meta["complete"], meta["stopped_by"], meta["best_dev_bleu"], meta["decay_start"],
            [p["step"] for p in curves.read_curve(out)])


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("plateau") / "whole"
    _training()(out)
    return out


@pytest.mark.slow
def test_training_stops_at_the_predicted_step(uninterrupted):
    # Fires at step 14 (two flat evaluations after the best, 30 BLEU at step 10), then decays for
    # 0.5 x 14 = 7 steps: stops at 21, evaluated there too.
    assert _outcome(uninterrupted) == (21, True, "plateau", 30.0, 14, [2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 21])
    assert checkpoint.kept_steps(uninterrupted) == [14] and checkpoint.latest_step(uninterrupted) == 21


@pytest.mark.slow
def test_the_state_where_the_rule_fired_is_kept(tmp_path, uninterrupted):
    """Saved at step 14 though checkpoints come every 4 steps, and kept past the later saves: the state of
    a training at the peak rate to step 14 (no decay before it), for a training continued past its plateau."""
    space: dict = {"__name__": "training"}
    exec(TRAINING, space)
    peak = space["config"].replace(until="steps", steps=14, decay_share=0.0)
    out = space["train"]("toy", space["model"], peak, tmp_path / "peak", progress=False, data=space["data"],
                         dev=space["scorer"])
    kept, step = checkpoint.restore_params(uninterrupted, kept=True)
    want, _ = checkpoint.restore_params(out)
    assert step == 14 and not (uninterrupted / checkpoint.STATE_DIR / "14").exists()
    jax.tree_util.tree_map(lambda u, v: np.testing.assert_allclose(u, v, rtol=1e-6, atol=1e-7), kept, want)


@pytest.mark.slow
def test_a_training_continued_past_its_plateau_is_the_training_with_min_steps(tmp_path, uninterrupted):
    """From the state kept at step 14, at the peak rate to 1.5 x 14 = 21 at least: the rule fires at the first
    evaluation after (22), the decay runs 0.5 x 22 = 11 steps. The same as that training from scratch."""
    from models.train import continue_past_plateau

    space: dict = {"__name__": "training"}
    exec(TRAINING, space)
    toy = dict(data=space["data"], dev=space["scorer"])
    out = continue_past_plateau(uninterrupted, factor=1.5, progress=False, **toy)
    assert out == uninterrupted.with_name("whole.past-plateau-1.5x")
    scratch = space["train"]("toy", space["model"], space["config"].replace(min_steps=21), tmp_path / "scratch",
                             progress=False, data=space["data"], dev=space["scorer"])
    assert _outcome(out) == _outcome(scratch) == (33, True, "plateau", 30.0, 22,
                                                  [2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 33])
    jax.tree_util.tree_map(lambda u, v: np.testing.assert_allclose(u, v, rtol=1e-6, atol=1e-7),
                           checkpoint.restore_params(out)[0], checkpoint.restore_params(scratch)[0])
    meta = checkpoint.read_meta(out)
    assert meta["continued_from"] == {"checkpoint": "whole", "step": 14, "factor": 1.5}
    assert meta["train_config"]["min_steps"] == 21
    assert continue_past_plateau(uninterrupted, factor=1.5, progress=False, **toy) == out    # finished: found
    # `narbench continue` ends with the comparison: both last points, and the swing before the plateau (steps 8-14:
    # 24, 30, 30, 30).
    from bench.cli.checkpoints import _past_plateau_line

    assert _past_plateau_line(uninterrupted, out) == (
        f"dev BLEU 30.00 at step 33 continued, 30.00 at step 21 stopped (+0.00; dev NLL 1.000 vs 1.000); its dev "
        f"BLEU swings by {float(np.std([6, 0, 0], ddof=1)):.2f} between evaluations at the peak rate: a rise beyond "
        "that means the rule stopped it early")


def test_what_cannot_be_continued_past_a_plateau_is_one_line(tmp_path, capsys):
    from bench.cli import main
    from models.train import continue_past_plateau

    with pytest.raises(UserError, match="holds no finished training to continue"):
        continue_past_plateau(tmp_path)
    assert main(["continue", str(tmp_path), "--quiet"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"narbench: error: {tmp_path} holds no finished training to continue; train it first (`narbench train`)"]
    base = {"complete": True, "stopped_by": "plateau", "decay_start": 14}
    for record, message in (({**base, "stopped_by": "cap"}, "was not stopped by the plateau rule"),
                            (base, r"kept no state at its plateau \(step 14")):
        checkpoint.write_meta(tmp_path, record)
        with pytest.raises(UserError, match=message):
            continue_past_plateau(tmp_path)
    with pytest.raises(UserError, match="--factor must be over 1"):
        continue_past_plateau(tmp_path, factor=1.0)


def test_rules_replayed_on_a_stopped_curve_say_where_each_fires_and_the_own_rule_is_marked(tmp_path, capsys):
    from bench.cli import main
    from models.schedule import replay

    # Noisy BLEU around a slow climb to step 20, flat after (the cap's latest decay start: 40).
    noise = {2: 0.0, 4: 4.0, 6: -4.0, 8: 4.0, 10: -4.0, 12: 4.0, 14: -4.0}
    points = [{"step": s, "dev_bleu": 1.0 * min(s, 20) + noise.get(s, 0.0), "dev_nll": 3.0 - 0.01 * min(s, 20)}
              for s in range(2, 31, 2)]
    rows = replay(cfg(steps=60), points, {"smooth": [1, 3], "patience": [2, 4]})
    # Each point alone: 16 is no rise over 12's 16 (min_delta 0.5), the second in a row; a patience of 4 waits to
    # 28 (flat from 20). Means of 3 rise to 24 (20), so a patience of 2 fires at 28 too, and of 4 not by 30.
    assert [(r["smooth"], r["patience"], r["fires"], r["stops"]) for r in rows] == [
        (1, 2, 16, 24), (1, 4, 28, 42), (3, 2, 28, 42), (3, 4, None, None)]
    assert rows[0]["min_delta"] == 0.5 and rows[0]["signal"] == "dev_bleu"      # the rest as the config's
    # The command reads a checkpoint's curve at the peak rate (to where its decay began), its own rule marked.
    curves.write_curve(tmp_path, points)
    checkpoint.write_meta(tmp_path, {"train_config": cfg(steps=60).to_dict(), "stopped_by": "plateau",
                                     "decay_start": 16})
    assert main(["replay", str(tmp_path), "--patience", "2", "4", "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "signal,smooth,min_delta,patience,patience_share,min_steps,fires,stops,best,best_step,own",
        "dev_bleu,1,0.5,2,0.0,0,16,24,16.0,12,True", "dev_bleu,1,0.5,4,0.0,0,,,16.0,12,False"]
    # Dev NLL falls by 0.02 a point: 0.04 at the second point is no progress over 0.05, so a patience of 2 fires.
    assert main(["replay", str(tmp_path), "--until", "30", "--signal", "dev_nll", "--min-delta", "0.05"]) == 0
    out = capsys.readouterr()
    assert out.out.splitlines()[2] == "| dev_nll | 1 | 0.05 | 2 | 0 | 0 | 6 | 9 | 2.8 | 20 |  |"
    assert out.err.startswith(f"narbench replay: {tmp_path}: 15 dev points, steps 2 to 30; its own rule fired at 16")
    # What cannot be replayed is one line.
    checkpoint.write_meta(tmp_path, {"train_config": cfg(schedule="cosine", until="steps").to_dict()})
    assert main(["replay", str(tmp_path)]) == 2
    assert "trained on a cosine schedule" in capsys.readouterr().err
    assert main(["replay", str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err.strip() == (f"narbench: error: {tmp_path / 'none'} has no narbench.json: pass a "
                                               f"checkpoint folder (under <data root>/checkpoints)")


@pytest.mark.slow
@pytest.mark.parametrize("kill_at", [10, 18])       # before the rule fires; in the decay phase
def test_a_sigkill_mid_way_resumes_and_stops_at_the_same_step(tmp_path, uninterrupted, kill_at):
    out = tmp_path / "killed"
    path = os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]))  # tiny_models
    proc = subprocess.Popen([sys.executable, "-c", TRAINING, str(out), str(kill_at)], stdout=subprocess.PIPE,
                            cwd=os.getcwd(), env=dict(os.environ, PYTHONPATH=path))
    try:
        assert proc.stdout.readline().split() == [b"evaluating", str(kill_at).encode()]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    meta = checkpoint.read_meta(out)
    assert not meta["complete"] and meta["steps_done"] == kill_at - 2      # the last checkpoint (every 4 steps)
    _training()(out)
    assert _outcome(out) == _outcome(uninterrupted)
    assert checkpoint.kept_steps(out) == [14]
    assert json.loads((out / "narbench.json").read_text())["final_loss"] == pytest.approx(
        checkpoint.read_meta(uninterrupted)["final_loss"], rel=1e-6)


@pytest.mark.slow
def test_a_folder_holding_another_training_is_refused_in_one_line(tmp_path, uninterrupted):
    space: dict = {"__name__": "training"}
    exec(TRAINING, space)
    other = space["config"].replace(patience=3)
    with pytest.raises(UserError, match="holds a different finished training; choose another --out"):
        space["train"]("toy", space["model"], other, uninterrupted, progress=False, data=space["data"],
                       dev=space["scorer"])
    checkpoint.write_meta(tmp_path, {**checkpoint.read_meta(uninterrupted), "complete": False})
    with pytest.raises(UserError, match="holds a different unfinished training"):
        space["train"]("toy", space["model"], other, tmp_path, progress=False, data=space["data"],
                       dev=space["scorer"])


# ------------------------------------------------------------- the same training under another step cap

class _Cut(Exception):
    """Stands for a training stopped part way (the session ended)."""


def _cut_at(step: int):
    def on_step(done: int, metrics: dict) -> None:
        if done == step:
            raise _Cut
    return on_step


def test_only_a_glancing_ratio_that_anneals_reads_the_cap_before_the_decay():
    from models.train import reads_cap

    assert not reads_cap(cfg()) and not reads_cap(cfg(glancing=True, glance_start=0.3, glance_end=0.3))
    assert reads_cap(cfg(glancing=True, glance_start=0.5, glance_end=0.3))


@pytest.mark.slow
def test_a_raised_cap_starts_from_the_same_training_under_the_old_one(tmp_path, uninterrupted, capsys):
    """Under a cap of 18 the decay starts at 12 at the latest, before the rule's step 14: that training, cut at step
    8, goes on under a cap of 80 from its step 8 as the training under a cap of 40 ran (fires at 14, stops at 21);
    a finished one whose rule fired is all of the same training under a higher cap; a decayed one is no start."""
    from models.train import seed_source

    space: dict = {"__name__": "training"}
    exec(TRAINING, space)
    toy = dict(progress=False, data=space["data"], dev=space["scorer"])
    identity = {"vocab_hash": None, "data": space["data"].fingerprint()}
    config, model = space["config"], space["model"]
    with pytest.raises(_Cut):
        space["train"]("toy", model, config.replace(steps=18), tmp_path / "cut", on_step=_cut_at(9), **toy)
    assert checkpoint.read_meta(tmp_path / "cut")["steps_done"] == 8
    source = seed_source(tmp_path / "raised", "toy", model, config.replace(steps=80), identity)
    assert (source.folder.name, source.step, source.cap, source.whole) == ("cut", 8, 18, False)
    for other in (config.replace(steps=80, seed=1), config.replace(steps=80, batch_tokens=128),
                  config.replace(steps=80, until="steps", schedule="cosine")):
        assert seed_source(tmp_path / "raised", "toy", model, other, identity) is None, other
    assert seed_source(tmp_path / "raised", "other", model, config.replace(steps=80), identity) is None
    capsys.readouterr()
    out = space["train"]("toy", model, config.replace(steps=80), tmp_path / "raised", **toy)
    assert capsys.readouterr().err.splitlines() == [
        "narbench: raised starts from cut, its step 8: the same training under another cap (18 steps); this one's cap: "
        "80"]
    assert _outcome(out) == _outcome(uninterrupted) and checkpoint.kept_steps(out) == [14]
    jax.tree_util.tree_map(lambda u, v: np.testing.assert_allclose(u, v, rtol=1e-6, atol=1e-7),
                           checkpoint.restore_params(out)[0], checkpoint.restore_params(uninterrupted)[0])
    meta = checkpoint.read_meta(out)
    assert meta["seeded_from"] == {"checkpoint": "cut", "step": 8, "steps": 18} and meta["train_config"]["steps"] == 80
    # Finished under 80 by its rule (at 14, under every cap whose latest decay start is past it): all of it.
    whole = seed_source(tmp_path / "higher", "toy", model, config.replace(steps=120), identity)
    assert (whole.folder.name, whole.step, whole.whole) == ("raised", 21, True)
    higher = space["train"]("toy", model, config.replace(steps=120), tmp_path / "higher", on_step=_cut_at(0), **toy)
    assert _outcome(higher) == _outcome(uninterrupted) and checkpoint.read_meta(higher)["seeded_from"]["step"] == 21
    assert seed_source(tmp_path / "lower", "toy", model, config.replace(steps=20), identity).folder.name == "cut"
    # The cut training run to its cap of 18 decayed from 12: nothing of it is a training under another cap.
    space["train"]("toy", model, config.replace(steps=18), tmp_path / "cut", **toy)
    assert checkpoint.read_meta(tmp_path / "cut")["stopped_by"] == "cap"
    (tmp_path / "alone").mkdir()
    (tmp_path / "cut").rename(tmp_path / "alone" / "cut")
    assert seed_source(tmp_path / "alone" / "new", "toy", model, config.replace(steps=80), identity) is None


@pytest.mark.slow
def test_another_rule_starts_from_the_state_kept_where_the_old_one_fired(tmp_path, uninterrupted, capsys):
    """The toy training fires at 14 (patience 2; kept there) and stops at 21. Under patience 4 the same training
    fires at 18: it starts from the kept step 14 and ends as that training from scratch, its totals those of every
    step run once. A rule that fires before 14 (patience 1: at 12) cannot start there."""
    import shutil

    from models.train import seed_source

    space: dict = {"__name__": "training"}
    exec(TRAINING, space)
    toy = dict(progress=False, data=space["data"], dev=space["scorer"])
    identity = {"vocab_hash": None, "data": space["data"].fingerprint()}
    config, model = space["config"], space["model"]
    shutil.copytree(uninterrupted, tmp_path / "siblings" / "whole")
    patient = config.replace(patience=4)
    source = seed_source(tmp_path / "siblings" / "patient", "toy", model, patient, identity)
    assert (source.folder.name, source.step, source.whole, source.kept, source.rule) == ("whole", 14, False, True, True)
    assert seed_source(tmp_path / "siblings" / "eager", "toy", model, config.replace(patience=1), identity) is None
    capsys.readouterr()
    out = space["train"]("toy", model, patient, tmp_path / "siblings" / "patient", **toy)
    assert capsys.readouterr().err.splitlines() == [
        "narbench: patient starts from whole, its step 14 (kept): the same training under another stopping rule "
        "(40 steps); this one's cap: 40"]
    scratch = space["train"]("toy", model, patient, tmp_path / "scratch", **toy)
    assert _outcome(out) == _outcome(scratch) == (27, True, "plateau", 30.0, 18,
                                                  [2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 27])
    jax.tree_util.tree_map(lambda u, v: np.testing.assert_allclose(u, v, rtol=1e-6, atol=1e-7),
                           checkpoint.restore_params(out)[0], checkpoint.restore_params(scratch)[0])
    seeded, alone = checkpoint.read_meta(out), checkpoint.read_meta(scratch)
    assert seeded["seeded_from"] == {"checkpoint": "whole", "step": 14, "steps": 40, "rule": True, "totals": (
        "replayed: compile, checkpoint and wall seconds before the seed not counted")}
    assert seeded["target_tokens"] == alone["target_tokens"]
    assert seeded["train_flops"] == pytest.approx(alone["train_flops"], rel=1e-12)
    assert checkpoint.kept_steps(out) == [18] and "continued_from" not in seeded
    # A copy of the very same training in another folder (one set aside as damaged) is never a source.
    assert seed_source(tmp_path / "siblings" / "again", "toy", model, patient, identity).folder.name == "whole"
    # Its training seconds start from the source's curve's at 14 (the record the seed writes, before any step runs),
    # and its curve keeps the source's points up to 14.
    at_14 = next(p["seconds"] for p in curves.read_curve(uninterrupted) if p["step"] == 14)
    assert [p for p in curves.read_curve(out) if p["step"] <= 14] == [
        p for p in curves.read_curve(uninterrupted) if p["step"] <= 14]
    probe = models.train._seed_from_sibling(tmp_path / "siblings" / "probe", "toy", model, patient, identity, None,
                                            space["data"])
    assert probe["steps_done"] == 14 and probe["train_seconds"] == at_14
    assert probe["eval_seconds"] == pytest.approx(
        sum(p["eval_seconds"] for p in curves.read_curve(uninterrupted) if p["step"] <= 14))
    shutil.rmtree(tmp_path / "siblings" / "probe")
    # A continuation past the plateau counts its totals from where it continued: a training seeded from it adds the
    # steps before. Under min_steps 21 and patience 4 the rule fires at 22, as the continuation's (min_steps 21,
    # patience 2) did, with the same decay: all of it.
    from models.train import continue_past_plateau

    continued = continue_past_plateau(tmp_path / "siblings" / "whole", factor=1.5, **toy)
    late = config.replace(min_steps=21, patience=4)
    source = seed_source(tmp_path / "siblings" / "late", "toy", model, late, identity)
    assert (source.folder, source.step, source.whole) == (continued, 33, True)
    out = space["train"]("toy", model, late, tmp_path / "siblings" / "late", **toy)
    scratch = space["train"]("toy", model, late, tmp_path / "late-scratch", **toy)
    seeded, alone = checkpoint.read_meta(out), checkpoint.read_meta(scratch)
    assert _outcome(out) == _outcome(scratch) and seeded["complete"] and "continued_from" not in seeded
    assert seeded["target_tokens"] == alone["target_tokens"]
    assert seeded["train_flops"] == pytest.approx(alone["train_flops"], rel=1e-12)
    at_33 = next(p["seconds"] for p in curves.read_curve(continued) if p["step"] == 33)
    assert seeded["train_seconds"] == pytest.approx(at_14 + at_33)


@pytest.mark.slow
def test_the_final_models_are_compared_on_the_dev_set_by_a_paired_bootstrap(tmp_path):
    """`narbench continue`'s verdict: the continued and the stopped final model decode the training's dev sentences
    by the curve decoder; their BLEU difference is sacrebleu's on those outputs, tested by the paired bootstrap."""
    import sacrebleu

    from bench.cli.checkpoints import _past_plateau_line, final_dev_difference
    from models.config import preset
    from models.decoders import load_decoder
    from models.train import train
    from suites.tasks import get_vocabulary
    from tiny_models import ONE_LAYER

    task = "synthetic_d0"
    model = preset("tiny", kind="ar", vocab_size=get_vocabulary(task).vocab_size, **ONE_LAYER)
    short = TrainConfig(steps=4, batch_tokens=1024, warmup_steps=1)     # dev: the default sample
    stopped = train(task, model, short, tmp_path / "stopped", progress=False)
    continued = train(task, model, short.replace(steps=40), tmp_path / "continued", progress=False)
    n, diff, (low, high) = final_dev_difference(stopped, continued, n_resamples=200)
    dev = curves.dev_set(task)
    bleu = {}
    for name, folder in (("stopped", stopped), ("continued", continued)):
        decoder = load_decoder(folder, "greedy")
        prepared = decoder.prepare(list(dev.sources))
        hyps = decoder.finish(decoder.run(prepared), prepared).hypotheses
        bleu[name] = sacrebleu.corpus_bleu(hyps, [list(dev.references)]).score
    assert n == len(dev.sources) and low <= diff <= high
    assert diff == pytest.approx(bleu["continued"] - bleu["stopped"], abs=1e-3)
    assert diff > 0.0                                        # 40 steps learn the copy-like task beyond 4
    same = final_dev_difference(stopped, stopped, n_resamples=200)
    assert same[1] == 0.0 and same[2][0] <= 0.0 <= same[2][1]
    checkpoint.write_meta(stopped, {**checkpoint.read_meta(stopped), "decay_start": 4})
    curves.write_curve(stopped, [{"step": 4, "dev_bleu": bleu["stopped"], "dev_nll": 3.0}])
    curves.write_curve(continued, [{"step": 40, "dev_bleu": bleu["continued"], "dev_nll": 2.0}])
    line = _past_plateau_line(stopped, continued, same)
    assert line.endswith(f"the final models on the {n} dev sentences: +0.00 BLEU, 95% CI [{same[2][0]:+.2f}, "
                         f"{same[2][1]:+.2f}] (paired bootstrap): within the dev set's noise: the rule did not stop it "
                         "early")
