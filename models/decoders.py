"""Decoders the harness compares (AR greedy / beam, PaDIR refine:T), built from a checkpoint.

Each implements ``bench.measure.decoder.Decoder`` structurally: ``prepare`` tokenizes and pads to a source
bucket (16/32/64/128 by default), ``run`` is the jitted device part (parameters are jit arguments),
``finish`` detokenizes. Target capacity depends on the source bucket s: target buckets between s/2
and 2s (capped by ``max_decode_length``). AR decodes up to the largest of them; PaDIR reads its k
predicted lengths back to the host (one small transfer) and refines in the smallest bucket that
holds them, so a pass costs what the predicted lengths need, with few compiled shapes.
``run`` returns a ``DeviceOutput``; ``PaDIRDecoder.refine_with_history`` runs the same jitted
refinement and also returns its per-pass history (optionally with the last layer's attention).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from narbench_core import defaults, phases
from narbench_core.errors import UserError
from narbench_core.outputs import DecodeOutput
from narbench_core.tokens import EOS_ID, FIRST_REGULAR_ID
from models import decoding, refine, t5
from models.config import ModelConfig

Array = jax.Array


class DeviceOutput(NamedTuple):
    """What ``run`` returns: device arrays, not yet transferred."""
    tokens: Array                        # [B, n] int32 each row's best hypothesis (text up to its first EOS)
    passes: Array                        # [B] int32 decoder passes run per row
    score: Array                         # [B] float32 AR: log-prob (beam: / length penalty); PaDIR: mean log-prob


@dataclass
class Prepared:
    inputs: np.ndarray                   # [B, S] int32 source ids (EOS appended, 0-padded to a bucket)
    num_sources: int                     # real rows; the rest pad the batch to a warmed-up size
    target_bucket: Optional[int] = None  # PaDIR: force this target bucket (warm-up)

    @property
    def active(self) -> np.ndarray:
        """[B] bool: real rows (batch-padding rows start finished, so they never lengthen a loop)."""
        return np.arange(self.inputs.shape[0]) < self.num_sources


@dataclass
class _Parsed:
    algorithm: str                       # "greedy" | "beam" | "refine"
    k: int = 1                           # beam size or refinement iterations T


def capped_buckets(buckets: Sequence[int], max_decode_length: int) -> list[int]:
    """Every target capacity: the buckets capped at (and including) the max decode length."""
    return sorted({min(b, max_decode_length) for b in tuple(buckets) + (max_decode_length,)})


def target_buckets(buckets: Sequence[int], max_decode_length: int, source_bucket: int) -> list[int]:
    """Target capacities allowed for a source bucket: buckets in [s/2, 2s], capped (an AR decoder
    decodes at most the largest of them)."""
    capped = capped_buckets(buckets, max_decode_length)
    allowed = [t for t in capped if source_bucket / 2 <= t <= 2 * source_bucket]
    return allowed or [min(capped, key=lambda t: abs(t - source_bucket))]


def source_bucket(buckets: Sequence[int], length: int) -> int:
    """The smallest source bucket that holds ``length`` tokens (the largest if none does)."""
    return next((b for b in sorted(buckets) if b >= length), max(buckets))


def parse_spec(spec: str) -> _Parsed:
    name, _, arg = str(spec).strip().partition(":")
    if name == "greedy" and not arg:
        return _Parsed("greedy")
    if name in ("beam", "refine") and arg.strip().isdigit():
        k = int(arg)
        if k < 1:
            what = "refinement iterations" if name == "refine" else "beam size"
            raise UserError(f"decoder {spec!r}: {what} must be >= 1, e.g. {name}:4")
        return _Parsed(name, k)
    raise UserError(f"unknown decoder {spec!r}; use greedy, beam:K or refine:T (e.g. beam:5, refine:4)")


def check_beam(parsed: _Parsed, vocab_size: int) -> None:
    """A beam wider than the tokens a step can choose from keeps the same hypotheses several times and fills
    memory with them (``beam:99999`` asked for 99,999 rows of KV cache a sentence): refused in one line."""
    choices = vocab_size - FIRST_REGULAR_ID
    if parsed.algorithm == "beam" and parsed.k > choices:
        raise UserError(f"decoder beam:{parsed.k}: the beam cannot be wider than the {choices} tokens the "
                        f"vocabulary offers a step; use beam:K with K <= {choices} (beam:4 or beam:5 are usual)")


def detokenize(vocab: Any, ids) -> str:
    """Token ids -> text: cut at the first EOS, special ids (pad, unk, <mask>) dropped."""
    ids = [int(i) for i in ids]
    if EOS_ID in ids:
        ids = ids[:ids.index(EOS_ID)]
    return vocab.decode([i for i in ids if FIRST_REGULAR_ID <= i < vocab.vocab_size])


# Parts of a decode that ``lower`` costs besides "encode": name -> chained decoder passes.
LOWER_PASSES = {"pass": 1, "pass2": 2}


class SourceBuckets:
    """Shapes and the host side of a decoder: sources tokenized, cut to the largest bucket and padded to the
    smallest that holds them; warm-up inputs for every bucket. The class that mixes it in sets ``vocab``,
    ``buckets`` (sorted), ``max_decode_length`` and ``_warm_batches`` (a set)."""

    # -- shapes ---------------------------------------------------------------------------------
    def _capped_buckets(self) -> list[int]:
        return capped_buckets(self.buckets, self.max_decode_length)

    def target_buckets(self, source_bucket: int) -> list[int]:
        return target_buckets(self.buckets, self.max_decode_length, source_bucket)

    def _source_bucket(self, length: int) -> int:
        return source_bucket(self.buckets, length)

    @property
    def max_source_tokens(self) -> int:
        """The longest source ``prepare`` keeps, EOS included (the largest shape bucket): a longer one
        is cut to its first ``max_source_tokens - 1`` tokens plus EOS."""
        return self.buckets[-1]

    def count_truncated(self, sources: Sequence[str]) -> int:
        """How many of ``sources`` ``prepare`` cuts to ``max_source_tokens``."""
        return sum(len(self.vocab.encode(s)) + 1 > self.max_source_tokens for s in sources)

    def prepare(self, sources: Sequence[str]) -> Prepared:
        if len(sources) == 0:
            raise UserError("no sources to translate; give at least one sentence")
        cap = self.max_source_tokens
        rows = [list(self.vocab.encode(s))[: cap - 1] + [EOS_ID] for s in sources]
        bucket = self._source_bucket(max(len(r) for r in rows))
        batch = min((b for b in self._warm_batches if b >= len(rows)), default=len(rows))
        inputs = np.zeros((batch, bucket), np.int32)
        inputs[len(rows):, 0] = EOS_ID                                       # batch-padding rows
        for i, r in enumerate(rows):
            inputs[i, : len(r)] = r
        return Prepared(inputs, len(rows))

    def warmup_inputs(self, batch_size: int) -> list[Prepared]:
        self._warm_batches.add(int(batch_size))
        out = []
        for bucket in self.buckets:
            inputs = np.zeros((batch_size, bucket), np.int32)
            inputs[:, : bucket - 1] = FIRST_REGULAR_ID
            inputs[:, bucket - 1] = EOS_ID
            out.extend(self._warmup_variants(inputs, batch_size))
        return out

    def _warmup_variants(self, inputs: np.ndarray, batch_size: int) -> list[Prepared]:
        return [Prepared(inputs, batch_size)]


class _BaseDecoder(SourceBuckets):
    ALGORITHMS: tuple[str, ...] = ()     # the decoder specs this class runs (greedy, beam, refine)
    MODEL: str = ""                      # the checkpoint it runs on, for error messages
    SPECS: str = ""                      # how to write its decoder specs, for error messages

    def __init__(self, config: ModelConfig, params: Any, vocab: Any, parsed: _Parsed, name: str,
                 buckets: Sequence[int] = defaults.DECODE_BUCKETS, max_decode_length: Optional[int] = None,
                 force_length: Optional[int] = None):
        """``force_length``: decode exactly this many target tokens whatever the model predicts (AR:
        EOS ends nothing; PaDIR: every length hypothesis has it), for latency with random weights."""
        self.config, self.vocab, self.parsed, self.name = config, vocab, parsed, name
        self.model = t5.make_model(config)
        self.params = jax.device_put(params)
        self.buckets = tuple(sorted({int(b) for b in buckets}))
        self.max_decode_length = int(min(max_decode_length or config.max_target_length, config.max_target_length))
        if force_length is not None and not 1 <= int(force_length) <= self.max_decode_length:
            raise UserError(f"force_length must be in [1, {self.max_decode_length}] (the max decode length), "
                            f"got {force_length}")
        self.force_length = None if force_length is None else int(force_length)
        self._warm_batches: set[int] = set()

    def finish(self, outputs: DeviceOutput, prepared: Prepared) -> "DecodeOutput":
        tokens, passes = jax.device_get((outputs.tokens, outputs.passes))   # [B, n], [B]
        phases.mark(phases.HOST_SYNC)
        n = prepared.num_sources
        hyps = [detokenize(self.vocab, row) for row in np.asarray(tokens)[:n]]
        return DecodeOutput(hyps, np.asarray(passes)[:n].astype(np.int64))

    def lower(self, prepared: Prepared, part: str):
        """The lowered computation of one ``part`` for cost analysis: "encode", one decoder "pass", or
        "pass2": two chained passes, in which XLA computes the work that does not depend on the
        tokens (the cross-attention keys and values of the source) once, as its decode loop does."""
        if part == "encode":
            return self._lower_encode(jnp.asarray(prepared.inputs))
        if part not in LOWER_PASSES:
            raise UserError(f"unknown part {part!r}; use encode, {' or '.join(LOWER_PASSES)}")
        return self._lower_pass(prepared, LOWER_PASSES[part])


class ARDecoder(_BaseDecoder):
    """Greedy (cached or uncached) or beam search; ``passes`` = decoder passes run per sentence.
    With ``force_length`` every row decodes exactly that many tokens (EOS does not end it)."""
    ALGORITHMS = ("greedy", "beam")
    MODEL, SPECS = "an AR checkpoint", "greedy or beam:K"

    def __init__(self, *args, cached: bool = True, length_penalty: float = defaults.LENGTH_PENALTY, **kw):
        super().__init__(*args, **kw)
        self.cached, self.length_penalty = bool(cached), float(length_penalty)
        if self.parsed.algorithm == "beam" and not self.cached:
            raise UserError("beam search always uses the KV cache; drop cached=False")
        check_beam(self.parsed, self.config.vocab_size)
        self._encode_jit = jax.jit(self._encode)
        self._decode_jit = jax.jit(self._device_decode, static_argnums=(4,))

    def max_len(self, source_bucket: int) -> int:
        return self.force_length or max(self.target_buckets(source_bucket))

    def _encode(self, params, inputs):
        return self.model.apply({"params": params}, inputs, method=t5.Transformer.encode)   # [b, s, d]

    def _step(self, params, cache, encoded, inputs, tokens):
        """One cached decoder pass: tokens [b, 1] -> logits [b, V], new cache."""
        logits, state = self.model.apply({"params": params, "cache": cache}, encoded, inputs, tokens,
                                         decode=True, mutable=["cache"], method=t5.Transformer.decode)
        return logits[:, 0], state["cache"]

    def _uncached_pass(self, params, encoded, inputs, seqs, index):
        """One uncached pass over the whole prefix buffer seqs [b, L]: logits [b, V] at ``index``."""
        logits = self.model.apply({"params": params}, encoded, inputs, seqs, logit_index=index,
                                  method=t5.Transformer.decode)
        return logits[:, 0]

    def _device_decode(self, params, encoded, inputs, active, max_len: int) -> DeviceOutput:
        b = inputs.shape[0]
        eos_id = EOS_ID if self.force_length is None else decoding.NO_EOS
        if self.parsed.algorithm == "beam":
            k = self.parsed.k   # beams [b*k] attend to their source once (encoded [b, s, d]: grouped cross-attention)
            cache = t5.init_cache(self.config, b * k, inputs.shape[1], max_len)
            fn = lambda tok, c: self._step(params, c, encoded, inputs, tok)
            res = decoding.beam_search(fn, cache, b, k, max_len, self.length_penalty, eos_id, active)
            return DeviceOutput(tokens=res.tokens[:, 0], passes=res.passes, score=res.scores[:, 0])
        if self.cached:
            cache = t5.init_cache(self.config, b, inputs.shape[1], max_len)
            fn = lambda tok, c: self._step(params, c, encoded, inputs, tok)
            res = decoding.greedy_search(fn, cache, b, max_len, eos_id, active)
        else:
            fn = lambda seqs, i: self._uncached_pass(params, encoded, inputs, seqs, i)
            res = decoding.greedy_search_uncached(fn, b, max_len, eos_id, active)
        return DeviceOutput(tokens=res.tokens, passes=res.passes, score=res.scores)

    def run(self, prepared: Prepared) -> DeviceOutput:
        inputs = jnp.asarray(prepared.inputs)
        encoded = self._encode_jit(self.params, inputs)                                   # [B, S, d]
        if phases.active():          # timed: wait for the encoder, so its time is a phase of its own
            jax.block_until_ready(encoded)
            phases.mark(phases.ENCODE)
            phases.sync()
        return self._decode_jit(self.params, encoded, inputs, jnp.asarray(prepared.active),
                                self.max_len(prepared.inputs.shape[1]))

    def _lower_encode(self, inputs):
        return jax.jit(self._encode).lower(self.params, inputs)

    def _lower_pass(self, prepared: Prepared, passes: int):
        b, s = prepared.inputs.shape
        rows = b * (self.parsed.k if self.parsed.algorithm == "beam" else 1)                  # decoder rows
        max_len = self.max_len(s)
        encoded = jax.ShapeDtypeStruct((b, s, self.config.d_model), self.config.jnp_dtype)  # once per source
        inputs = jax.ShapeDtypeStruct((b, s), jnp.int32)
        if self.parsed.algorithm == "greedy" and not self.cached:
            def uncached(params, encoded, inputs, seqs, index):
                for i in range(passes):
                    logits = self._uncached_pass(params, encoded, inputs, seqs, index + i)    # [b, V]
                    seqs = seqs.at[:, index + i + 1].set(jnp.argmax(logits, axis=-1))
                return logits

            seqs = jax.ShapeDtypeStruct((rows, max_len), jnp.int32)
            return jax.jit(uncached).lower(self.params, encoded, inputs, seqs, jnp.int32(0))

        def cached(params, cache, encoded, inputs, tokens):
            for _ in range(passes):
                logits, cache = self._step(params, cache, encoded, inputs, tokens)            # [b, V]
                tokens = jnp.argmax(logits, axis=-1)[:, None]                                 # [b, 1]
            return logits, cache

        cache = jax.eval_shape(lambda: t5.init_cache(self.config, rows, s, max_len))
        tokens = jax.ShapeDtypeStruct((rows, 1), jnp.int32)
        return jax.jit(cached).lower(self.params, cache, encoded, inputs, tokens)


class PaDIRDecoder(_BaseDecoder):
    """refine:T with k length hypotheses; ``passes`` = refinement passes run per sentence.
    ``early_stop=False`` runs exactly T passes; with ``force_length`` every hypothesis has that length
    (the length predictor does not run) and refines in the one capacity that holds it. ``keep_repeats`` skips the
    last step's dropping of consecutive repeats, and ``run_at_lengths`` refines at given lengths instead of the
    predicted ones (oracle lengths): diagnostics of where a gap to AR comes from (``bench.gap``)."""
    ALGORITHMS = ("refine",)
    MODEL, SPECS = "a PaDIR checkpoint", "refine:T (e.g. refine:4)"

    def __init__(self, *args, length_hyps: int = defaults.LENGTH_HYPS, remask: str = defaults.REMASK,
                 start: str = defaults.START, seed: int = 0, early_stop: bool = True,
                 length_bonus: int = defaults.LENGTH_BONUS, keep_repeats: bool = False, **kw):
        super().__init__(*args, **kw)
        check_refine_options(remask, start, length_hyps, length_bonus)
        self.length_hyps, self.remask, self.start = int(length_hyps), remask, start
        self.keep_repeats = bool(keep_repeats)
        self.length_bonus = int(length_bonus)
        self.early_stop, self.seed = bool(early_stop), int(seed)
        self.rng = jax.random.key(self.seed)
        # Shared like the loop: a timing worker hosts every PaDIR system of its family, and an executable per
        # decoder instance would map its code again each time (the kernel's map limit ends the process).
        self._encode = _shared_encode(self.config, self.length_hyps, self.max_decode_length, self.force_length,
                                      self.length_bonus)
        # T is a traced argument and the jitted loop is shared by every PaDIR decoder
        # of the same model config and options, so refine:1/2/4/10 compile each shape once in memory
        # (re-reading one's own executable from JAX's persistent cache segfaulted in jaxlib 0.10.2).
        self._refine = _shared_refine(self.config, self.length_hyps, remask, start, self.max_decode_length,
                                      self.early_stop, self.keep_repeats)
        self._num_iterations = jax.device_put(np.int32(self.parsed.k))

    def _encode_and_lengths(self, params, inputs):
        """Encoder + length prediction (``encode_and_lengths``) with this decoder's options."""
        return encode_and_lengths(self.model, params, inputs, self.length_hyps, self.max_decode_length,
                                  self.force_length, self.length_bonus)

    def target_buckets(self, source_bucket: int) -> list[int]:
        """As for every decoder; with ``force_length`` the smallest capacity that holds it, for any source."""
        if self.force_length is None:
            return super().target_buckets(source_bucket)
        return [next(t for t in self._capped_buckets() if t >= self.force_length)]

    def _pass(self, params, encoded, inputs, tokens, mask):
        """One parallel decoder pass: tokens/mask [b*k, n] -> logits [b*k, n, V]."""
        return self.model.apply({"params": params}, encoded, inputs, tokens, mask, method=t5.PaDIR.refine)

    def _choose_bucket(self, source_bucket: int, longest: int) -> int:
        allowed = self.target_buckets(source_bucket)
        return next((t for t in allowed if t >= longest), allowed[-1])

    def run(self, prepared: Prepared) -> DeviceOutput:
        out = self._encode_and_refine(prepared)
        return DeviceOutput(tokens=out.tokens, passes=out.passes, score=out.score)

    def run_at_lengths(self, prepared: Prepared, lengths: Sequence[int]) -> DeviceOutput:
        """``run`` with every hypothesis of row i at ``lengths[i]`` tokens (EOS included, clipped to [1,
        max_decode_length]) instead of the predicted lengths: the oracle-length diagnostic."""
        inputs = jnp.asarray(prepared.inputs)
        encoded, _ = self._encode(self.params, inputs)
        given = np.ones(inputs.shape[0], np.int32)
        given[:len(lengths)] = np.clip(np.asarray(lengths, np.int32), 1, self.max_decode_length)
        at = jnp.asarray(np.repeat(given[:, None], self.length_hyps, axis=1))                     # [b, k]
        capacity = prepared.target_bucket or self._choose_bucket(inputs.shape[1], int(given[prepared.active].max()))
        out = self._refine(self.params, encoded, inputs, at, jnp.asarray(prepared.active), self.rng,
                           self._num_iterations, capacity)
        return DeviceOutput(tokens=out.tokens, passes=out.passes, score=out.score)

    def refine_with_history(self, prepared: Prepared, attention: bool = False) -> refine.RefineOutput:
        """``run``'s refinement (the same jitted loop, compiled once more with the history on) plus its
        ``refine.RefineHistory`` over T passes: per pass the best hypothesis's argmax tokens [T, B, n]
        before repeat-dropping, the rows that ran it [T, B] and its mask [B, n]; with ``attention``
        also ``aux["self_attention"]`` [T, B, heads, n, n] and ``aux["cross_attention"]``
        [T, B, heads, n, S] of the last decoder layer in each pass."""
        return self._encode_and_refine(prepared, history_iterations=self.parsed.k, attention=attention)

    def _encode_and_refine(self, prepared: Prepared, **history: Any) -> refine.RefineOutput:
        inputs = jnp.asarray(prepared.inputs)
        encoded, lengths = self._encode(self.params, inputs)
        active = jnp.asarray(prepared.active)
        jax.block_until_ready(lengths)
        phases.mark(phases.ENCODE)
        longest = int(np.max(np.asarray(lengths)[prepared.active]))                   # host sync (tiny)
        phases.mark(phases.HOST_SYNC)
        phases.sync()
        capacity = prepared.target_bucket or self._choose_bucket(inputs.shape[1], longest)
        return self._refine(self.params, encoded, inputs, lengths, active, self.rng, self._num_iterations, capacity,
                            **history)

    def _warmup_variants(self, inputs: np.ndarray, batch_size: int) -> list[Prepared]:
        return [Prepared(inputs, batch_size, t) for t in self.target_buckets(inputs.shape[1])]

    def _lower_encode(self, inputs):
        return jax.jit(self._encode_and_lengths).lower(self.params, inputs)

    def _lower_pass(self, prepared: Prepared, passes: int):
        b, s = prepared.inputs.shape
        n_src = int(np.max((prepared.inputs > 0).sum(axis=1)))
        capacity = prepared.target_bucket or self._choose_bucket(s, n_src)
        encoded = jax.eval_shape(self._encode_and_lengths, self.params, prepared.inputs)[0]   # [b, s(+1), d]
        tokens = jax.ShapeDtypeStruct((b * self.length_hyps, capacity), jnp.int32)             # [b*k, n]

        def chained(params, encoded, inputs, tokens, mask):
            for _ in range(passes):
                logits = self._pass(params, encoded, inputs, tokens, mask)                    # [b*k, n, V]
                tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)                        # [b*k, n]
            return logits

        return jax.jit(chained).lower(self.params, encoded, jax.ShapeDtypeStruct((b, s), jnp.int32), tokens, tokens)


