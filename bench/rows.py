"""The result row: one column list and the figures it carries.

``CORE`` names every column a row of any system has, in order, each with its table label, its cell
format and whether higher is better; a family adds the columns only it fills (``Family.columns``),
and the rows of other families hold None there. Every table (``table.md``, ``leaderboard.md``,
``narbench results --format md``) renders cells with ``Column.cell`` (``bench.columns``). ``figures``
computes every number of a row that follows from per-sentence data, and ``bench.verify.verify_run``
recomputes them from ``samples.jsonl``.
"""
from __future__ import annotations

import itertools
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from bench import families
from bench.columns import Column, count, fixed, ms, plain, si, stars, yes_no
from bench.measure.stats import min_samples
from narbench_core import defaults, langs, markdown, phases
from narbench_core.errors import UserError

SCHEMA_VERSION = 2   # 2: `family` is the plug-in family (ar, padir ...); `paradigm` is ar | nar
RENAMED = {"steps": "iterations"}   # old column name -> its name now (rows written before the rename load as new)
RETIRED = {                         # columns narbench no longer writes: rows that carry them load without them
    "bleu_delta_ci": "narbench's own paired bootstrap; now bleu_bs_mean / bleu_bs_ci, sacrebleu's",
    "bleu_delta_p_value": "narbench's own paired bootstrap; now bleu_p_ar and bleu_p_bs, sacrebleu's tests",
}
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
    return "–" if row.bleu_delta_vs_ar is None else f"{row.bleu_delta_vs_ar:+.2f}{stars(row.bleu_p_ar)}"


def _bootstrap(row: "Row") -> str:
    """BLEU as ``sacrebleu --paired-bs`` prints it: the score (bootstrap mean ± half the 95% CI)."""
    if row.bleu is None:
        return "–"
    return fixed(2)(row.bleu) + ("" if row.bleu_bs_mean is None else f" ({row.bleu_bs_mean:.2f} ± {row.bleu_bs_ci:.2f})")


