"""Accelerator projections: roofline bounds from published peaks, labelled so and never measured.

:data:`ACCELERATORS` is the one place the harness states an accelerator's peaks; reports that quote them
read them from here.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from narbench_core.errors import UserError
from bench.costs.xla import DecoderCost

PROJECTION_LABEL = "projection"


@dataclass(frozen=True)
class Accelerator:
    name: str
    peak_flops: float   # flop/s at the dtype below, dense
    bandwidth: float    # bytes/s, HBM
    dtype: str
    source: str


# Published vendor peaks (dense, no sparsity). Projections assume matmuls at this dtype.
ACCELERATORS: dict[str, Accelerator] = {
    "tpu-v3": Accelerator("tpu-v3", 123e12, 900e9, "bf16", "Google Cloud TPU v3 system architecture (per chip)"),
    "tpu-v4": Accelerator("tpu-v4", 275e12, 1200e9, "bf16", "Google Cloud TPU v4 system architecture"),
    "tpu-v5e": Accelerator("tpu-v5e", 197e12, 819e9, "bf16", "Google Cloud TPU v5e documentation"),
    "a100-sxm-80gb": Accelerator("a100-sxm-80gb", 156e12, 2039e9, "tf32", "NVIDIA A100 datasheet"),
    "h100-sxm": Accelerator("h100-sxm", 494.7e12, 3350e9, "tf32", "NVIDIA H100 datasheet"),
    "h100-pcie": Accelerator("h100-pcie", 378e12, 2000e9, "tf32", "NVIDIA H100 datasheet (PCIe)"),
    "h200-sxm": Accelerator("h200-sxm", 494.7e12, 4800e9, "tf32", "NVIDIA H200 datasheet (SXM)"),
}

# JAX's device_kind -> the published entry above (first match wins; a device none matches gets no projection of
# its own). JAX exposes no peak flop/s or bandwidth of a GPU, only its kind, SM count and memory; the measured
# side is the machine model's own probe on that device (``bench.costs.machine``).
DEVICE_KINDS: tuple[tuple[str, str], ...] = (
    ("H200 NVL", ""), ("H200", "h200-sxm"), ("H100 PCIe", "h100-pcie"), ("H100 NVL", ""), ("H100", "h100-sxm"),
    ("A100-SXM4-80GB", "a100-sxm-80gb"), ("TPU v3", "tpu-v3"), ("TPU v4", "tpu-v4"), ("TPU v5 lite", "tpu-v5e"),
)


def for_device(device_kind: str | None) -> str | None:
    """The published accelerator entry for a JAX ``device_kind`` (e.g. ``NVIDIA H100 80GB HBM3`` ->
    ``h100-sxm``), or None where narbench states no peaks for it (a CPU, or a kind not listed)."""
    for fragment, name in DEVICE_KINDS:
        if fragment.lower() in (device_kind or "").lower():
            return name or None
    return None


@dataclass(frozen=True)
class Projection:
    """Roofline lower bound on an accelerator: a projection, not a measurement."""

    accelerator: str
    label: str                  # always PROJECTION_LABEL
    bound_ms: np.ndarray        # [n_sentences]
    p50_bound_ms: float


def accelerator(name: str) -> Accelerator:
    if name not in ACCELERATORS:
        raise UserError(f"unknown accelerator {name!r}; known: {', '.join(sorted(ACCELERATORS))}")
    return ACCELERATORS[name]


def project(cost: DecoderCost, name: str) -> Projection:
    """Roofline-bound latency of ``cost`` on a published accelerator (labelled ``projection``)."""
    acc = accelerator(name)
    bound = cost.bound_ms(acc.peak_flops, acc.bandwidth)
    return Projection(accelerator=acc.name, label=PROJECTION_LABEL, bound_ms=bound,
                      p50_bound_ms=float(np.percentile(bound, 50)))
