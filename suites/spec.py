"""Suite specs: one frozen schema for a benchmark grid, loaded from TOML and validated key by key.

A spec names the tasks (train task -> test sets), the model preset, the distillation settings, how to
time, and one section per system family (``[ar]``, ``[padir]`` ...) with its training budget
(``[train.ar]``, ``[train.padir]`` ...). This module knows no family: the caller passes a parser per
family section (``bench.families`` does), which reads its table with the public ``Reader`` and
checkers below and returns a frozen dataclass. Built-in suites live in ``suites/specs/<name>.toml``;
``load_spec`` also takes a path.

Any unknown key or bad value raises ``UserError`` naming the file and the key path, e.g.
``suites/specs/x.toml: padir.iterations: expected positive integers, got 0``.

Test sets are written ``[TASK:]SPLIT[+refs]``: ``"test"`` scores the train task's test split against
its own references; ``"test+refs"`` also uses the extra references where the task has them
(multi-reference BLEU); ``"bible_en_de:test"`` scores another task's split.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

from narbench_core.digest import COMPACT, json_digest
from narbench_core import defaults
from narbench_core.errors import UserError
from narbench_core.runs import PLAIN_NAME
from suites.files import SPLITS as FILE_SPLITS, FileTask, SplitFiles

SPECS_DIR = Path(__file__).resolve().parent / "specs"
SCHEMA_VERSION = 1

# Keys mirror the fields of models.config.ModelConfig that a suite may override (`kind` is set by
# the grid, `vocab_size` by the task's vocabulary).
MODEL_OVERRIDE_KEYS = (
    "d_model", "num_heads", "head_dim", "d_ff", "num_encoder_layers", "num_decoder_layers",
    "dropout_rate", "relative_attention_num_buckets", "relative_attention_max_distance",
    "max_target_length", "dtype",
)
PHASES = ("end_to_end", "device")
BUDGET_MATCHES = ("flops", "seconds")   # [train.<family>] match: give it the baseline model's training budget
TEACHER_DECODER_RE = re.compile(r"^(?:greedy|beam:[1-9][0-9]*)$")   # the distillation teacher's search
TEST_SET_RE = re.compile(r"^(?:(?P<task>[A-Za-z0-9_]+):)?(?P<split>[A-Za-z0-9_]+)(?P<refs>\+refs)?$")


@dataclass(frozen=True)
class TestSet:
    task: str
    split: str
    multi_ref: bool = False

    @property
    def name(self) -> str:
        return f"{self.task}:{self.split}" + ("+refs" if self.multi_ref else "")


@dataclass(frozen=True)
class TaskSpec:
    train: str                       # seqio task the models are trained on
    test_sets: tuple[TestSet, ...]
    files: FileTask | None = None    # your own data: the task is registered from these files

    def to_dict(self) -> dict[str, Any]:
        tests = [_test_set_str(self.train, ts) for ts in self.test_sets]
        if self.files is None:
            return {"train": self.train, "test": tests}
        f = self.files
        return {"name": f.name, "source_lang": f.source_lang, "target_lang": f.target_lang,
                "files": {split: (sf.paths[0] if sf.is_tsv else list(sf.paths)) for split, sf in f.splits},
                "vocab_size": f.vocab_size, "test": tests}


@dataclass(frozen=True)
class ModelSpec:
    """The models' size: one preset, or a list (``preset = ["mini", "small", "medium"]``: the size axis, every
    model of the suite trained at each size, issue 52), with the suite's overrides on every one. A list of one is
    an axis too: a run of one size of a sized suite (``only``) names its size like the whole suite's run."""

    presets: tuple[str, ...]
    overrides: tuple[tuple[str, Any], ...] = ()   # sorted (field, value) pairs
    axis: bool = False                            # ``preset`` is a list (a size axis, even of one size)

    def override_dict(self) -> dict[str, Any]:
        return dict(self.overrides)

    @property
    def sized(self) -> bool:
        """Whether size is an axis (a list of presets): cells, systems and rows then name their size."""
        return self.axis or len(self.presets) > 1

    def only(self, sizes: Sequence[str]) -> "ModelSpec":
        """The same size axis cut to ``sizes`` (in the suite's order): a run of some sizes of a sized suite,
        each size timed where its models were trained (``narbench run --sizes``)."""
        if not self.sized:
            raise UserError(f"--sizes {' '.join(sizes)}: the suite has one model size ({self.presets[0]}), not a "
                            "size axis; leave --sizes out")
        unknown = [s for s in sizes if s not in self.presets]
        if unknown:
            raise UserError(f"--sizes {' '.join(unknown)}: not a size of the suite (its sizes: "
                            f"{', '.join(self.presets)})")
        return dataclasses.replace(self, presets=tuple(s for s in self.presets if s in sizes), axis=True)

    def preset_of(self, cell: Any) -> str:
        """The preset a training cell's model is built at: its own size on a size axis, else the one preset."""
        return getattr(cell, "preset", None) or self.presets[0]

    def to_dict(self) -> dict[str, Any]:
        # one preset stays a string: the spec hash of every suite without a size axis is unchanged
        preset = self.presets[0] if not self.sized else list(self.presets)
        return {"preset": preset, "overrides": self.override_dict()}