PHASE_SHORT = {phases.TOKENIZE: "tok", phases.ENCODE: "enc", phases.HOST_SYNC: "sync", phases.HOST: "host",
               phases.PASSES: "passes", phases.DETOKENIZE: "detok"}


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
    C("schema_version", doc="the row schema (bench.rows.SCHEMA_VERSION); a row of another schema is refused"),
    C("suite", align="left", doc="the suite's name (its spec: spec.toml in the run folder)"),
    C("task", align="left", doc="the task the system's models were trained on"),
    C("test_set", "Test set", align="left", doc="TASK:SPLIT, with +refs when extra references are scored too"),
    C("system", "System", align="left", doc="the system's id, unique in a run (family, decoder and axes)"),
    C("family", "Family", render=_family, align="left", doc="the plug-in family that made the system"),
    C("paradigm", "Paradigm", align="left", doc="ar or nar: the side of the comparison"),
    C("decoder", align="left", doc="decoder spec: greedy | beam:K | refine:T"),
    C("hypotheses", "# Hyp.", doc="beam size (AR) or length hypotheses (PaDIR)"),
    C("distill", "Distilled", doc="trained on the AR teacher's outputs"),
    C("seed", doc="the training seed of the system's models"),
    C("size", "Size", align="left", optional=True,
      doc="the model preset of the system's models on a suite's size axis (several presets); None with one preset"),
    C("variant", doc="systems that differ only in refinement iterations share it (one line in T plots)"),
    C("reproduces", align="left", optional=True,
      doc="the system of the run whose outputs this one should reproduce (PaDIR on ONNX Runtime: the same "
          "model and decoding in JAX)"),
    C("batch_size", "Batch", doc="sentences per decoder call while timing"),
)
FIGURES = (
    C("n_sentences", "n", doc="test sentences timed and scored"),
    C("bleu", "BLEU", fixed(2), True, doc="SacreBLEU corpus BLEU against every reference of the test set"),
    C("bleu_signature", doc="SacreBLEU's signature of the BLEU score (references, tokenizer, version)"),
    C("chrf", "chrF", fixed(1), True, doc="SacreBLEU corpus chrF"),
    C("chrf_signature", doc="SacreBLEU's signature of the chrF score"),
    C("bleurt", "BLEURT", fixed(4), True, doc="null without a BLEURT checkpoint"),
    C("bleu_delta_vs_ar", "ΔBLEU vs AR greedy", fixed(2), True, _delta,
      doc="BLEU minus the baseline's (AR greedy) on the same sentences; the table cell's stars: bleu_p_ar"),
    C("bleu_p_ar", "p (AR)", fixed(4), optional=True,
      doc="p-value of sacrebleu's paired approximate randomization test (its default) of BLEU against the "
          "baseline (`sacrebleu --paired-ar`; trials and seed in bleu_ar_signature); 1.0 for hypotheses identical "
          "to the baseline's"),
    C("bleu_p_bs", "p (bootstrap)", fixed(4), optional=True,
      doc="p-value of sacrebleu's paired bootstrap resampling test of BLEU against the baseline (`sacrebleu "
          "--paired-bs`; resamples and seed in bleu_bs_signature); 1.0 for hypotheses identical to the baseline's"),
    C("bleu_bs_mean", "BLEU bootstrap mean", fixed(2), optional=True,
      doc="mean BLEU over the paired bootstrap's resamples (sacrebleu)"),
    C("bleu_bs_ci", "± 95% CI", fixed(2), optional=True,
      doc="half the width of the 95% interval of BLEU over the paired bootstrap's resamples (sacrebleu's "
          "'mean ± CI')"),
    C("bleu_ar_signature", optional=True, doc="sacrebleu's signature of the approximate randomization test"),
    C("bleu_bs_signature", optional=True, doc="sacrebleu's signature of the paired bootstrap test"),
    C("agreement_with_ar_greedy", "= AR greedy", fixed(3), None, optional=True,
      doc="share of sentences whose hypothesis is identical to AR greedy's (1.0 for AR greedy itself)"),
    C("reproduced_agreement", "= reproduced", fixed(3), None, optional=True,
      doc="share of sentences whose hypothesis is identical to that of the system it reproduces "
          "(`reproduces`: the same model and decoder in another runtime)"),
    C("exact_match", "exact match", fixed(3), True, optional=True,
      doc="share of hypotheses equal to one of their source's valid targets (tasks that know them all)"),
    C("mode_mixing", "mode mixing", fixed(3), False, optional=True,
      doc="share of hypotheses with words of two or more different valid targets (bench.measure.quality)"),
    C("stutter_per_1k_words", "stutter /1k words", fixed(2), False,
      doc="adjacent repeated words beyond those in the first reference, per 1,000 hypothesis words (characters "
          "for Chinese and Japanese)"),
    C("stutter_sentence_share", "stutter sentences", fixed(3), False, _share,
      doc="share of sentences with any such repeat"),
    C("length_ratio", "len ratio", fixed(2), doc="hypothesis words / words of the first reference, over the test set",
      optional=True),
    C("latency_p50_ms", "p50 ms", ms, False,
      doc="median per-sentence latency (every sentence of a batch gets the batch's time), in the timing phase"),
    C("latency_p90_ms", "p90 ms", ms, False, doc="90th percentile latency"),
    C("latency_p99_ms", "p99 ms", ms, False, _p99,
      doc=f"99th percentile latency (tables say 'n too small' below {P99_MIN_N} sentences)"),
    C("latency_mean_ms", "mean ms", ms, False, doc="mean latency"),
    C("latency_min_ms", "min ms", ms, False, doc="fastest sentence"),
    C("latency_max_ms", "max ms", ms, False, doc="slowest sentence"),
    C("latency_p50_ci_ms", doc="[low, high]: 95% order-statistics interval of the p50 (null with too few sentences)"),
    C("latency_p90_ci_ms", doc="the same for the p90"),
    C("latency_p99_ci_ms", doc="the same for the p99"),
    C("solo_p50_ms", "solo p50 ms", ms, False, optional=True,
      doc="p50 of the solo check: the system timed again alone (back to back) on a seeded sample of the batches"),
    C("interference", "in suite / solo", fixed(2), None, optional=True,
      doc="p50 over the solo check's sentences as timed in the interleaved schedule, over solo_p50_ms "
          f"(1.0: the other systems did not slow it; the leaderboard flags values outside "
          f"{defaults.INTERFERENCE_OK[0]:g}-{defaults.INTERFERENCE_OK[1]:g})"),
    C("speedup_p50_vs_ar", "speedup p50 vs AR greedy [95% CI]", fixed(2), True, _speedup,
      doc="median over sentences of AR greedy's latency / this system's, paired per sentence in one run"),
    C("speedup_p50_ci", doc="[low, high]: 95% order-statistics interval of that median"),
    C("speedup_share_faster", "share faster", fixed(2), True,
      doc="share of sentences this system decoded faster than AR greedy"),
    C("passes_mean", "passes mean", fixed(1), None,
      doc="decoder passes per sentence, mean (AR: one per generated token; PaDIR: refinement passes)"),
    C("passes_p99", "passes p99", fixed(0), doc="decoder passes per sentence, 99th percentile"),
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
    C("compile_s", "compile s", fixed(1), doc="seconds of the warm-up (every shape bucket once: compiling)"),
    C("platform", doc="the JAX platform timed on (cpu, gpu, tpu)"),
    C("phase", doc="what the clock covers: end_to_end (tokenize to detokenize) or device"),
    C("repeats", doc="times each sentence was timed (its latency: the median)"),
    C("target_lang", doc="target language (picks the BLEU tokenizer and how stutter and lengths count)"),
    C("n_references", "refs", doc="reference streams scored against"),
    C("truncated_sources", "cut sources", count, optional=True,
      doc="test sources longer than the system's maximum source length (its largest shape bucket, EOS "
          "included), cut to it before decoding (None: rows written before narbench counted them, or a "
          "decoder that does not say)"),
    C("baseline_system", doc="the system speedups and BLEU differences are against (AR greedy)"),
    C("baseline_timed_together", doc="the baseline was timed in the same schedule (the speedups are paired)"),
    C("checkpoint", doc="the checkpoint folder under the data root"),
    C("decoder_options", doc="the options the system's decoder was built with (shape buckets, threads ...)"),
    C("isolated", doc="timed in a worker process apart from the driver (bench.measure.workers)", optional=True),
    C("turn", doc="batches the system decoded back to back, after one untimed call, each time its turn came "
                  "in the interleaved schedule (absent: 1, no untimed call)", optional=True),
    C("engine_threads", "threads", doc="intra-op threads of the system's engine (XLA's pool or CTranslate2's)",
      optional=True),
    C("worker_peak_rss_mb", "worker MB", fixed(0), doc="peak resident memory of the system's worker process",
      optional=True),
    C("worker_systems", "systems in worker", count, optional=True,
      doc="systems timed in the system's worker process: 1, or its family's systems where the family shares one "
          "(None: rows written before workers were shared, each in a process of its own)"),
    C("others_cpu_share", "others' CPU", fixed(2), optional=True,
      doc="the share of the machine's CPU capacity that processes not of this run took while its split was "
          "timed (/proc/stat and the run's processes' own times; env.json's machine_load has it before and "
          "during). None: rows written before narbench recorded it, or not Linux"),
    C("steal_share", "steal", fixed(2), optional=True,
      doc="the share of the machine's CPU time the hypervisor gave to other virtual machines meanwhile"),
)
COSTS = (                                            # XLA systems only (None for CTranslate2)
    C("flops_per_sentence", doc="XLA's cost analysis: encoder + passes x one decoder pass, mean per sentence"),
    C("bytes_per_sentence", doc="bytes accessed by the same programs, mean per sentence"),
    C("roofline_p50_ms", "roofline p50 ms", ms,
      doc="median of the roofline bound max(flops / peak_flops, bytes / bandwidth): no run can be faster"),
    C("roofline_share_p50", doc="median over sentences of the roofline bound / the measured latency"),
    C("peak_flops", doc="the machine's measured fp32 matmul peak, flop/s (bench.costs.machine)"),
    C("bandwidth_bytes_s", doc="the machine's measured memory bandwidth, bytes/s"),
    C("tpu_v4_projection_p50_ms", "TPU v4 projection p50 ms", ms,
      doc="the roofline bound at a TPU v4's published peaks: a projection, not a measurement"),
)
TRAINING = (                                         # the system's trained model (None: its family trains none)
    C("model", align="left", doc="the trained model (training cell) the system decodes with", optional=True),
    C("model_params", "params", si, doc="the trained model's parameter count (its checkpoint's record)",
      optional=True),
    C("train_steps", "train steps", count, doc="optimizer steps (a matched budget's resolved count)", optional=True),
    C("train_tokens", "train tokens", si, doc="target tokens trained on", optional=True),
    C("train_seconds", "train s", fixed(0), doc="seconds in train steps (no compiling, checkpoints, curves, nor time stopped by SIGSTOP)",
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
      doc="what ended the training: plateau (its dev signal stopped improving), cap (no plateau by its steps), or "
          "steps (a set number of steps; models.schedule)"),
    C("decay_start", "decay from step", count, optional=True,
      doc="the step the learning-rate decay began at: where the plateau rule fired (null: no decay began, as "
          "with a cosine schedule; models.schedule)"),
    C("plateau_dev_bleu", "dev BLEU at plateau", fixed(2), True, optional=True,
      doc="the best dev BLEU before the decay began (best_dev_bleu minus it: what the decay added)"),
    C("best_dev_bleu", "best dev BLEU", fixed(2), True, optional=True,
      doc="the best dev BLEU of the model's learning curve (its curve decoder, the task's own references)"),
    C("dev_bleu_swing", "dev BLEU swing", fixed(2), None, optional=True,
      doc="how much dev BLEU swings between evaluations at the peak learning rate: the standard deviation of the "
          "successive differences of the curve points from half the peak-rate steps on "
          "(bench.measure.learning.dev_swing; null under 3 such points)"),
    C("best_dev_nll", "best dev NLL", fixed(3), False, optional=True,
      doc="where the plateau rule reads dev NLL (signal = dev_nll): its best, the mean of its last `smooth` points "
          "(nats per target token; a distilled model's against its teacher's dev outputs)"),
    C("dev_nll_swing", "dev NLL swing", fixed(3), None, optional=True,
      doc="how much dev NLL swings between evaluations at the peak learning rate, as dev_bleu_swing "
          "(bench.measure.learning.dev_swing; null under 3 such points)"),
    C("still_improving", "still improving", yes_no,
      doc=f"no when the plateau rule stopped it; else: dev BLEU rose by more than {defaults.CURVE_RISE:g} over "
          f"the last {defaults.CURVE_TAIL:.0%} of the training steps (bench.measure.learning.still_improving)",
      optional=True),
)
ENV = (C("device_kind", doc="the JAX device kind"),
       C("device_driver", optional=True, doc="an accelerator's driver: the NVIDIA driver's version and the runtime "
         "JAX's backend reports (env.json's device has its SMs, compute capability and memory); empty on a CPU"),
       C("cpu_model", doc="the CPU's name (env.json has its details)"),
       C("threads", doc="CPU threads the process could use"), C("jax_version", doc="jax's version"),
       C("flax_version", doc="flax's version (env.json has every library's)"),
       C("git_commit", doc="the narbench commit that made the row"),
       C("git_dirty", doc="the working tree had uncommitted changes"),
       C("date_utc", doc="UTC time the run recorded its environment"))
