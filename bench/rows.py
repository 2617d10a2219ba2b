"""The result row: one column list and the figures it carries.

``CORE`` names every column a row of any system has, in order, each with its table label, its cell
format and whether higher is better; a family adds the columns only it fills (``Family.columns``),
and the rows of other families hold None there. Every table (``table.md``, ``leaderboard.md``,
``narbench results --format md``) renders cells with ``Column.cell`` (``bench.columns``). ``figures``
computes every number of a row that follows from per-sentence data, and ``bench.verify.verify_run``
recomputes them from ``samples.jsonl``.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from bench import families
from bench.columns import Column, count, fixed, ms, plain, si, stars, yes_no
from bench.measure.stats import min_samples
from narbench_core import defaults, langs, phases
from narbench_core.errors import UserError

SCHEMA_VERSION = 2   # 2: `family` is the plug-in family (ar, padir ...); `paradigm` is ar | nar
RENAMED = {"steps": "iterations"}   # old column name -> its name now (rows written before the rename load as new)
P99_MIN_N = min_samples(0.99)


# ------------------------------------------------------------------------------------------- cells

def _ci(fmt: Callable[[Any], str], ci: Any) -> str:
    return "(CI: n too small)" if not ci else f"[{fmt(ci[0])}, {fmt(ci[1])}]"


def _p50(row: "Row") -> str:
    return f"{ms(row.latency_p50_ms)} {_ci(ms, row.latency_p50_ci_ms)}"


def _p99(row: "Row") -> str:
    n = row.n_sentences
    return ms(row.latency_p99_ms) if n >= P99_MIN_N else f"n too small ({n} < {P99_MIN_N})"


def _speedup(row: "Row") -> str:
    if row.speedup_p50_vs_ar is None:
        return "–"
    return f"{row.speedup_p50_vs_ar:.2f}x " + _ci(fixed(2), row.speedup_p50_ci)


def _delta(row: "Row") -> str:
    return "–" if row.bleu_delta_vs_ar is None else f"{row.bleu_delta_vs_ar:+.2f}{stars(row.bleu_delta_p_value)}"


PHASE_SHORT = {phases.TOKENIZE: "tok", phases.ENCODE: "enc", phases.HOST_SYNC: "sync", phases.PASSES: "passes",
               phases.DETOKENIZE: "detok"}


def _phases(row: "Row") -> str:
    d = row.phase_p50_ms
    return "–" if not d else " / ".join(f"{PHASE_SHORT[p]} {ms(d[p])}" for p in phases.PHASES if p in d)


def _iterations(row: "Row") -> str:
    return "N" if row.paradigm == "ar" else plain(row.iterations)


def _passes(row: "Row") -> str:
    return f"{fixed(1)(row.passes_mean)} / {fixed(0)(row.passes_p99)}"


def _family(row: "Row") -> str:
    return families.get(row.family).label


def _share(row: "Row") -> str:
    share = row.stutter_sentence_share
    return "–" if share is None else f"{100 * share:.1f}%"


# ------------------------------------------------------------------------------------------- columns

C = Column
IDENTITY = (
    C("schema_version"), C("suite", align="left"), C("task", align="left"),
    C("test_set", "Test set", align="left"), C("system", "System", align="left"),
    C("family", "Family", render=_family, align="left", doc="the plug-in family that made the system"),
    C("paradigm", "Paradigm", align="left", doc="ar or nar: the side of the comparison"),
    C("decoder", align="left", doc="decoder spec: greedy | beam:K | refine:T"),
    C("hypotheses", "# Hyp.", doc="beam size (AR) or length hypotheses (PaDIR)"),
    C("distill", "Distilled", doc="trained on the AR teacher's outputs"),
    C("seed"),
    C("variant", doc="systems that differ only in refinement iterations share it (one line in T plots)"),
    C("batch_size", "Batch"),
)
FIGURES = (
    C("n_sentences", "n"),
    C("bleu", "BLEU", fixed(2), True), C("bleu_signature"),
    C("chrf", "chrF", fixed(1), True), C("chrf_signature"),
    C("bleurt", "BLEURT", fixed(4), True, doc="null without a BLEURT checkpoint"),
    C("bleu_delta_vs_ar", "ΔBLEU vs AR greedy", fixed(2), True, _delta),
    C("bleu_delta_ci"), C("bleu_delta_p_value"),
    C("agreement_with_ar_greedy", "= AR greedy", fixed(3), None, optional=True,
      doc="share of sentences whose hypothesis is identical to AR greedy's (1.0 for AR greedy itself)"),
    C("exact_match", "exact match", fixed(3), True, optional=True,
      doc="share of hypotheses equal to one of their source's valid targets (tasks that know them all)"),
    C("mode_mixing", "mode mixing", fixed(3), False, optional=True,
      doc="share of hypotheses with words of two or more different valid targets (bench.measure.quality)"),
    C("stutter_per_1k_words", "stutter /1k words", fixed(2), False),
    C("stutter_sentence_share", "stutter sentences", fixed(3), False, _share),
    C("length_ratio", "len ratio", fixed(2), doc="hypothesis words / words of the first reference, over the test set",
      optional=True),
    C("latency_p50_ms", "p50 ms", ms, False),
    C("latency_p90_ms", "p90 ms", ms, False),
    C("latency_p99_ms", "p99 ms", ms, False, _p99),
    C("latency_mean_ms", "mean ms", ms, False), C("latency_min_ms", "min ms", ms, False),
    C("latency_max_ms", "max ms", ms, False),
    C("latency_p50_ci_ms"), C("latency_p90_ci_ms"), C("latency_p99_ci_ms"),
    C("solo_p50_ms", "solo p50 ms", ms, False, optional=True,
      doc="p50 of the solo check: the system timed again alone (back to back) on a seeded sample of the batches"),
    C("interference", "in suite / solo", fixed(2), None, optional=True,
      doc="p50 over the solo check's sentences as timed in the interleaved schedule, over solo_p50_ms "
          f"(1.0: the other systems did not slow it; the leaderboard flags values outside "
          f"{defaults.INTERFERENCE_OK[0]:g}-{defaults.INTERFERENCE_OK[1]:g})"),
    C("speedup_p50_vs_ar", "speedup p50 vs AR greedy [95% CI]", fixed(2), True, _speedup),
    C("speedup_p50_ci"), C("speedup_share_faster", "share faster", fixed(2), True),
    C("passes_mean", "passes mean", fixed(1), None), C("passes_p99", "passes p99", fixed(0)),
    C("phase_p50_ms", "phases p50 ms", render=_phases, optional=True,
      doc="phase -> p50 ms over sentences: " + "; ".join(f"{p}: {d}" for p, d in phases.DOCS.items())),
    C("phase_p50_sum_ratio", "phases / p50", fixed(3), optional=True,
      doc="the phases' p50s summed, over latency p50 (each call's phases add up to its time exactly; "
          "the p50s add up within a few percent)"),
    C("host_syncs", "host syncs", fixed(1), optional=True,
      doc="blocking waits on the device per decoder call, mean over sentences (AR: the encoder's end, "
          "timed as its own phase, and the results; PaDIR: the predicted lengths and the results)"),
)
RUN = (
    C("compile_s", "compile s", fixed(1)), C("platform"), C("phase"), C("repeats"), C("target_lang"),
    C("n_references", "refs"),
    C("truncated_sources", "cut sources", count, optional=True,
      doc="test sources longer than the system's maximum source length (its largest shape bucket, EOS "
          "included), cut to it before decoding (None: rows written before narbench counted them, or a "
          "decoder that does not say)"),
    C("baseline_system"), C("baseline_timed_together"),
    C("checkpoint", doc="the checkpoint folder under the data root"), C("decoder_options"),
    C("isolated", doc="timed in a worker process of its own (bench.measure.workers)", optional=True),
    C("turn", doc="batches the system decoded back to back, after one untimed call, each time its turn came "
                  "in the interleaved schedule (absent: 1, no untimed call)", optional=True),
    C("engine_threads", "threads", doc="intra-op threads of the system's engine (XLA's pool or CTranslate2's)",
      optional=True),
    C("worker_peak_rss_mb", "worker MB", fixed(0), doc="peak resident memory of the system's worker process",
      optional=True),
)
COSTS = (
    C("flops_per_sentence"), C("bytes_per_sentence"), C("roofline_p50_ms", "roofline p50 ms", ms),
    C("roofline_share_p50"), C("peak_flops"), C("bandwidth_bytes_s"),
    C("tpu_v4_projection_p50_ms", "TPU v4 projection p50 ms", ms),
)
TRAINING = (                                         # the system's trained model (None: its family trains none)
    C("model", align="left", doc="the trained model (training cell) the system decodes with", optional=True),
    C("train_steps", "train steps", count, doc="optimizer steps (a matched budget's resolved count)", optional=True),
    C("train_tokens", "train tokens", si, doc="target tokens trained on", optional=True),
    C("train_seconds", "train s", fixed(0), doc="seconds in train steps (no compiling, checkpoints, curves)",
      optional=True),
    C("train_flops", "train FLOPs", si, doc="XLA cost analysis of each step's compiled train step, summed",
      optional=True),
    C("warm_start_seconds", "warm-start s", fixed(0),
      doc="train s of the model this one was warm-started from (its budget adds to train s)", optional=True),
    C("distill_seconds", "distill s", fixed(0), doc="seconds the teacher spent making the distilled data",
      optional=True),
    C("dev_length_exact", "len exact", fixed(3), True,
      doc="dev sentences whose top predicted length is exact (models with a length predictor; last curve point)",
      optional=True),
    C("dev_length_within2", "len ±2", fixed(3), True,
      doc="dev sentences whose top predicted length is within 2 tokens (last curve point)", optional=True),
    C("stopped_by", "stopped by", align="left", optional=True,
      doc="what ended the training: plateau (dev BLEU stopped rising), cap (no plateau by its steps), or "
          "steps (a set number of steps; models.schedule)"),
    C("best_dev_bleu", "best dev BLEU", fixed(2), True, optional=True,
      doc="the best dev BLEU of the model's learning curve (its curve decoder, the task's own references)"),
    C("still_improving", "still improving", yes_no,
      doc=f"no when the plateau rule stopped it; else: dev BLEU rose by more than {defaults.CURVE_RISE:g} over "
          f"the last {defaults.CURVE_TAIL:.0%} of the training steps (bench.measure.learning.still_improving)",
      optional=True),
)
ENV = (C("device_kind"), C("cpu_model"), C("threads"), C("jax_version"), C("flax_version"), C("git_commit"),
       C("git_dirty"), C("date_utc"))
CORE = IDENTITY + FIGURES + RUN + TRAINING + COSTS + ENV

# Composite cells the tables show in place of a value column.
VIEWS = {c.name: c for c in (
    C("iterations_view", "T", render=_iterations, doc="refinement iterations; 'N' = autoregressive (one pass a token)"),
    C("p50_view", "p50 ms [95% CI]", render=_p50),
    C("passes_view", "passes mean / p99", render=_passes),
    *(C(f"phase_{p}_view", f"{p} p50 ms", render=lambda row, p=p: ms((row.phase_p50_ms or {}).get(p)),
        doc=phases.DOCS[p]) for p in phases.PHASES),
)}


def columns() -> tuple[Column, ...]:
    """Every column of a row: the core ones, then each registered family's."""
    extra = {c.name: c for f in families.all_families() for c in f.columns}
    core = {c.name for c in CORE}
    return IDENTITY + tuple(c for n, c in extra.items() if n not in core) + FIGURES + RUN + TRAINING + COSTS + ENV


