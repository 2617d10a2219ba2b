"""Your own data: a suite task on parallel text files, `narbench data check` (one test per defect),
`narbench data export`, and `narbench run` refusing bad data before it writes anything."""
from __future__ import annotations

import json

import pytest
import hypothesis
from hypothesis import strategies as hst

from bench import store as st
from bench.cli import main
from bench.families import load_suite, parse_suite
from narbench_core.errors import UserError
from suites import files, tasks, vocab

SOURCES = [f"quelle {i} wort{i % 7} satz" for i in range(40)]
TARGETS = [f"source {i} word{i % 7} sentence" for i in range(40)]


def write_tsv(path, pairs):
    path.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    return path


def corpus(tmp_path, train=None, dev=None, test=None):
    """train/dev/test TSVs in tmp_path/data from disjoint slices of the toy pairs (or the given lines)."""
    folder = tmp_path / "data"
    folder.mkdir(exist_ok=True)
    pairs = list(zip(SOURCES, TARGETS))
    for name, default, given in (("train", pairs[:30], train), ("dev", pairs[30:35], dev),
                                 ("test", pairs[35:], test)):
        if isinstance(given, bytes):
            (folder / f"{name}.tsv").write_bytes(given)
        else:
            write_tsv(folder / f"{name}.tsv", given if given is not None else default)
    return folder


SPEC = """
name = "mine"
max_test_sentences = 4
bootstrap_resamples = 10
decode_buckets = [32]
max_decode_length = 32

[[tasks]]
name = "{name}"
source_lang = "de"
target_lang = "{target}"
files = {{ train = "data/train.tsv", dev = "data/dev.tsv", test = "data/test.tsv" }}
vocab_size = {vocab}
test = ["test"]

[model]
preset = "tiny"

[model.overrides]            # one layer a side, as the smoke suite: compiled sooner
num_encoder_layers = 1
num_decoder_layers = 1

[train.ar]
steps = 6
batch_tokens = 256
learning_rate = 3e-3
warmup_steps = 2
max_length = 32
buckets = [32]
eval_every = 6

[ar]
decoders = ["greedy"]
"""


def write_spec(tmp_path, name="mine_de_en", target="en", vocab=64, extra=""):
    path = tmp_path / "mine.toml"
    path.write_text(SPEC.format(name=name, target=target, vocab=vocab) + extra, encoding="utf-8")
    return path


def split_of(tmp_path, name="test"):
    return files.SplitFiles((str(tmp_path / "data" / f"{name}.tsv"),))


# -- reading and the spec ------------------------------------------------------------------------
def test_spec_task_reads_files_relative_to_the_spec(tmp_path, monkeypatch):
    corpus(tmp_path)
    monkeypatch.chdir("/")                                   # not the spec's folder
    spec = load_suite(write_spec(tmp_path))
    task = spec.tasks[0]
    assert task.train == "mine_de_en" and task.files.files("train").paths == (str(tmp_path / "data" / "train.tsv"),)
    assert tasks.split_sizes("mine_de_en") == {"train": 30, "dev": 5, "test": 5}
    src, refs = tasks.load_text("mine_de_en", "test")
    assert src == SOURCES[35:] and refs == [TARGETS[35:]]
    info = tasks.task_info("mine_de_en")
    assert (info.family, info.source_lang, info.target_lang) == ("files", "de", "en")
    # the resolved spec holds absolute paths, so a run's spec.toml reloads from anywhere
    again = load_suite(write_spec(tmp_path)).to_dict()
    assert again["tasks"][0]["files"]["dev"] == str(tmp_path / "data" / "dev.tsv")
    assert parse_suite(again, "spec.toml").tasks == spec.tasks          # round-trips
    assert again["tasks"][0]["test"] == ["test"]


def test_aligned_files_and_extra_references(tmp_path):
    corpus(tmp_path)
    folder = tmp_path / "data"
    (folder / "test.de").write_text("".join(s + "\n" for s in SOURCES[35:]), encoding="utf-8")
    (folder / "test.en").write_text("".join(t + "\n" for t in TARGETS[35:]), encoding="utf-8")
    (folder / "test.en2").write_text("".join(t.upper() + "\n" for t in TARGETS[35:]), encoding="utf-8")
    path = write_spec(tmp_path, name="aligned_de_en")
    path.write_text(path.read_text().replace('test = "data/test.tsv"',
                                             'test = ["data/test.de", "data/test.en", "data/test.en2"]'))
    load_suite(path)
    src, refs = tasks.load_text("aligned_de_en", "test")
    assert src == SOURCES[35:] and refs == [TARGETS[35:], [t.upper() for t in TARGETS[35:]]]