CORE = IDENTITY + FIGURES + RUN + TRAINING + COSTS + ENV

# Composite cells the tables show in place of a value column.
VIEWS = {c.name: c for c in (
    C("iterations_view", "T", render=_iterations, doc="refinement iterations; 'N' = autoregressive (one pass a token)"),
    C("p50_view", "p50 ms [95% CI]", render=_p50),
    C("bleu_bs_view", "BLEU (bootstrap mean ± 95% CI)", render=_bootstrap),
    C("passes_view", "passes mean / p99", render=_passes),
    *(C(f"phase_{p}_view", f"{p} p50 ms", render=lambda row, p=p: ms((row.phase_p50_ms or {}).get(p)),
        doc=phases.DOCS[p]) for p in phases.PHASES),
)}


def columns() -> tuple[Column, ...]:
    """Every column of a row: the core ones, then each registered family's."""
    extra = {c.name: c for f in families.all_families() for c in f.columns}
    core = {c.name for c in CORE}
    return IDENTITY + tuple(c for n, c in extra.items() if n not in core) + FIGURES + RUN + TRAINING + COSTS + ENV


GROUPS = (("Identity", IDENTITY), ("Figures", FIGURES), ("Run", RUN), ("Training", TRAINING),
          ("Costs (XLA systems)", COSTS), ("Environment", ENV))
