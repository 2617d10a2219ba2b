"""`narbench train`: families build the configs, and --distill uses the same settings a suite does."""
from __future__ import annotations

import pytest

from bench.cli import checkpoints
from bench.cli import main
from bench.families import load_suite
from suites.spec import DistillSpec


@pytest.fixture
def recorded(monkeypatch, tmp_path):
    """Fake trainer and distiller that record their arguments."""
    calls = {"distill": [], "train": []}

    def distill_task(teacher, task, progress=True, **kwargs):
        calls["distill"].append((str(teacher), task, kwargs))
        return task

    def train(task, model_config, train_config, out_dir=None, progress=True, init_from=None, retrain_damaged=True):
        calls["train"].append((task, model_config, train_config))
        calls.setdefault("init_from", []).append(init_from)
        calls.setdefault("retrain_damaged", []).append(retrain_damaged)
        return tmp_path / f"ckpt-{len(calls['train'])}"

    monkeypatch.setattr("models.distill.distill_task", distill_task)
    monkeypatch.setattr("models.train.train", train)
    return calls


def test_distill_settings_come_from_the_suite_then_the_flags():
    assert checkpoints.distill_settings() == DistillSpec()
    assert checkpoints.distill_settings("smoke") == load_suite("smoke").distill
    assert checkpoints.distill_settings("smoke", max_examples=7, decoder=None) == DistillSpec("beam:2", 7, 0.6)
    assert checkpoints.distill_settings(decoder="greedy").decoder == "greedy"


def test_train_distill_passes_the_suite_settings(recorded, tmp_path, capsys):
    teacher = tmp_path / "teacher"
    code = main(["train", "--task", "synthetic_d0", "--model", "padir", "--preset", "tiny", "--steps", "3",
                 "--distill", "--suite", "smoke", "--teacher", str(teacher), "--unmask-rate", "0.3", "--quiet"])
    assert code == 0
    smoke = load_suite("smoke").distill
    assert recorded["distill"] == [(str(teacher), "synthetic_d0", {**smoke.kwargs(), "seed": 0})]
    (task, model, train), = recorded["train"]
    assert model.kind == "padir" and train.unmask_rate == 0.3 and train.steps == 3


def test_train_distill_without_teacher_trains_the_ar_teacher_first(recorded, capsys):
    assert main(["train", "--task", "synthetic_d0", "--model", "padir", "--preset", "tiny", "--steps", "3",
                 "--distill", "--distill-decoder", "greedy", "--seed", "4", "--quiet"]) == 0
    assert [m.kind for _, m, _ in recorded["train"]] == ["ar", "padir"]
    assert recorded["train"][0][2].seed == 4                        # the teacher's seed draws the sample
    assert recorded["distill"][0][2] == {**DistillSpec(decoder="greedy").kwargs(), "seed": 4}


def test_train_warm_start_and_recipe(recorded, tmp_path, capsys):
    source = tmp_path / "ar"
    assert main(["train", "--task", "synthetic_d0", "--model", "padir", "--preset", "tiny", "--steps", "3",
                 "--init", "ar", "--init-from", str(source), "--recipe", "plain", "--quiet"]) == 0
    (_, model, train), = recorded["train"]
    assert recorded["init_from"] == [source]
    assert not model.fixed_eos and not model.length_token and not train.stage_remask
    assert main(["train", "--task", "synthetic_d0", "--model", "padir", "--preset", "tiny", "--steps", "3",
                 "--init", "ar", "--quiet"]) == 0                        # the AR model trains first, then warms it
    assert [m.kind for _, m, _ in recorded["train"][1:]] == ["ar", "padir"]
    assert recorded["init_from"] == [source, None, tmp_path / "ckpt-2"]     # the AR checkpoint it just trained
    _, model, train = recorded["train"][-1]
    assert model.fixed_eos and model.length_token and train.stage_remask     # the reference recipe by default


@pytest.mark.parametrize("argv, message", [
    (["--model", "ar", "--unmask-rate", "0.3"], "do not apply to AR models"),
    (["--model", "padir", "--suite", "smoke"], "only apply with --distill"),
    (["--model", "padir", "--init-from", "x"], "--init-from only applies with --init ar"),
    (["--model", "padir", "--distill-decoder", "greedy"], "only apply with --distill"),
    (["--model", "padir", "--distill", "--distill-decoder", "refine:4"], "--distill-decoder must be greedy or beam:K"),
])
def test_train_flag_errors(recorded, capsys, argv, message):
    assert main(["train", "--task", "synthetic_d0", "--preset", "tiny", *argv]) == 2
    assert message in capsys.readouterr().err


def test_train_glancing_ratios_and_the_rate_glancing_silences(recorded, capsys):
    base = ["train", "--task", "synthetic_d0", "--model", "padir", "--preset", "tiny", "--steps", "3", "--quiet"]
    assert main(base + ["--glancing", "--glance-end", "0.5"]) == 0
    (_, _, train), = recorded["train"]
    assert train.glancing and (train.glance_start, train.glance_end) == (0.5, 0.5)
    capsys.readouterr()
    assert main(base + ["--glancing", "--unmask-rate", "0.3"]) == 2
    assert capsys.readouterr().err == ("narbench: error: unmask_rate has no effect with glancing = true (stage 1 keeps "
                                       "a glanced number of reference tokens instead); drop it\n")
    assert main(base + ["--glance-start", "0.3"]) == 2
    assert "glance_start has no effect with glancing = false" in capsys.readouterr().err


def test_refuse_damaged_reaches_every_training(recorded, capsys):
    """Damaged checkpoints are retrained by default; --refuse-damaged asks every training on the way
    (here the AR teacher, then the student) to refuse one instead."""
    argv = ["train", "--task", "synthetic_d0", "--model", "padir", "--preset", "tiny", "--steps", "3",
            "--init", "ar", "--quiet"]
    assert main(argv) == 0 and recorded["retrain_damaged"] == [True, True]
    assert main(argv + ["--refuse-damaged"]) == 0 and recorded["retrain_damaged"] == [True, True, False, False]