@dataclass(frozen=True)
class TrainBudget:
    """Training budget of one family's models (mapped by name onto ``models.train.TrainConfig``)."""

    steps: int
    batch_tokens: int
    learning_rate: float
    warmup_steps: int
    min_learning_rate: float | None = None    # None: keep TrainConfig's default
    label_smoothing: float | None = None
    length_loss_weight: float | None = None   # PaDIR's length-predictor loss weight
    max_length: int | None = None             # longer training examples are truncated
    buckets: tuple[int, ...] | None = None    # sequence-length buckets of the batcher
    checkpoint_every: int | None = None
    optimizer: str | None = None              # "adafactor" (paper) or "adam"
    eval_every: int | None = None             # steps between learning-curve points (None: the family's default)
    match: str | None = None                  # "flops" | "seconds": as much as the baseline (AR) model, steps a cap
    until: str | None = None                  # "plateau": stop when dev BLEU stops rising (models/schedule.py),
    signal: str | None = None                 # plateau: "dev_bleu" (None) or "dev_nll", the curve value it reads
    patience: int | None = None               #   after `patience` evaluations without a rise over `min_delta`,
    min_delta: float | None = None            #   steps a cap; None: "steps" (train `steps` steps)
    smooth: int | None = None                 # plateau: the rule reads the mean dev BLEU of the last `smooth` points
    patience_share: float | None = None       # plateau: the patience is at least this share of the evaluations so far
    min_steps: int | None = None              # plateau: the rule does not fire before this step
    dev_sentences: int | None = None          # dev sentences per curve point (0, "all" in a spec: the whole split)
    schedule: str | None = None               # "cosine" | "wsd" (a plateau budget's default: wsd)
    decay_share: float | None = None          # wsd: decay steps per step run before the decay

    def train_kwargs(self) -> dict[str, Any]:
        """The ``TrainConfig`` fields that are set (None means: keep its default; ``match`` is the
        grid's, resolved into ``steps`` before training)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None and k != "match"}


@dataclass(frozen=True)
class DistillSpec:
    """How the AR teacher decodes the training sources for distilled students."""

    decoder: str = defaults.DISTILL_DECODER                    # the teacher's search: greedy or beam:K
    max_examples: int | None = defaults.DISTILL_MAX_EXAMPLES   # size of the seeded sample (None, "all" in a spec: all)
    length_penalty: float = defaults.LENGTH_PENALTY
    engine: str = defaults.DISTILL_ENGINE                      # "jax" | "ct2": where the teacher decodes

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``models.distill.distill_task`` (the caller adds the seed)."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class TimingSpec:
    repeats: int = 1
    phase: str = "end_to_end"
    rotate: bool = True
    costs: bool = True     # XLA flops/bytes per sentence and the roofline bound (compiles 2 programs)
    isolate: bool = True   # systems in worker processes (bench.measure.workers), a JAX family's sharing one
    solo_sentences: int = 200   # sentences (whole batches, a seeded sample) each system is timed on again alone
    turn: int = 10         # batches a system decodes back to back when its turn comes (bench.measure.timing, step 2)
    load_sample_s: float = defaults.LOAD_SAMPLE_S   # the machine's load sampled this long before each measurement


# Settings added after specs were hashed, left out of the resolved spec at their default so that every earlier
# spec keeps its hash: section -> {key: default}.
UNHASHED_DEFAULTS = {"distill": {"engine": defaults.DISTILL_ENGINE},
                     "timing": {"load_sample_s": defaults.LOAD_SAMPLE_S}}

SCENARIOS = ("SingleStream", "Offline", "Server")   # MLPerf LoadGen's scenarios narbench serves (bench.serving)


@dataclass(frozen=True)
class ServingSpec:
    """``[serving]``: each chosen system served under MLPerf LoadGen's scenarios from its own worker process,
    with a dynamic batcher in the driver (bench.serving). Durations and query counts are CPU-sized, not
    MLPerf's submission minimums."""

    systems: tuple[str, ...] = ()          # system names of the suite to serve (empty: every system)
    scenarios: tuple[str, ...] = SCENARIOS
    bounds_ms: tuple[float, ...] = (100.0, 250.0)   # Server: the latency bounds whose peak QPS is searched
    percentile: float = 0.99               # Server: the latency percentile a bound holds for
    max_batch: tuple[int, ...] = (16,)     # the batcher's largest batch; several: Offline measures each, and the
                                           # system is served at the one it was fastest at (its users' choice)
    max_wait_ms: float = 0.0               # how long the batcher holds a partial batch for more queries
    group_by_length: bool = True           # a batch cut from a longer queue: the oldest query and those nearest its length
    min_duration_s: float = 10.0           # each LoadGen run's minimum duration
    min_queries: int = 700                 # SingleStream, the Server curve and the validation runs (p99 early stopping)
    single_rounds: int = 1                 # SingleStream as this many LoadGen tests of min_queries / rounds queries,
                                           # each between two solo timings (ABABA: the machine's drift cancels)
    search_queries: int = 200              # each step of FindPeakPerformance's search
    loads: tuple[float, ...] = (0.25, 0.5, 0.75)    # Server curve points: shares of the Offline throughput
    start_qps: float | None = None         # FindPeakPerformance's first QPS (None: a share of the Offline throughput)
    ct2_batch_type: str = "examples"       # CTranslate2's translate_batch(batch_type=...) when serving
    ct2_max_batch_size: int = 0            # CTranslate2's translate_batch(max_batch_size=...) (0: the whole batch)

    def __post_init__(self):
        if isinstance(self.max_batch, int):
            object.__setattr__(self, "max_batch", (self.max_batch,))

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        """The batch shapes a decoder is warmed up for: powers of two below the largest ``max_batch``, and each
        ``max_batch``."""
        top, sizes, b = max(self.max_batch), [], 1
        while b < top:
            sizes.append(b)
            b *= 2
        return tuple(sorted({*sizes, *self.max_batch}))

    def settings_key(self) -> tuple:
        """Every setting but the choice of systems: two runs serve a system alike (and as long) when these agree."""
        return tuple((f.name, getattr(self, f.name)) for f in dataclasses.fields(self) if f.name != "systems")