def check_refine_options(remask: str, start: str, length_hyps: int, length_bonus: int) -> None:
    """A one-line ``UserError`` for a PaDIR decoding option out of range (every runtime's PaDIR decoder)."""
    if remask not in defaults.REMASK_MODES:
        raise UserError(f"unknown remask {remask!r}; use one of {', '.join(defaults.REMASK_MODES)}")
    if start not in defaults.START_MODES:
        raise UserError(f"unknown start {start!r}; use one of {', '.join(defaults.START_MODES)}")
    if int(length_hyps) < 1:
        raise UserError(f"length_hyps must be >= 1, got {length_hyps}")
    if int(length_bonus) != length_bonus:
        raise UserError(f"length_bonus must be a whole number of tokens, got {length_bonus}")


def encode_and_lengths(model, params, inputs, length_hyps: int, max_decode_length: int, force_length: int | None,
                       length_bonus: int):
    """Encoder + length prediction: encoded [b, s, d], top-k lengths [b, k] in [1, max], each plus
    ``length_bonus`` tokens (``force_length`` for every hypothesis if set)."""
    v = {"params": params}
    encoded = model.apply(v, inputs, method=t5.PaDIR.encode)
    if force_length is not None:
        return encoded, jnp.full((inputs.shape[0], length_hyps), force_length, jnp.int32)
    logits = model.apply(v, encoded, inputs, method=t5.PaDIR.predict_length)                  # [b, L + 1]
    lengths = refine.top_k_lengths(logits, length_hyps, max_decode_length)                     # [b, k]
    return encoded, jnp.clip(lengths + length_bonus, 1, max_decode_length)


