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

from bench.decoder import DecodeOutput
from bench.grid import Deps
from bench.rows import SCHEMA_VERSION, Row, columns

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def fake_text(n: int = 30, seed: int = 0) -> tuple[list[str], list[list[str]]]:
    rng = np.random.default_rng(seed)
    sources = [" ".join(rng.choice(WORDS, size=int(rng.integers(3, 9)))) for _ in range(n)]
    first = [s.upper() for s in sources]
    extra = [s.upper().replace("ALPHA", "ALEPH") for s in sources]
    return sources, [first, extra]


def fake_spec(name: str, *, test: Sequence[str], ar_decoders: Sequence[str], padir_steps: Sequence[int],
              max_test_sentences: int, length_hyps: Sequence[int] | None = None) -> str:
    """A suite spec (TOML text) over ``fake_task``: tiny models, 5-step trainings, PaDIR with and
    without distillation at ``padir_steps``."""
    q = lambda items: "[" + ", ".join(f'"{x}"' for x in items) + "]"
    train = "\nsteps = 5\nbatch_tokens = 256\nlearning_rate = 1e-3\nwarmup_steps = 1\n"
    extra = f"length_hyps = {list(length_hyps)}\n" if length_hyps else ""
    return (f'name = "{name}"\nseeds = [0]\nmax_test_sentences = {max_test_sentences}\n'
            f"bootstrap_resamples = 50\n\n[[tasks]]\ntrain = \"fake_task\"\ntest = {q(test)}\n\n"
            f'[model]\npreset = "tiny"\n\n[train.ar]{train}\n[train.padir]{train}\n'
            f"[ar]\ndecoders = {q(ar_decoders)}\n\n[padir]\nsteps = {list(padir_steps)}\n"
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


class FakeDecoder:
    """Implements ``bench.decoder.Decoder`` structurally, with no model behind it."""

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

    def _translate(self, source: str) -> tuple[str, int]:
        words = source.upper().split()
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
        return FakeLowered(1e6 if part == "encode" else 2e5 * len(prepared["sources"]))


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

    def __call__(self, task: str, model_config: dict, train_config: dict, progress: bool = True) -> Path:
        key = json.dumps([task, model_config, train_config], sort_keys=True)
        self.calls.append((task, key))
        out = self.root / f"ckpt-{abs(hash(key)) % 10**10}"
        out.mkdir(parents=True, exist_ok=True)
        meta = {"task": task, "distill": task.endswith("_distilled"), **model_config}
        (out / "narbench.json").write_text(json.dumps(meta))
        return out


@dataclass
class FakeDistiller:
    calls: list[tuple[str, str]] = field(default_factory=list)

    def __call__(self, teacher_dir, task: str, beam_size: int = 5, **kwargs) -> str:
        assert (Path(teacher_dir) / "narbench.json").is_file(), "teacher must be trained first"
        self.calls.append((str(teacher_dir), task))
        return f"{task}_distilled"


def fake_configs(spec, cell) -> tuple[dict, dict]:
    model = {"family": cell.family, "preset": spec.model.preset, **dict(cell.axes)}
    train = {**spec.budget(cell.family).train_kwargs(), "seed": cell.seed}
    if "buckets" in train:
        train["buckets"] = list(train["buckets"])
    return model, train


def fake_deps(root: Path, factory: FakeFactory | None = None, n_sentences: int = 30) -> Deps:
    def load_text(task: str, split: str):
        return fake_text(n_sentences, seed=hash((task, split)) % 1000)

    deps = Deps(train=FakeTrainer(root), distill=FakeDistiller(), load_decoder=factory or FakeFactory(),
                load_text=load_text, target_lang=lambda task: "en", configs=fake_configs)
    return deps