@dataclass(frozen=True)
class SuiteSpec:
    name: str
    description: str
    tasks: tuple[TaskSpec, ...]
    model: ModelSpec
    systems: tuple[tuple[str, Any], ...]            # (family, its parsed section), in registry order
    budgets: tuple[tuple[str, TrainBudget], ...]     # (family, [train.<family>])
    distill: DistillSpec = field(default_factory=DistillSpec)
    timing: TimingSpec = field(default_factory=TimingSpec)
    batch_size: int = 1
    seeds: tuple[int, ...] = (0,)
    max_test_sentences: int | None = None
    bootstrap_resamples: int = 1000    # resamples of sacrebleu's paired bootstrap of BLEU vs the AR baseline
    decode_buckets: tuple[int, ...] | None = None   # source-length shape buckets of every decoder
    max_decode_length: int | None = None            # target length cap of every decoder
    serving: ServingSpec | None = None              # [serving]: LoadGen scenarios (bench.serving), None: none
    source: str = ""   # where it was loaded from (not part of the hash)

    def replace(self, **changes: Any) -> "SuiteSpec":
        return dataclasses.replace(self, **changes)

    def section(self, family: str) -> Any:
        """The parsed ``[family]`` section, or None when the suite has none."""
        return dict(self.systems).get(family)

    def budget(self, family: str) -> TrainBudget:
        budgets = dict(self.budgets)
        if family not in budgets:
            raise UserError(f"{self.source}: train.{family}: missing training budget; add a [train.{family}] "
                            "table with steps, batch_tokens, learning_rate and warmup_steps")
        return budgets[family]

    def decoder_shapes(self) -> dict[str, Any]:
        """Decoder options every system of the suite shares: shape buckets and the length cap."""
        return {k: v for k, v in (("buckets", self.decode_buckets), ("max_decode_length", self.max_decode_length))
                if v}

    def test_sets(self) -> list[TestSet]:
        return [ts for task in self.tasks for ts in task.test_sets]

    def to_dict(self) -> dict[str, Any]:
        """The resolved spec in the TOML layout (``parse_spec(to_dict())`` round-trips)."""
        def clean(d: dict, section: str = "") -> dict:
            unhashed = UNHASHED_DEFAULTS.get(section, {})
            return {k: (list(v) if isinstance(v, tuple) else v) for k, v in d.items()
                    if v is not None and not (k in unhashed and v == unhashed[k])}

        return {
            "schema_version": SCHEMA_VERSION,
            "name": self.name, "description": self.description,
            "batch_size": self.batch_size, "seeds": list(self.seeds),
            "bootstrap_resamples": self.bootstrap_resamples,
            **({"max_test_sentences": self.max_test_sentences} if self.max_test_sentences else {}),
            **({"decode_buckets": list(self.decode_buckets)} if self.decode_buckets else {}),
            **({"max_decode_length": self.max_decode_length} if self.max_decode_length else {}),
            "tasks": [t.to_dict() for t in self.tasks],
            "model": self.model.to_dict(),
            "train": {family: clean(dataclasses.asdict(b)) for family, b in self.budgets},
            **{family: clean(dataclasses.asdict(section)) for family, section in self.systems},
            "distill": clean(dataclasses.asdict(self.distill), "distill"),
            "timing": clean(dataclasses.asdict(self.timing), "timing"),
            **({"serving": clean(dataclasses.asdict(self.serving))} if self.serving else {}),
        }

    def spec_hash(self) -> str:
        """Stable hex digest of the resolved spec (canonical JSON; the source path is excluded)."""
        return json_digest(self.to_dict(), separators=COMPACT)

    def to_toml(self, relative_to: str | os.PathLike | None = None) -> str:
        """The resolved spec as TOML. With ``relative_to`` (the folder the text is written into, a run
        folder), own-data file paths are written relative to it, not as absolute paths: a results tree
        moved or committed with its data still reads (``parse_spec(..., base_dir=relative_to)``)."""
        data = self.to_dict()
        if relative_to is not None:
            for task in data["tasks"]:
                if "files" in task:
                    task["files"] = {split: _relative(v, relative_to) if isinstance(v, str)
                                     else [_relative(p, relative_to) for p in v] for split, v in task["files"].items()}
        return dump_toml(data)


