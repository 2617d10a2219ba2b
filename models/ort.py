"""PaDIR on ONNX Runtime (the optional ``ort`` extra: ``pip install -e ".[ort]"``), float32 or int8.

``export`` writes a PaDIR checkpoint's two graphs (``models/onnx_graph.py``: the encoder with the length
predictor and the cross-attention keys, and one refinement pass) into a folder, whole or not at all,
stamped like the CTranslate2 export; ``int8`` quantizes the weight matrices of both graphs with ONNX
Runtime's dynamic quantization (int8 weights, activations quantized per call from their own range, so no
calibration data is needed and none is read). ``ORTPaDIRDecoder`` runs narbench's refinement loop around
the runtime: the same options (``refine:T``, ``length_hyps``, ``remask``, ``start``, ``length_bonus``, the
seed) with the same meanings, and the same random tokens as the JAX decoder (``noise_tables``), so float32
outputs match JAX PaDIR's sentence for sentence up to float rounding.
"""
from __future__ import annotations

import fcntl
import functools
from pathlib import Path
from typing import Any, NamedTuple, Optional, Sequence

import numpy as np

from models import checkpoint
from models.checkpoint import read_export_stamp
from models.decoders import SourceBuckets
from narbench_core import defaults, phases
from narbench_core.errors import UserError
from narbench_core.io import check_replaceable, write_export
from narbench_core.outputs import DecodeOutput
from narbench_core.tokens import EOS_ID, PAD_ID

QUANTIZATIONS = ("float32", "int8")
EXTRA_HINT = 'pip install -e ".[ort]"'
GRAPHS = ("encoder.onnx", "refine.onnx")
STAMP_KEYS = {"checkpoint", "steps_done", "quantization", "format", "max_source_tokens"}


def require_onnxruntime():
    """The ``onnxruntime`` module (``onnx`` beside it: the export builds graphs with it), or a one-line
    ``UserError`` naming the extra to install."""
    try:
        import onnx  # noqa: F401
        import onnxruntime
    except ImportError:
        raise UserError(f"ONNX Runtime is not installed; install the extra: {EXTRA_HINT}") from None
    return onnxruntime


# -- export ---------------------------------------------------------------------------------------------
def _is_export(folder: Path) -> bool:
    record = read_export_stamp(folder)
    return (record is not None and STAMP_KEYS <= set(record) <= STAMP_KEYS | {"params_digest", "files"}
            and all((folder / g).is_file() for g in GRAPHS))


def quantize_int8(source: Path, target: Path) -> None:
    """ONNX Runtime's dynamic quantization of the weight matrices (MatMul with a constant right side):
    int8 weights, per-call activation scales; the attention matmuls of two activations stay float32."""
    require_onnxruntime()
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"],
                     extra_options={"MatMulConstBOnly": True})


def write_graphs(folder: Path, config, params: dict, quantization: str, max_source_tokens: int) -> None:
    """The two graphs of a PaDIR model into ``folder`` (``GRAPHS``), float32 or quantized to int8."""
    import onnx

    from models.onnx_graph import build_encoder, build_refine

    for name, model in (("encoder.onnx", build_encoder(config, params, int(max_source_tokens))),
                        ("refine.onnx", build_refine(config, params))):
        if quantization == "float32":
            onnx.save(model, str(Path(folder) / name))
        else:
            onnx.save(model, str(Path(folder) / f"float32-{name}"))
            quantize_int8(Path(folder) / f"float32-{name}", Path(folder) / name)
            (Path(folder) / f"float32-{name}").unlink()


def export(checkpoint_dir: str | Path, out_dir: str | Path, quantization: str = "float32", force: bool = False,
           max_source_tokens: int = max(defaults.DECODE_BUCKETS)) -> Path:
    """Write the ONNX graphs of a PaDIR checkpoint to ``out_dir`` (whole or not at all); returns it. An
    export of the same checkpoint (by its parameters' digest), quantization and source capacity there, whole
    (its files' digests as written), is kept unless ``force``; anything else is replaced only with ``force``,
    and only if narbench wrote it."""
    from models.onnx_graph import check_exportable

    require_onnxruntime()
    if quantization not in QUANTIZATIONS:
        raise UserError(f"unknown quantization {quantization!r}; use one of {', '.join(QUANTIZATIONS)}")
    out_dir = Path(out_dir)
    stamp = checkpoint.export_stamp(checkpoint_dir, quantization, max_source_tokens=int(max_source_tokens))
    if not force and checkpoint.export_is(out_dir, stamp):
        return out_dir                                  # this export, already written, whole
    if (out_dir.exists() or out_dir.is_symlink()) and not force:
        what = "another export (of another checkpoint or quantization, or damaged)" if _is_export(out_dir) else "something else"
        raise UserError(f"{out_dir} exists and holds {what}; pass --force to replace it or choose another --out")
    if out_dir.exists() or out_dir.is_symlink():
        check_replaceable(out_dir, recognise=_is_export)     # --force replaces only narbench's own folders
    config, params, meta = checkpoint.load(checkpoint_dir)
    check_exportable(config)
    return write_export(out_dir, lambda tmp: write_graphs(tmp, config, params, quantization, int(max_source_tokens)),
                        stamp, "narbench export onnx", _is_export)