def column(name: str) -> Column:
    if name in VIEWS:
        return VIEWS[name]
    for c in columns():
        if c.name == name:
            return c
    raise KeyError(f"no column {name!r}")


# ---------------------------------------------------------------------------------------------- row

class Row(Mapping[str, Any]):
    """One result row (a system on a test set): every column present, read as ``row.bleu``."""

    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, Any]):
        names = [c.name for c in columns()]
        missing = [n for n in names if n not in values]
        unknown = sorted(set(values) - set(names))
        if missing or unknown:
            raise ValueError(f"a row needs exactly the declared columns: missing {missing}, unknown {unknown}")
        object.__setattr__(self, "_values", {n: values[n] for n in names})

    @classmethod
    def load(cls, record: Mapping[str, Any], where: str = "rows.jsonl") -> "Row":
        """A row read back: its schema must be this one; columns of a family or ``added`` columns it
        predates are None."""
        if record.get("schema_version") != SCHEMA_VERSION:
            raise UserError(f"{where}: row schema {record.get('schema_version')} is not {SCHEMA_VERSION} (written by "
                            "another narbench version); re-run the suite with `narbench run --force`")
        record = {RENAMED.get(k, k): v for k, v in record.items()}
        core = {c.name for c in CORE}
        missing = sorted(core - set(record) - {c.name for c in CORE if c.optional})
        if missing:
            raise UserError(f"{where}: a row lacks columns {missing}; re-run the suite with `narbench run --force`")
        values = {c.name: record.get(c.name) for c in columns()}    # a family's absent columns are None
        row = cls.__new__(cls)
        object.__setattr__(row, "_values", {**values, **record})
        return row

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name, value):
        raise AttributeError("rows are immutable")

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Row({self._values['system']!r}, {self._values['test_set']!r})"

    @property
    def key(self) -> tuple[str, str]:
        return self.system, self.test_set