def _relative(path: str, start: str | os.PathLike) -> str:
    try:
        return Path(os.path.relpath(path, Path(start).absolute())).as_posix()
    except ValueError:                       # another drive (Windows): no relative path exists
        return path


def _test_set_str(train: str, ts: TestSet) -> str:
    prefix = "" if ts.task == train else f"{ts.task}:"
    return f"{prefix}{ts.split}" + ("+refs" if ts.multi_ref else "")


# ---------------------------------------------------------------------------------------- parsing

class Reader:
    """Reads typed values out of one TOML table, with errors naming ``source: key.path``."""

    def __init__(self, source: str, table: Any, path: str):
        self.source, self.path = source, path
        if not isinstance(table, dict):
            self.fail("", f"expected a table, got {_show(table)}")
        self.table, self.used = table, set()

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def fail(self, name: str, message: str):
        where = self.key(name) if name else (self.path or "<top>")
        raise UserError(f"{self.source}: {where}: {message}")

    def get(self, name: str, check: Callable[[Any], Any], default: Any = ..., required: bool = False):
        self.used.add(name)
        if name not in self.table:
            if required or default is ...:
                self.fail(name, "missing required key")
            return default
        try:
            return check(self.table[name])
        except Invalid as bad:
            self.fail(name, str(bad))

    def sub(self, name: str, required: bool = False) -> "Reader":
        self.used.add(name)
        if name not in self.table:
            if required:
                self.fail(name, "missing required table")
            return Reader(self.source, {}, self.key(name))
        return Reader(self.source, self.table[name], self.key(name))

    def done(self) -> None:
        unknown = sorted(set(self.table) - self.used)
        if unknown:
            known = ", ".join(sorted(self.used))
            self.fail(unknown[0], f"unknown key (known keys here: {known})")


class Invalid(Exception):
    pass


def _show(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (str, list, dict)) else repr(value)


def integer(lo: int) -> Callable[[Any], int]:
    def check(v):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise Invalid(f"expected an integer >= {lo}, got {_show(v)}")
        return v
    return check


