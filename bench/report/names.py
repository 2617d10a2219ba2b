"""Display names: what a reader sees instead of a system id.

A system id (``padir-s4-u0.15-distill-k3-lb1-init-ar-glat-lenoff``) names every axis, so that ids stay
unique and stable across runs; a page only needs the axes that vary in its run. Each family splits a
row's name into parts (``Family.name_parts``); a system's display name is its family's label, the
parts marked always, and the parts whose text differs between that family's rows of the run (rows where
an axis does not act, text None, neither differ nor show):
"PaDIR T=4 k=3, distilled", "CTranslate2 greedy, int8, 1 thread", "AR beam 5". Rows keep the id;
``render_legend`` maps one to the other.
"""
from __future__ import annotations

from typing import Sequence

from bench import families
from bench.rows import Row
from narbench_core.markdown import table


def _join(label: str, texts: Sequence[str | None]) -> str:
    out = label
    for text in texts:
        if text:
            out += text if text.startswith(",") else f" {text}"
    return out


def _core_parts(row: Row) -> list[tuple[str, str | None, bool]]:
    """Name parts every family's rows have: the model size on a suite's size axis (", mini")."""
    return [("size", None if row.get("size") is None else f", {row.get('size')}", False)]


def display_names(rows: Sequence[Row]) -> dict[str, str]:
    """System id -> display name, for every system of ``rows`` (unique: names that would collide, as
    when an axis a family does not describe tells them apart, keep their ids)."""
    first: dict[str, Row] = {}
    for r in rows:
        first.setdefault(r.system, r)
    parts = {name: families.get(r.family).name_parts(r) + _core_parts(r) for name, r in first.items()}
    names: dict[str, str] = {}
    for family in dict.fromkeys(r.family for r in first.values()):
        members = [n for n, r in first.items() if r.family == family]
        varies = {axis for axis in {a for n in members for a, _, _ in parts[n]}
                  if len({text for n in members for a, text, _ in parts[n] if a == axis and text is not None}) > 1}
        label = families.get(family).label
        for n in members:
            names[n] = _join(label, [text for axis, text, always in parts[n] if always or axis in varies])
    counts: dict[str, int] = {}
    for shown in names.values():
        counts[shown] = counts.get(shown, 0) + 1
    return {n: (shown if counts[shown] == 1 else f"{shown} ({n})") for n, shown in names.items()}


def render_legend(rows: Sequence[Row], order: Sequence[str]) -> list[str]:
    """"Systems": each display name with its system id (the ``system`` field of rows.jsonl)."""
    shown = display_names(rows)
    return ["## Systems", "", "The name each table shows, and the system id that rows.jsonl, samples.jsonl and "
            "table.md use:", "", *table(["system", "id"], ([shown[n], f"`{n}`"] for n in order), "ll"), ""]