# ------------------------------------------------------------------------------------------ figures

def compute_figures(hypotheses: Sequence[str], references: Sequence[Sequence[str]], latencies_ms: Sequence[float],
                    passes: Sequence[int], target_lang: str, baseline_latencies_ms: Sequence[float] | None = None,
                    baseline_hypotheses: Sequence[str] | None = None, bootstrap_resamples: int = 1000,
                    seed: int = 0, score: bool = True, phase_ms: Sequence[Mapping[str, float]] | None = None,
                    host_syncs: Sequence[int] | None = None,
                    solo_ms: Sequence[float | None] | None = None,
                    valid_targets: Sequence[Sequence[str]] | None = None) -> dict[str, Any]:
    """Every column of a row that follows from per-sentence data (``verify_run`` recomputes these);
    without ``score`` (timing only) the quality columns are None; without ``phase_ms`` (runs that
    predate phases) the phase columns are; without ``solo_ms`` (the solo check's latencies, None for
    sentences outside its sample) the solo columns are; without ``valid_targets`` (every correct output
    of each source, for tasks that know them) exact match and mode mixing are."""
    from bench.measure import quality, stats

    lat = stats.summarize(latencies_ms)
    p = np.asarray(passes, dtype=np.float64)  # [n_sentences]
    ci = lambda c: None if c is None else [c[0], c[1]]  # noqa: E731
    out: dict[str, Any] = {
        "n_sentences": lat.n,
        "latency_p50_ms": lat.p50, "latency_p90_ms": lat.p90, "latency_p99_ms": lat.p99,
        "latency_mean_ms": lat.mean, "latency_min_ms": lat.min, "latency_max_ms": lat.max,
        "latency_p50_ci_ms": ci(lat.p50_ci), "latency_p90_ci_ms": ci(lat.p90_ci),
        "latency_p99_ci_ms": ci(lat.p99_ci),
        "passes_mean": float(p.mean()), "passes_p99": float(np.percentile(p, 99)),
        "speedup_p50_vs_ar": None, "speedup_p50_ci": None, "speedup_share_faster": None,
        "bleu": None, "bleu_signature": None, "chrf": None, "chrf_signature": None,
        "stutter_per_1k_words": None, "stutter_sentence_share": None, "length_ratio": None,
        "bleu_delta_vs_ar": None, "bleu_delta_ci": None, "bleu_delta_p_value": None,
        "agreement_with_ar_greedy": None, "exact_match": None, "mode_mixing": None,
        **phase_figures(phase_ms, host_syncs, lat.p50),
        **solo_figures(latencies_ms, solo_ms),
    }
    if baseline_latencies_ms is not None:
        sp = stats.paired_speedup(baseline_latencies_ms, latencies_ms)
        out.update(speedup_p50_vs_ar=sp.median, speedup_p50_ci=ci(sp.ci), speedup_share_faster=sp.share_faster)
    if not score:
        return out
    q = quality.score_corpus(hypotheses, references, target_lang)
    out.update(bleu=q.bleu, bleu_signature=q.bleu_signature, chrf=q.chrf, chrf_signature=q.chrf_signature,
               stutter_per_1k_words=q.stutter_per_1k_words, stutter_sentence_share=q.stutter_sentence_share,
               length_ratio=q.length_ratio)
    if valid_targets is not None:
        out.update(exact_match=quality.exact_match(hypotheses, valid_targets),
                   mode_mixing=quality.mode_mixing(hypotheses, valid_targets))
    if baseline_hypotheses is not None:
        same = [a == b for a, b in zip(hypotheses, baseline_hypotheses)]
        out["agreement_with_ar_greedy"] = float(np.mean(same)) if same else None
        if list(baseline_hypotheses) == list(hypotheses):
            out.update(bleu_delta_vs_ar=0.0, bleu_delta_ci=[0.0, 0.0], bleu_delta_p_value=1.0)
        else:
            tok = langs.bleu_tokenizer(target_lang)
            boot = quality.paired_bootstrap_bleu(hypotheses, baseline_hypotheses, references, tok,
                                                 n_resamples=bootstrap_resamples, seed=seed)
            out.update(bleu_delta_vs_ar=boot.delta, bleu_delta_ci=list(boot.ci), bleu_delta_p_value=boot.p_value)
    return out