def session_options(threads: int, spinning: Optional[bool] = None):
    """Session options as ONNX Runtime's CPU tuning guide sets them for one request at a time: every
    graph optimisation, sequential execution, ``threads`` intra-op threads and one inter-op thread;
    ``spinning`` (default: ONNX Runtime's, on) lets idle pool threads spin after a parallel region."""
    ort = require_onnxruntime()
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.intra_op_num_threads = int(threads)
    options.inter_op_num_threads = 1
    if spinning is not None:
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    options.log_severity_level = 3
    return options


def sessions(model_dir: str | Path, threads: int, spinning: Optional[bool] = None):
    """``(encoder, refine)`` inference sessions of an export on ``threads`` CPU threads; a graph that does
    not load is a one-line ``UserError``."""
    ort = require_onnxruntime()
    out = []
    for name in GRAPHS:
        try:
            out.append(ort.InferenceSession(str(Path(model_dir) / name), session_options(threads, spinning),
                                            providers=["CPUExecutionProvider"]))
        except Exception as e:                          # onnxruntime raises its own error types
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UserError(f"{Path(model_dir) / name} does not load in ONNX Runtime ({first[:160]}); "
                            "re-export it with --force") from None
    return tuple(out)


# -- the refinement loop on the host ----------------------------------------------------------------------
@functools.lru_cache(maxsize=64)
def noise_tables(seed: int, rows: int, capacity: int, iterations: int, start: str, vocab_size: int):
    """The random tokens JAX PaDIR draws for ``rows`` hypotheses of ``capacity`` positions with this seed:
    ``(initial [rows, n], replacements [T, rows, n])``, int64. The JAX decoder keys every sentence alike
    (``models.refine.refine_length_hypotheses``: one split into the initial key and the loop key, then
    one split per pass), so the draws depend on the shape alone and are computed once per shape, outside
    any timed call."""
    import jax

    from models.refine import replacement_tokens

    init_key, key = jax.random.split(jax.random.key(int(seed)))
    first = np.asarray(replacement_tokens(init_key, (rows, capacity), start, vocab_size), np.int64)
    passes = []
    for _ in range(iterations):
        key, sub = jax.random.split(key)
        passes.append(np.asarray(replacement_tokens(sub, (rows, capacity), start, vocab_size), np.int64))
    return first, np.stack(passes)


def top_k_lengths(length_logits: np.ndarray, k: int, max_length: int) -> np.ndarray:
    """``models.refine.top_k_lengths`` on the host: the k most likely lengths in [1, max_length], best
    first (ties to the shorter length, as XLA's top-k)."""
    ids = np.arange(length_logits.shape[1])
    allowed = np.where((ids >= 1) & (ids <= max_length), length_logits.astype(np.float32), -np.inf)
    return np.clip(np.argsort(-allowed, axis=1, kind="stable")[:, :k], 1, max_length)


def offset_to_lengths(offset_logits: np.ndarray, source_lengths: np.ndarray, max_length: int) -> np.ndarray:
    """``models.t5.offset_to_length_logits`` on the host: [b, 2M + 1] offset logits -> [b, M + 1]."""
    index = np.clip(np.arange(max_length + 1)[None, :] - source_lengths[:, None] + max_length, 0, 2 * max_length)
    return np.take_along_axis(offset_logits, index, axis=1)


def remask_stutter(tokens: np.ndarray, valid: np.ndarray, replacement: np.ndarray) -> np.ndarray:
    repeat = np.zeros_like(valid)
    repeat[:, 1:] = tokens[:, 1:] == tokens[:, :-1]
    return np.where(repeat & valid, replacement, tokens)


def mask_predict_remask(tokens, confidence, valid, replacement, passes_done, iterations: int) -> np.ndarray:
    count = (valid.sum(axis=1) * (iterations - passes_done)) // iterations                      # [r]
    rank = np.argsort(np.argsort(np.where(valid, confidence, np.inf), axis=1, kind="stable"), axis=1, kind="stable")
    return np.where(valid & (rank < count[:, None]), replacement, tokens)