COLUMNS_BEGIN = "<!-- columns: generated by `narbench results --columns` (bench.rows.columns_markdown) -->"
COLUMNS_END = "<!-- end of columns -->"


def columns_markdown() -> str:
    """The reference of every column of ``rows.jsonl``: ``columns()`` in order, under the heading of the
    group that declares it (a family's own columns under the family), each with its table header,
    whether higher is better, and its doc. docs/results_format.md holds it between ``COLUMNS_BEGIN`` and
    ``COLUMNS_END`` (a test fails when the two differ)."""
    group = {c.name: title for title, cols in GROUPS for c in cols}
    for f in families.all_families():
        for c in f.columns:
            group.setdefault(c.name, f"{f.label} systems only (None in other families' rows)")
    better = {True: "higher", False: "lower", None: ""}
    cell = lambda text: text.replace("|", "\\|")  # noqa: E731   (a pipe would end the markdown cell)
    lines = [COLUMNS_BEGIN]
    for title, cols in itertools.groupby(columns(), key=lambda c: group[c.name]):
        body = ([f"`{c.name}`", cell(c.label), better[c.higher_is_better], cell(c.doc)] for c in cols)
        lines += ["", f"### {title}", "", *markdown.table(["column", "header", "better", "meaning"], body, "llll")]
    return "\n".join([*lines, "", COLUMNS_END]) + "\n"


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
        """A row read back: its schema must be this one; columns of a family or ``optional`` columns it
        predates are None; ``RENAMED`` columns read under their new names, ``RETIRED`` ones are dropped."""
        if record.get("schema_version") != SCHEMA_VERSION:
            raise UserError(f"{where}: row schema {record.get('schema_version')} is not {SCHEMA_VERSION} (written by "
                            "another narbench version); re-run the suite with `narbench run --force`")
        record = {RENAMED.get(k, k): v for k, v in record.items() if k not in RETIRED}
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

    def __reduce__(self):
        """Pickled as its values (a Ray timing node sends its rows to the driver)."""
        return _restore_row, (dict(self._values),)

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


