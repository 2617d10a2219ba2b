"""Task packs (issue 54 item 1): a task written as plain files reads as the task itself, and a suite trains,
distils and times from it with TensorFlow and seqio unimportable, in this process and in every child."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from narbench_core.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
TASK = "synthetic_d100"           # three valid targets per source: the references and valid targets travel too


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    from models.packing import write_pack

    return write_pack(TASK, tmp_path_factory.mktemp("packs") / TASK)


@pytest.fixture
def packed(pack, monkeypatch):
    """This test's process reads TASK from the pack."""
    from suites import catalog

    monkeypatch.setenv(catalog.PACKS_ENV, str(pack))
    monkeypatch.setattr(catalog, "_DISTILLED", {})
    return pack


def test_a_pack_reads_as_its_task_and_names_the_same_caches(pack, tmp_path, monkeypatch):
    from models.batching import load_task_tokens, task_identity, token_cache_path
    from suites import catalog, tasks

    seqio_side = {split: (tasks.load_text(TASK, split), task_identity(TASK, split), token_cache_path(TASK, split),
                          load_task_tokens(TASK, split)) for split in ("train", "dev", "test")}
    info = tasks.task_info(TASK)
    manifest = json.loads((pack / "pack.json").read_text())
    assert manifest["splits"] == {s: len(seqio_side[s][0][0]) for s in seqio_side} and manifest["valid_targets"]
    monkeypatch.setenv(catalog.PACKS_ENV, str(pack))
    monkeypatch.setattr(catalog, "_DISTILLED", {})
    assert catalog.packed(TASK) and not catalog.packed("synthetic_d0")
    packed_info = catalog.task_info(TASK)
    assert (packed_info.source_lang, packed_info.target_lang, packed_info.family, packed_info.splits) == (
        info.source_lang, info.target_lang, info.family, info.splits)
    assert packed_info.vocabulary.vocab_size == info.vocabulary.vocab_size
    assert catalog.valid_targets(TASK, "dev") == tasks.valid_targets(TASK, "dev")
    for split, (text, identity, cache, tokens) in seqio_side.items():
        assert catalog.load_text(TASK, split) == text
        assert task_identity(TASK, split) == identity and token_cache_path(TASK, split) == cache
        assert load_task_tokens(TASK, split).fingerprint() == tokens.fingerprint()
    # A distilled variant of a packed task is tokenized by the SentencePiece model: the ids seqio gives.
    sources, refs = tasks.load_text(TASK, "train")
    tsv = tmp_path / "train.tsv"
    tsv.write_text("".join(f"{s}\t{t}\n" for s, t in zip(sources[:50], refs[1][:50])))
    name = catalog.register_distilled_task(TASK, tsv)
    assert catalog.is_known(name) and catalog.task_info(name).splits["train"] == 50
    assert catalog.distilled_train(name) == tsv and catalog.distilled_train(TASK) is None
    assert catalog.load_text(name, "train") == (sources[:50], [refs[1][:50]])
    ours = load_task_tokens(name, "train")
    monkeypatch.delenv(catalog.PACKS_ENV)
    assert tasks.register_distilled_task(TASK, tsv) == name
    from models.batching import _seqio_tokens

    inputs, targets = _seqio_tokens(name, "train")
    assert [list(ours.input(i)) for i in range(50)] == [list(x) for x in inputs]
    assert [list(ours.target(i)) for i in range(50)] == [list(y) for y in targets]


