"""Seconds this process spent stopped, so that what a training records is the time it ran.

A training paused with SIGSTOP (``kill -STOP``, Ctrl-Z) while a timing run has the machine, or inside a suspended VM,
keeps its wall clock going: the step in flight then "took" the whole pause, and ``train_seconds`` (which estimates,
``match = "seconds"`` budgets and the reports' training hours read) grew by it. ``running()`` is a clock that stands
still while the process is stopped: ``time.perf_counter()`` less the stopped seconds so far (``stopped_seconds()``).

How a stop is seen: a daemon thread wakes every ``TICK`` seconds and reads the clock and the process's CPU time (all
of its threads'). A reading more than ``LATE`` seconds after the one before, over which the process used less CPU
time than the wall time that passed, counts that difference, less one tick, as stopped: a stopped process uses no
CPU, while one that kept the thread waiting and ran (the GIL held through a compilation) used about as much CPU time
as passed, or more on several cores. A caller's reading closes the interval as the thread's does, so a step that
ends just after the SIGCONT already sees the pause. The thread starts on first use.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Callable

TICK = 0.2       # seconds between the thread's readings
LATE = 1.0       # a reading this late (seconds) may hold a stop


class StoppedClock:
    """The stopped seconds of one process (``clock``: wall seconds; ``cpu``: the process's CPU seconds)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter,
                 cpu: Callable[[], float] = time.process_time, start_thread: bool = True):
        self.clock, self.cpu = clock, cpu
        self._lock = threading.Lock()
        self._last = (clock(), cpu())
        self._stopped = 0.0
        if start_thread:
            threading.Thread(target=self._tick, daemon=True, name="narbench-stopped-clock").start()

    def read(self) -> tuple[float, float]:
        """``(now, stopped seconds so far)``, this reading's interval counted."""
        with self._lock:
            now, used = self.clock(), self.cpu()
            gap = now - self._last[0]
            if gap > LATE:
                self._stopped += max(0.0, gap - TICK - (used - self._last[1]))
            self._last = (now, used)
            return now, self._stopped

    def running(self) -> float:
        """Seconds by a clock that stands still while the process is stopped."""
        now, stopped = self.read()
        return now - stopped

    def _tick(self) -> None:
        while True:
            time.sleep(TICK)
            self.read()


_CLOCK: StoppedClock | None = None
_START = threading.Lock()


def _forget() -> None:          # a forked child has no ticking thread: it starts its own clock
    global _CLOCK
    _CLOCK = None


os.register_at_fork(after_in_child=_forget)


def _clock() -> StoppedClock:
    global _CLOCK
    with _START:
        if _CLOCK is None:
            _CLOCK = StoppedClock()
        return _CLOCK


def running() -> float:
    """This process's ``StoppedClock.running``: subtract two readings for the seconds it ran between them."""
    return _clock().running()


def stopped_seconds() -> float:
    """Seconds this process was seen stopped since the clock started (its first use)."""
    return _clock().read()[1]
