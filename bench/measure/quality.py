"""Quality metrics: SacreBLEU BLEU and chrF (with signatures), stutter, sacrebleu's paired tests vs a baseline.

- Tokenizer: by target language (``narbench_core.langs.bleu_tokenizer``: ``zh``, ``ja-mecab``, else ``13a``).
- References are a list of streams (``refs[k][i]`` = k-th reference of sentence i), as in sacrebleu.
- Stutter (docs/methodology.md): for hypothesis h and reference r, ``sum_w max(0, c_h(w,w) - c_r(w,w))`` where
  ``c_x(w,w)`` counts adjacent identical word pairs; words are whitespace tokens, and for Chinese
  targets single non-space characters (Chinese is written without spaces). With several reference
  streams, r is the first one (the task's own target).
- Valid targets (tasks that know every correct output of a source, e.g. the synthetic dial): exact
  match is the share of hypotheses equal (up to whitespace) to one of their source's valid targets;
  mode mixing is the share of hypotheses with words that belong to two or more different valid targets
  only (a word of target A found in no other target, and one of target B): parallel decoding's failure
  on multimodal outputs, measured directly. Sentences with one valid target cannot mix modes.
- Paired tests against a baseline are sacrebleu's own (``sacrebleu.significance.PairedTest``, the
  tests of ``sacrebleu --paired-ar`` and ``--paired-bs``): approximate randomization (its default
  test, ``defaults.AR_TRIALS`` trials) and paired bootstrap resampling (Koehn 2004, as Moses'
  script; also the system's mean BLEU over the resamples and its 95% CI), seeded with
  ``defaults.SIGNIFICANCE_SEED``, each with sacrebleu's signature (the BLEU signature plus the trials
  and the seed). Hypotheses identical to the baseline's get p = 1.0 without a test: sacrebleu counts
  only strictly larger differences, so it gives identical systems 1 / (trials + 1) (multeval#5).
"""
from __future__ import annotations

import os
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.significance import PairedTest

from narbench_core import defaults, langs
from narbench_core.errors import UserError

# Metric registry: name -> higher is better. Reports use it to sort and to mark the best value.
METRICS: dict[str, bool] = {
    "bleu": True,
    "chrf": True,
    "bleurt": True,
    "exact_match": True,
    "mode_mixing": False,
    "bleu_delta_vs_ar": True,
    "stutter_per_1k_words": False,
    "stutter_sentence_share": False,
    "latency_p50_ms": False,
    "latency_p90_ms": False,
    "latency_p99_ms": False,
    "latency_mean_ms": False,
    "speedup_p50_vs_ar": True,
    "passes_mean": False,
    "compile_s": False,
}


def higher_is_better(metric: str) -> bool:
    """Whether larger values of ``metric`` are better; unknown names list the known ones."""
    if metric not in METRICS:
        raise UserError(f"unknown metric {metric!r}; known metrics: {', '.join(sorted(METRICS))}")
    return METRICS[metric]


def _check_streams(hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> list[list[str]]:
    if not references or isinstance(references[0], str):
        raise ValueError("references must be a list of reference streams (list of lists of strings)")
    streams = [list(r) for r in references]
    for k, stream in enumerate(streams):
        if len(stream) != len(hypotheses):
            raise UserError(f"reference stream {k} has {len(stream)} lines but there are {len(hypotheses)} "
                            "hypotheses; give aligned files with one sentence per line")
    return streams


@dataclass(frozen=True)
class CorpusScore:
    score: float
    signature: str


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[Sequence[str]], tokenize: str = "13a") -> CorpusScore:
    """SacreBLEU corpus BLEU (default smoothing ``exp``) and its signature."""
    streams = _check_streams(hypotheses, references)
    metric = BLEU(tokenize=tokenize)
    score = metric.corpus_score(list(hypotheses), streams)
    return CorpusScore(float(score.score), str(metric.get_signature()))


