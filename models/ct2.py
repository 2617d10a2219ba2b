"""CTranslate2 export of an AR checkpoint (the optional ``ct2`` extra: ``pip install -e ".[ct2]"``).

``build_spec`` lays the Flax parameters out as a CTranslate2 ``TransformerSpec`` with numpy only (no
torch, no transformers). The architecture is narbench's T5.1.1 variant:

- pre-norm RMSNorm (epsilon 1e-6) before each sublayer, and a final norm per stack;
- a gated-GELU FFN (tanh approximation): ``wo(gelu(wi_0 x) * wi_1 x)``;
- one relative-position bias table per stack, shared by its layers (bidirectional in the encoder,
  causal in the decoder), stored by CTranslate2 as [buckets, heads]: narbench's [heads, buckets]
  table is transposed (left as is it would silently read as another bucket count);
- queries scaled by 1/sqrt(head_dim), CTranslate2's default (the Hugging Face T5 loader sets
  ``queries_scale = 1.0``, which would be wrong here);
- one token embedding shared by encoder, decoder and output, no embedding scaling, output logits
  scaled by d_model^-0.5 (``scale_outputs``);
- decoding starts from pad (id 0), as narbench's AR decoder does; the source ends with EOS.

``export`` writes the model folder (atomically). ``spec.validate()`` only takes real numpy arrays, and
``optimize("int8")`` rewrites the arrays in place, so every array handed over is a fresh copy.
"""
from __future__ import annotations

import fcntl
from pathlib import Path
from typing import Any, Optional

import numpy as np

from narbench_core.errors import UserError
from narbench_core.io import check_replaceable, write_export
from narbench_core.tokens import EOS_ID, FIRST_REGULAR_ID, PAD_ID, UNK_ID

QUANTIZATIONS = ("float32", "int8")
EXTRA_HINT = 'pip install -e ".[ct2]"'


def require_ctranslate2():
    """The ``ctranslate2`` module, or a one-line ``UserError`` naming the extra to install."""
    try:
        import ctranslate2
    except ImportError:
        raise UserError(f"CTranslate2 is not installed; install the extra: {EXTRA_HINT}") from None
    return ctranslate2


def _array(x: Any) -> np.ndarray:
    return np.array(np.asarray(x, dtype=np.float32), copy=True)


def _dense(kernel: Any) -> np.ndarray:
    """A Flax kernel [in, ..., out ...] -> CTranslate2's [out, in] weight."""
    k = np.asarray(kernel, np.float32)
    return _array(k.reshape(k.shape[0], -1).T)


def _attention_in(att: dict, names: tuple[str, ...]) -> np.ndarray:
    """Query/key/value kernels [d, h, hd] fused along the output axis: [len(names) * h * hd, d]."""
    return np.concatenate([_dense(att[n]["kernel"]) for n in names], axis=0)


def _attention_out(att: dict) -> np.ndarray:
    """The output kernel [h, hd, d] -> [d, h * hd]."""
    k = np.asarray(att["out"]["kernel"], np.float32)
    return _array(k.reshape(-1, k.shape[-1]).T)


def _norm(spec, scale: Any) -> None:
    spec.gamma = _array(scale)


def _ffn(spec, mlp: dict, norm: dict) -> None:
    _norm(spec.layer_norm, norm["scale"])
    spec.linear_0.weight = _dense(mlp["wi_0"]["kernel"])          # gated by GELU
    spec.linear_0_noact.weight = _dense(mlp["wi_1"]["kernel"])
    spec.linear_1.weight = _dense(mlp["wo"]["kernel"])


