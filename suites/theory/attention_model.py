"""The model hook of the attention analysis: decode with a PaDIR checkpoint, read its attention.

For each source sentence: encode, take the k most likely lengths, run T refinement passes
(``models.refine.iterative_refinement``, the same remask/init options as the decoders), keep the best
hypothesis by mean log-prob WITHOUT dropping repeats (stutter is what we study), then run one decoder
pass on that final hypothesis and read the last layer's attention weights that ``models.t5`` sows into
``intermediates`` (``self_attention`` [b, heads, n, n], ``cross_attention`` [b, heads, n, src]).
When refinement converged (a pass changed nothing, so it stopped before T), that pass is exactly the
one that produced the output; ``info["converged_share"]`` says how often that holds.
Pairs are taken over the output tokens before the first EOS; source positions include the source EOS.
"""
from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from narbench_core.errors import UserError
from bench.store import resolve_run_dir
from suites.theory import attention

EOS_ID = 1
BUCKETS = (16, 32, 64, 128)


@dataclass(frozen=True)
class AttentionJob:
    checkpoint: str
    sources: tuple[str, ...]
    origin: str                 # where the sources and checkpoint came from (for the page)
    steps: int = 4
    length_hyps: int = 5
    remask: str = "stutter"
    init: str = "random"
    max_sentences: int = 300
    seed: int = 0

    def with_overrides(self, **changes) -> "AttentionJob":
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    def config(self) -> dict:
        d = dataclasses.asdict(self)
        d["sources"] = min(len(self.sources), self.max_sentences)
        return d


def _read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def job_from_run(run_dir: str, system: str | None = None, test_set: str | None = None) -> AttentionJob:
    """The NAR system's checkpoint, decoder options and test sources recorded by `narbench run`."""
    path = resolve_run_dir(run_dir)
    if not (path / "rows.jsonl").is_file():
        raise UserError(f"{run_dir} has no rows.jsonl; pass a `narbench run` folder results/<suite>/<run_id>")
    nar = [r for r in _read_jsonl(path / "rows.jsonl") if r.get("family") == "nar" and r.get("checkpoint")]
    if system:
        nar = [r for r in nar if r.get("system") == system]
    if test_set:
        nar = [r for r in nar if r.get("test_set") == test_set]
    elif nar:
        nar = [r for r in nar if r.get("test_set") == nar[0].get("test_set")]   # the run's first test set
    if not nar:
        raise UserError(f"{path} has no PaDIR (family nar) row{' for ' + system if system else ''}"
                        f"{' on ' + test_set if test_set else ''}; run a suite with a PaDIR system or pass --checkpoint")
    # The most refinement steps; among those, the best BLEU (e.g. the distilled model), then the first row.
    row = max(nar, key=lambda r: (r.get("steps") or 0, r.get("bleu") or 0.0))
    samples = path / "samples.jsonl"
    if not samples.is_file():
        raise UserError(f"{path} has no samples.jsonl (its test sources); re-run `narbench run` or use --checkpoint")
    picked = sorted((s for s in _read_jsonl(samples)
                     if s.get("system") == row["system"] and s.get("test_set") == row["test_set"]),
                    key=lambda s: s.get("index", 0))
    if not picked:
        raise UserError(f"{samples} has no sentences for {row['system']} on {row['test_set']}; use --checkpoint")
    opts = row.get("decoder_options") or {}
    pick = lambda key, default: opts.get(key) or row.get(key) or default
    return AttentionJob(checkpoint=row["checkpoint"], sources=tuple(s["source"] for s in picked),
                        origin=f"run {path}, system {row['system']}, test set {row['test_set']}",
                        steps=int(row.get("steps") or 4), length_hyps=int(pick("length_hyps", 5)),
                        remask=str(pick("remask", "stutter")), init=str(pick("init", "random")))


def job_from_checkpoint(checkpoint: str, task: str | None = None, split: str = "test") -> AttentionJob:
    """A checkpoint plus the sources of a task split (default: the checkpoint's own task)."""
    from models.checkpoint import read_meta

    meta = read_meta(Path(checkpoint))
    if meta is None:
        raise UserError(f"no checkpoint in {checkpoint} (no narbench.json); train one with `narbench train`")
    task = task or str(meta.get("task", "")).removesuffix("_distilled")
    if not task:
        raise UserError("the checkpoint names no task; pass --task NAME")
    from suites.tasks import load_text

    sources, _ = load_text(task, split)
    return AttentionJob(checkpoint=str(checkpoint), sources=tuple(sources),
                        origin=f"checkpoint {checkpoint}, task {task}, split {split}")


def analyse(job: AttentionJob, batch_size: int = 16):
    """Load the checkpoint and run ``analyse_model`` on the job's sources."""
    from models.checkpoint import load
    from models.decoders import checkpoint_vocabulary

    config, params, meta = load(job.checkpoint)
    if config.kind != "padir":
        raise UserError(f"{job.checkpoint} is an AR checkpoint; the attention analysis needs a PaDIR model")
    stats, info = analyse_model(config, params, checkpoint_vocabulary(meta), job.sources[: job.max_sentences],
                                steps=job.steps, length_hyps=job.length_hyps, remask=job.remask, init=job.init,
                                seed=job.seed, batch_size=batch_size)
    info.update(origin=job.origin, checkpoint=job.checkpoint, task=meta.get("task"))
    return stats, info