def test_spec_errors_name_the_fix(tmp_path):
    corpus(tmp_path)
    path = write_spec(tmp_path)
    path.write_text(path.read_text().replace("data/dev.tsv", "data/missing.tsv"))
    with pytest.raises(UserError, match=r"tasks\[0\]\.files\.dev: .*missing\.tsv not found \(relative paths start"):
        load_suite(path)
    with pytest.raises(UserError, match="is built in; give your data another name"):
        load_suite(write_spec(tmp_path, name="bible_de_en"))
    path = write_spec(tmp_path)
    path.write_text(path.read_text().replace('name = "mine_de_en"', 'name = "mine_de_en"\ntrain = "bible_de_en"'))
    with pytest.raises(UserError, match="give either train = TASK"):
        load_suite(path)


def test_japanese_target_scores_with_mecab(tmp_path):
    corpus(tmp_path)
    load_suite(write_spec(tmp_path, name="mine_de_ja", target="ja"))
    assert tasks.task_info("mine_de_ja").target_lang == "ja"
    assert "mine_de_ja" in tasks.known_tasks()
    from narbench_core import langs
    assert langs.bleu_tokenizer(tasks.task_info("mine_de_ja").target_lang) == "ja-mecab"


def test_vocabulary_is_trained_on_train_and_cached_by_the_files(tmp_path, empty_root):
    corpus(tmp_path)
    load_suite(write_spec(tmp_path))
    first = tasks.get_vocabulary("mine_de_en").sentencepiece_model_file
    assert "mine_de_en-" in first
    ids = tasks.get_vocabulary("mine_de_en").encode("quelle 3 wort3 satz")
    assert tasks.get_vocabulary("mine_de_en").decode(ids) == "quelle 3 wort3 satz"
    write_tsv(tmp_path / "data" / "train.tsv", list(zip(SOURCES[:29], TARGETS[:29])))   # other files
    load_suite(write_spec(tmp_path))
    assert tasks.get_vocabulary("mine_de_en").sentencepiece_model_file != first


# -- narbench data check: one test per defect ------------------------------------------------------
def check(tmp_path, capsys, *names, args=()):
    code = main(["data", "check", *[str(tmp_path / "data" / n) for n in names], *args])
    return code, capsys.readouterr().out


def test_check_clean_data_passes(tmp_path, capsys):
    corpus(tmp_path)
    code, out = check(tmp_path, capsys, "train.tsv", "test.tsv")
    assert code == 0 and "0 defects: the data is clean" in out
    assert "train.tsv: 30 lines, 30 clean pairs, 0 defects" in out
    assert "source words: mean 4.0  p50 4  p95 4  max 4" in out


def test_check_finds_misaligned_tsv_lines(tmp_path, capsys):
    corpus(tmp_path, test=b"a\tb\nno tab here\nc\td\te\n")
    code, out = check(tmp_path, capsys, "test.tsv")
    assert code == 1
    assert "test.tsv:2: misaligned: no tab" in out and "test.tsv:3: misaligned: 3 columns where the first line has 2" in out


def test_check_finds_misaligned_files(tmp_path, capsys):
    corpus(tmp_path)
    (tmp_path / "data" / "x.de").write_text("a\nb\nc\n")
    (tmp_path / "data" / "x.en").write_text("a\nb\n")
    code = main(["data", "check", f"{tmp_path}/data/x.de,{tmp_path}/data/x.en"])
    out = capsys.readouterr().out
    assert code == 1 and "x.de:3: misaligned: the aligned files differ in length (x.de 3, x.en 2 lines)" in out


def test_check_finds_empty_lines_and_sides(tmp_path, capsys):
    corpus(tmp_path, test=b"a\tb\n\n \tc\nd\t\n")
    code, out = check(tmp_path, capsys, "test.tsv")
    assert code == 1
    assert "test.tsv:2: empty: empty line" in out and "test.tsv:3: empty: empty source" in out
    assert "test.tsv:4: empty: empty target" in out