@functools.lru_cache(maxsize=None)
def _shared_encode(config: ModelConfig, length_hyps: int, max_decode_length: int, force_length: int | None,
                   length_bonus: int):
    """The jitted ``encode_and_lengths`` for one model config and length options, shared by every PaDIR
    decoder with them (the parameters are an argument)."""
    model = t5.make_model(config)
    return jax.jit(functools.partial(encode_and_lengths, model, length_hyps=length_hyps,
                                     max_decode_length=max_decode_length, force_length=force_length,
                                     length_bonus=length_bonus))


@functools.lru_cache(maxsize=None)
def _shared_refine(config: ModelConfig, length_hyps: int, remask: str, start: str, max_decode_length: int,
                   early_stop: bool, keep_repeats: bool = False):
    """The jitted refinement of k length hypotheses for one model config and decoding options; the
    T is an argument; static ones: the target capacity, ``history_iterations`` (0: no history,
    else the passes the history holds) and ``attention`` (the history keeps the attention weights)."""
    model = t5.make_model(config)

    def refine_all(params, encoded, inputs, lengths, active, rng, num_iterations, capacity: int,
                   history_iterations: int = 0, attention: bool = False) -> refine.RefineOutput:
        def fn(tokens, mask):
            """One pass over tokens/mask [b*k, n] (encoded [b, s, d], once per source): logits [b*k, n, V];
            with ``attention`` also the last layer's weights."""
            if not attention:
                return model.apply({"params": params}, encoded, inputs, tokens, mask, method=t5.PaDIR.refine)
            logits, state = model.apply({"params": params}, encoded, inputs, tokens, mask, method=t5.PaDIR.refine,
                                        mutable=["intermediates"])
            sown = state["intermediates"]["decoder"]
            return logits, {"self_attention": sown["self_attention"][0],              # [b*k, h, n, n]
                            "cross_attention": sown["cross_attention"][0]}            # [b*k, h, n, s]

        return refine.refine_length_hypotheses(fn, jnp.minimum(lengths, capacity), capacity, num_iterations, rng,
                                               remask, start, config.vocab_size, early_stop, active,
                                               retain_history=history_iterations > 0, history_iterations=history_iterations or None,
                                               fixed_eos=config.fixed_eos, keep_repeats=keep_repeats)

    return jax.jit(refine_all, static_argnames=("capacity", "history_iterations", "attention"))


