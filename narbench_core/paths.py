"""Where data, vocabularies, checkpoints and caches live (never inside the repo).

Everything is under one root: ``$NARBENCH_DATA`` if set, else ``~/.cache/narbench``.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path


def data_root(create: bool = True) -> Path:
    """The root folder for all downloaded and generated artefacts (made if missing, unless ``create=False``)."""
    root = os.environ.get("NARBENCH_DATA") or os.path.join(Path.home(), ".cache", "narbench")
    path = Path(root).expanduser()
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


def subdir(name: str) -> Path:
    """A named folder under the data root (``corpora``, ``vocab``, ``checkpoints``, ``jax_cache`` ...)."""
    path = data_root() / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def enable_compilation_cache() -> Path:
    """Turn on JAX's persistent compilation cache; returns its folder: ``$NARBENCH_JAX_CACHE`` when that names a
    folder, else ``jax_cache`` under the data root. ``NARBENCH_JAX_CACHE=0`` opts out: every process compiles afresh.

    A second run of the same command then loads compiled executables instead of compiling. JAX's cache keys
    include the folder's path (jaxlib 0.10.2 hashes compile options that name it), so the path is made canonical
    (symbolic links resolved): a data root reached through a link, or several data roots given one folder by
    ``NARBENCH_JAX_CACHE``, load what another compiled.

    Where JAX is not imported yet, the settings go to the environment variables JAX reads at import (and the
    processes this one starts inherit): a job that turns the cache on but compiles nothing (a Ray job whose
    trainer is a test's fake) never imports JAX, 3-5 s of a Ray worker's start on a busy core (2026-12-03).
    """
    jax = sys.modules.get("jax")
    setting = os.environ.get("NARBENCH_JAX_CACHE", "1")
    if setting == "0":
        if jax is None:
            os.environ.pop(JAX_CACHE_OPTIONS[0].upper(), None)      # not from a parent that turned it on either
        return subdir("jax_cache")
    path = subdir("jax_cache") if setting == "1" else Path(setting).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    path = path.resolve()
    for name, value in zip(JAX_CACHE_OPTIONS, (str(path), 0, 0.0)):          # every compile, however quick
        if jax is None:
            os.environ[name.upper()] = str(value)
        else:
            jax.config.update(name, value)
    return path


# The cache's JAX options (its folder first); JAX reads each at import from the environment variable of its name in
# capitals, which is how a process not yet importing JAX, or a worker it starts, gets them.
JAX_CACHE_OPTIONS = ("jax_compilation_cache_dir", "jax_persistent_cache_min_entry_size_bytes",
                     "jax_persistent_cache_min_compile_time_secs")


def portable(path: str | os.PathLike) -> str:
    """How results name a file: relative to the data root when under it (``checkpoints/x-ar-1a2b``),
    so committed results carry no machine path; else as given."""
    path = Path(path).absolute()
    try:
        return path.relative_to(data_root().absolute()).as_posix()
    except ValueError:
        return str(path)


def resolve(name: str | os.PathLike) -> Path:
    """The file a result names (``portable``'s inverse): relative names are under the data root."""
    path = Path(name)
    return path if path.is_absolute() else data_root() / path
