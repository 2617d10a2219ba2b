"""bench.measure.quality: BLEU/chrF and the paired tests equal to the sacrebleu CLI, stutter on hand cases, metric
registry."""
from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench import rows
from bench.measure import quality
from narbench_core import defaults, langs
from narbench_core.errors import UserError

WORDS = "the lord said unto moses go down and speak to the people of israel in the land of egypt".split()
ZH = "起初神创造天地地是空虚混沌渊面黑暗神的灵运行在水面上神说要有光就有了光"


def _corpus(seed: int, n: int = 60):
    """Seeded references, a second reference stream, and two systems of different quality."""
    rng = random.Random(seed)
    refs = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 18))) for _ in range(n)]
    refs2 = [" ".join(w if rng.random() > 0.2 else rng.choice(WORDS) for w in r.split()) for r in refs]

    def noisy(p):
        out = []
        for r in refs:
            ws = [w if rng.random() > p else rng.choice(WORDS) for w in r.split()]
            if rng.random() < 0.3:  # stutter
                i = rng.randrange(len(ws))
                ws.insert(i, ws[i])
            out.append(" ".join(ws))
        return out

    return refs, refs2, noisy(0.1), noisy(0.4)


def _zh_corpus(seed: int, n: int = 30):
    rng = random.Random(seed)
    refs = ["".join(rng.choice(ZH) for _ in range(rng.randint(5, 20))) + "。" for _ in range(n)]
    hyps = ["".join(c if rng.random() > 0.25 else rng.choice(ZH) for c in r) for r in refs]
    return refs, hyps


def _cli(tmp_path: Path, hyps, ref_streams, *args) -> float:
    exe = shutil.which("sacrebleu") or str(Path(sys.executable).with_name("sacrebleu"))
    hyp_file = tmp_path / "hyp.txt"
    hyp_file.write_text("\n".join(hyps) + "\n", encoding="utf-8")
    ref_files = []
    for k, stream in enumerate(ref_streams):
        ref_files.append(tmp_path / f"ref{k}.txt")
        ref_files[-1].write_text("\n".join(stream) + "\n", encoding="utf-8")
    done = subprocess.run([exe, *map(str, ref_files), "-i", str(hyp_file), "-b", "-w", "6", *args],
                          capture_output=True, text=True, check=True)
    return float(done.stdout.strip())


def test_bleu_equals_sacrebleu_cli_single_and_multi_reference(tmp_path):
    refs, refs2, good, _ = _corpus(0)
    single = quality.corpus_bleu(good, [refs])
    assert single.score == pytest.approx(_cli(tmp_path, good, [refs]), abs=1e-5)
    assert single.signature.startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    multi = quality.corpus_bleu(good, [refs, refs2])
    assert multi.score == pytest.approx(_cli(tmp_path, good, [refs, refs2]), abs=1e-5)
    assert multi.signature.startswith("nrefs:2|") and multi.score > single.score


def test_japanese_targets_score_with_mecab_and_count_characters():
    assert langs.bleu_tokenizer("ja") == langs.bleu_tokenizer("ja_JP") == "ja-mecab"
    refs, hyps = ["私は学生です。"], ["私は学生です。"]
    score = quality.corpus_bleu(hyps, [refs], tokenize="ja-mecab")
    assert score.score == pytest.approx(100.0) and "tok:ja-mecab" in score.signature
    # mecab splits the unspaced sentence into words: one wrong word costs part of the score, not all.
    assert 0.0 < quality.corpus_bleu(["私は先生です。"], [refs], tokenize="ja-mecab").score < 100.0
    assert langs.counts_characters("ja") and langs.text_length("私は 学生", "ja") == 4
    assert quality.score_corpus(["私は学生"], [["私は学生です"]], "ja").length_ratio == pytest.approx(4 / 6)


def test_bleu_zh_tokenizer_equals_cli(tmp_path):
    refs, hyps = _zh_corpus(1)
    tok = langs.bleu_tokenizer("zh")
    assert tok == "zh" and langs.bleu_tokenizer("en") == "13a" and langs.bleu_tokenizer("zh-Hans") == "zh"
    score = quality.corpus_bleu(hyps, [refs], tokenize=tok)
    assert score.score == pytest.approx(_cli(tmp_path, hyps, [refs], "-tok", "zh"), abs=1e-5)
    assert "tok:zh" in score.signature
    # 13a leaves unspaced Chinese as one token per sentence: a different (much lower) number.
    assert quality.corpus_bleu(hyps, [refs], tokenize="13a").score < score.score