def test_check_finds_over_long_lines(tmp_path, capsys):
    long = " ".join(["wort"] * 12)
    corpus(tmp_path, test=[("kurz", "short"), (long, "long")])
    code, out = check(tmp_path, capsys, "test.tsv", args=("--max-words", "10"))
    assert code == 1 and "test.tsv:2: too_long: source of 12 words > 10 (--max-words)" in out
    assert check(tmp_path, capsys, "test.tsv")[0] == 0                  # the default limit is higher


def test_check_finds_encoding_errors(tmp_path, capsys):
    corpus(tmp_path, test=b"\xef\xbb\xbfa\tb\nbad \xff\tc\r\nok\tfine\r\n")
    code, out = check(tmp_path, capsys, "test.tsv")
    assert code == 1 and "test.tsv:2: encoding: not UTF-8 (byte 4: b'\\xff')" in out
    assert "3 lines, 2 clean pairs, 1 defects" in out
    pairs = files.check_split(split_of(tmp_path)).pairs                 # a BOM and CRLF endings are no defects
    assert [(p.line, p.source, p.references) for p in pairs] == [(1, "a", ["b"]), (3, "ok", ["fine"])]


def test_check_finds_nul_characters(tmp_path, capsys):
    corpus(tmp_path, test=b"a\tb\nc\x00d\te\n")
    code, out = check(tmp_path, capsys, "test.tsv")
    assert code == 1 and "test.tsv:2: nul: a NUL character (\\x00) at character 2" in out
    assert "2 lines, 1 clean pairs, 1 defects" in out


def test_check_finds_a_header_line(tmp_path, capsys):
    corpus(tmp_path, test=b"source\ttarget\nquelle\tsource\n")
    code, out = check(tmp_path, capsys, "test.tsv")
    assert code == 1 and "test.tsv:1: header: looks like column names (source | target)" in out
    assert "2 lines, 1 clean pairs, 1 defects" in out
    corpus(tmp_path, test=b"de\ten\nquelle\tsource\n")              # language codes, languages unknown
    assert "test.tsv:1: header: looks like column names (de | en)" in check(tmp_path, capsys, "test.tsv")[1]
    corpus(tmp_path, test=b"EN\tSrc\nquelle\tsource\n")             # the task's languages, any case
    code, out = check(tmp_path, capsys, "test.tsv", args=("--source-lang", "de", "--target-lang", "en"))
    assert code == 1 and "test.tsv:1: header: " in out
    corpus(tmp_path, test=b"text\ttexte\nja\tyes\n")                # a sentence pair, even of one word
    assert check(tmp_path, capsys, "test.tsv")[0] == 0
    (tmp_path / "data" / "x.de").write_text("de\nquelle\n")
    (tmp_path / "data" / "x.en").write_text("en\nsource\n")
    code = main(["data", "check", f"{tmp_path}/data/x.de,{tmp_path}/data/x.en"])
    assert code == 1 and "x.de:1: header: looks like column names (de | en)" in capsys.readouterr().out


def test_check_finds_an_empty_split(tmp_path, capsys):
    corpus(tmp_path, test=b"")
    code, out = check(tmp_path, capsys, "test.tsv")
    assert code == 1 and "test.tsv:1: empty: no lines: the split is empty" in out


def test_check_finds_test_sources_repeated_from_train(tmp_path, capsys):
    corpus(tmp_path, test=[(SOURCES[3], "anything"), ("neu", "new")])
    code, out = check(tmp_path, capsys, "train.tsv", "test.tsv")
    assert code == 1 and "test.tsv:1: duplicate: source also in training data (" in out and "train.tsv:4)" in out


def test_check_spec_counts_real_tokens(tmp_path, capsys):
    long = " ".join(f"x{i}y" for i in range(40))
    corpus(tmp_path, train=list(zip(SOURCES[:30], TARGETS[:30])) + [("kurz", long)])
    code = main(["data", "check", "--spec", str(write_spec(tmp_path))])
    out = capsys.readouterr().out
    assert code == 1 and "train.tsv:31: too_long: target of " in out and "> max_length 32" in out


