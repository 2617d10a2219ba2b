"""The one interface every compared system implements (AR greedy, AR beam, PaDIR with any T).

``bench/`` only talks to this protocol and never imports a concrete model class; ``models/`` provides
implementations structurally (it does not import ``bench``). The harness times the three phases:

    prepared = decoder.prepare(sources)          # host: tokenize, pad to a shape bucket
    outputs  = decoder.run(prepared)             # device: the jitted encode + decode (async)
    jax.block_until_ready(outputs)               # the timer synchronises here
    result   = decoder.finish(outputs, prepared) # host: transfer, detokenize

End-to-end latency (the paper's measure) covers all three; device-only covers ``run`` + sync.
Inside the timed window a decoder may split its own work into phases with ``narbench_core.phases``
(``mark("encode")`` once its encoder's outputs are ready, ``mark("host_sync")`` after reading device
values back, ``sync()`` per blocking wait); the timer closes ``tokenize``, ``passes`` and
``detokenize`` itself, so a decoder that marks nothing still gets those three.
"""
from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

from narbench_core.outputs import DecodeOutput


@runtime_checkable
class Decoder(Protocol):
    name: str                  # row id, e.g. "ar-greedy", "ar-beam5", "padir-s4-u0.15-distill"

    def prepare(self, sources: Sequence[str]) -> Any:
        """Host part before the device: tokenize and pad to a shape bucket."""

    def run(self, prepared: Any) -> Any:
        """Device part: jitted encode + decode; returns device arrays without blocking."""

    def finish(self, outputs: Any, prepared: Any) -> DecodeOutput:
        """Host part after the device: transfer results and detokenize."""

    def warmup_inputs(self, batch_size: int) -> list[Any]:
        """One prepared input per shape bucket, so a warm-up compiles every shape before timing."""

    def lower(self, prepared: Any, part: str) -> Any:
        """``jax.stages.Lowered`` of one ``part``: "encode" (encoder + length prediction), "pass"
        (one decoder forward pass) or "pass2" (two chained passes: the second takes the first's argmax,
        so work that does not depend on the tokens is shared), for XLA cost analysis. A decoder that runs outside XLA
        (CTranslate2) sets a class attribute ``xla_costs = False`` and is not costed."""

    # Optional: a decoder that cuts long sources also has ``max_source_tokens`` (the longest source it
    # keeps, EOS included) and ``count_truncated(sources) -> int`` (how many of them ``prepare`` cuts).
    # One whose ``run`` hands batches to workers of its own has ``parallel_batches`` (how many run at a time):
    # untimed batch loops (the distillation's) keep one batch more than that run before finishing the oldest.


__all__ = ["DecodeOutput", "Decoder", "truncated_sources", "truncation_note", "translate"]


def truncated_sources(decoder: Any, sources: Sequence[str]) -> int | None:
    """How many of ``sources`` the decoder cuts to its maximum source length (None: it does not say)."""
    count = getattr(decoder, "count_truncated", None)
    return None if count is None else int(count(list(sources)))


def truncation_note(cut: int, total: int, limit: int | None, where: str = "") -> str:
    """The one-line note ``translate`` and ``eval`` print when sources were cut."""
    limit_text = f" of {limit} tokens (EOS included)" if limit else ""
    return (f"narbench: {cut} of {total} sources{where} are longer than the model's maximum source length"
            f"{limit_text} and were cut to it: their translations cover only the kept part")


def translate(decoder: Decoder, sources: Sequence[str]) -> DecodeOutput:
    """Untimed convenience: all three phases."""
    prepared = decoder.prepare(sources)
    return decoder.finish(decoder.run(prepared), prepared)