def test_chrf_equals_cli(tmp_path):
    refs, refs2, good, _ = _corpus(2)
    chrf = quality.corpus_chrf(good, [refs, refs2])
    assert chrf.score == pytest.approx(_cli(tmp_path, good, [refs, refs2], "-m", "chrf"), abs=1e-5)
    assert chrf.signature.startswith("nrefs:2|case:mixed|eff:yes|nc:6|nw:0|space:no|version:")


def test_misaligned_references_raise():
    with pytest.raises(UserError, match="reference stream 0"):
        quality.corpus_bleu(["a", "b"], [["a"]])
    with pytest.raises(ValueError):
        quality.corpus_bleu(["a"], ["a"])  # a bare list of strings is not a list of streams


@pytest.mark.parametrize("hyp,ref,expected", [
    ("the the cat", "the cat", 1),
    ("the the the cat", "the cat", 2),              # (the,the) occurs twice
    ("the the cat", "the the cat", 0),              # the reference has the same repeat
    ("the the the cat", "the the cat", 1),
    ("go go go go", "go go", 2),                    # 3 pairs in h, 1 in r
    ("a a b b", "b b", 1),                          # per word: a +1, b 0
    ("the cat the cat", "the cat", 0),              # non-adjacent repeats are not stutter
    ("", "the the", 0),
    ("Amen amen", "amen", 0),                       # case-sensitive words
])
def test_stutter_hand_cases(hyp, ref, expected):
    assert quality.stutter_count(hyp, ref) == expected


def test_stutter_chinese_counts_characters():
    assert quality.stutter_count("神神说", "神说", characters=True) == 1
    assert quality.stutter_count("神 神说", "神说", characters=True) == 1   # spaces are ignored
    assert quality.stutter_count("神神说", "神神说", characters=True) == 0
    assert quality.stutter_count("神神说", "神说", characters=False) == 0  # one whitespace word


def test_stutter_corpus_rates():
    hyps = ["a a b c", "d e f g h i", "x x x y"]   # 4 + 6 + 4 = 14 words; stutter 1, 0, 2
    refs = ["a b c", "d e f", "x y"]
    s = quality.stutter(hyps, refs)
    assert s.total == 3 and s.hypothesis_words == 14
    assert s.per_1k_words == pytest.approx(3000 / 14)
    assert s.sentence_share == pytest.approx(2 / 3)


def _cli_paired(tmp_path: Path, baseline, system, ref_streams, test: str, n: int, *args) -> dict:
    """``sacrebleu REFS -i BASELINE SYSTEM --paired-TEST --paired-TEST-n N`` with ``SACREBLEU_SEED`` =
    narbench's seed: the system's result (score, p_value, mean, ci) from the JSON output."""
    exe = shutil.which("sacrebleu") or str(Path(sys.executable).with_name("sacrebleu"))
    files = []
    for name, lines in (("baseline", baseline), ("system", system),
                        *((f"ref{k}", stream) for k, stream in enumerate(ref_streams))):
        files.append(tmp_path / f"{name}.txt")
        files[-1].write_text("\n".join(lines) + "\n", encoding="utf-8")
    env = {**os.environ, "SACREBLEU_SEED": str(defaults.SIGNIFICANCE_SEED)}
    done = subprocess.run([exe, *map(str, files[2:]), "-i", str(files[0]), str(files[1]), f"--paired-{test}",
                           f"--paired-{test}-n", str(n), "-f", "json", *args],
                          capture_output=True, text=True, check=True, env=env)
    baseline_result, system_result = json.loads(done.stdout)
    assert baseline_result["system"].startswith("Baseline")
    return system_result["BLEU"]


def test_paired_tests_equal_sacrebleu_cli_single_multi_reference_and_chinese(tmp_path):
    """narbench's p-values (the row's columns) are sacrebleu's own: its CLI on the same files, same seed
    and trials, gives the same numbers, with several reference streams and with the zh tokenizer."""
    refs, refs2, good, bad = _corpus(4, n=12)
    zh_refs, zh_hyps = _zh_corpus(2, n=10)
    zh_other = [h[1:] + h[:1] for h in zh_hyps]
    for system, baseline, streams, lang, args in ((good, bad, [refs], "en", ()),
                                                  (bad, good, [refs, refs2], "en", ()),
                                                  (zh_other, zh_hyps, [zh_refs], "zh", ("--tokenize", "zh"))):
        figures = rows.paired_test_figures(system, baseline, streams, lang, bootstrap_resamples=200, ar_trials=500)
        ar = _cli_paired(tmp_path, baseline, system, streams, "ar", 500, *args)
        bs = _cli_paired(tmp_path, baseline, system, streams, "bs", 200, *args)
        assert figures["bleu_p_ar"] == ar["p_value"] and figures["bleu_p_bs"] == bs["p_value"]
        assert figures["bleu_bs_mean"] == bs["mean"] and figures["bleu_bs_ci"] == bs["ci"]
        tok = "zh" if lang == "zh" else "13a"
        assert figures["bleu_ar_signature"].startswith(f"nrefs:{len(streams)}|ar:500|seed:12345|case:mixed|eff:no|"
                                                       f"tok:{tok}|smooth:exp|version:")
        assert figures["bleu_bs_signature"].startswith(f"nrefs:{len(streams)}|bs:200|seed:12345|")
    assert 0 < figures["bleu_p_ar"] < 1 and 0 < figures["bleu_p_bs"] < 1   # the zh pair: a real test, not p = 1


