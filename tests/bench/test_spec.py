"""Suite spec schema: built-in suites load, round-trip and hash stably; bad specs fail naming the key."""
from __future__ import annotations

import tomllib

import pytest

from bench.cli import main
from narbench_core.errors import UserError
from bench.families import load_suite as load_spec, parse_suite as parse_spec
from suites.spec import builtin_specs

GOOD = """
name = "mini"
seeds = [0]

[[tasks]]
train = "synthetic_d0"
test = ["test", "test+refs", "synthetic_d50:test"]

[model]
preset = "tiny"

[train.ar]
steps = 10
batch_tokens = 512
learning_rate = 1e-3
warmup_steps = 2

[train.padir]
steps = 10
batch_tokens = 512
learning_rate = 1e-3
warmup_steps = 2

[padir]
iterations = [1, 2]
"""


def write(tmp_path, text: str, name: str = "x.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_builtin_suites_load_and_round_trip():
    names = builtin_specs()
    assert {"smoke", "quick", "dial", "default", "anchors", "ablation", "paper"} <= set(names)
    for name in names:
        spec = load_spec(name)
        again = parse_spec(tomllib.loads(spec.to_toml()), "round-trip")
        assert again.replace(source=spec.source) == spec
        assert again.spec_hash() == spec.spec_hash()


def test_minimal_spec_round_trips_with_defaults(tmp_path):
    spec = load_spec(write(tmp_path, GOOD))
    assert spec.description == "" and spec.batch_size == 1 and spec.section("padir").distill == (False, True)
    again = parse_spec(tomllib.loads(spec.to_toml()), "round-trip")
    assert again.replace(source=spec.source) == spec


def test_default_suite_matches_the_readme_job():
    spec = load_spec("default")
    assert [t.train for t in spec.tasks] == ["bible_de_en"]
    assert spec.model.presets == ("small",) and not spec.model.sized
    assert spec.section("ar").decoders == ("greedy", "beam:5")
    assert spec.section("padir").iterations == (1, 2, 4, 10) and set(spec.section("padir").distill) == {False, True}


def test_hash_is_stable_and_sensitive(tmp_path):
    a = load_spec(write(tmp_path, GOOD))
    b = load_spec(write(tmp_path, GOOD.replace('name = "mini"', 'name="mini"  # same'), "y.toml"))
    assert a.spec_hash() == b.spec_hash()  # formatting and file location do not matter
    assert a.replace(batch_size=4).spec_hash() != a.spec_hash()
    c = load_spec(write(tmp_path, GOOD.replace("learning_rate = 1e-3", "learning_rate = 0.001"), "z.toml"))
    assert c.spec_hash() == a.spec_hash()  # resolved values, not spelling


def test_test_set_syntax(tmp_path):
    spec = load_spec(write(tmp_path, GOOD))
    names = [ts.name for ts in spec.test_sets()]
    assert names == ["synthetic_d0:test", "synthetic_d0:test+refs", "synthetic_d50:test"]
    assert [ts.multi_ref for ts in spec.test_sets()] == [False, True, False]


@pytest.mark.parametrize("old,new,message", [
    ("iterations = [1, 2]", "iterations = [1, 0]", "x.toml: padir.iterations: expected positive integers, got 0"),
    ("iterations = [1, 2]", "iterations = [1, 2]\nspeed = 3", "x.toml: padir.speed: unknown key"),
    ("iterations = [1, 2]", "steps = [1, 2]", "x.toml: padir.steps: renamed: write the refinement iterations T as"),
    ('preset = "tiny"', 'preset = "tiny"\nlayers = 3', "x.toml: model.layers: unknown key"),
    ("seeds = [0]", "seeds = [0]\nbatch_size = 0", "x.toml: batch_size: expected an integer >= 1, got 0"),
    ("seeds = [0]", "seeds = [0]\nbatch_size = true", "x.toml: batch_size: expected an integer >= 1, got True"),
    ("iterations = [1, 2]", "iterations = [1, 1]", "x.toml: padir.iterations: expected distinct"),
    ("learning_rate = 1e-3\nwarmup_steps = 2\n\n[train.padir]",
     'learning_rate = 1e-3\nwarmup_steps = 2\noptimizer = "sgd"\n\n[train.padir]',
     'x.toml: train.ar.optimizer: expected one of adafactor, adam, got "sgd"'),
    ("iterations = [1, 2]", 'iterations = [1, 2]\nremask = ["sometimes"]', "x.toml: padir.remask: expected one of none"),
    ("iterations = [1, 2]", "iterations = [1, 2]\nunmask_rate = [1.5]", "x.toml: padir.unmask_rate: expected numbers in [0, 1], got 1.5"),
    ("learning_rate = 1e-3\nwarmup_steps = 2\n\n[train.padir]", "learning_rate = -1.0\nwarmup_steps = 2\n\n[train.padir]",
     "x.toml: train.ar.learning_rate: expected a number > 0.0, got -1.0"),
    ('test = ["test", "test+refs", "synthetic_d50:test"]', 'test = ["te st"]', "x.toml: tasks[0].test: expected"),
    ('test = ["test", "test+refs", "synthetic_d50:test"]', 'test = ["test", "synthetic_d0:test"]',
     "x.toml: tasks[0].test: test set 'synthetic_d0:test' already belongs"),
    ('[model]\npreset = "tiny"', '[model]\npreset = "tiny"\n[model.overrides]\nd_model = 0',
     "x.toml: model.overrides.d_model: expected an integer >= 1, got 0"),
    ('[model]\npreset = "tiny"', '[model]\npreset = "tiny"\n[model.overrides]\nkind = "ar"',
     "x.toml: model.overrides.kind: unknown model field"),
    ("[train.padir]\nsteps = 10", "[train.padir]\nsteps = 10\nmax_minutes = 3", "x.toml: train.padir.max_minutes: unknown key"),
    ("[train.padir]\nsteps = 10", "[train.padir]\nsteps = 10\nuntil = \"plateau\"\neval_every = 2\nmatch = \"flops\"",
     "x.toml: train.padir.match: a plateau budget (until = \"plateau\") trains until dev BLEU stops rising"),
    ("[train.ar]\nsteps = 10", "[train.ar]\nsteps = 10\nuntil = \"plateau\"",
     "x.toml: train.ar.eval_every: until = \"plateau\" needs eval_every"),
    ("[train.ar]\nsteps = 10", "[train.ar]\nsteps = 10\nuntil = \"plateau\"\neval_every = 2\npatience = 0",
     "x.toml: train.ar.patience: expected an integer >= 1, got 0"),
    ("[train.ar]\nsteps = 10", "[train.ar]\nsteps = 10\nuntil = \"plateau\"\neval_every = 2\nmin_delta = -0.5",
     "x.toml: train.ar.min_delta: expected a number >= 0.0, got -0.5"),
    ("[train.ar]\nsteps = 10", "[train.ar]\nsteps = 10\nuntil = \"plateau\"\neval_every = 2\nschedule = \"cosine\"",
     "x.toml: train.ar.schedule: until = \"plateau\" needs schedule = \"wsd\""),
    ("[train.ar]\nsteps = 10", "[train.ar]\nsteps = 10\npatience = 2", "x.toml: train.ar.patience: applies to until"),
    ("[train.ar]\nsteps = 10", "[train.ar]\nsteps = 10\nsmooth = 3", "x.toml: train.ar.smooth: applies to until"),
    ("[train.ar]\nsteps = 10", "[train.ar]\nsteps = 10\nsignal = \"dev_nll\"",
     "x.toml: train.ar.signal: applies to until"),
    ("[train.ar]\nsteps = 10", "[train.ar]\nsteps = 10\nuntil = \"plateau\"\neval_every = 2\nsignal = \"loss\"",
     "x.toml: train.ar.signal: expected one of"),
    ("[train.ar]\nsteps = 10", "[train.ar]\nsteps = 10\nuntil = \"plateau\"\neval_every = 2\nsmooth = 0",
     "x.toml: train.ar.smooth: expected an integer >= 1, got 0"),
    ("[train.ar]\nsteps = 10", "[train.ar]\nsteps = 10\nuntil = \"plateau\"\neval_every = 2\npatience_share = 1",
     "x.toml: train.ar.patience_share: expected a number >= 0.0 and < 1.0"),
    ("[train.ar]\nsteps = 10", "[train.ar]\nsteps = 10\ndev_sentences = \"most\"",
     "x.toml: train.ar.dev_sentences: expected an integer >= 0"),
    ("[train.ar]\nsteps = 10", "[train.ar]\nsteps = 10\nuntil = \"plateau\"\neval_every = 2",
     "x.toml: train: every family of a suite trains by the same rule"),
    ("iterations = [1, 2]", 'iterations = [1, 2]\n[ar]\ndecoders = ["beam:5"]', 'x.toml: ar.decoders: must include "greedy"'),
    ("iterations = [1, 2]", 'iterations = [1, 2]\n[ar]\ndecoders = ["greedy", "beam:0"]', "x.toml: ar.decoders: expected"),
    ("iterations = [1, 2]", 'iterations = [1, 2]\n[timing]\nphase = "wall"', "x.toml: timing.phase: expected one of end_to_end, device"),
    ("iterations = [1, 2]", 'iterations = [1, 2]\n[distill]\ndecoder = "refine:4"',
     'x.toml: distill.decoder: expected "greedy" or "beam:K" (K >= 1), got "refine:4"'),
    ("iterations = [1, 2]", 'iterations = [1, 2]\n[distill]\ndecoder = "beam:0"', "x.toml: distill.decoder: expected"),
    ("iterations = [1, 2]", 'iterations = [1, 2]\n[distill]\ndecoder = 5', "x.toml: distill.decoder: expected"),
    ("iterations = [1, 2]", 'iterations = [1, 2]\n[distill]\ndecoder = "greedy"\nbeam_size = 5', "x.toml: distill.beam_size: give decoder only"),
    ('preset = "tiny"', "preset = []", "x.toml: model.preset: expected a non-empty list of preset names"),
    ('preset = "tiny"', 'preset = ["tiny", "tiny"]', "x.toml: model.preset: expected distinct preset names"),
    ('preset = "tiny"', 'preset = ["tiny", "a b"]', "x.toml: model.preset: expected preset names"),
])
def test_bad_values_name_the_key(tmp_path, old, new, message):
    assert old in GOOD
    path = write(tmp_path, GOOD.replace(old, new, 1))
    with pytest.raises(UserError) as err:
        load_spec(path)
    text = str(err.value)
    assert text.startswith(str(tmp_path)) and message in text, text
    assert "\n" not in text


def test_a_steadier_plateau_rule_reads_and_round_trips(tmp_path):
    rule = ('until = "plateau"\neval_every = 2\nsmooth = 3\npatience_share = 0.25\nmin_steps = 6\n'
            'dev_sentences = "all"\nsignal = "dev_nll"\n')
    text = GOOD.replace("warmup_steps = 2\n", "warmup_steps = 2\n" + rule)
    spec = load_spec(write(tmp_path, text))
    kwargs = spec.budget("padir").train_kwargs()
    assert {k: kwargs[k] for k in ("smooth", "patience_share", "min_steps", "dev_sentences", "signal")} == {
        "smooth": 3, "patience_share": 0.25, "min_steps": 6, "dev_sentences": 0,           # "all": the whole split
        "signal": "dev_nll"}
    again = parse_spec(tomllib.loads(spec.to_toml()), "round-trip")
    assert again.budgets == spec.budgets and again.spec_hash() == spec.spec_hash()


def test_distill_decoder(tmp_path):
    assert load_spec(write(tmp_path, GOOD)).distill.decoder == "beam:5"                 # the shared default
    spec = load_spec(write(tmp_path, GOOD + '\n[distill]\ndecoder = "greedy"\nmax_examples = 9\n'))
    assert spec.distill.kwargs() == {"decoder": "greedy", "max_examples": 9, "length_penalty": 0.6, "engine": "jax"}
    # `beam_size = K` (the spec.toml of runs before `decoder`) still reads as beam:K.
    assert load_spec(write(tmp_path, GOOD + "\n[distill]\nbeam_size = 3\n")).distill.decoder == "beam:3"
    assert load_spec("smoke").distill.decoder == "beam:2" and load_spec("default").distill.decoder == "greedy"


def test_the_load_sample_window_is_a_timing_setting_and_its_default_keeps_old_hashes(tmp_path):
    plain = load_spec(write(tmp_path, GOOD))
    assert plain.timing.load_sample_s == 1.0 and "load_sample_s" not in plain.to_dict()["timing"]
    same = load_spec(write(tmp_path, GOOD + "\n[timing]\nload_sample_s = 1.0\n"))
    short = load_spec(write(tmp_path, GOOD + "\n[timing]\nload_sample_s = 0.1\n"))
    assert same.spec_hash() == plain.spec_hash() != short.spec_hash() and short.timing.load_sample_s == 0.1
    with pytest.raises(UserError, match=r"timing.load_sample_s: expected a number >= 0.05, got 0.01"):
        load_spec(write(tmp_path, GOOD + "\n[timing]\nload_sample_s = 0.01\n"))


def test_distill_all_examples_and_engine(tmp_path):
    spec = load_spec(write(tmp_path, GOOD + '\n[distill]\nmax_examples = "all"\nengine = "ct2"\n'))
    assert spec.distill.max_examples is None and spec.distill.engine == "ct2"
    assert parse_spec(spec.to_dict()).distill == spec.distill                       # round trip
    # The default engine is left out of the resolved spec: the hashes of specs without the key stay.
    plain = load_spec(write(tmp_path, GOOD))
    assert "engine" not in plain.to_dict()["distill"] and spec.to_dict()["distill"]["engine"] == "ct2"
    assert spec.spec_hash() != load_spec(write(tmp_path, GOOD + '\n[distill]\nmax_examples = "all"\n')).spec_hash()
    for bad, message in (('max_examples = "some"', 'distill.max_examples: expected an integer >= 1, got "some" (or "all")'),
                         ('engine = "onnx"', "distill.engine: expected one of jax, ct2")):
        with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
            load_spec(write(tmp_path, GOOD + f"\n[distill]\n{bad}\n"))
    # The converged suite: the whole training split, decoded by CTranslate2 with beam 5.
    converged = load_spec("converged").distill
    assert (converged.max_examples, converged.decoder, converged.engine) == (None, "beam:5", "ct2")


def test_missing_sections(tmp_path):
    with pytest.raises(UserError, match="x.toml: tasks: missing required key"):
        load_spec(write(tmp_path, 'name = "a"\n[model]\npreset = "tiny"\n'))
    with pytest.raises(UserError, match=r"x.toml: train.padir: missing required table"):
        load_spec(write(tmp_path, GOOD.replace("[train.padir]", "[unused]")))


def test_unknown_suite_and_missing_file(tmp_path):
    with pytest.raises(UserError, match="unknown suite 'nope'; built-in suites: .*smoke"):
        load_spec("nope")
    with pytest.raises(UserError, match="does not exist"):
        load_spec(tmp_path / "absent.toml")


def test_malformed_toml(tmp_path):
    with pytest.raises(UserError, match="x.toml: malformed TOML"):
        load_spec(write(tmp_path, 'name = "a\n'))


@pytest.mark.parametrize("suite,expected", [
    ("nope", "unknown suite 'nope'"),
    ("BAD", "padir.iterations: expected positive integers, got 0"),
    ("MALFORMED", "malformed TOML"),
])
def test_cli_exits_2_with_one_line(tmp_path, capsys, suite, expected):
    if suite == "BAD":
        suite = str(write(tmp_path, GOOD.replace("iterations = [1, 2]", "iterations = [0]")))
    elif suite == "MALFORMED":
        suite = str(write(tmp_path, "[[tasks]\n"))
    code = main(["run", "--suite", suite, "--out", str(tmp_path / "results"), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("narbench: error: ") and expected in err[0], err
    assert not (tmp_path / "results").exists()  # nothing written for a bad spec


def test_extends_lays_a_suite_on_a_built_in_one(tmp_path):
    """`extends`: anchors is the default suite with its own name, description, AR layouts and [ort]; tables
    merge key by key (the [ar] decoders stay), arrays replace; unknown parents and cycles are errors."""
    default, anchors = load_spec("default").to_dict(), load_spec("anchors").to_dict()
    changed = {k for k in default if default[k] != anchors[k]}
    assert changed == {"name", "description", "ar", "ort"}
    assert {k for k in default["ar"] if default["ar"][k] != anchors["ar"][k]} == {"layers"}
    assert anchors["ar"]["layers"] == ["6-1"]
    path = tmp_path / "child.toml"
    path.write_text('extends = "default"\nname = "child"\n[padir]\niterations = [4]\n')
    child = load_spec(path).to_dict()
    assert child["padir"]["iterations"] == [4] and child["padir"]["length_hyps"] == default["padir"]["length_hyps"]
    path.write_text('extends = "nosuch"\nname = "child"\n')
    with pytest.raises(UserError, match="extends = 'nosuch' is not a built-in suite"):
        load_spec(path)
    path = tmp_path / "default.toml"
    path.write_text('extends = "default"\nname = "loop"\n')
    with pytest.raises(UserError, match="makes a cycle"):
        load_spec(path)


def test_without_leaves_tables_of_the_extended_suite_out(tmp_path):
    path = tmp_path / "child.toml"
    path.write_text('extends = "default"\nwithout = ["ort"]\nname = "child"\n')
    child = load_spec(path)
    assert child.section("ort") is None and child.section("ct2") is not None
    for bad in ('["nosuch"]', '"ort"', '["name"]'):
        path.write_text(f'extends = "default"\nwithout = {bad}\nname = "child"\n')
        with pytest.raises(UserError, match="without = .* must list tables of the suite it extends") as err:
            load_spec(path)
        assert "\n" not in str(err.value)


def test_a_size_axis_reads_and_one_preset_keeps_its_spec(tmp_path):
    """``preset`` takes one name or a list (the size axis); one preset writes as before, so no suite without a size
    axis changes its hash; several round-trip as a list."""
    one = load_spec(write(tmp_path, GOOD))
    assert one.model.presets == ("tiny",) and not one.model.sized and one.to_dict()["model"]["preset"] == "tiny"
    sized = load_spec(write(tmp_path, GOOD.replace('preset = "tiny"', 'preset = ["tiny", "mini"]'), "s.toml"))
    assert sized.model.presets == ("tiny", "mini") and sized.model.sized
    assert sized.to_dict()["model"]["preset"] == ["tiny", "mini"] and sized.spec_hash() != one.spec_hash()
    again = parse_spec(tomllib.loads(sized.to_toml()), "round-trip")
    assert again.replace(source=sized.source) == sized
    scale = load_spec("scale")
    assert scale.model.presets == ("tiny", "mini", "small") and scale.section("ort") is None


@pytest.mark.parametrize("name", ["..", ".", ".hidden", "a/b", "../up", ""])
def test_a_suite_name_is_a_plain_name(tmp_path, capsys, name):
    """The name names the results folder: `name = ".."` would write beside --out and overwrite its latest."""
    path = write(tmp_path, GOOD.replace('name = "mini"', f'name = "{name}"'))
    with pytest.raises(UserError, match=r"x.toml: name: expected a plain name \(letters, digits, _ \. -, not "
                                        r"starting with a dot\): it names the results folder"):
        load_spec(path)
    code = main(["run", "--suite", str(path), "--out", str(tmp_path / "results" / "out"), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "not starting with a dot" in err[0]
    assert [p.name for p in tmp_path.iterdir()] == ["x.toml"]        # nothing written, beside --out or in it
