"""Fake decoders implementing ``bench.measure.decoder.Decoder`` for harness tests (C1 and C2 import these).

- :class:`FakeClock` + :class:`ScriptedDecoder`: no JAX work; each phase advances a fake clock by a
  fixed number of nanoseconds and appends to a shared event log, so tests can assert exact latencies,
  the interleaving order, and that ``block_until_ready`` was called.
- :class:`JittedDecoder`: a real jitted workload (embedding lookup, then ``passes`` dense tanh
  layers in a ``fori_loop``), with ``lower`` for XLA cost analysis. Flops per pass of the bare
  matmul are ``2 * batch * length * dim**2``.
"""
from __future__ import annotations

import contextlib
from pathlib import Path

from dataclasses import dataclass, field
from functools import partial
from types import SimpleNamespace
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bench.measure.decoder import DecodeOutput
from narbench_core import phases


class FakeClock:
    """Nanosecond clock that only moves when told to."""

    def __init__(self, start: int = 1_000):
        self.now = start

    def __call__(self) -> int:
        return self.now

    def advance(self, ns: int) -> None:
        self.now += int(ns)


@dataclass
class Costs:
    prepare: int = 0   # ns each phase advances the fake clock
    encode: int = 0    # inside run, before its own phase mark (0: the decoder marks no encode phase)
    run: int = 0
    block: int = 0
    finish: int = 0


@dataclass
class _Prepared:
    sources: list[str]
    bucket: int


class _Output:
    """Device output stand-in: ``jax.block_until_ready`` calls its method (a pytree leaf)."""

    def __init__(self, decoder: "ScriptedDecoder", prepared: _Prepared):
        self.decoder, self.prepared, self.blocked = decoder, prepared, False

    def block_until_ready(self):
        self.blocked = True
        self.decoder.clock.advance(self.decoder.costs.block)
        self.decoder.log.append(("block", self.decoder.name, len(self.prepared.sources)))
        return self


@dataclass
class ScriptedDecoder:
    """Hypothesis = the source's words reversed; passes = number of words (or ``fixed_passes``)."""

    name: str
    clock: FakeClock
    log: list = field(default_factory=list)
    costs: Costs = field(default_factory=Costs)
    family: str = "ar"
    buckets: tuple[int, ...] = (8, 16)
    fixed_passes: int | None = None
    info: dict = field(default_factory=dict)
    warmup_costs: int = 0  # extra ns the first run of each bucket takes ("compile")

    def __post_init__(self):
        self._compiled: set[int] = set()

    def _bucket(self, sources: Sequence[str]) -> int:
        longest = max(len(s.split()) for s in sources)
        return next((b for b in self.buckets if b >= longest), self.buckets[-1])

    def prepare(self, sources):
        self.clock.advance(self.costs.prepare)
        self.log.append(("prepare", self.name, len(sources)))
        return _Prepared(list(sources), self._bucket(sources))

    def run(self, prepared):
        if prepared.bucket not in self._compiled:
            self._compiled.add(prepared.bucket)
            self.clock.advance(self.warmup_costs)
        if self.costs.encode:
            self.clock.advance(self.costs.encode)
            phases.mark(phases.ENCODE)
            phases.sync()
        self.clock.advance(self.costs.run)
        self.log.append(("run", self.name, len(prepared.sources)))
        return {"tokens": _Output(self, prepared)}

    def finish(self, outputs, prepared):
        if not outputs["tokens"].blocked:
            raise AssertionError("finish called before block_until_ready")
        self.clock.advance(self.costs.finish)
        self.log.append(("finish", self.name, len(prepared.sources)))
        hyps = [" ".join(reversed(s.split())) for s in prepared.sources]
        passes = [self.fixed_passes or len(s.split()) for s in prepared.sources]
        return DecodeOutput(hypotheses=hyps, passes=np.asarray(passes))

    def warmup_inputs(self, batch_size):
        return [_Prepared(["w " * (b - 1) + "w"] * batch_size, b) for b in self.buckets]

    def lower(self, prepared, part):
        raise NotImplementedError("ScriptedDecoder has no device program; use JittedDecoder")


# ------------------------------------------------------------------------------ real jitted work

def _encode(params, ids):
    return jnp.tanh(params["embed"][ids])                      # [batch, length, dim]


def _one_pass(params, h):
    return jnp.tanh(h @ params["w"])                           # [batch, length, dim]


def _decode(params, ids, passes):
    h = _encode(params, ids)
    h = jax.lax.fori_loop(0, passes, lambda _, x: _one_pass(params, x), h)
    return jnp.argmax(h @ params["embed"].T, axis=-1)          # [batch, length]


class JittedDecoder:
    """A decoder-shaped jitted workload: ``passes`` dense layers over all positions of a bucket."""

    def __init__(self, name: str, passes: int, dim: int = 64, vocab: int = 97,
                 buckets: tuple[int, ...] = (8, 16), family: str = "nar", seed: int = 0):
        self.name, self.family, self.passes = name, family, passes
        self.info = {"iterations": passes}
        self.buckets, self.vocab, self.dim = buckets, vocab, dim
        self.config = SimpleNamespace(d_model=dim, d_ff=dim)      # its GEMM shape, as a model config has
        k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
        self.params = {"embed": jax.random.normal(k1, (vocab, dim)) / np.sqrt(dim),
                       "w": jax.random.normal(k2, (dim, dim)) / np.sqrt(dim)}
        self._run = jax.jit(partial(_decode, passes=passes))

    def prepare(self, sources):
        tokens = [[sum(map(ord, w)) % (self.vocab - 1) + 1 for w in s.split()] for s in sources]
        longest = max(len(t) for t in tokens)
        length = next((b for b in self.buckets if b >= longest), self.buckets[-1])
        ids = np.zeros((len(sources), length), np.int32)       # [batch, length], 0 = pad
        for i, t in enumerate(tokens):
            ids[i, :min(len(t), length)] = t[:length]
        return ids

    def run(self, prepared):
        return self._run(self.params, jnp.asarray(prepared))

    def finish(self, outputs, prepared):
        out = np.asarray(outputs)
        hyps = [" ".join(f"w{t}" for t, keep in zip(row, mask) if keep) for row, mask in zip(out, prepared > 0)]
        return DecodeOutput(hypotheses=hyps, passes=np.full(len(hyps), self.passes))

    def warmup_inputs(self, batch_size):
        return [np.ones((batch_size, b), np.int32) for b in self.buckets]

    def lower(self, prepared, part):
        ids = jnp.asarray(prepared)
        if part == "encode":
            return jax.jit(_encode).lower(self.params, ids)
        if part in ("pass", "pass2"):
            def chained(params, h):
                for _ in range(1 if part == "pass" else 2):
                    h = _one_pass(params, h)
                return h

            h = jax.ShapeDtypeStruct(ids.shape + (self.dim,), jnp.float32)
            return jax.jit(chained).lower(self.params, h)
        raise ValueError(f"unknown part {part!r}")


@contextlib.contextmanager
def saved_figures():
    """Every matplotlib figure saved inside the block, by file name, so a test reads what was drawn."""
    from matplotlib.figure import Figure

    figures, savefig = {}, Figure.savefig

    def keep(fig, path, *args, **kwargs):
        figures[Path(path).name] = fig
        return savefig(fig, path, *args, **kwargs)

    Figure.savefig = keep
    try:
        yield figures
    finally:
        Figure.savefig = savefig