def test_paired_tests_are_seeded_and_give_identical_hypotheses_p_one(monkeypatch):
    refs, _, good, bad = _corpus(5, n=12)
    monkeypatch.setenv("SACREBLEU_SEED", "7")                   # the user's setting neither changes nor is lost
    first = quality.paired_tests(good, bad, [refs], ar_trials=300, bs_resamples=100)
    assert os.environ["SACREBLEU_SEED"] == "7"
    monkeypatch.delenv("SACREBLEU_SEED")
    assert quality.paired_tests(good, bad, [refs], ar_trials=300, bs_resamples=100) == first
    assert "SACREBLEU_SEED" not in os.environ
    assert quality.paired_tests(good, bad, [refs], ar_trials=300, bs_resamples=100, seed=8) != first
    assert "|ar:300|seed:12345|" in first.ar_signature and "|bs:100|seed:12345|" in first.bs_signature
    assert quality.ar_trials_of(first.ar_signature) == 300 and quality.ar_trials_of(first.bs_signature) is None
    same = quality.paired_tests(good, good, [refs], ar_trials=300, bs_resamples=100)
    assert same.p_ar == same.p_bs == 1.0                        # sacrebleu would say 1 / (trials + 1)
    assert abs(same.bs_mean - quality.corpus_bleu(good, [refs]).score) < same.bs_ci
    with pytest.raises(ValueError, match="seed 0"):
        quality.paired_tests(good, bad, [refs], seed=0)


def test_score_corpus_bundles_metrics():
    refs, refs2, good, _ = _corpus(5)
    q = quality.score_corpus(good, [refs, refs2], "en")
    assert q.bleu == pytest.approx(quality.corpus_bleu(good, [refs, refs2]).score)
    assert q.stutter_per_1k_words == pytest.approx(quality.stutter(good, refs).per_1k_words)
    assert np.isfinite(q.chrf)
    assert q.length_ratio == pytest.approx(quality.length_ratio(good, refs))      # against the first stream


def test_length_ratio_counts_words_or_chinese_characters():
    assert quality.length_ratio(["a b c", "d"], ["a b", "c d e f"]) == pytest.approx(4 / 6)
    assert quality.length_ratio(["我们 走"], ["我们走了"], characters=True) == pytest.approx(3 / 4)
    assert quality.length_ratio(["a"], [""]) == 0.0


def test_metric_registry():
    assert quality.higher_is_better("bleu") and not quality.higher_is_better("latency_p99_ms")
    assert not quality.higher_is_better("stutter_per_1k_words")
    with pytest.raises(UserError, match="known metrics"):
        quality.higher_is_better("blue")


def test_exact_match_and_mode_mixing_against_every_valid_target():
    # Two modes per source, as the synthetic dial makes them: other words, other order.
    valid = [["ka lo mi", "zu pe ra"], ["ti", "bo"], ["ne sa"]]
    hyps = ["ka  lo mi", "ti", "ne"]                  # one of the targets (spacing aside); one; neither
    assert quality.exact_match(hyps, valid) == pytest.approx(2 / 3)
    assert quality.exact_match(["zu pe ra", "bo", "ne sa"], valid) == 1.0
    # Words of both modes in one output mix them; words of one mode in the wrong order do not.
    assert quality.mixes_modes("ka pe mi", valid[0]) and not quality.mixes_modes("mi lo ka", valid[0])
    assert not quality.mixes_modes("ka xx", valid[0]) and not quality.mixes_modes("ne sa ne", valid[2])
    # Words that two targets share belong to neither mode alone.
    assert not quality.mixes_modes("a b", ["a b", "a c"]) and quality.mixes_modes("b c", ["a b", "a c"])
    assert quality.mode_mixing(["ka pe mi", "ti bo", "ne sa"], valid) == pytest.approx(2 / 3)
    with pytest.raises(UserError, match="valid targets for 3 sources"):
        quality.exact_match(["a"], valid)
    assert quality.higher_is_better("exact_match") and not quality.higher_is_better("mode_mixing")
