"""The one markdown table renderer: every page (table.md, leaderboard.md, the latency map, the theory
pages) builds its tables here."""
from __future__ import annotations

from typing import Any, Iterable, Sequence


def table(header: Sequence[Any], rows: Iterable[Sequence[Any]], align: str = "") -> list[str]:
    """A table's lines: the header, the alignment row, one line per row. ``align`` has one letter per
    column, ``l`` (left: text) or ``r`` (right: numbers); columns it does not reach are right-aligned."""
    align = align.ljust(len(header), "r")
    lines = ["| " + " | ".join(str(h) for h in header) + " |",
             "|" + "".join("---|" if a == "l" else "---:|" for a in align)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines
