"""Fakes for the grid tests: a trainer, a distiller, a decoder factory and a text source.

The fake "translation" task: sources are lower-case word sequences, the reference is the same words
upper-cased. Fake decoders translate deterministically with a system-dependent error pattern (AR
beam is perfect, AR greedy drops the last word of long sentences, PaDIR stutters more with fewer
steps), so BLEU, stutter and passes differ between systems in known ways.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from bench.measure.decoder import DecodeOutput
from bench.runner import Deps
from bench.rows import SCHEMA_VERSION, Row, columns

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def fake_text(n: int = 30, seed: int = 0) -> tuple[list[str], list[list[str]]]:
    rng = np.random.default_rng(seed)
    sources = [" ".join(rng.choice(WORDS, size=int(rng.integers(3, 9)))) for _ in range(n)]
    first = [s.upper() for s in sources]
    extra = [s.upper().replace("ALPHA", "ALEPH") for s in sources]
    return sources, [first, extra]


def fake_spec(name: str, *, test: Sequence[str], ar_decoders: Sequence[str], padir_iterations: Sequence[int],
              max_test_sentences: int, length_hyps: Sequence[int] | None = None, timing: str = "") -> str:
    """A suite spec (TOML text) over ``fake_task``: tiny models, 5-step trainings, PaDIR with and
    without distillation at ``padir_iterations``; ``timing``: more of its ``[timing]`` table. The machine's
    load is sampled for 0.1 s before each measurement (1 s by default: 2 s of every fake run with two
    test sets was that wait)."""
    q = lambda items: "[" + ", ".join(f'"{x}"' for x in items) + "]"
    train = "\nsteps = 5\nbatch_tokens = 256\nlearning_rate = 1e-3\nwarmup_steps = 1\n"
    extra = f"length_hyps = {list(length_hyps)}\n" if length_hyps else ""
    return (f'name = "{name}"\nseeds = [0]\nmax_test_sentences = {max_test_sentences}\n'
            f"bootstrap_resamples = 50\n\n[[tasks]]\ntrain = \"fake_task\"\ntest = {q(test)}\n\n"
            f'[model]\npreset = "tiny"\n\n[timing]\nload_sample_s = 0.1\n{timing}\n'
            f"[train.ar]{train}\n[train.padir]{train}\n"
            f"[ar]\ndecoders = {q(ar_decoders)}\n\n[padir]\niterations = {list(padir_iterations)}\n"
            f"distill = [false, true]\n{extra}")


def fake_row(system: str, test_set: str = "t", **values: Any) -> Row:
    """A row with every column (None unless given)."""
    return Row({**{c.name: None for c in columns()}, "schema_version": SCHEMA_VERSION, "system": system,
                "test_set": test_set, **values})


class FakeLowered:
    def __init__(self, flops: float):
        self.flops = flops

    def compile(self):
        return self

    def cost_analysis(self):
        return {"flops": self.flops, "bytes accessed": 4 * self.flops}

    def as_text(self):      # one text per program: bench.costs keys its compile cache on it
        return (f"// flops {self.flops}\nENTRY %main (p: f32[4]) -> f32[4] {{\n  %p = f32[4]{{0}} parameter(0)\n"
                "  ROOT %t = f32[4]{0} tanh(%p)\n}\n")


class FakeDecoder:
    """Implements ``bench.measure.decoder.Decoder`` structurally, with no model behind it. A token is a
    word: a source of more than ``max_source_tokens - 1`` words is cut to them (as the real decoders cut
    at their largest shape bucket), and ``count_truncated`` says how many were."""

    max_source_tokens = 9

    def __init__(self, checkpoint_dir: Path, spec: str, name: str, factory: "FakeFactory", **options: Any):
        self.name, self.spec, self.options, self.factory = name, spec, options, factory
        self.steps = int(spec.split(":")[1]) if spec.startswith("refine") else None
        self.meta = json.loads((Path(checkpoint_dir) / "narbench.json").read_text())

    def prepare(self, sources: Sequence[str]) -> dict:
        return {"sources": list(sources), "tokens": np.zeros((len(sources), 16), np.int32)}

    def run(self, prepared: dict) -> np.ndarray:
        self.factory.runs += 1
        if self.factory.interrupt_after_runs is not None and self.factory.runs > self.factory.interrupt_after_runs:
            raise KeyboardInterrupt
        return prepared["tokens"] + 1   # [batch, 16]

    def count_truncated(self, sources: Sequence[str]) -> int:
        return sum(len(s.split()) + 1 > self.max_source_tokens for s in sources)

    def _translate(self, source: str) -> tuple[str, int]:
        words = source.upper().split()[: self.max_source_tokens - 1]
        if self.spec == "greedy":
            return " ".join(words[:-1] if len(words) > 5 else words), len(words) + 1
        if self.spec.startswith("beam"):
            return " ".join(words), len(words) + 1
        # PaDIR: the first word is stuttered unless refined enough; distilled models stutter less.
        stutters = self.steps < 2 or (not self.meta["distill"] and self.steps < 4)
        out = [words[0]] + words if stutters else words
        return " ".join(out), min(self.steps, 1 + len(words) % 3)

    def finish(self, outputs: np.ndarray, prepared: dict) -> DecodeOutput:
        assert outputs.shape == prepared["tokens"].shape
        pairs = [self._translate(s) for s in prepared["sources"]]
        return DecodeOutput([p[0] for p in pairs], np.asarray([p[1] for p in pairs]))

    def warmup_inputs(self, batch_size: int) -> list[dict]:
        return [self.prepare(["warm up"] * batch_size)]

    def lower(self, prepared: dict, part: str) -> FakeLowered:
        passes = {"encode": 0, "pass": 1, "pass2": 2}[part]
        return FakeLowered(1e6 if part == "encode" else 2e5 * passes * len(prepared["sources"]))


@dataclass
class FakeFactory:
    """Decoder factory that can fail: raise after ``fail_after`` loads or interrupt mid-measurement."""

    fail_after: int | None = None
    interrupt_after_runs: int | None = None
    loads: list[tuple[str, str]] = field(default_factory=list)
    runs: int = 0

    def __call__(self, family: str, checkpoint_dir, spec: str, **options) -> FakeDecoder:
        if self.fail_after is not None and len(self.loads) >= self.fail_after:
            raise RuntimeError("fake decoder factory: simulated crash")
        self.loads.append((options["name"], str(checkpoint_dir)))
        return FakeDecoder(Path(checkpoint_dir), spec, factory=self, **options)


@dataclass
class FakeTrainer:
    root: Path
    calls: list[tuple[str, str]] = field(default_factory=list)

    def folder(self, task: str, model_config: dict, train_config: dict, init_from: Path | None = None) -> Path:
        """Where a training of these settings goes (the fakes' checkpoint_dir_for)."""
        key = json.dumps([task, model_config, train_config, str(init_from)], sort_keys=True)
        return self.root / f"ckpt-{abs(hash(key)) % 10**10}"

    def __call__(self, task: str, model_config: dict, train_config: dict, progress: bool = True,
                 init_from: Path | None = None) -> Path:
        key = json.dumps([task, model_config, train_config, str(init_from)], sort_keys=True)
        self.calls.append((task, key))
        out = self.folder(task, model_config, train_config, init_from)
        out.mkdir(parents=True, exist_ok=True)
        if init_from is not None:
            assert (Path(init_from) / "narbench.json").is_file(), "the warm-start source must be trained first"
        meta = {"task": task, "distill": task.endswith("_distilled"), **model_config, "train_config": train_config,
                "init_from": None if init_from is None else str(init_from), "complete": True}
        (out / "narbench.json").write_text(json.dumps(meta))
        return out


@dataclass
class FakeDistiller:
    """Returns the distilled task's name and a fake ``distill.json`` record of the settings it got."""

    calls: list[tuple[str, str]] = field(default_factory=list)
    settings: list[dict] = field(default_factory=list)

    def __call__(self, teacher_dir, task: str, decoder: str = "beam:5", max_examples: int | None = None, *,
                 seed: int = 0, progress: bool = True, **kwargs) -> tuple[str, dict]:
        assert (Path(teacher_dir) / "narbench.json").is_file(), "teacher must be trained first"
        self.calls.append((str(teacher_dir), task))
        self.settings.append({"decoder": decoder, "max_examples": max_examples, "seed": seed, **kwargs})
        record = {"task": task, "seed": seed, "examples": max_examples or 100, "teacher_decoder": decoder,
                  "teacher_bleu": 42.0, "length_ratio": 0.98, "sentences_per_second": 50.0, "seconds": 2.0}
        return f"{task}_distilled", record


STEP_COST = {"ar": {"flops": 1e9, "seconds": 0.5}, "padir": {"flops": 2.5e9, "seconds": 0.8}}   # per step
FAKE_PARAMS = {"tiny": 10 ** 6, "mini": 4 * 10 ** 6, "small": 16 * 10 ** 6}                   # by preset
TOKENS_PER_STEP = 200


def fake_train_record(checkpoint_dir) -> dict:
    """The training record of a fake checkpoint: its steps at the family's fixed cost per step."""
    meta = json.loads((Path(checkpoint_dir) / "narbench.json").read_text())
    steps, cost = meta["train_config"]["steps"], STEP_COST.get(meta["family"], STEP_COST["padir"])
    record = {"steps_done": steps, "target_tokens": TOKENS_PER_STEP * steps, "train_seconds": cost["seconds"] * steps,
              "train_flops": cost["flops"] * steps, "num_params": FAKE_PARAMS.get(meta.get("preset"), 10 ** 6)}
    if meta.get("init_from"):
        source = fake_train_record(meta["init_from"])
        record["init"] = {"source_train_seconds": source["train_seconds"], "source_train_flops": source["train_flops"]}
    return record


def fake_train_curve(checkpoint_dir) -> list[dict]:
    """Five points: AR's dev BLEU rises by 2 per fifth of training (still improving), the others' is flat."""
    meta = json.loads((Path(checkpoint_dir) / "narbench.json").read_text())
    steps, rising = meta["train_config"]["steps"], meta["family"] == "ar"
    cost = STEP_COST.get(meta["family"], STEP_COST["padir"])["seconds"]
    lengths = {} if rising else {"dev_length_exact": 0.25, "dev_length_within2": 0.75}
    return [{"step": steps * k // 5 or 1, "seconds": cost * (steps * k // 5), "dev_nll": 4.0 - 0.1 * k,
             "dev_bleu": 2.0 * k if rising else 3.0, "eval_seconds": 0.1, **lengths} for k in range(1, 6)]


@dataclass
class FakeStepCost:
    calls: list[tuple[str, str, str]] = field(default_factory=list)   # (match, task, family)

    def __call__(self, match: str, task: str, model_config: dict, train_config: dict) -> float:
        self.calls.append((match, task, model_config["family"]))
        return STEP_COST[model_config["family"]][match]


def fake_configs(spec, cell) -> tuple[dict, dict]:
    model = {"family": cell.family, "preset": spec.model.preset_of(cell), **dict(cell.axes)}
    train = {**spec.budget(cell.family).train_kwargs(), "seed": cell.seed}
    if "buckets" in train:
        train["buckets"] = list(train["buckets"])
    return model, train


def fake_deps(root: Path, factory: FakeFactory | None = None, n_sentences: int = 30) -> Deps:
    def load_text(task: str, split: str):
        return fake_text(n_sentences, seed=hash((task, split)) % 1000)

    deps = Deps(train=FakeTrainer(root), distill=FakeDistiller(), load_decoder=factory or FakeFactory(),
                load_text=load_text, target_lang=lambda task: "en", configs=fake_configs,
                train_record=fake_train_record, train_curve=fake_train_curve, step_cost=FakeStepCost())
    return deps


def fake_locator(deps: Deps, n_sentences: int = 30):
    """A ``bench.preview.Locator`` over the fakes: the fake trainer's folders, and a distillation is cached
    once the fake distiller has made it from that teacher."""
    from bench.preview import Locator

    def record(folder: Path) -> dict | None:
        file = Path(folder) / "narbench.json"
        return json.loads(file.read_text()) if file.is_file() else None

    def distillation(teacher_dir, task: str, seed: int, **kwargs) -> tuple[Path, str | None]:
        made = (str(teacher_dir), task) in deps.distill.calls
        return Path(teacher_dir) / f"distilled-{task}", f"{task}_distilled" if made else None

    return Locator(fake_configs, lambda task: None, deps.train.folder, record, distillation,
                   lambda task, split: n_sentences)