DECODERS = {"ar": ARDecoder, "padir": PaDIRDecoder}   # model kind -> the decoder class that runs it


def make_decoder(model_config: ModelConfig, params: Any, vocab: Any, spec: str, **options: Any):
    """A decoder for ``spec`` (greedy | beam:K | refine:T) from an in-memory model and vocabulary.

    The model's kind picks the decoder class; the class checks that it runs ``spec`` and takes
    ``options`` (its keyword arguments). ``name`` defaults to the spec itself: system names are the
    harness's (its families make them), not the decoder's.
    """
    parsed = parse_spec(spec)
    cls = DECODERS[model_config.kind]
    if parsed.algorithm not in cls.ALGORITHMS:
        needs = next(c for c in DECODERS.values() if parsed.algorithm in c.ALGORITHMS)
        raise UserError(f"decoder {spec!r} needs {needs.MODEL}; use {cls.SPECS} for {cls.MODEL}")
    known = _option_names(cls)
    unknown = sorted(set(options) - known)
    if unknown:
        raise UserError(f"decoder options {unknown} do not apply to {cls.MODEL}; known: {', '.join(sorted(known))}")
    options = {k: v for k, v in options.items() if v is not None}
    return cls(model_config, params, vocab, parsed, name=options.pop("name", str(spec)), **options)