def corpus_chrf(hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> CorpusScore:
    """SacreBLEU corpus chrF (char order 6, beta 2) and its signature."""
    streams = _check_streams(hypotheses, references)
    metric = CHRF()
    score = metric.corpus_score(list(hypotheses), streams)
    return CorpusScore(float(score.score), str(metric.get_signature()))


# ----------------------------------------------------------------------------------------- stutter

def words(text: str, characters: bool = False) -> list[str]:
    """Whitespace tokens, or non-space characters (Chinese, Japanese: ``langs.counts_characters``)."""
    if characters:
        return [ch for ch in text if not ch.isspace()]
    return text.split()


def _repeat_counts(tokens: list[str]) -> Counter:
    return Counter(a for a, b in zip(tokens, tokens[1:]) if a == b)


def stutter_count(hypothesis: str, reference: str, characters: bool = False) -> int:
    """``sum_w max(0, c_h(w,w) - c_r(w,w))`` for one sentence."""
    c_h = _repeat_counts(words(hypothesis, characters))
    c_r = _repeat_counts(words(reference, characters))
    return sum(max(0, count - c_r.get(w, 0)) for w, count in c_h.items())


@dataclass(frozen=True)
class StutterScore:
    per_1k_words: float      # excess repeats per 1,000 hypothesis words
    sentence_share: float    # fraction of sentences with stutter > 0
    total: int               # excess repeats summed over sentences
    hypothesis_words: int


def stutter(hypotheses: Sequence[str], references: Sequence[str], characters: bool = False) -> StutterScore:
    """Corpus stutter against one reference stream (see module docstring)."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses vs {len(references)} references")
    counts = [stutter_count(h, r, characters) for h, r in zip(hypotheses, references)]
    n_words = sum(len(words(h, characters)) for h in hypotheses)
    total = int(sum(counts))
    return StutterScore(
        per_1k_words=1000.0 * total / n_words if n_words else 0.0,
        sentence_share=float(np.mean([c > 0 for c in counts])) if counts else 0.0,
        total=total, hypothesis_words=n_words)


# ----------------------------------------------------------------------------------- paired tests

@dataclass(frozen=True)
class PairedTests:
    """sacrebleu's paired tests of a system's BLEU against a baseline's on the same sentences."""
    p_ar: float                  # approximate randomization (sacrebleu's default test), two-sided
    p_bs: float                  # paired bootstrap resampling
    bs_mean: float               # the system's BLEU: its mean over the bootstrap resamples ...
    bs_ci: float                 # ... and half the width of their 95% interval (sacrebleu's "mean ± CI")
    ar_signature: str            # sacrebleu's signature of each test: BLEU's, with the trials and the seed
    bs_signature: str


@contextmanager
def _sacrebleu_seed(seed: int) -> Iterator[None]:
    """sacrebleu's paired tests read their seed from ``SACREBLEU_SEED`` when they are built."""
    before = os.environ.get("SACREBLEU_SEED")
    os.environ["SACREBLEU_SEED"] = str(seed)
    try:
        yield
    finally:
        if before is None:
            del os.environ["SACREBLEU_SEED"]
        else:
            os.environ["SACREBLEU_SEED"] = before


def paired_tests(system: Sequence[str], baseline: Sequence[str], references: Sequence[Sequence[str]],
                 tokenize: str = "13a", ar_trials: int | None = None, bs_resamples: int = 1000,
                 seed: int = defaults.SIGNIFICANCE_SEED) -> PairedTests:
    """Both of sacrebleu's paired tests of ``system`` against ``baseline`` (seeded: deterministic), as
    ``sacrebleu REFS -i BASELINE SYSTEM --tokenize TOKENIZE --paired-ar --paired-ar-n AR_TRIALS`` and
    ``--paired-bs --paired-bs-n BS_RESAMPLES`` compute them with ``SACREBLEU_SEED=seed``
    (``ar_trials`` None: ``defaults.AR_TRIALS``)."""
    if len(system) != len(baseline):
        raise ValueError(f"{len(system)} system vs {len(baseline)} baseline hypotheses")
    if len(system) == 0:
        raise ValueError("empty test set")
    if seed < 1:
        raise ValueError(f"seed {seed}: sacrebleu does not seed its tests with 0; give a positive seed")
    streams = _check_streams(system, references)
    same = list(system) == list(baseline)
    named = [("baseline", list(baseline))] + ([] if same else [("system", list(system))])
    bleu = BLEU(tokenize=tokenize, references=streams)      # the references tokenized once, as the CLI does
    results = {}
    for test, n in (("ar", defaults.AR_TRIALS if ar_trials is None else ar_trials), ("bs", bs_resamples)):
        with _sacrebleu_seed(seed):
            paired = PairedTest(named, {"BLEU": bleu}, None, test_type=test, n_samples=n)
        signatures, scores = paired()
        ((metric, signature),) = signatures.items()
        results[test] = scores[metric][-1], signature.format()      # the system's result (the baseline's if same)
    (ar, ar_signature), (bs, bs_signature) = results["ar"], results["bs"]
    return PairedTests(p_ar=1.0 if same else float(ar.p_value), p_bs=1.0 if same else float(bs.p_value),
                       bs_mean=float(bs.mean), bs_ci=float(bs.ci), ar_signature=ar_signature,
                       bs_signature=bs_signature)


def ar_trials_of(ar_signature: str | None) -> int | None:
    """The trials an approximate-randomization test ran, from its signature (``...|ar:10000|...``); None when
    the signature names none."""
    for part in (ar_signature or "").split("|"):
        name, _, value = part.partition(":")
        if name == "ar" and value.isdigit():
            return int(value)
    return None


# ---------------------------------------------------------------------------------- one-stop score

@dataclass(frozen=True)
class QualityScores:
    bleu: float
    bleu_signature: str
    chrf: float
    chrf_signature: str
    stutter_per_1k_words: float
    stutter_sentence_share: float
    length_ratio: float


def _normal(text: str) -> str:
    return " ".join(text.split())


def exact_match(hypotheses: Sequence[str], valid_targets: Sequence[Sequence[str]]) -> float:
    """Share of hypotheses equal to one of their source's valid targets (``valid_targets[i]``)."""
    if len(hypotheses) != len(valid_targets):
        raise UserError(f"{len(hypotheses)} hypotheses but valid targets for {len(valid_targets)} sources")
    if not hypotheses:
        return 0.0
    hits = sum(_normal(h) in {_normal(v) for v in valid} for h, valid in zip(hypotheses, valid_targets))
    return hits / len(hypotheses)


def mixes_modes(hypothesis: str, valid: Sequence[str]) -> bool:
    """Does the hypothesis hold words of two or more valid targets that no other valid target has?"""
    vocab = [set(words(v)) for v in valid]
    own = [w - set().union(*(o for j, o in enumerate(vocab) if j != i)) for i, w in enumerate(vocab)]
    found = set(words(hypothesis))
    return sum(bool(found & mine) for mine in own) >= 2


def mode_mixing(hypotheses: Sequence[str], valid_targets: Sequence[Sequence[str]]) -> float:
    """Share of hypotheses that mix modes (``mixes_modes``)."""
    if len(hypotheses) != len(valid_targets):
        raise UserError(f"{len(hypotheses)} hypotheses but valid targets for {len(valid_targets)} sources")
    if not hypotheses:
        return 0.0
    return sum(mixes_modes(h, valid) for h, valid in zip(hypotheses, valid_targets)) / len(hypotheses)


def length_ratio(hypotheses: Sequence[str], references: Sequence[str], characters: bool = False) -> float:
    """Hypothesis words / reference words over the corpus (words as for stutter); 0.0 for empty references."""
    ref_words = sum(len(words(r, characters)) for r in references)
    return sum(len(words(h, characters)) for h in hypotheses) / ref_words if ref_words else 0.0


def score_corpus(hypotheses: Sequence[str], references: Sequence[Sequence[str]], target_lang: str) -> QualityScores:
    """BLEU, chrF, stutter and length ratio of one system on one test set (stutter and length ratio
    against the first reference)."""
    tok = langs.bleu_tokenizer(target_lang)
    bleu = corpus_bleu(hypotheses, references, tok)
    chrf = corpus_chrf(hypotheses, references)
    characters = langs.counts_characters(target_lang)
    st = stutter(hypotheses, list(references[0]), characters=characters)
    return QualityScores(bleu.score, bleu.signature, chrf.score, chrf.signature,
                         st.per_1k_words, st.sentence_share, length_ratio(hypotheses, references[0], characters))
