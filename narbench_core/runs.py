"""Run folders' names, shared by every writer of results (``bench.store``, ``theory.writer``): a run id is
the UTC date-time plus 8 hex digits of what the run is (its spec or config hash), and a folder of runs
names its newest in a one-line ``latest`` file. The name of such a folder of runs (a suite's) is a plain
name (``check_name``)."""
from __future__ import annotations

import re
from datetime import datetime, timezone

from narbench_core.errors import UserError

LATEST = "latest"


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def make_run_id(digest: str, now: datetime | None = None) -> str:
    """``<YYYYmmddTHHMMSSZ>-<first 8 of digest>``, e.g. ``20240501T120000Z-1a2b3c4d``."""
    now = (now or utc_now()).astimezone(timezone.utc)
    return f"{now:%Y%m%dT%H%M%SZ}-{digest[:8]}"


PLAIN_NAME = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]*$")   # a folder name: no separator, no leading dot


def check_name(name: str, what: str = "name") -> str:
    """``name`` if it is a plain folder name (letters, digits, ``_ . -``, not starting with a dot, so never
    empty, ``.`` or ``..``), else a ``UserError`` naming the rule: results are written under it."""
    if not isinstance(name, str) or not PLAIN_NAME.match(name):
        raise UserError(f"{what} {name!r} is not a plain name: use letters, digits, _ . - and do not start "
                        "with a dot")
    return name
