"""bench.measure.quality: BLEU/chrF equal to the sacrebleu CLI, stutter on hand cases, bootstrap, metric registry."""
from __future__ import annotations

import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.measure import quality
from narbench_core import langs
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


def test_sentence_stats_sum_to_corpus_bleu():
    refs, refs2, good, _ = _corpus(3)
    for streams in ([refs], [refs, refs2]):
        stats = quality.sentence_stats(good, streams)
        assert stats.shape == (len(good), 10)
        assert quality.bleu_from_stats(stats.sum(0)) == pytest.approx(quality.corpus_bleu(good, streams).score)


def test_paired_bootstrap_is_deterministic_and_sensible():
    refs, _, good, bad = _corpus(4, n=80)
    r1 = quality.paired_bootstrap_bleu(good, bad, [refs], n_resamples=300, seed=7)
    r2 = quality.paired_bootstrap_bleu(good, bad, [refs], n_resamples=300, seed=7)
    r3 = quality.paired_bootstrap_bleu(good, bad, [refs], n_resamples=300, seed=8)
    assert r1 == r2 and r1.ci != r3.ci
    expected = quality.corpus_bleu(good, [refs]).score - quality.corpus_bleu(bad, [refs]).score
    assert r1.delta == pytest.approx(expected) and r1.delta > 0
    assert r1.ci[0] <= r1.delta <= r1.ci[1] and r1.ci[0] > 0
    assert r1.p_value < 0.01
    same = quality.paired_bootstrap_bleu(good, good, [refs], n_resamples=200, seed=0)
    assert same.delta == 0.0 and same.ci == (0.0, 0.0) and same.p_value == 1.0


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
