"""Learning curves: dev NLL and dev BLEU of a model while it trains.

``models.train.train`` evaluates every ``TrainConfig.eval_every`` steps and at its last step with a
``DevEvaluator`` on a ``DevSet`` (by default ``CURVE_SENTENCES`` dev sentences of the task, a sample
seeded by ``DEV_SEED``, so every model of a suite is scored on the same sentences), and appends a
point to ``curve.jsonl`` in the checkpoint folder::

    {"step": 300, "seconds": 181.2, "dev_nll": 3.91, "dev_bleu": 7.4, "eval_seconds": 6.3}

(PaDIR points also hold ``dev_length_exact`` and ``dev_length_within2``: the share of dev sentences
whose top predicted length is exact, or within 2 tokens.)

``seconds`` is the training time so far (``train_seconds`` of ``narbench.json``: evaluation time is
not in it; ``eval_seconds`` is the point's own). A resumed training keeps the points up to the step it
resumes from. ``dev_nll``: the training loss's token NLL (mean per target token, no label smoothing,
no dropout; PaDIR: its last stage, on seeded training noise) against targets of the kind the model trains on:
the task's references, or for a distilled task its teacher's outputs for the same dev sources (``DevSet.nll_targets``,
the distillation's ``dev.tsv``: a distilled model learns the teacher's translations, not the human ones).
``dev_bleu``: SacreBLEU (tokenizer
``13a``, ``zh`` for Chinese targets) of the decoder in ``CURVE_DECODERS`` against the task's own
references (and every other valid target, for tasks that know them all: the synthetic dial), decoder options at their defaults except PaDIR's length hypotheses
(``defaults.CURVE_LENGTH_HYPS``).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import numpy as np

from narbench_core import defaults, langs
from narbench_core.errors import UserError
from narbench_core.io import read_jsonl, write_jsonl
from narbench_core.tokens import EOS_ID

CURVE_FILE = "curve.jsonl"
REFERENCES, TEACHER_OUTPUTS = "references", "teacher outputs"   # what dev NLL is measured against (a record's
                                                                # ``dev_nll_targets``)
DEV_SEED = 0                         # the dev sample, the NLL noise and PaDIR's decoding seed
EVAL_BATCH = 32                      # sentences per evaluation batch (NLL and decoding)
CURVE_DECODERS = {"ar": "greedy", "padir": f"refine:{defaults.CURVE_REFINE_STEPS}"}   # model kind -> decoder


@dataclass(frozen=True)
class DevSet:
    """The dev sentences a curve is measured on."""

    sources: tuple[str, ...]
    references: tuple[str, ...]      # one reference per source (the task's own)
    vocab: Any                       # the SentencePiece vocabulary the model was trained with
    tokenize: str = "13a"            # SacreBLEU tokenizer: "zh" for Chinese targets
    others: tuple[tuple[str, ...], ...] = ()   # further reference streams BLEU also scores against
    nll_targets: tuple[str, ...] = ()          # the targets dev NLL is measured on, one per source (a distilled
                                               # task's teacher outputs); empty: ``references``

    def __post_init__(self):
        if not self.sources or len(self.sources) != len(self.references):
            raise UserError(f"a dev set needs sources with one reference each, got {len(self.sources)} sources "
                            f"and {len(self.references)} references")
        if self.nll_targets and len(self.nll_targets) != len(self.sources):
            raise UserError(f"a dev set's NLL targets need one per source, got {len(self.nll_targets)} for "
                            f"{len(self.sources)} sources")

    @property
    def targets(self) -> tuple[str, ...]:
        """What dev NLL is measured against: ``nll_targets``, else the references."""
        return self.nll_targets or self.references

    @property
    def targets_kind(self) -> str:
        """``TEACHER_OUTPUTS`` or ``REFERENCES``: what ``targets`` are, as a training's record says it."""
        return TEACHER_OUTPUTS if self.nll_targets else REFERENCES


def dev_set(task: str, n: int = defaults.CURVE_SENTENCES, seed: int = DEV_SEED, needed_by: str | None = None) -> DevSet:
    """``n`` sentences of the dev split of ``task`` (of its source task if distilled, with its teacher's outputs for
    them as the NLL targets), seeded; ``n`` 0: all of them (``needed_by``: the setting that asks for them, named
    in the error when there are none)."""
    from models.distill import dev_targets
    from suites import catalog

    base = catalog.source_task(task)
    sources, references = catalog.load_text(base, "dev")
    if not sources:
        why = f"{needed_by} trains until dev BLEU stops rising" if needed_by else "learning curves need one"
        raise UserError(f"task {base} has an empty dev split; {why} (add a dev split, or train a set number of "
                        "steps; check `narbench tasks`)")
    idx = np.arange(len(sources))
    if 0 < n < len(sources):
        idx = np.sort(np.random.default_rng(seed).choice(len(sources), size=n, replace=False))
    # A task that knows every valid target of a source (the synthetic dial) is scored against all of them.
    others = references[1:] if catalog.valid_targets(base, "dev") is not None else []
    distilled = catalog.distilled_train(task) if base != task else None
    teacher = [] if distilled is None else dev_targets(distilled, sources)
    return DevSet(tuple(sources[i] for i in idx), tuple(references[0][i] for i in idx),
                  catalog.get_vocabulary(base), langs.bleu_tokenizer(catalog.task_info(base).target_lang),
                  tuple(tuple(r[i] for i in idx) for r in others), tuple(teacher[i] for i in idx) if teacher else ())


