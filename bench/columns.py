"""A table column: its name, header, cell format and whether higher is better; and the cell formats.

Result rows (``bench.rows``) declare their columns with ``Column``, and so do system families for the
columns only they fill (``Family.columns``); every table renders its cells with ``Column.cell``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping


# ------------------------------------------------------------------------------------------- formats

def fixed(digits: int) -> Callable[[Any], str]:
    def fmt(value: Any) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "–"
        return f"{value:.{digits}f}"
    return fmt


def ms(value: Any) -> str:
    """Milliseconds with enough digits for sub-millisecond figures."""
    if value is None:
        return "–"
    return f"{value:.3f}" if value < 1 else f"{value:.2f}" if value < 10 else f"{value:.1f}"


def plain(value: Any) -> str:
    return "–" if value is None else str(value)


def stars(p: float | None) -> str:
    return "" if p is None else "**" if p < 0.01 else "*" if p < 0.05 else ""


def count(value: Any) -> str:
    """An integer with thousands separators."""
    return "–" if value is None else f"{int(value):,}"


def si(value: Any) -> str:
    """A large quantity with an SI prefix (1.23M tokens, 4.56P FLOPs)."""
    if value is None:
        return "–"
    for factor, prefix in ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.2f}{prefix}"
    return f"{value:.0f}"


def yes_no(value: Any) -> str:
    return "–" if value is None else "yes" if value else "no"



# ------------------------------------------------------------------------------------------- columns

@dataclass(frozen=True)
class Column:
    name: str
    label: str = ""                                  # table header (default: the name)
    fmt: Callable[[Any], str] = plain                # the value as a table cell
    higher_is_better: bool | None = None             # None: not a score (tables mark the best of a score)
    render: Callable[[Any], str] | None = None     # a cell showing more than the value (CI, stars)
    doc: str = ""
    align: str = "right"                             # markdown alignment: "left" for text
    optional: bool = False                           # older rows may lack it (added after schema 2): absent reads as None

    @property
    def header(self) -> str:
        return self.label or self.name

    def cell(self, row: Mapping[str, Any]) -> str:
        return self.render(row) if self.render else self.fmt(row[self.name])