def build_spec(config, params: dict, pieces: list[str]):
    """A CTranslate2 ``TransformerSpec`` of an AR ``ModelConfig`` and its Flax ``params``, with the
    SentencePiece ``pieces`` (index = id) as the shared vocabulary."""
    require_ctranslate2()
    from ctranslate2.specs import common_spec, transformer_spec

    if config.kind != "ar":
        raise UserError(f"only AR checkpoints export to CTranslate2; this one is {config.kind!r}")
    if config.num_heads * config.head_dim != config.d_model:
        raise UserError(f"CTranslate2 needs num_heads x head_dim = d_model; this model has "
                        f"{config.num_heads} x {config.head_dim} != {config.d_model}")
    if len(pieces) > config.vocab_size:
        raise UserError(f"the vocabulary has {len(pieces)} pieces but the model only {config.vocab_size}; "
                        "export with the checkpoint's own vocabulary")
    # A SentencePiece model may stop short of the model's vocab_size (a soft limit): the embedding rows
    # past it are never emitted by narbench's decoders; CTranslate2 needs a name for each.
    pieces = list(pieces) + [f"<unused_{i}>" for i in range(len(pieces), config.vocab_size)]
    spec = transformer_spec.TransformerSpec.from_config(
        (config.num_encoder_layers, config.num_decoder_layers), config.num_heads, pre_norm=True,
        activation=common_spec.Activation.GELUTanh, ffn_glu=True, relative_attention_bias=True, rms_norm=True)
    embedding = _array(params["token_embedder"]["embedding"])        # [V, d]
    for stack_spec, stack, decoder in ((spec.encoder, params["encoder"], False),
                                       (spec.decoder, params["decoder"], True)):
        embeddings = stack_spec.embeddings[0] if isinstance(stack_spec.embeddings, list) else stack_spec.embeddings
        embeddings.weight = _array(embedding)
        stack_spec.scale_embeddings = False
        _norm(stack_spec.layer_norm, stack["decoder_norm" if decoder else "encoder_norm"]["scale"])
        bias = _array(np.asarray(stack["relpos_bias"]["rel_embedding"]).T)   # [heads, buckets] -> [buckets, heads]
        distance = np.dtype("int32").type(config.relative_attention_max_distance)
        for i, layer_spec in enumerate(stack_spec.layer):
            layer = stack[f"layers_{i}"]
            att = layer["self_attention" if decoder else "attention"]
            self_spec = layer_spec.self_attention
            _norm(self_spec.layer_norm, layer["pre_self_attention_layer_norm" if decoder
                                              else "pre_attention_layer_norm"]["scale"])
            self_spec.linear[0].weight = _attention_in(att, ("query", "key", "value"))
            self_spec.linear[1].weight = _attention_out(att)
            self_spec.relative_attention_bias = bias if i == 0 else _array(bias)
            self_spec.relative_attention_max_distance = distance
            if decoder:
                cross = layer["encoder_decoder_attention"]
                cross_spec = layer_spec.attention
                _norm(cross_spec.layer_norm, layer["pre_cross_attention_layer_norm"]["scale"])
                cross_spec.linear[0].weight = _attention_in(cross, ("query",))
                cross_spec.linear[1].weight = _attention_in(cross, ("key", "value"))
                cross_spec.linear[2].weight = _attention_out(cross)
            _ffn(layer_spec.ffn, layer["mlp"], layer["pre_mlp_layer_norm"])
    spec.decoder.projection.weight = _array(embedding)
    spec.decoder.scale_outputs = np.float32(config.d_model ** -0.5)
    spec.register_source_vocabulary(list(pieces))
    spec.register_target_vocabulary(list(pieces))
    spec.config.bos_token = pieces[PAD_ID]
    spec.config.decoder_start_token = pieces[PAD_ID]
    spec.config.eos_token = pieces[EOS_ID]
    spec.config.unk_token = pieces[UNK_ID]
    return spec


def vocabulary_pieces(vocab) -> list[str]:
    """The pieces of a seqio SentencePiece vocabulary, index = id."""
    sp = vocab.tokenizer
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size())]


def _export_stamp(folder: Path) -> dict | None:
    """The ``narbench.json`` an export leaves in its folder (checkpoint, steps, quantization, format), or None."""
    from models.checkpoint import read_export_stamp

    return read_export_stamp(folder)


def _is_export(folder: Path) -> bool:
    """A CTranslate2 export narbench wrote before it stamped its folders: ``model.bin`` and narbench's
    ``narbench.json`` with exactly the export's keys (a checkpoint's ``narbench.json`` has others)."""
    record = _export_stamp(folder)
    return (record is not None and {"checkpoint", "steps_done", "quantization", "format"} <= set(record)
            <= {"checkpoint", "steps_done", "params_digest", "quantization", "format", "files"}
            and (folder / "model.bin").is_file())


