"""What every executor shares: jobs, their states and the board.

The runner (``bench.runner``) turns the training cells a run needs into :class:`Job` s, a DAG: an AR
model, the distillation of its outputs, the PaDIR models trained on them or warm-started from it. An
executor runs the jobs in an order that respects ``needs`` and gives each job the results of its needs
as its call's arguments. The local executor (``bench.executors.local``) runs them one after another in
this process, as narbench always did; the Ray executor (``bench.executors.raycluster``) runs each in a
fresh worker process of a Ray cluster, dependencies passed as object references.

A job is built on the driver (``build``), only once the jobs named in ``after`` are done: a ``match``
training budget is resolved from its baseline's record before its job exists. Only the driver writes the
run folder: a job's ``done`` callback runs there, and every change of a job's state goes to a
:class:`Board`, which keeps ``cells.json`` (``narbench status``) and the driver's progress bar.
"""
from __future__ import annotations

import contextlib
import dataclasses
import socket
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol


EXECUTORS = ("local", "ray")          # `narbench run --executor`; local is the default

# A job's states, in the order a job goes through them.
PENDING, RUNNING, DONE, FAILED = "pending", "running", "done", "failed"


@dataclass
class Job:
    """One unit of training work: a model to train or a distillation to run."""

    key: str                                         # unique; what progress, logs and `narbench status` name
    kind: str                                        # "train" | "distill"
    build: Callable[[Mapping[str, Any]], Callable]   # driver: (results of done jobs) -> the call
    needs: tuple[str, ...] = ()                      # jobs whose results are the call's arguments, in order
    after: tuple[str, ...] = ()                      # jobs the driver waits for before it builds this one
    done: Callable[[Any, Mapping[str, Any]], None] = lambda result, results: None   # driver, on success


def check_order(jobs: list[Job]) -> None:
    """Every job's needs and afters name an earlier job (the runner lists them in dependency order)."""
    seen: set[str] = set()
    for job in jobs:
        missing = [k for k in (*job.needs, *job.after) if k not in seen]
        if missing or job.key in seen:
            raise ValueError(f"job {job.key!r}: {'duplicate key' if job.key in seen else f'needs {missing} first'}")
        seen.add(job.key)


@dataclass
class CellState:
    """What ``cells.json`` says of one job."""

    cell: str
    kind: str
    state: str = PENDING
    host: str | None = None
    attempt: int = 0
    seconds: float | None = None
    error: str | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class Board:
    """The driver's view of the jobs: their states, written through ``save`` (the run folder's
    ``cells.json``) on every change, and a one-line summary for the progress bar."""

    executor: str
    save: Callable[[dict], None] = lambda board: None
    on_change: Callable[[str], None] = lambda summary: None
    cells: dict[str, CellState] = field(default_factory=dict)

    def add(self, jobs: list[Job]) -> None:
        for job in jobs:
            self.add_cell(job.key, job.kind)

    def add_cell(self, key: str, kind: str) -> None:
        """A job of ``kind`` (also one no executor runs: an evaluation), pending unless known."""
        self.cells.setdefault(key, CellState(key, kind))
        self._changed()

    def set(self, key: str, state: str, **fields: Any) -> None:
        cell = self.cells[key]
        cell.state = state
        for name, value in fields.items():
            setattr(cell, name, value)
        self._changed()

    def counts(self) -> dict[str, int]:
        out = {s: 0 for s in (PENDING, RUNNING, DONE, FAILED)}
        for cell in self.cells.values():
            out[cell.state] += 1
        return out

    def summary(self) -> str:
        c = self.counts()
        hosts: dict[str, int] = {}
        for cell in self.cells.values():
            if cell.state == RUNNING and cell.host:
                hosts[cell.host] = hosts.get(cell.host, 0) + 1
        where = f" ({', '.join(f'{h}: {n}' for h, n in sorted(hosts.items()))})" if hosts else ""
        return (f"{c[DONE]} done, {c[RUNNING]} running{where}, {c[PENDING]} pending"
                + (f", {c[FAILED]} failed" if c[FAILED] else ""))

    def to_dict(self) -> dict:
        from narbench_core.runs import utc_now

        return {"executor": self.executor, "updated": utc_now().isoformat(timespec="seconds"),
                "cells": [c.to_dict() for c in self.cells.values()]}

    def _changed(self) -> None:
        self.save(self.to_dict())
        self.on_change(self.summary())


@dataclass
class TimingHost:
    """Where the runner times and scores: this process (``remote=False``), or a cluster node that
    ``run(key, call)`` sends each evaluation group's call to."""

    name: str                                         # the host's name (cells.json)
    info: dict                                        # env.json's ``executor``
    remote: bool = False
    run: Callable[[str, Callable], Any] | None = None


class Executor(Protocol):
    name: str
    shows_progress: bool          # whether a job's own progress bars reach the user (jobs run in this process)

    def run(self, jobs: list[Job], board: Board) -> dict[str, Any]:
        """Run ``jobs`` (in dependency order); returns every job's result by key. A job that fails raises
        (a ``UserError`` with its one line); the jobs done before stay done."""

    def quiet_host(self) -> "contextlib.AbstractContextManager[TimingHost]":
        """The context the runner times in, on a host where nothing of the executor's runs meanwhile; it
        yields that ``TimingHost``."""


def this_host() -> str:
    return socket.gethostname()


def first_line(err: BaseException) -> str:
    """An error's first line (its type's name when it has no message): what ``cells.json`` keeps."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
