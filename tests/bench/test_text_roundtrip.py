"""The one line rule through the results store (rows, samples, curves), `narbench eval`'s inputs and
`narbench translate`: any text, line-breaking code points included, reads back as written, and
`wc -l` and narbench count the same lines. And sources cut to a model's maximum length are reported."""
from __future__ import annotations

import gzip

import io
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from bench import store as st_
from bench.cli import main
from bench.cli.run import _read_lines
from bench.measure.decoder import DecodeOutput
from grid_fakes import fake_row

BREAKS = "\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
TEXT = st.text(alphabet=st.one_of(st.sampled_from(BREAKS), st.sampled_from("ab "), st.characters(codec="utf-8")),
               max_size=20)
LINE = TEXT.map(lambda s: s.replace("\n", "").rstrip("\r"))    # one line's text (see tests/core/test_io_lines.py)
HASH = "0123456789abcdef" * 4


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=st.lists(TEXT, min_size=1, max_size=4, unique=True), text=st.lists(TEXT, min_size=3, max_size=3))
@example(names=["my\u2028set", "t"], text=["a\rb", "c\x85d", "e\x0cf"])
def test_rows_samples_and_curves_read_back_whatever_the_text(tmp_path_factory, names, text):
    run, _ = st_.open_run(tmp_path_factory.mktemp("out"), "suite", HASH, 'name = "suite"\n', "cmd")
    rows = [fake_row("sys", test_set=name, bleu=1.0) for name in names]
    samples = [{"system": "sys", "test_set": name, "index": 0, "source": text[0], "reference": text[1],
                "hypothesis": text[2]} for name in names]
    run.save_cells(rows, samples)
    run.save_curve(text[0], [{"model": text[0], "step": 1}])
    assert [r.test_set for r in run.rows()] == names and run.samples() == samples
    assert run.curves() == [{"model": text[0], "step": 1}]
    assert gzip.decompress((run.path / st_.SAMPLES).read_bytes()).count(b"\n") == len(samples)
    assert st_.RunStore(run.path).done_keys() == {("sys", n) for n in names}


@settings(max_examples=40, deadline=None)
@given(lines=st.lists(LINE, max_size=6), ending=st.sampled_from(["\n", "\r\n"]))
@example(lines=["a\rb", "c\u2028d", "\x0c"], ending="\n")
def test_eval_inputs_read_line_for_line(tmp_path_factory, lines, ending):
    path = tmp_path_factory.mktemp("eval") / "src.txt"
    path.write_bytes("".join(line + ending for line in lines).encode("utf-8"))
    assert _read_lines(str(path)) == lines


# -- narbench eval ------------------------------------------------------------------------------------
@pytest.fixture
def finished_run(tmp_path, monkeypatch, fixed_peaks):
    """A finished run of fake systems (bench.runner.real_deps patched); returns its suite folder."""
    from grid_fakes import FakeFactory, fake_deps, fake_spec

    monkeypatch.setattr("bench.runner.real_deps", lambda **_: fake_deps(tmp_path / "ckpt", FakeFactory()))
    spec = tmp_path / "lines.toml"
    spec.write_text(fake_spec("lines", test=["test"], ar_decoders=["greedy"], padir_iterations=[2],
                              max_test_sentences=6))
    assert main(["run", "--suite", str(spec), "--out", str(tmp_path / "results"), "--no-progress"]) == 0
    return tmp_path / "results" / "lines"


def test_eval_name_and_inputs_with_line_breaking_characters(finished_run, tmp_path, capsys):
    """A test set named with U+2028 leaves rows.jsonl readable; a lone CR and U+2028 inside an input line
    are text, so 2 lines give 2 sentences (wc -l agrees)."""
    src, ref = tmp_path / "in.src", tmp_path / "in.ref"
    src.write_bytes("alpha\rbeta gamma\ndelta\u2028delta\r\n".encode())
    ref.write_bytes("ALPHA\rBETA GAMMA\nDELTA\u2028DELTA\n".encode())
    name = "my\u2028set"
    capsys.readouterr()
    code = main(["eval", "--run", str(finished_run), "--source-file", str(src), "--reference-file", str(ref),
                 "--name", name])
    assert code == 0, capsys.readouterr().err
    run = st_.RunStore(st_.resolve_run_dir(finished_run))
    mine = [r for r in run.rows() if r.test_set == name]
    assert len(mine) == 3 and all(r.n_sentences == 2 for r in mine)
    assert [s["source"] for s in run.samples() if s["test_set"] == name][:2] == ["alpha\rbeta gamma",
                                                                                 "delta\u2028delta"]
    capsys.readouterr()
    assert main(["results", str(finished_run), "--test-set", name, "--format", "json"]) == 0
    code = main(["eval", "--run", str(finished_run), "--source-file", str(src), "--reference-file", str(ref),
                 "--name", name])
    assert code == 2 and "already has a test set" in capsys.readouterr().err
    for bad in ("two\nlines", "tab\there", "not utf-8 \udcff"):      # would break the tables, or cannot be stored
        code = main(["eval", "--run", str(finished_run), "--source-file", str(src), "--reference-file", str(ref),
                     "--name", bad])
        err = capsys.readouterr().err
        assert code == 2 and "pass --name with a plain name" in err and len(err.strip().split("\n")) == 1