class DevEvaluator:
    """Scores parameters of one model on a ``DevSet``; compiles once per training (the decoder and
    the NLL function are built on first use and reused with new parameters)."""

    def __init__(self, model_config, train_config, dev: DevSet, loss: Callable, seed: int = DEV_SEED):
        """``loss(params, batch, rng) -> (total, nll)``: the trainer's loss of a model built without
        dropout or label smoothing (``models.train`` passes it, so this module does not import the trainer)."""
        from models.batching import BucketedBatches, TokenPairs

        if model_config.kind not in CURVE_DECODERS:
            raise UserError(f"no learning-curve decoder for {model_config.kind} models")
        self.model_config, self.dev, self.seed = model_config, dev, seed
        self._nll = jax.jit(lambda params, batch, rng: loss(params, batch, rng)[1])
        inputs = [list(dev.vocab.encode(s)) + [EOS_ID] for s in dev.sources]
        targets = [list(dev.vocab.encode(r)) + [EOS_ID] for r in dev.targets]
        limit = train_config.max_length
        longest = min(limit, max(max(len(x), len(y)) for x, y in zip(inputs, targets)))
        length = min([b for b in train_config.buckets if b >= longest] + [limit])
        # One bucket, EVAL_BATCH rows: one compiled shape; truncation as in training.
        batches = BucketedBatches(TokenPairs.from_lists(inputs, targets), EVAL_BATCH * length, length,
                                  (length,), seed)
        self._batches = [batches.batch(i) for i in range(batches.batches_per_epoch)]
        self._decoder = None

    def losses(self, params) -> dict[str, float]:
        """Mean token NLL over the dev set (``dev_nll``); for models with a length predictor also the
        share of sentences whose predicted length (top 1, EOS included) is exact
        (``dev_length_exact``) and within 2 tokens (``dev_length_within2``)."""
        sums: dict[str, float] = {}
        for i, batch in enumerate(self._batches):
            m = self._nll(params, batch, jax.random.fold_in(jax.random.PRNGKey(self.seed), i))
            n = float(m["target_tokens"])
            sums["nll"] = sums.get("nll", 0.0) + float(m["nll"]) * n
            sums["tokens"] = sums.get("tokens", 0.0) + n
            if "length_accuracy" in m:
                rows = float(m["sentences"])
                for key, metric in (("exact", "length_accuracy"), ("within2", "length_within2")):
                    sums[key] = sums.get(key, 0.0) + float(m[metric]) * rows
                sums["sentences"] = sums.get("sentences", 0.0) + rows
        out = {"dev_nll": sums["nll"] / max(sums["tokens"], 1.0)}
        if "sentences" in sums:
            for key in ("exact", "within2"):
                out[f"dev_length_{key}"] = sums[key] / max(sums["sentences"], 1.0)
        return out

    def nll(self, params) -> float:
        """Mean token NLL over the dev set."""
        return self.losses(params)["dev_nll"]

    def hypotheses(self, params) -> list[str]:
        from models.decoders import make_decoder

        spec = CURVE_DECODERS[self.model_config.kind]
        if self._decoder is None:
            options = ({"seed": self.seed, "length_hyps": defaults.CURVE_LENGTH_HYPS}
                       if spec.startswith("refine") else {})
            self._decoder = make_decoder(self.model_config, params, self.dev.vocab, spec, name="dev", **options)
            self._decoder.warmup_inputs(EVAL_BATCH)   # fixes the batch size: the last batch pads up to it
        # Parameters are arguments of the decoder's jitted functions: new ones reuse its compilations.
        self._decoder.params = jax.device_put(params)
        # Batches of similar source length (fewer padded positions, smaller shape buckets).
        order = sorted(range(len(self.dev.sources)), key=lambda i: (len(self.dev.sources[i]), i))
        out: list[str] = [""] * len(order)
        try:
            for start in range(0, len(order), EVAL_BATCH):
                idx = order[start:start + EVAL_BATCH]
                prepared = self._decoder.prepare([self.dev.sources[i] for i in idx])
                for i, hyp in zip(idx, self._decoder.finish(self._decoder.run(prepared), prepared).hypotheses):
                    out[i] = hyp
        finally:
            self._decoder.params = None     # the training step donates these buffers next
        return out

    def bleu(self, hypotheses: Sequence[str]) -> float:
        import sacrebleu

        streams = [list(self.dev.references), *(list(r) for r in self.dev.others)]
        return float(sacrebleu.corpus_bleu(list(hypotheses), streams, tokenize=self.dev.tokenize).score)

    def __call__(self, params, step: int | None = None) -> dict[str, float]:
        """The curve point's scores of ``params`` (reached at ``step``; the scores do not depend on it)."""
        return {**self.losses(params), "dev_bleu": self.bleu(self.hypotheses(params))}


def read_curve(ckpt_dir: str | Path) -> list[dict]:
    """The points of a checkpoint folder's ``curve.jsonl`` ([] without one), by step."""
    return sorted(read_jsonl(Path(ckpt_dir) / CURVE_FILE), key=lambda p: p["step"])


def write_curve(ckpt_dir: str | Path, points: list[dict]) -> None:
    write_jsonl(Path(ckpt_dir) / CURVE_FILE, points)