def all_or(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``check``, or the string "all" read as None (no limit)."""
    def check_or_all(v):
        if v == "all":
            return None
        try:
            return check(v)
        except Invalid as err:
            raise Invalid(f'{err} (or "all")') from None
    return check_or_all


def number(lo: float, hi: float = math.inf, lo_open: bool = False, hi_open: bool = False) -> Callable[[Any], float]:
    def check(v):
        ok = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
        ok = ok and (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
        if not ok:
            bound = (f"{'>' if lo_open else '>='} {lo}"
                     + (f" and {'<' if hi_open else '<='} {hi}" if hi != math.inf else ""))
            raise Invalid(f"expected a number {bound}, got {_show(v)}")
        return float(v)
    return check


def string(pattern: re.Pattern | None = None, choices: tuple[str, ...] | None = None, what: str = "a string"):
    def check(v):
        if not isinstance(v, str) or not v or (pattern and not pattern.match(v)) or (choices and v not in choices):
            hint = f"one of {', '.join(choices)}" if choices else what
            raise Invalid(f"expected {hint}, got {_show(v)}")
        return v
    return check


def plain_text(v):
    if not isinstance(v, str):
        raise Invalid(f"expected a string, got {_show(v)}")
    return v


def boolean(v):
    if not isinstance(v, bool):
        raise Invalid(f"expected true or false, got {_show(v)}")
    return v


def one_or_list(item: Callable[[Any], Any], what: str) -> Callable[[Any], Any]:
    """One ``item`` (an int stays an int), or a non-empty list of distinct ones (a tuple)."""
    many = list_of(item, what)

    def check(v):
        if isinstance(v, list):
            return many(v)
        try:
            return item(v)
        except Invalid as err:
            raise Invalid(f"{err} (or a list of {what})") from None
    return check


def list_of(item: Callable[[Any], Any], what: str, unique: bool = True,
            empty: bool = False) -> Callable[[Any], tuple]:
    def check(v):
        if not isinstance(v, list) or not (v or empty):
            raise Invalid(f"expected a {'' if empty else 'non-empty '}list of {what}, got {_show(v)}")
        out = []
        for x in v:
            try:
                out.append(item(x))
            except Invalid:
                raise Invalid(f"expected {what}, got {_show(x)}") from None
        if unique and len(set(out)) != len(out):
            raise Invalid(f"expected distinct {what}, got duplicates in {_show(v)}")
        return tuple(out)
    return check


_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_TASK = re.compile(r"^[A-Za-z0-9_]+$")
_LANG = re.compile(r"^[A-Za-z]{2,3}(?:[-_][A-Za-z0-9]+)*$")


def _dev_sentences(v: Any) -> int:
    """A count of dev sentences; 0 or "all": the whole split (0 in ``TrainConfig.dev_sentences``)."""
    n = all_or(integer(0))(v)
    return 0 if n is None else n


def _budget(r: Reader) -> TrainBudget:
    until = r.get("until", string(choices=defaults.TRAIN_UNTIL), None)
    b = TrainBudget(
        steps=r.get("steps", integer(1), required=True),
        batch_tokens=r.get("batch_tokens", integer(1), required=True),
        learning_rate=r.get("learning_rate", number(0.0, lo_open=True), required=True),
        warmup_steps=r.get("warmup_steps", integer(0), required=True),
        min_learning_rate=r.get("min_learning_rate", number(0.0), None),
        label_smoothing=r.get("label_smoothing", number(0.0, 1.0), None),
        length_loss_weight=r.get("length_loss_weight", number(0.0), None),
        max_length=r.get("max_length", integer(2), None),
        buckets=r.get("buckets", list_of(integer(1), "positive integers"), None),
        checkpoint_every=r.get("checkpoint_every", integer(1), None),
        optimizer=r.get("optimizer", string(choices=("adafactor", "adam")), None),
        eval_every=r.get("eval_every", integer(0), None),
        match=r.get("match", string(choices=BUDGET_MATCHES), None),
        until=until,
        signal=r.get("signal", string(choices=tuple(defaults.PLATEAU_SIGNALS)), None),
        patience=r.get("patience", integer(1), None),
        min_delta=r.get("min_delta", number(0.0), None),
        smooth=r.get("smooth", integer(1), None),
        patience_share=r.get("patience_share", number(0.0, 1.0, hi_open=True), None),
        min_steps=r.get("min_steps", integer(0), None),
        dev_sentences=r.get("dev_sentences", _dev_sentences, None),
        schedule=r.get("schedule", string(choices=defaults.LR_SCHEDULES), "wsd" if until == "plateau" else None),
        decay_share=r.get("decay_share", number(0.0, 1.0, hi_open=True), None),
    )
    if until == "plateau":
        if b.match is not None:
            r.fail("match", f'a plateau budget (until = "plateau") trains until dev BLEU stops rising; it cannot also '
                            f'match the baseline\'s {b.match}: drop one of them')
        if not b.eval_every:
            r.fail("eval_every", 'until = "plateau" needs eval_every: the steps between dev evaluations')
        if b.schedule == "cosine":
            r.fail("schedule", 'until = "plateau" needs schedule = "wsd": cosine needs the total steps in advance')
    elif until is None:
        for key in ("signal", "patience", "min_delta", "smooth", "patience_share", "min_steps"):
            if getattr(b, key) is not None:
                r.fail(key, 'applies to until = "plateau" only')
    r.done()
    return b


def _file_task(r: Reader, base_dir: Path | None) -> FileTask:
    """``name``, ``source_lang``, ``target_lang``, ``files`` and ``vocab_size`` of a task on your own data."""
    name = r.get("name", string(_TASK, what="a task name of letters, digits and _"), required=True)
    langs = [r.get(k, string(_LANG, what='a language code such as "de" or "zh-Hans"'), required=True)
             for k in ("source_lang", "target_lang")]
    vocab_size = r.get("vocab_size", integer(8), 8000)
    fr = r.sub("files", required=True)
    splits = []
    for split in FILE_SPLITS:
        value = fr.get(split, lambda v: v, required=True)
        if isinstance(value, str) and value:
            raw = (value,)
        elif isinstance(value, list) and len(value) >= 2 and all(isinstance(x, str) and x for x in value):
            raw = tuple(value)
        else:
            fr.fail(split, f'expected a TSV path ("train.tsv") or aligned files (["train.de", "train.en"]), '
                           f"got {_show(value)}")
        resolved = []
        for text in raw:
            path = Path(text).expanduser()
            path = (path if path.is_absolute() else (base_dir or Path.cwd()) / path).resolve()
            if path.is_dir():
                fr.fail(split, f"{path} is a folder; name the split's file in it")
            if not path.is_file():
                fr.fail(split, f"{path} not found (relative paths start at the spec's folder, {base_dir or Path.cwd()})")
            resolved.append(str(path))
        splits.append((split, SplitFiles(tuple(resolved))))
    fr.done()
    return FileTask(name, langs[0], langs[1], tuple(splits), vocab_size)


def _tasks(source: str, value: Any, base_dir: Path | None = None) -> tuple[TaskSpec, ...]:
    if not isinstance(value, list) or not value:
        raise UserError(f"{source}: tasks: expected a non-empty array of tables "
                        f"([[tasks]] with train = ... and test = [...])")
    out, seen = [], {}
    for i, table in enumerate(value):
        r = Reader(source, table, f"tasks[{i}]")
        own = isinstance(table, dict) and ("files" in table or "name" in table)
        if own and "train" in table:
            r.fail("train", "give either train = TASK (a registered task) or name + files (your own data), not both")
        files = _file_task(r, base_dir) if own else None
        train = files.name if files else r.get("train", string(_TASK, what="a task name"), required=True)
        raw = r.get("test", list_of(string(TEST_SET_RE, what='"[TASK:]SPLIT[+refs]"'),
                                  '"[TASK:]SPLIT[+refs]" strings'), ("test",))
        r.done()
        sets = []
        for text in raw:
            m = TEST_SET_RE.match(text)
            ts = TestSet(task=m["task"] or train, split=m["split"], multi_ref=bool(m["refs"]))
            if ts.name in seen:
                r.fail("test", f"test set {ts.name!r} already belongs to tasks[{seen[ts.name]}]; "
                               "each test set may appear once")
            seen[ts.name] = i
            sets.append(ts)
        out.append(TaskSpec(train=train, test_sets=tuple(sets), files=files))
    return tuple(out)


def _max_batch(value) -> tuple[int, ...]:
    return tuple(sorted(set(value))) if isinstance(value, (list, tuple)) else (value,)


def _serving(r: Reader) -> ServingSpec:
    d = ServingSpec()
    positive = number(0.0, lo_open=True)
    start = r.get("start_qps", positive, None)
    spec = ServingSpec(
        systems=r.get("systems", list_of(string(what="a system name"), "system names", empty=True), d.systems),
        scenarios=r.get("scenarios", list_of(string(choices=SCENARIOS), f"scenarios of {list(SCENARIOS)}"),
                        d.scenarios),
        bounds_ms=r.get("bounds_ms", list_of(positive, "latency bounds in ms > 0"), d.bounds_ms),
        percentile=r.get("percentile", number(0.5, 1.0, hi_open=True), d.percentile),
        max_batch=_max_batch(r.get("max_batch", one_or_list(integer(1), "integers >= 1"), d.max_batch)),
        max_wait_ms=r.get("max_wait_ms", number(0.0), d.max_wait_ms),
        group_by_length=r.get("group_by_length", boolean, d.group_by_length),
        min_duration_s=r.get("min_duration_s", positive, d.min_duration_s),
        min_queries=r.get("min_queries", integer(1), d.min_queries),
        search_queries=r.get("search_queries", integer(1), d.search_queries),
        single_rounds=r.get("single_rounds", integer(1), d.single_rounds),
        loads=r.get("loads", list_of(number(0.0, 1.0, lo_open=True), "shares of the Offline throughput in (0, 1]",
                                     empty=True), d.loads),
        start_qps=start,
        ct2_batch_type=r.get("ct2_batch_type", string(choices=("examples", "tokens")), d.ct2_batch_type),
        ct2_max_batch_size=r.get("ct2_max_batch_size", integer(0), d.ct2_max_batch_size),
    )
    r.done()
    return spec


def serving_spec(table: Any, source: str) -> ServingSpec:
    """A ``[serving]`` table (e.g. of a run's spec.toml) as a ``ServingSpec``, checked as a suite's is."""
    return _serving(Reader(source, table, "serving"))


def _model(r: Reader) -> ModelSpec:
    preset = r.get("preset", one_or_list(string(_NAME, what="a preset name (tiny, mini, small, medium, paper)"),
                                         "preset names"), required=True)
    o = r.sub("overrides")
    overrides = {}
    for key in list(o.table):
        if key not in MODEL_OVERRIDE_KEYS:
            o.fail(key, f"unknown model field (known: {', '.join(MODEL_OVERRIDE_KEYS)})")
        if key == "dtype":
            overrides[key] = o.get(key, string(choices=("float32", "bfloat16")))
        elif key == "dropout_rate":
            overrides[key] = o.get(key, number(0.0, 0.999))
        else:
            overrides[key] = o.get(key, integer(1))
    r.done()
    return ModelSpec(presets=preset if isinstance(preset, tuple) else (preset,),
                     overrides=tuple(sorted(overrides.items())), axis=isinstance(preset, tuple))


class Section(Protocol):
    """What a system family offers the spec: a parser of its ``[name]`` table (to a frozen dataclass),
    whether it trains models (then ``[train.name]`` is its budget) and whether every suite has it (an
    absent table then takes the parser's defaults)."""

    trains: bool
    required: bool

    def parse(self, table: Reader) -> Any: ...


def parse_spec(data: dict[str, Any], source: str = "<spec>",
               sections: Mapping[str, Section] | None = None, base_dir: Path | None = None) -> SuiteSpec:
    """Validate a TOML-shaped dict into a ``SuiteSpec`` (``UserError`` on the first bad key).

    ``sections`` maps each system family's name to its ``Section``; a family that trains needs its
    ``[train.name]`` budget. Relative data paths of file tasks start at ``base_dir`` (default: the
    working directory).
    """
    sections = dict(sections or {})
    top = Reader(source, data, "")
    top.get("schema_version", integer(1), SCHEMA_VERSION)
    name = top.get("name", string(PLAIN_NAME, what="a plain name (letters, digits, _ . -, not starting with a "
                                                     "dot): it names the results folder"), required=True)
    description = top.get("description", plain_text, "")
    top.used.add("tasks")
    if "tasks" not in data:
        top.fail("tasks", "missing required key")
    tasks = _tasks(source, data["tasks"], base_dir)
    model = _model(top.sub("model", required=True))
    systems = tuple((family, section.parse(top.sub(family))) for family, section in sections.items()
                    if family in data or section.required)
    if not systems:
        top.fail("", f"no system family section; add one of [{'], ['.join(sections) or 'ar'}]")
    tr = top.sub("train", required=True)
    budgets = tuple((family, _budget(tr.sub(family, required=True))) for family, _ in systems
                    if sections[family].trains)
    tr.done()
    rules = {b.until or "steps" for _, b in budgets}
    if len(rules) > 1:
        tr.fail("", "every family of a suite trains by the same rule: give each [train.<family>] the same `until`")
    ds = top.sub("distill")
    d = DistillSpec()
    # `beam_size = K` is what `decoder = "beam:K"` replaced: still read from the spec.toml of earlier runs.
    legacy = ds.get("beam_size", integer(1), None)
    if legacy is not None and "decoder" in ds.table:
        ds.fail("beam_size", 'give decoder only (decoder = "beam:K" replaces beam_size = K)')
    teacher = string(TEACHER_DECODER_RE, what='"greedy" or "beam:K" (K >= 1)')
    distill = DistillSpec(decoder=ds.get("decoder", teacher, d.decoder if legacy is None else f"beam:{legacy}"),
                          max_examples=ds.get("max_examples", all_or(integer(1)), d.max_examples),
                          length_penalty=ds.get("length_penalty", number(0.0), d.length_penalty),
                          engine=ds.get("engine", string(choices=defaults.DISTILL_ENGINES), d.engine))
    ds.done()

    t = top.sub("timing")
    timing = TimingSpec(repeats=t.get("repeats", integer(1), 1),
                        phase=t.get("phase", string(choices=PHASES), "end_to_end"),
                        rotate=t.get("rotate", boolean, True),
                        costs=t.get("costs", boolean, True),
                        isolate=t.get("isolate", boolean, True),
                        solo_sentences=t.get("solo_sentences", integer(0), TimingSpec.solo_sentences),
                        turn=t.get("turn", integer(1), TimingSpec.turn),
                        load_sample_s=t.get("load_sample_s", number(0.05), TimingSpec.load_sample_s))
    t.done()
    serving = _serving(top.sub("serving")) if "serving" in data else None

    spec = SuiteSpec(
        name=name, description=description, tasks=tasks, model=model, systems=systems, budgets=budgets,
        distill=distill, timing=timing,
        batch_size=top.get("batch_size", integer(1), 1),
        seeds=top.get("seeds", list_of(integer(0), "non-negative integers"), (0,)),
        max_test_sentences=top.get("max_test_sentences", integer(1), None),
        bootstrap_resamples=top.get("bootstrap_resamples", integer(10), 1000),
        decode_buckets=top.get("decode_buckets", list_of(integer(1), "positive integers"), None),
        max_decode_length=top.get("max_decode_length", integer(1), None),
        serving=serving,
        source=source,
    )
    top.done()
    return spec


def builtin_specs() -> list[str]:
    return sorted(p.stem for p in SPECS_DIR.glob("*.toml"))


def _merged(base: dict, over: dict) -> dict:
    """``over`` laid on ``base``: tables merge key by key, any other value (arrays included) replaces."""
    out = dict(base)
    for key, value in over.items():
        out[key] = _merged(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return out


def load_spec(name_or_path: str | Path, sections: Mapping[str, Section] | None = None) -> SuiteSpec:
    """A built-in suite by name (``smoke``, ``default`` ...) or a path to a ``.toml`` file (see
    ``parse_spec`` for ``sections``). A top-level ``extends = "default"`` (a built-in suite) takes that
    suite's settings and lays this file's on top (tables merge key by key, other values replace);
    ``without = ["ort"]`` beside it leaves those tables of the extended suite out (a family's systems)."""
    data, source, base_dir = _load_data(name_or_path)
    return parse_spec(data, source, sections, base_dir=base_dir)


def _load_data(name_or_path: str | Path, chain: tuple[str, ...] = ()) -> tuple[dict, str, Path]:
    """The spec's TOML data (``extends`` resolved), its source, and ``parse_spec``'s ``base_dir``."""
    text = str(name_or_path)
    path = Path(text)
    if text.endswith(".toml") or path.is_file() or "/" in text:
        if not path.is_file():
            state = "is a folder, not a file" if path.is_dir() else "does not exist"
            raise UserError(f"suite file {text} {state}; pass a built-in suite "
                            f"({', '.join(builtin_specs())}) or a path to a .toml spec")
        source = text
    else:
        path = SPECS_DIR / f"{text}.toml"
        if not path.is_file():
            raise UserError(f"unknown suite {text!r}; built-in suites: {', '.join(builtin_specs())} "
                            "(or pass a path to a .toml spec)")
        source = f"suites/specs/{text}.toml"
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as err:
        raise UserError(f"{source}: malformed TOML: {err}") from None
    except UnicodeDecodeError:
        raise UserError(f"{source}: not UTF-8 text; save the spec as UTF-8 TOML") from None
    base_dir = path.resolve().parent
    parent = data.pop("extends", None)
    if parent is None:
        return data, source, base_dir
    if not isinstance(parent, str) or parent not in builtin_specs():
        raise UserError(f"{source}: extends = {parent!r} is not a built-in suite; use one of "
                        f"{', '.join(builtin_specs())}")
    if parent in chain or parent == path.stem:
        raise UserError(f"{source}: extends = {parent!r} makes a cycle; a suite cannot extend itself")
    base, _, _ = _load_data(parent, chain + (path.stem,))
    without = data.pop("without", [])
    if not isinstance(without, list) or not all(isinstance(t, str) and isinstance(base.get(t), dict) for t in without):
        raise UserError(f"{source}: without = {without!r} must list tables of the suite it extends "
                        f"({', '.join(k for k, v in base.items() if isinstance(v, dict))}) to leave out")
    return _merged({k: v for k, v in base.items() if k not in without}, data), source, base_dir


# ---------------------------------------------------------------------------------------- writing

def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)  # a JSON string is a valid TOML basic string
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def dump_toml(data: dict[str, Any]) -> str:
    """TOML text for the spec layout: scalars first, then tables, arrays of tables and sub-tables."""
    lines: list[str] = []

    def table(d: dict, prefix: str) -> None:
        scalars = {k: v for k, v in d.items()
                   if not isinstance(v, dict) and not (isinstance(v, list) and v and isinstance(v[0], dict))}
        lines.extend(f"{k} = {_toml_value(v)}" for k, v in scalars.items())
        for k, v in d.items():
            if isinstance(v, list) and v and isinstance(v[0], dict):
                for item in v:
                    lines.extend(["", f"[[{prefix}{k}]]"])
                    table(item, f"{prefix}{k}.")
        for k, v in d.items():
            if isinstance(v, dict):
                lines.extend(["", f"[{prefix}{k}]"])
                table(v, f"{prefix}{k}.")

    table(data, "")
    return "\n".join(lines).lstrip("\n") + "\n"