def export(checkpoint_dir: str | Path, out_dir: str | Path, quantization: str = "float32",
           force: bool = False, vocab: Any = None, cached: bool = False) -> Path:
    """Write the CTranslate2 model of an AR checkpoint to ``out_dir`` (whole or not at all); returns it.
    An export of the same checkpoint (by its parameters' digest) and quantization there, whole (its files'
    digests as written), is kept unless ``force``; anything else is replaced only with ``force`` or ``cached``
    (the runner's cache folder: a stale or damaged export is written again, a whole one kept). ``vocab``
    defaults to the checkpoint's own vocabulary."""
    from models import checkpoint
    from models.decoders import checkpoint_vocabulary

    require_ctranslate2()
    if quantization not in QUANTIZATIONS:
        raise UserError(f"unknown quantization {quantization!r}; use one of {', '.join(QUANTIZATIONS)}")
    out_dir = Path(out_dir)
    stamp = checkpoint.export_stamp(checkpoint_dir, quantization)
    if checkpoint.export_is(out_dir, stamp) and (cached or not force):
        return out_dir                                  # this export, already written, whole
    if out_dir.exists() and not (force or cached):
        what = ("another export (of another checkpoint or quantization, or damaged)" if _is_export(out_dir) else "something else")
        raise UserError(f"{out_dir} exists and holds {what}; pass --force to replace it or choose another --out")
    if out_dir.exists() or out_dir.is_symlink():
        check_replaceable(out_dir, recognise=_is_export)     # --force replaces only narbench's own folders
    config, params, meta = checkpoint.load(checkpoint_dir)        # the weights: only when (re)exporting
    spec = build_spec(config, params, vocabulary_pieces(vocab or checkpoint_vocabulary(meta)))
    spec.validate()
    spec.optimize(quantization=None if quantization == "float32" else quantization)
    return write_export(out_dir, lambda tmp: spec.save(str(tmp)), stamp, "narbench export ct2", _is_export)


def translator(model_dir: str | Path, threads: int, compute_type: str = "default", parallel_batches: int = 1):
    """A CPU ``ctranslate2.Translator``: ``parallel_batches`` translations at a time, each on ``threads`` cores."""
    ct2 = require_ctranslate2()
    return ct2.Translator(str(model_dir), device="cpu", compute_type=compute_type,
                          inter_threads=int(parallel_batches), intra_threads=int(threads))


def source_pieces(vocab, sources: list[str], max_length: Optional[int] = None) -> list[list[str]]:
    """Sources as pieces with EOS appended (truncated like narbench's decoders: ``max_length - 1``
    pieces + EOS)."""
    sp = vocab.tokenizer
    eos = sp.id_to_piece(EOS_ID)
    out = []
    for text in sources:
        pieces = sp.encode_as_pieces(text)
        out.append((pieces[: max_length - 1] if max_length else pieces) + [eos])
    return out