def _option_names(cls) -> set[str]:
    """Keyword options a decoder class takes: its own and its bases' (after the positional ones)."""
    import inspect

    names = set()
    for klass in cls.__mro__:
        if "__init__" in vars(klass):
            names |= {p.name for p in inspect.signature(klass.__init__).parameters.values()
                      if p.kind is p.KEYWORD_ONLY or (p.default is not p.empty)}
    return names | {"name"}


def vocabulary_file(recorded: str):
    """The vocabulary file a checkpoint's record names: relative to the data root (records since 2026-11-28);
    an absolute path of an older record, or where it sits under this data root's ``vocab/`` when the data root
    moved since. None when neither exists."""
    from pathlib import Path

    from narbench_core.paths import resolve

    path = resolve(recorded)
    if path.is_file():
        return path
    moved = resolve(Path("vocab") / Path(recorded).name)
    return moved if Path(recorded).is_absolute() and moved.is_file() else None


def checkpoint_vocabulary(meta: dict):
    """The vocabulary a checkpoint was trained with (its recorded path, else its task's)."""
    path = meta.get("vocab_path")
    if path:
        from suites.sentencepiece_text import SentencePieceText

        found = vocabulary_file(path)
        if found is None:
            raise UserError(f"the checkpoint's vocabulary {path} is missing; rebuild it with the task's data step")
        return SentencePieceText(str(found))  # no seqio: a timing worker loads no TensorFlow
    task = meta.get("task")
    if not task:
        raise UserError("the checkpoint names neither a vocabulary nor a task; retrain it with `narbench train`")
    from suites.catalog import get_vocabulary

    return get_vocabulary(task)


def load_decoder(checkpoint_dir, spec: str, **options: Any):
    """The decoder ``spec`` for the trained checkpoint in ``checkpoint_dir`` (see ``make_decoder``)."""
    parse_spec(spec)  # a bad spec fails before loading anything
    from models.checkpoint import META_FILE

    meta_file = Path(checkpoint_dir) / META_FILE
    record = meta_file.stat() if meta_file.exists() else None
    model_config, params, meta = _load_checkpoint(str(checkpoint_dir), record and (record.st_mtime_ns, record.st_size))
    return make_decoder(model_config, params, checkpoint_vocabulary(meta), spec, **options)


@functools.lru_cache(maxsize=4)
def _load_checkpoint(path: str, record: tuple | None):
    """``models.checkpoint.load`` once per checkpoint in this process: a timing worker builds all of a model's
    decoders, and they share its parameters (7 PaDIR decoders held 7 copies, 0.24 GB more). ``record``
    (its ``narbench.json``'s modification time and size, rewritten at every save) makes a checkpoint
    trained further load again."""
    from models.checkpoint import load

    return load(path)
