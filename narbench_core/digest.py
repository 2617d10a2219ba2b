"""The one home of content hashes: cache keys, spec hashes and run ids are sha256 hex digests of
canonical JSON (sorted keys) or of file bytes. Callers choose the JSON separators, a ``default`` for
values JSON lacks and a prefix length; every key already on disk was made with those same choices,
so changing them invalidates cached checkpoints, distillations and vocabularies."""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Callable

COMPACT = (",", ":")          # spec hashes: no spaces


def json_digest(obj: Any, length: int | None = None, *, separators: tuple[str, str] | None = None,
                default: Callable[[Any], Any] | None = None) -> str:
    """sha256 of ``json.dumps(obj, sort_keys=True, separators=..., default=...)``, cut to ``length`` hex digits."""
    blob = json.dumps(obj, sort_keys=True, separators=separators, default=default)
    return text_digest(blob, length)


def text_digest(text: str, length: int | None = None) -> str:
    """sha256 of a string's UTF-8 bytes, cut to ``length`` hex digits."""
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def update_with_file(h: "hashlib._Hash", path: str | os.PathLike) -> None:
    """Feed a file's bytes into a running hash, 1 MiB at a time."""
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)


def file_digest(path: str | os.PathLike) -> str:
    """sha256 of a file's bytes."""
    h = hashlib.sha256()
    update_with_file(h, path)
    return h.hexdigest()