def _restore_row(values: dict[str, Any]) -> Row:
    row = Row.__new__(Row)
    object.__setattr__(row, "_values", values)
    return row


# ------------------------------------------------------------------------------------------ figures

def compute_figures(hypotheses: Sequence[str], references: Sequence[Sequence[str]], latencies_ms: Sequence[float],
                    passes: Sequence[int], target_lang: str, baseline_latencies_ms: Sequence[float] | None = None,
                    baseline_hypotheses: Sequence[str] | None = None, bootstrap_resamples: int = 1000,
                    score: bool = True, phase_ms: Sequence[Mapping[str, float]] | None = None,
                    host_syncs: Sequence[int] | None = None,
                    solo_ms: Sequence[float | None] | None = None,
                    valid_targets: Sequence[Sequence[str]] | None = None,
                    tests: bool = True, ar_trials: int | None = None) -> dict[str, Any]:
    """Every column of a row that follows from per-sentence data (``verify_run`` recomputes these);
    without ``score`` (timing only) the quality columns are None; without ``phase_ms`` (runs that
    predate phases) the phase columns are; without ``solo_ms`` (the solo check's latencies, None for
    sentences outside its sample) the solo columns are; without ``valid_targets`` (every correct output
    of each source, for tasks that know them) exact match and mode mixing are; without ``tests`` (rows
    written before narbench ran sacrebleu's paired tests) the tests' columns are."""
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
        "bleu_delta_vs_ar": None, **{name: None for name in PAIRED_TEST_FIELDS},
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
        base = quality.corpus_bleu(baseline_hypotheses, references, langs.bleu_tokenizer(target_lang))
        out["bleu_delta_vs_ar"] = q.bleu - base.score
        if tests:
            out.update(paired_test_figures(hypotheses, baseline_hypotheses, references, target_lang,
                                           bootstrap_resamples, ar_trials))
    return out


PAIRED_TEST_FIELDS = ("bleu_p_ar", "bleu_p_bs", "bleu_bs_mean", "bleu_bs_ci", "bleu_ar_signature",
                      "bleu_bs_signature")


def paired_test_figures(hypotheses: Sequence[str], baseline_hypotheses: Sequence[str],
                        references: Sequence[Sequence[str]], target_lang: str, bootstrap_resamples: int = 1000,
                        ar_trials: int | None = None) -> dict[str, Any]:
    """The ``PAIRED_TEST_FIELDS`` columns: sacrebleu's paired tests of BLEU against the baseline's
    hypotheses (``bench.measure.quality.paired_tests``; ``ar_trials`` None: ``defaults.AR_TRIALS``), with the
    target language's BLEU tokenizer."""
    from bench.measure import quality

    t = quality.paired_tests(hypotheses, baseline_hypotheses, references, langs.bleu_tokenizer(target_lang),
                             ar_trials=ar_trials, bs_resamples=bootstrap_resamples)
    return {"bleu_p_ar": t.p_ar, "bleu_p_bs": t.p_bs, "bleu_bs_mean": t.bs_mean, "bleu_bs_ci": t.bs_ci,
            "bleu_ar_signature": t.ar_signature, "bleu_bs_signature": t.bs_signature}


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