def test_eval_reports_and_records_sources_cut_to_the_maximum(finished_run, tmp_path, capsys):
    """The fake decoders keep 8 words (9 tokens with EOS): one of three sources is longer."""
    long = " ".join(["alpha", "beta"] * 6)
    src, ref = tmp_path / "cut.src", tmp_path / "cut.ref"
    src.write_text(f"alpha beta\n{long}\ngamma\n")
    ref.write_text(f"ALPHA BETA\n{long.upper()}\nGAMMA\n")
    capsys.readouterr()
    assert main(["eval", "--run", str(finished_run), "--source-file", str(src), "--reference-file", str(ref)]) == 0
    err = capsys.readouterr().err
    notes = [line for line in err.splitlines() if "longer than the model's maximum source length" in line]
    assert len(notes) == 1 and "1 of 3 sources of test set 'cut'" in notes[0], err
    rows = st_.RunStore(st_.resolve_run_dir(finished_run)).rows()
    assert {r.truncated_sources for r in rows if r.test_set == "cut"} == {1}
    assert {r.truncated_sources for r in rows if r.test_set != "cut"} == {0}      # `narbench run` counts too


# -- narbench translate --------------------------------------------------------------------------------
class EchoDecoder:
    """Upper-cases each source; one of more than ``max_source_tokens - 1`` words is cut to them."""

    name = "echo"
    max_source_tokens = 4

    def count_truncated(self, sources):
        return sum(len(s.split()) + 1 > self.max_source_tokens for s in sources)

    def warmup_inputs(self, batch_size):
        return []

    def prepare(self, sources):
        keep = self.max_source_tokens - 1
        return [s if len(s.split()) <= keep else " ".join(s.split()[:keep]) for s in sources]

    def run(self, prepared):
        return prepared

    def finish(self, outputs, prepared):
        return DecodeOutput([s.upper() for s in outputs], np.ones(len(outputs), np.int64))


def translate(monkeypatch, argv, stdin_text=""):
    monkeypatch.setattr("models.decoders.load_decoder", lambda *a, **kw: EchoDecoder())
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin_text))
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    code = main(["translate", "--checkpoint", "ckpt", "--decoder", "greedy", *argv])
    return code, out.getvalue(), err.getvalue()


def test_translate_gives_one_line_per_input_line(monkeypatch, tmp_path):
    src = tmp_path / "src.txt"
    src.write_bytes(b"one\rtwo\nthree \xe2\x80\xa8four\r\n")          # 2 lines: a lone CR, U+2028, CRLF
    code, out, err = translate(monkeypatch, ["--source-file", str(src)])
    assert code == 0, err
    assert out.split("\n") == ["ONE\rTWO", "THREE \u2028FOUR", ""]
    code, out, _ = translate(monkeypatch, [], "a\x0cb\nc\x85d\n")
    assert code == 0 and out == "A\x0cB\nC\x85D\n"


def test_translate_notes_sources_cut_to_the_maximum(monkeypatch):
    code, out, err = translate(monkeypatch, [], "a b c d e\nshort\nw x y z\n")
    assert code == 0 and out.count("\n") == 3
    assert err.strip().splitlines() == [
        "narbench: 2 of 3 sources are longer than the model's maximum source length of 4 tokens (EOS included) "
        "and were cut to it: their translations cover only the kept part"]
    code, _, err = translate(monkeypatch, [], "short\n")
    assert code == 0 and err == ""