class CT2Decoder:
    """A CTranslate2 translator behind narbench's decoder protocol (``greedy`` or ``beam:K``).

    Shapes follow narbench's AR decoder: the source keeps at most ``buckets[-1] - 1`` pieces plus
    EOS, and a batch decodes at most as many tokens as the AR decoder would for its source bucket.
    With ``parallel_batches = 1`` (the timed systems) ``run`` does all the translating and returns host
    results; ``finish`` detokenizes. With ``parallel_batches = N > 1`` the translator has N workers of
    ``threads`` cores each (CTranslate2's ``inter_threads``): ``run`` hands the batch to them and returns at
    once, ``finish`` waits for it, so N batches run at a time where N are in flight (the distillation's teacher:
    ``models.distill``). It has no XLA program: ``xla_costs`` is False and the harness skips its cost analysis.
    ``passes`` counts decoder steps: the tokens emitted plus EOS, at most the length cap.
    """
    xla_costs = False

    def __init__(self, model_dir: str | Path, vocab: Any, spec: str, name: str = "", *,
                 buckets=None, max_decode_length: Optional[int] = None, max_target_length: int = 128,
                 length_penalty: Optional[float] = None, threads: int = 0, compute_type: str = "default",
                 max_batch_size: int = 0, batch_type: str = "examples", parallel_batches: int = 1):
        import os

        from models.decoders import check_beam, parse_spec
        from narbench_core import defaults

        self.parsed = parse_spec(spec)
        if self.parsed.algorithm not in ("greedy", "beam"):
            raise UserError(f"CTranslate2 runs greedy or beam:K, not {spec!r}")
        self.name, self.vocab = name or spec, vocab
        check_beam(self.parsed, vocab.vocab_size)
        self.buckets = tuple(sorted({int(b) for b in (buckets or defaults.DECODE_BUCKETS)}))
        self.max_decode_length = int(min(max_decode_length or max_target_length, max_target_length))
        self.length_penalty = defaults.LENGTH_PENALTY if length_penalty is None else float(length_penalty)
        self.threads = int(threads) or (os.cpu_count() or 1)
        if int(parallel_batches) < 1:
            raise UserError(f"parallel_batches must be at least 1, not {parallel_batches!r}")
        self.parallel_batches = int(parallel_batches)
        if batch_type not in ("examples", "tokens"):
            raise UserError(f"batch_type must be examples or tokens, not {batch_type!r}")
        self.max_batch_size, self.batch_type = int(max_batch_size), batch_type   # translate_batch's own batching
        from models.checkpoint import check_export

        check_export(model_dir, "CTranslate2", "narbench export ct2")
        self.translator = translator(model_dir, self.threads, compute_type, self.parallel_batches)

    def _max_len(self, pieces: list[list[str]]) -> int:
        from models.decoders import source_bucket, target_buckets

        bucket = source_bucket(self.buckets, max(len(p) for p in pieces))
        return max(target_buckets(self.buckets, self.max_decode_length, bucket))

    @property
    def max_source_tokens(self) -> int:
        """The longest source ``prepare`` keeps, EOS included (as narbench's decoders)."""
        return self.buckets[-1]

    def count_truncated(self, sources) -> int:
        """How many of ``sources`` ``prepare`` cuts to ``max_source_tokens``."""
        return sum(len(p) > self.max_source_tokens for p in source_pieces(self.vocab, list(sources)))

    def prepare(self, sources):
        if len(sources) == 0:
            raise UserError("no sources to translate; give at least one sentence")
        return source_pieces(self.vocab, list(sources), self.max_source_tokens)

    def run(self, prepared):
        beam = self.parsed.k if self.parsed.algorithm == "beam" else 1
        max_len = self._max_len(prepared)
        results = self.translator.translate_batch(
            prepared, beam_size=beam, max_decoding_length=max_len, min_decoding_length=0,
            length_penalty=self.length_penalty if beam > 1 else 1.0, return_scores=beam > 1,
            max_batch_size=self.max_batch_size, batch_type=self.batch_type, asynchronous=self.parallel_batches > 1)
        return results, max_len

    def finish(self, outputs, prepared):
        from models.decoders import detokenize
        from narbench_core.outputs import DecodeOutput

        results, cap = outputs
        if self.parallel_batches > 1:
            results = [r.result() for r in results]      # waits for the worker that has the batch
        sp = self.vocab.tokenizer                       # detokenized as narbench's decoders do (special ids dropped)
        best = [r.hypotheses[0] for r in results]
        hyps = [detokenize(self.vocab, [sp.piece_to_id(p) for p in tokens]) for tokens in best]
        passes = np.asarray([min(len(tokens) + 1, cap) for tokens in best], np.int64)
        return DecodeOutput(hyps, passes)

    def warmup_inputs(self, batch_size: int) -> list:
        """One input per source bucket (CTranslate2 compiles nothing; this warms its caches)."""
        sp = self.vocab.tokenizer
        word = sp.id_to_piece(FIRST_REGULAR_ID)
        return [[[word] * (b - 1) + [sp.id_to_piece(EOS_ID)]] * batch_size for b in self.buckets]

    def lower(self, prepared, part: str):
        raise UserError(f"{self.name} runs in CTranslate2, which has no XLA program to cost")


def load_decoder(checkpoint_dir: str | Path, spec: str, quantization: str = "float32", vocab: Any = None,
                 **options: Any) -> CT2Decoder:
    """A ``CT2Decoder`` on the CTranslate2 export of an AR checkpoint (exported on first use into
    ``<data root>/ct2/<checkpoint folder>-<quantization>``)."""
    from models import checkpoint
    from models.decoders import checkpoint_vocabulary
    from narbench_core import paths

    out = paths.subdir("ct2") / f"{Path(checkpoint_dir).resolve().name}-{quantization}"
    with open(out.with_name(out.name + ".lock"), "w") as lock:      # timing workers load side by side:
        fcntl.flock(lock, fcntl.LOCK_EX)                             # one exports, the others then reuse it
        export(checkpoint_dir, out, quantization, vocab=vocab, cached=True)
    meta = checkpoint.read_meta(checkpoint_dir)
    compute = "int8" if quantization == "int8" else "float32"
    return CT2Decoder(out, vocab or checkpoint_vocabulary(meta), spec, compute_type=compute,
                      max_target_length=int(meta["model_config"].get("max_target_length", 128)), **options)
