"""How the tests switch XLA's optimizations (imported by name: pytest puts this folder on the path)."""
from __future__ import annotations

import contextlib
from typing import Iterator


@contextlib.contextmanager
def optimizations(enabled: bool) -> Iterator[None]:
    """Compile with (``enabled``) or without XLA's optimizations inside the block, as ``JAX_DISABLE_MOST_OPTIMIZATIONS``
    does for a whole process; the setting before is restored after."""
    import jax

    before = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", not enabled)
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", before)