def phase_figures(phase_ms: Sequence[Mapping[str, float]] | None, host_syncs: Sequence[int] | None,
                  p50_ms: float) -> dict[str, Any]:
    """``phase_p50_ms`` (phase -> p50 over sentences, a phase absent in a call counting 0 there),
    ``phase_p50_sum_ratio`` and the mean ``host_syncs``."""
    out = {"phase_p50_ms": None, "phase_p50_sum_ratio": None, "host_syncs": None}
    if phase_ms:
        seen = [p for p in phases.PHASES if any(p in d for d in phase_ms)]
        p50 = {p: float(np.percentile([d.get(p, 0.0) for d in phase_ms], 50)) for p in seen}
        out.update(phase_p50_ms=p50, phase_p50_sum_ratio=sum(p50.values()) / p50_ms if p50_ms > 0 else None)
    if host_syncs is not None and len(host_syncs):
        out["host_syncs"] = float(np.mean(host_syncs))
    return out


def solo_figures(latencies_ms: Sequence[float], solo_ms: Sequence[float | None] | None) -> dict[str, Any]:
    """``solo_p50_ms`` and ``interference``: the in-suite p50 over the solo check's sentences / their solo p50."""
    picked = [(lat, solo) for lat, solo in zip(latencies_ms, solo_ms or ()) if solo is not None]
    if not picked:
        return {"solo_p50_ms": None, "interference": None}
    suite, solo = (np.asarray(x, np.float64) for x in zip(*picked))
    solo_p50 = float(np.percentile(solo, 50))
    return {"solo_p50_ms": solo_p50, "interference": float(np.percentile(suite, 50)) / solo_p50}


FIGURE_FIELDS = tuple(compute_figures(["a"], [["a"]], [1.0], [1], "en", score=False))   # what compute_figures() returns


# ------------------------------------------------------------------------------------------- verify
