"""Run folders' names, shared by every writer of results (``bench.store``, ``theory.writer``): a run id is
the UTC date-time plus 8 hex digits of what the run is (its spec or config hash), and a folder of runs
names its newest in a one-line ``latest`` file."""
from __future__ import annotations

from datetime import datetime, timezone

LATEST = "latest"


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def make_run_id(digest: str, now: datetime | None = None) -> str:
    """``<YYYYmmddTHHMMSSZ>-<first 8 of digest>``, e.g. ``20240501T120000Z-1a2b3c4d``."""
    now = (now or utc_now()).astimezone(timezone.utc)
    return f"{now:%Y%m%dT%H%M%SZ}-{digest[:8]}"