def test_a_damaged_or_missing_pack_is_one_line(pack, tmp_path, monkeypatch):
    import shutil

    from bench.cli import main
    from suites import catalog

    for bad, fix in ((tmp_path / "nothing", "write one with `narbench data pack"),):
        with pytest.raises(UserError, match=fix):
            catalog._packs(str(bad))
    broken = tmp_path / "broken"
    shutil.copytree(pack, broken)
    (broken / "dev.jsonl.gz").write_bytes((broken / "dev.jsonl.gz").read_bytes()[:40])
    monkeypatch.setenv(catalog.PACKS_ENV, str(broken))
    with pytest.raises(UserError, match="cut off or damaged; write the pack again"):
        catalog.load_text(TASK, "dev")
    (broken / "pack.json").write_text("{")
    catalog._packs.cache_clear()
    with pytest.raises(UserError, match="not valid JSON"):
        catalog.packs()
    monkeypatch.delenv(catalog.PACKS_ENV)
    catalog._packs.cache_clear()
    assert main(["--pack", str(tmp_path / "nothing"), "plan", "--suite", "smoke"]) == UserError.exit_code
    assert catalog.PACKS_ENV not in os.environ                     # a pack that fails is not kept
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(UserError, match="is a file; give a folder"):
        from models.packing import write_pack
        write_pack(TASK, tmp_path / "a-file")


# Stand-ins for the packages a pack's reader must not need: any import of them fails, in every process.
BLOCKED = ("tensorflow", "seqio", "tensorflow_datasets", "tensorflow_text")

SUITE = """
name = "packed"
seeds = [0]
batch_size = 1
max_test_sentences = 4
bootstrap_resamples = 20
decode_buckets = [32]
max_decode_length = 32

[[tasks]]
train = "{task}"
test = ["test"]

[model]
preset = "tiny"

[model.overrides]            # one layer a side, as the smoke suite: the same code paths, compiled sooner
num_encoder_layers = 1
num_decoder_layers = 1

{budgets}
[ar]
decoders = ["greedy"]

[distill]
decoder = "greedy"
max_examples = 32

[padir]
iterations = [1]
distill = [true]
length_hyps = [1]

[timing]
repeats = 1
costs = false
"""


@pytest.mark.slow
def test_a_suite_trains_distils_and_times_from_a_pack_without_tensorflow(pack, tmp_path):
    blocked = tmp_path / "blocked"
    for name in BLOCKED:
        (blocked / name).mkdir(parents=True)
        (blocked / name / "__init__.py").write_text(f"raise ImportError('{name} is blocked in this test')\n")
    root = tmp_path / "root"                        # a data root that holds nothing of the task: all from the pack
    root.mkdir()
    spec = tmp_path / "packed.toml"
    budget = ("steps = 4\nbatch_tokens = 512\nlearning_rate = 3e-3\nwarmup_steps = 1\nmax_length = 32\nbuckets = [32]\n"
              "eval_every = 2\ndev_sentences = 8\n")     # two curve points of 8 sentences (by default: 4 of 200)
    spec.write_text(SUITE.format(task=TASK, budgets="".join(f"[train.{f}]\n{budget}\n" for f in ("ar", "padir"))))
    env = dict(os.environ, NARBENCH_DATA=str(root), PYTHONPATH=os.pathsep.join([str(blocked), str(ROOT)]))
    env.pop("NARBENCH_PACKS", None)
    probe = "import sys; from bench.cli import main; code = main(sys.argv[1:]); " \
            f"assert not {{m.split('.')[0] for m in sys.modules}} & set({BLOCKED!r}); sys.exit(code)"
    proc = subprocess.run([sys.executable, "-c", probe, "--pack", str(pack), "run", "--suite", str(spec),
                           "--out", str(tmp_path / "results"), "--no-progress"],
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    from bench import store as st

    run = st.RunStore(st.resolve_run_dir(tmp_path / "results" / "packed"))
    systems = sorted(r.system for r in run.rows())
    assert len(systems) == 2 and systems[0] == "ar-greedy" and "distill" in systems[1]
    assert len(run.samples()) == 2 * 4 and json.loads((run.path / "distill.json").read_text())
    assert sorted(p.name for p in (root / "vocab").iterdir())          # installed from the pack
    assert not (root / "corpora").exists()                               # nothing of the task was made here