# -- narbench run --------------------------------------------------------------------------------
def test_run_refuses_bad_data_before_writing(tmp_path, capsys):
    corpus(tmp_path, test=[("a", "b"), (SOURCES[0], "c")])
    results = tmp_path / "results"
    code = main(["run", "--suite", str(write_spec(tmp_path)), "--out", str(results), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0
    assert any(line.startswith("narbench: error: task mine_de_en: bad data: ") and "test.tsv:2: duplicate" in line
               and "narbench data check --spec" in line for line in err), err
    assert not results.exists()


def test_run_refuses_an_empty_split_before_writing(tmp_path, capsys):
    corpus(tmp_path, test=b"")
    results = tmp_path / "results"
    code = main(["run", "--suite", str(write_spec(tmp_path)), "--out", str(results), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "test.tsv:1: empty: no lines: the split is empty" in err[0], err
    assert not results.exists()


# -- the one line rule -----------------------------------------------------------------------------
BREAKS = "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
FIELD = (hst.text(alphabet=hst.one_of(hst.sampled_from(BREAKS), hst.sampled_from("ab "), hst.characters(codec="utf-8")),
                 min_size=1, max_size=12)
         .map(lambda s: s.replace("\t", " ").replace("\n", " ").replace("\x00", " "))
         .filter(lambda s: s.strip() and not s.startswith("\ufeff")))


@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(pairs=hst.lists(hst.tuples(FIELD, FIELD), min_size=1, max_size=5),
                  ending=hst.sampled_from(["\n", "\r\n"]))
@hypothesis.example(pairs=[("ein\rzwei", "one\u2028two"), ("drei\x0cvier", "three\x85four")], ending="\n")
def test_own_data_reads_back_whatever_the_text(tmp_path_factory, pairs, ending):
    """TSV and aligned files of any text (no tab or newline in a field) give their pairs back, stripped,
    one per line, and the vocabulary's input holds them line for line: a lone CR, U+2028, form feed ...
    are text."""
    hypothesis.assume(not files.looks_like_header(pairs[0], "de", "en"))
    folder = tmp_path_factory.mktemp("own")
    for name, text in (("x.tsv", "".join(f"{s}\t{t}{ending}" for s, t in pairs)),
                       ("x.de", "".join(s + ending for s, _ in pairs)),
                       ("x.en", "".join(t + ending for _, t in pairs))):
        (folder / name).write_bytes(text.encode("utf-8"))
    tsv = files.SplitFiles((str(folder / "x.tsv"),))
    aligned = files.SplitFiles((str(folder / "x.de"), str(folder / "x.en")))
    task = files.FileTask("own_lines", "de", "en", (("train", tsv), ("dev", aligned), ("test", tsv)))
    want = ([s.strip() for s, _ in pairs], [[t.strip() for _, t in pairs]])
    assert files.load_split(task, "train") == want and files.load_split(task, "dev") == want
    assert files.count_lines(tsv) == files.count_lines(aligned) == len(pairs)
    sentences = list(vocab._sentences([tasks._clean_train_tsv(task)], (0, 1)))
    assert sentences == [x for s, t in zip(want[0], want[1][0]) for x in (s, t)]


def test_export_writes_a_synthetic_corpus(tmp_path, capsys):
    out = tmp_path / "syn"
    assert main(["data", "export", "synthetic_d0", "--out", str(out), "--limit", "25"]) == 0
    rows = (out / "train.tsv").read_text(encoding="utf-8").splitlines()
    src, refs = tasks.load_text("synthetic_d0", "train")
    assert rows[:3] == [f"{src[i]}\t{refs[0][i]}" for i in range(3)] and len(rows) == 25
    assert all((out / f"{s}.tsv").is_file() for s in ("dev", "test"))


@pytest.mark.slow
def test_own_data_suite_runs_end_to_end(tmp_path, capsys):
    """A synthetic corpus written out as TSV, a one-system suite on it, its task in the leaderboard."""
    assert main(["data", "export", "synthetic_d0", "--out", str(tmp_path / "data"), "--limit", "400"]) == 0
    spec = write_spec(tmp_path, name="syn_files", vocab=256)
    results = tmp_path / "results"
    code = main(["run", "--suite", str(spec), "--out", str(results), "--no-progress"])
    assert code == 0, capsys.readouterr().err
    run_dir = st.resolve_run_dir(results / "mine")
    rows = st.RunStore(run_dir).rows()
    assert [(r.system, r.task, r.test_set) for r in rows] == [("ar-greedy", "syn_files", "syn_files:test")]
    assert "syn_files:test" in (run_dir / "leaderboard.md").read_text()
    assert rows[0]["n_sentences"] == 4 and rows[0].train_steps == 6
    curve = [json.loads(line) for line in (run_dir / st.CURVES).read_text().splitlines()]
    assert [p["step"] for p in curve] == [6] and curve[0]["dev_bleu"] is not None   # the dev split, scored