def drop_repeats(tokens: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """[a, a, b, b, 1, 0] -> [a, b, 1, 0, 0, 0] inside the mask (``models.refine.drop_repeats``)."""
    new = np.ones_like(valid)
    new[:, 1:] = tokens[:, 1:] != tokens[:, :-1]
    out = np.zeros_like(tokens)
    for i, row in enumerate(tokens):
        kept = row[valid[i] & new[i]]
        out[i, : len(kept)] = kept
    return out


class Refined(NamedTuple):
    tokens: np.ndarray       # [B, n] int64 each source's best hypothesis, repeats dropped
    passes: np.ndarray       # [B] int64 refinement passes (the most any of its hypotheses ran)
    score: np.ndarray        # [B] float32 the best hypothesis's mean log-prob


@functools.lru_cache(maxsize=None)
def _arange(n: int) -> np.ndarray:
    return np.arange(n)


# -- the decoder -------------------------------------------------------------------------------------------
class ORTPaDIRDecoder(SourceBuckets):
    """``refine:T`` on an ONNX export, behind narbench's decoder protocol.

    Shapes follow ``models.decoders.PaDIRDecoder``: sources padded to a bucket, the k hypotheses refined in
    the smallest target bucket that holds the longest predicted length. ONNX Runtime has no asynchronous
    handle: ``run`` does the work and returns host arrays, marking the phases ``encode`` (encoder and length
    logits), ``host`` (the loop's numpy work: lengths, masks, remasking, the choice of hypothesis) and
    ``passes`` (the refinement graph's calls). It has no XLA program: ``xla_costs`` is False.
    """
    xla_costs = False

    def __init__(self, model_dir: str | Path, config, vocab: Any, spec: str, name: str = "", *,
                 buckets: Sequence[int] = defaults.DECODE_BUCKETS, max_decode_length: Optional[int] = None,
                 length_hyps: int = defaults.LENGTH_HYPS, remask: str = defaults.REMASK, start: str = defaults.START,
                 seed: int = 0, length_bonus: int = defaults.LENGTH_BONUS, early_stop: bool = True, threads: int = 0,
                 spinning: Optional[bool] = None):
        import os

        from models.decoders import check_refine_options, parse_spec

        self.parsed = parse_spec(spec)
        if self.parsed.algorithm != "refine":
            raise UserError(f"ONNX Runtime runs PaDIR's refine:T, not {spec!r}")
        check_refine_options(remask, start, length_hyps, length_bonus)
        self.name, self.config, self.vocab = name or spec, config, vocab
        self.buckets = tuple(sorted({int(b) for b in buckets}))
        self.max_decode_length = int(min(max_decode_length or config.max_target_length, config.max_target_length))
        self.length_hyps, self.remask, self.start = int(length_hyps), remask, start
        self.seed, self.length_bonus, self.early_stop = int(seed), int(length_bonus), bool(early_stop)
        self.threads = int(threads) or (os.cpu_count() or 1)
        checkpoint.check_export(model_dir, "ONNX Runtime", "narbench export onnx")
        stamp = read_export_stamp(Path(model_dir)) or {}
        if stamp.get("max_source_tokens", 0) < self.buckets[-1]:
            raise UserError(f"the export {model_dir} holds sources of {stamp.get('max_source_tokens')} tokens, "
                            f"fewer than the largest bucket {self.buckets[-1]}; re-export it with --force")
        self.encoder, self.refiner = sessions(model_dir, self.threads, spinning)
        self._warm_batches: set[int] = set()

    def _warmup_variants(self, inputs: np.ndarray, batch_size: int) -> list:
        """Every target bucket of each source bucket (the random tokens of each shape are drawn then)."""
        from models.decoders import Prepared

        return [Prepared(inputs, batch_size, t) for t in self.target_buckets(inputs.shape[1])]

    # -- the loop ------------------------------------------------------------------------------------
    def _lengths(self, length_logits: np.ndarray, inputs: np.ndarray) -> np.ndarray:
        """[b, k] lengths, as ``models.decoders.encode_and_lengths``."""
        if self.config.length_offset:
            length_logits = offset_to_lengths(length_logits, (inputs > 0).sum(-1), self.config.max_target_length)
        lengths = top_k_lengths(length_logits, self.length_hyps, self.max_decode_length)
        return np.clip(lengths + self.length_bonus, 1, self.max_decode_length)

    def run(self, prepared) -> Refined:
        inputs = np.asarray(prepared.inputs, np.int64)                                       # [b, s]
        length_logits, *cross = self.encoder.run(None, {"ids": inputs})
        phases.mark(phases.ENCODE)
        b, k, iterations = inputs.shape[0], self.length_hyps, self.parsed.k
        lengths = self._lengths(length_logits, inputs)                                       # [b, k]
        active = prepared.active
        if prepared.target_bucket:
            capacity = prepared.target_bucket
        else:
            allowed = self.target_buckets(inputs.shape[1])
            longest = int(lengths[active].max())
            capacity = next((t for t in allowed if t >= longest), allowed[-1])
        rows = b * k
        mask = (_arange(capacity)[None, :] < np.minimum(lengths, capacity).reshape(rows, 1)).astype(np.int64)
        valid = mask > 0                                                                     # [r, n]
        first, replacements = noise_tables(self.seed, rows, capacity, iterations, self.start,
                                           self.config.vocab_size)
        eos_here = np.zeros_like(valid)
        if self.config.fixed_eos:
            eos_here[np.arange(rows), valid.sum(1) - 1] = True
            eos_here &= valid
        tokens = np.where(valid, np.where(eos_here, EOS_ID, first), PAD_ID)
        feeds = {"ids": inputs, **{f"{'kv'[j % 2]}_{j // 2}": c for j, c in enumerate(cross)}}
        out, conf = tokens, np.zeros(valid.shape, np.float32)
        finished = ~np.repeat(np.asarray(active, bool), k)                                  # [r]
        passes = np.zeros(rows, np.int64)
        inp = tokens
        phases.mark(phases.HOST)
        for t in range(iterations):
            if finished.all():
                break
            new, new_conf = self.refiner.run(None, {**feeds, "tokens": inp, "mask": mask})
            phases.mark(phases.PASSES)
            running = ~finished
            changed = (new != out).any(axis=1)
            out = np.where(running[:, None], new, out)
            conf = np.where(running[:, None], new_conf, conf)
            passes += running
            if self.early_stop:
                finished = finished | ~changed
            if self.remask == "none":
                inp = out
            else:
                if self.remask == "stutter":
                    inp = remask_stutter(out, valid, replacements[t])
                else:
                    inp = mask_predict_remask(out, conf, valid, replacements[t], passes, iterations)
                inp = np.where(eos_here, EOS_ID, inp)
            phases.mark(phases.HOST)
        score = (np.where(valid, conf, 0.0).sum(1) / np.maximum(valid.sum(1), 1)).reshape(b, k)
        best = np.argmax(score, axis=1)                                                      # [b]
        pick = np.arange(b) * k + best
        result = Refined(drop_repeats(out[pick], valid[pick]), passes.reshape(b, k).max(1),
                         score[np.arange(b), best].astype(np.float32))
        phases.mark(phases.HOST)
        return result

    def finish(self, outputs: Refined, prepared) -> DecodeOutput:
        from models.decoders import detokenize

        n = prepared.num_sources
        return DecodeOutput([detokenize(self.vocab, row) for row in outputs.tokens[:n]],
                            np.asarray(outputs.passes[:n], np.int64))

    def lower(self, prepared, part: str):
        raise UserError(f"{self.name} runs in ONNX Runtime, which has no XLA program to cost")


def export_dir(checkpoint_dir: str | Path, quantization: str) -> Path:
    """Where the runner caches a checkpoint's export: ``<data root>/onnx/<checkpoint folder>-<quantization>``."""
    from narbench_core import paths

    return paths.subdir("onnx") / f"{Path(checkpoint_dir).resolve().name}-{quantization}"


def load_decoder(checkpoint_dir: str | Path, spec: str, quantization: str = "float32", vocab: Any = None,
                 **options: Any) -> ORTPaDIRDecoder:
    """An ``ORTPaDIRDecoder`` on the export of a PaDIR checkpoint (exported on first use into ``export_dir``;
    an export that does not load is written again, once)."""
    from models.config import ModelConfig
    from models.decoders import checkpoint_vocabulary

    out = export_dir(checkpoint_dir, quantization)
    meta = checkpoint.read_meta(checkpoint_dir) or checkpoint.load(checkpoint_dir)[2]
    config = ModelConfig.from_dict(meta["model_config"])
    vocab = vocab or checkpoint_vocabulary(meta)
    sources = max(max(options.get("buckets") or defaults.DECODE_BUCKETS), max(defaults.DECODE_BUCKETS))

    def ensure(rewrite: bool) -> None:
        with open(out.with_name(out.name + ".lock"), "w") as lock:   # workers load side by side: one exports
            fcntl.flock(lock, fcntl.LOCK_EX)
            capacity = max((read_export_stamp(out) or {}).get("max_source_tokens") or 0, sources)
            stamp = checkpoint.export_stamp(checkpoint_dir, quantization, max_source_tokens=capacity)
            export(checkpoint_dir, out, quantization, force=rewrite or not checkpoint.export_is(out, stamp),
                   max_source_tokens=capacity)

    ensure(False)
    try:
        return ORTPaDIRDecoder(out, config, vocab, spec, **options)
    except UserError as e:
        if "does not load" not in str(e):
            raise
        ensure(True)                                         # a damaged export: written again, once
        return ORTPaDIRDecoder(out, config, vocab, spec, **options)