def _bucket(length: int, cap: int) -> int:
    return min(next((b for b in BUCKETS if b >= length), BUCKETS[-1]), cap)


def analyse_model(config, params, vocab, sources, steps=4, length_hyps=5, remask="stutter", init="random",
                  seed=0, batch_size=16):
    """(PairStats over all sentences, info) for an in-memory PaDIR model and a vocabulary with
    ``encode(str) -> list[int]``."""
    from models import refine, t5

    if not sources:
        raise UserError("no source sentences to analyse")
    model = t5.make_model(config)
    max_len = config.max_target_length

    @jax.jit
    def lengths_of(params, inputs):
        enc = model.apply({"params": params}, inputs, method=t5.PaDIR.encode)               # [b, s, d]
        logits = model.apply({"params": params}, enc, inputs, method=t5.PaDIR.predict_length)
        return enc, refine.top_k_lengths(logits, length_hyps, max_len)                      # [b, k]

    @functools.partial(jax.jit, static_argnums=(5,))
    def refine_and_attend(params, enc, inputs, lengths, rng, capacity):
        b, k = lengths.shape
        enc_k, inp_k = jnp.repeat(enc, k, axis=0), jnp.repeat(inputs, k, axis=0)            # [b*k, ...]
        fn = lambda tok, m: model.apply({"params": params}, enc_k, inp_k, tok, m, method=t5.PaDIR.refine)
        init_key, loop_key = jax.random.split(rng)
        mask = (jnp.arange(capacity)[None] < jnp.minimum(lengths, capacity).reshape(b * k, 1)).astype(jnp.int32)
        start = jnp.where(mask > 0, refine.replacement_tokens(init_key, mask.shape, init, config.vocab_size), 0)
        res = refine.iterative_refinement(fn, start, mask, steps, loop_key, remask, init, config.vocab_size)
        best = jnp.argmax(res.score.reshape(b, k), axis=1)                                   # [b]
        pick = lambda x: jnp.take_along_axis(x.reshape(b, k, -1), best[:, None, None], axis=1)[:, 0]
        tokens, tmask = pick(res.tokens), pick(mask)                                          # [b, n]
        passes = pick(res.passes[:, None])[:, 0]                                              # [b]
        _, inter = model.apply({"params": params}, enc, inputs, tokens, tmask, method=t5.PaDIR.refine,
                               mutable=["intermediates"])
        dec = inter["intermediates"]["decoder"]
        return tokens, tmask, passes, dec["self_attention"][0], dec["cross_attention"][0]

    rows = [list(vocab.encode(s))[: BUCKETS[-1] - 1] + [EOS_ID] for s in sources]
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))       # similar lengths share a bucket
    parts, passes_all, converged = [], [], []
    key = jax.random.key(seed)
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        s_len = _bucket(max(len(rows[i]) for i in idx), BUCKETS[-1])
        inputs = np.zeros((batch_size, s_len), np.int32)
        inputs[:, 0] = EOS_ID                                          # batch-padding rows
        for r, i in enumerate(idx):
            inputs[r, : len(rows[i])] = rows[i]
        enc, lengths = lengths_of(params, jnp.asarray(inputs))
        capacity = _bucket(int(jnp.max(lengths[: len(idx)])), max_len)
        tokens, tmask, passes, self_w, cross_w = jax.device_get(
            refine_and_attend(params, enc, jnp.asarray(inputs), lengths, jax.random.fold_in(key, start), capacity))
        for r, i in enumerate(idx):
            toks = tokens[r][tmask[r] > 0]
            eos = np.flatnonzero(toks == EOS_ID)
            n = int(eos[0]) if eos.size else len(toks)
            if n < 2:
                continue
            src = len(rows[i])
            parts.append(attention.sentence_pair_stats(self_w[r, :, :n, :n], cross_w[r, :, :n, :src], toks[:n]))
            passes_all.append(int(passes[r]))
            converged.append(int(passes[r]) < steps)
    if not parts:
        raise UserError("every output had fewer than 2 tokens; nothing to pair (is the checkpoint trained?)")
    stats = attention.concat(parts)
    info = dict(sentences=len(parts), total_pairs=int(stats.stutter.size), stutter_pairs=int(stats.stutter.sum()),
                passes_mean=float(np.mean(passes_all)), converged_share=float(np.mean(converged)),
                steps=steps, length_hyps=length_hyps, remask=remask, init=init, seed=seed)
    return stats, info


def describe(info: dict) -> str:
    return (f"Model outputs: {info.get('origin', 'in-memory model')}; {info['sentences']} sentences, "
            f"{info['total_pairs']} adjacent pairs of which {info['stutter_pairs']} stutter; refine:{info['steps']}, "
            f"{info['length_hyps']} length hypotheses, remask {info['remask']}, init {info['init']}; "
            f"mean passes {info['passes_mean']:.2f}; refinement converged before T for "
            f"{100 * info['converged_share']:.0f}% of sentences (then the analysed pass is the one that "
            "produced the output). Entries: mean ± std.\n")
