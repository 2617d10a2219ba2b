"""One frozen config for every model (AR T5 and PaDIR) and the named presets.

Variants are derived with ``dataclasses.replace`` (or ``config.replace(...)``), never by copying
fields. ``vocab_size`` comes from the task's vocabulary and is set by the caller, e.g.
``preset("small", kind="padir", vocab_size=vocab.vocab_size)``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from narbench_core.errors import UserError

KINDS = ("ar", "padir")
DTYPES = ("float32", "bfloat16")


def unhashed_at_default(default: Any, doc: str = ""):
    """A config field that ``to_dict`` (the checkpoint identity) omits while it holds its default, so a
    field added later changes no existing checkpoint's hash. Its default must be the behaviour of
    checkpoints trained before it existed."""
    return dataclasses.field(default=default, metadata={"unhashed_at_default": True, "doc": doc})


def setting_field(default: Any, doc: str = ""):
    """A config field that does not change what is trained (how often to evaluate, say): never part of
    the checkpoint identity (``to_dict``)."""
    return dataclasses.field(default=default, metadata={"setting": True, "doc": doc})


def identity_dict(config: Any) -> dict[str, Any]:
    """``dataclasses.asdict`` without the ``setting_field``s and the ``unhashed_at_default`` fields that hold their
    defaults."""
    out = dataclasses.asdict(config)
    for f in dataclasses.fields(config):
        if f.metadata.get("setting") or (f.metadata.get("unhashed_at_default") and out[f.name] == f.default):
            del out[f.name]
    return out


@dataclass(frozen=True)
class ModelConfig:
    kind: str = "ar"                       # "ar" (causal T5) or "padir" (bidirectional refiner)
    vocab_size: int = 8000                 # shared source/target SentencePiece vocabulary
    d_model: int = 256
    num_heads: int = 4
    head_dim: int = 64
    d_ff: int = 672                        # hidden width of the gated-GELU FFN (3 matrices)
    num_encoder_layers: int = 3
    num_decoder_layers: int = 3
    dropout_rate: float = 0.1
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    max_target_length: int = 128           # PaDIR: absolute positions and length classes 0..this
    positional_attention: bool = True      # PaDIR only: the positional-attention sublayer
    dtype: str = "float32"                 # activation dtype; parameters stay float32
    length_token: bool = unhashed_at_default(False, "PaDIR: predict the length from a learned [LENGTH] query "
                                             "prepended to the encoder input (the reference design), not "
                                             "from the mean-pooled encoder output")
    fixed_eos: bool = unhashed_at_default(False, "PaDIR: EOS sits at each hypothesis' last position: never noised in "
                                          "training, placed there at inference, never emitted elsewhere")
    length_offset: bool = unhashed_at_default(False, "PaDIR: the length predictor scores offsets from the source "
                                              "length (target - source tokens, in [-max_target_length, "
                                              "max_target_length], as fairseq's NAT models do), not absolute lengths")

    def __post_init__(self):
        if self.kind not in KINDS:
            raise UserError(f"model kind {self.kind!r} is unknown; use one of {', '.join(KINDS)}")
        if self.dtype not in DTYPES:
            raise UserError(f"dtype {self.dtype!r} is unknown; use one of {', '.join(DTYPES)}")
        for name in ("vocab_size", "d_model", "num_heads", "head_dim", "d_ff", "num_encoder_layers",
                     "num_decoder_layers", "relative_attention_num_buckets",
                     "relative_attention_max_distance", "max_target_length"):
            if int(getattr(self, name)) < 1:
                raise UserError(f"model config field {name} must be >= 1, got {getattr(self, name)}")
        if self.vocab_size <= 4:
            raise UserError("vocab_size must exceed the 4 reserved ids (pad, eos, unk, <mask>)")
        if not 0.0 <= self.dropout_rate < 1.0:
            raise UserError(f"dropout_rate must be in [0, 1), got {self.dropout_rate}")

    def replace(self, **changes: Any) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    @property
    def jnp_dtype(self):
        import jax.numpy as jnp      # here: reading a config (narbench plan, the CLI) needs no JAX

        return jnp.dtype(self.dtype)

    def to_dict(self) -> dict[str, Any]:
        return identity_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise UserError(f"unknown model config fields {unknown}; known: {sorted(known)}")
        return cls(**data)


# Sizes. `small` matches the calibration reference model (d_model 256, 3+3, 4 heads, FFN 1024): a gated
# FFN has 3 d x d_ff matrices instead of 2, so d_ff = 672 (~2/3 of 1024) costs about the same.
# `mini` and `medium` (the `scale` suite's size axis, issue 52) sit about 4x below and above `small` in parameters at
# an 8,000-token vocabulary: `small`'s layout at half and twice its width (d_ff still ~2.6 d_model), `medium` one
# layer deeper on each side. `paper` is the paper's size: 6+6, 8 heads, d_model 512, FFN 2048 (~73M params as an AR T5.1.1
# with 32k shared vocab; the paper quotes 67M for its variant).
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(d_model=64, num_heads=4, head_dim=16, d_ff=128, num_encoder_layers=2,
                 num_decoder_layers=2, relative_attention_num_buckets=16,
                 relative_attention_max_distance=64, max_target_length=64),
    "mini": dict(d_model=128, num_heads=4, head_dim=32, d_ff=336, num_encoder_layers=3,
                 num_decoder_layers=3, max_target_length=128),
    "small": dict(d_model=256, num_heads=4, head_dim=64, d_ff=672, num_encoder_layers=3,
                  num_decoder_layers=3, max_target_length=128),
    "medium": dict(d_model=512, num_heads=8, head_dim=64, d_ff=1344, num_encoder_layers=4,
                   num_decoder_layers=4, max_target_length=128),
    "paper": dict(d_model=512, num_heads=8, head_dim=64, d_ff=2048, num_encoder_layers=6,
                  num_decoder_layers=6, max_target_length=128),
}


def preset(name: str, **overrides: Any) -> ModelConfig:
    """The named preset with ``overrides`` applied (e.g. ``kind="padir", vocab_size=8000``)."""
    if name not in PRESETS:
        raise UserError(f"unknown model preset {name!r}; known presets: {', '.join(sorted(PRESETS))}")
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    bad = sorted(set(overrides) - fields)
    if bad:
        raise UserError(f"unknown model config fields {bad}; known: {sorted(fields)}")
    return ModelConfig(**{**PRESETS[name], **overrides})
