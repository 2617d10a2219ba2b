"""Data parallelism with ``jax.sharding``: a 1-D mesh named "data" over the devices.

Batches are split along their first axis across the mesh; params and optimizer state are
replicated. The jitted train step needs no change: XLA's SPMD partitioner follows the input
shardings and inserts the gradient all-reduce. On one device the same code runs unsharded.
"""
from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

AXIS = "data"


def make_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A 1-D ``Mesh`` named "data" over ``devices`` (default: all of them)."""
    devices = list(jax.devices() if devices is None else devices)
    return Mesh(np.array(devices), (AXIS,))


def data_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (batch) axis split over "data"."""
    return NamedSharding(mesh, P(AXIS))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def shard_batch(batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """Put a host batch on the mesh, rows split over the devices (rows % devices must be 0)."""
    n = mesh.devices.size
    for name, x in batch.items():
        if x.shape[0] % n:
            raise ValueError(f"batch {name!r} has {x.shape[0]} rows, not a multiple of {n} devices")
    return jax.device_put(batch, data_sharding(mesh))


def replicate(tree: Any, mesh: Mesh) -> Any:
    """Copy a pytree (params, optimizer state, keys) to every device of the mesh."""
    return jax.device_put(tree, replicated(mesh))
