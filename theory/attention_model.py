"""The model hook of the attention analysis: decode with a PaDIR checkpoint, read its attention.

The checkpoint's own decoder (``models.decoders``, ``refine:T`` with the run's length hypotheses,
remask and start options) decodes each batch through ``PaDIRDecoder.refine_with_history``: the same
jitted refinement as ``narbench run``, which also keeps every pass of the best length hypothesis.
From the final pass of each sentence (the one that produced its output) the analysis takes the tokens
BEFORE repeats are dropped (stutter is what we study) and the last decoder layer's attention weights
that ``models.t5`` sows into ``intermediates`` (self-attention [heads, n, n], cross-attention
[heads, n, src]). ``info["converged_share"]`` says how often refinement converged before T (a pass
changed nothing). Pairs are taken over the output tokens before the first EOS; source positions
include the source EOS.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np

from narbench_core import defaults
from narbench_core.errors import UserError
from narbench_core.paths import portable
from narbench_core.tokens import EOS_ID
from theory import attention


@dataclass(frozen=True)
class AttentionJob:
    checkpoint: str
    sources: tuple[str, ...]
    origin: str                 # where the sources and checkpoint came from (for the page)
    iterations: int = 4         # refinement iterations T
    length_hyps: int = defaults.LENGTH_HYPS
    remask: str = defaults.REMASK
    start: str = defaults.START
    max_sentences: int = 300
    seed: int = 0

    def with_overrides(self, **changes) -> "AttentionJob":
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    def config(self) -> dict:
        d = dataclasses.asdict(self)
        d["sources"] = min(len(self.sources), self.max_sentences)
        d["checkpoint"] = portable(self.checkpoint)            # no machine path in a committed page
        return d


def job_from_checkpoint(checkpoint: str, task: str | None = None, split: str = "test") -> AttentionJob:
    """A checkpoint plus the sources of a task split (default: the checkpoint's own task, or the task
    a distilled one was made from)."""
    from models.checkpoint import read_meta
    from suites.tasks import load_text, source_task

    meta = read_meta(Path(checkpoint))
    if meta is None:
        raise UserError(f"no checkpoint in {checkpoint} (no narbench.json); train one with `narbench train`")
    task = task or source_task(str(meta.get("task", "")))
    if not task:
        raise UserError("the checkpoint names no task; pass --task NAME")
    sources, _ = load_text(task, split)
    return AttentionJob(checkpoint=str(checkpoint), sources=tuple(sources),
                        origin=f"checkpoint {checkpoint}, task {task}, split {split}")


def analyse(job: AttentionJob, batch_size: int = 16):
    """Load the checkpoint's ``refine:T`` decoder and run ``analyse_model`` on the job's sources."""
    from models.checkpoint import read_meta
    from models.decoders import load_decoder

    decoder = load_decoder(job.checkpoint, f"refine:{job.iterations}", length_hyps=job.length_hyps, remask=job.remask,
                           start=job.start, seed=job.seed)
    stats, info = analyse_model(decoder, job.sources[: job.max_sentences], batch_size=batch_size)
    info.update(origin=job.origin, checkpoint=portable(job.checkpoint), task=(read_meta(Path(job.checkpoint)) or {}).get("task"))
    return stats, info


def analyse_model(decoder, sources, batch_size=16):
    """(PairStats over all sentences, info) for a ``models.decoders.PaDIRDecoder`` (its vocabulary
    needs only ``encode``); sentences of similar length share a batch."""
    if not sources:
        raise UserError("no source sentences to analyse")
    iterations = decoder.parsed.k
    order = sorted(range(len(sources)), key=lambda i: len(decoder.vocab.encode(sources[i])))
    parts, passes_all = [], []
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        prepared = decoder.prepare([sources[i] for i in idx])
        history = jax.device_get(decoder.refine_with_history(prepared, attention=True).history)
        last = history.active.sum(axis=0) - 1                          # [B] each best hypothesis's final pass
        for r in range(len(idx)):
            toks = history.tokens[last[r], r][history.mask[r] > 0]     # before repeats are dropped
            eos = np.flatnonzero(toks == EOS_ID)
            n = int(eos[0]) if eos.size else len(toks)
            if n < 2:
                continue
            src = int((prepared.inputs[r] > 0).sum())
            self_w = history.aux["self_attention"][last[r], r]         # [heads, n, n]
            cross_w = history.aux["cross_attention"][last[r], r]       # [heads, n, S]
            parts.append(attention.sentence_pair_stats(self_w[:, :n, :n], cross_w[:, :n, :src], toks[:n]))
            passes_all.append(int(last[r]) + 1)
    if not parts:
        raise UserError("every output had fewer than 2 tokens; nothing to pair (is the checkpoint trained?)")
    stats = attention.concat(parts)
    info = dict(sentences=len(parts), total_pairs=int(stats.stutter.size), stutter_pairs=int(stats.stutter.sum()),
                passes_mean=float(np.mean(passes_all)), converged_share=float(np.mean(np.array(passes_all) < iterations)),
                iterations=iterations, length_hyps=decoder.length_hyps, remask=decoder.remask, start=decoder.start,
                seed=decoder.seed)
    return stats, info


def describe(info: dict) -> str:
    return (f"Model outputs: {info.get('origin', 'in-memory model')}; {info['sentences']} sentences, "
            f"{info['total_pairs']} adjacent pairs of which {info['stutter_pairs']} stutter; refine:{info['iterations']}, "
            f"{info['length_hyps']} length hypotheses, remask {info['remask']}, start {info['start']}; "
            f"mean passes {info['passes_mean']:.2f}; refinement converged before T for "
            f"{100 * info['converged_share']:.0f}% of sentences; the analysed pass is each sentence's final "
            "one, which produced its output. Entries: mean ± std.\n")
