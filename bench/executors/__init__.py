"""Executors: where a suite's training jobs run (``narbench run --executor local|ray``).

``bench.executors.base`` holds what they share (``Job``, ``Board``, the states); ``local`` runs every job
in this process, ``raycluster`` on a Ray cluster. ``make`` builds one by name.
"""
from __future__ import annotations

from typing import Any

from bench.executors.base import (DONE, EXECUTORS, FAILED, PENDING, RUNNING, Board, CellState, Executor, Job,
                                  TimingHost, check_order, first_line, this_host)
from narbench_core.errors import UserError

__all__ = ["DONE", "EXECUTORS", "FAILED", "PENDING", "RUNNING", "Board", "CellState", "Executor", "Job",
           "TimingHost", "check_order", "first_line", "make", "this_host"]


def make(name: str, **options: Any) -> Executor:
    """The executor called ``name`` (``EXECUTORS``)."""
    if name == "local":
        from bench.executors.local import LocalExecutor
        return LocalExecutor()
    if name == "ray":
        from bench.executors.raycluster import RayExecutor
        return RayExecutor(**options)
    raise UserError(f"unknown executor {name!r}; use one of: {', '.join(EXECUTORS)}")
