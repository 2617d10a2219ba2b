"""The machine's load around a timed measurement, from the kernel's own counters (Linux ``/proc``).

``snapshot(pids)`` reads the CPU time of the whole machine (``/proc/stat``: every core's busy, idle and stolen
time) and of the run's own processes (``/proc/<pid>/stat``: the driver and its timing workers). Between two
snapshots ``share`` says what the machine did: the share of its CPU capacity that was busy, spent by the run's
own processes, spent by anything else (``others``: another user's job, a training under another data root, a
browser; narbench's lock registry sees only narbench processes of the same data root), and stolen by the
hypervisor (``steal``: a VM's cores running someone else), with the 1-minute load average at the end. The
runner records them before and during each timed measurement (env.json's ``machine_load``, each row's
``others_cpu_share``), and warns in one line when others took more than ``defaults.BUSY_SHARE``.

Outside Linux (no ``/proc/stat``) every snapshot is None and nothing is recorded.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Iterable

STAT = "/proc/stat"


@dataclass(frozen=True)
class Snapshot:
    total: int                 # clock ticks of every core, all states
    idle: int                  # idle + iowait
    steal: int                 # stolen by the hypervisor
    ours: int                  # user + system ticks of the run's own processes
    at: float                  # time.monotonic()


def _machine() -> tuple[int, int, int] | None:
    try:
        with open(STAT, encoding="ascii") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(x) for x in fields[1:9]] + [0] * max(0, 8 - len(fields[1:9]))
    user, nice, system, idle, iowait, irq, softirq, steal = ticks[:8]
    return sum(ticks[:8]), idle + iowait, steal


def _process_ticks(pid: int) -> int:
    """user + system clock ticks of ``pid`` (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError:
        return 0
    after = text[text.rfind(")") + 2:].split()       # the command name may hold spaces: fields after it
    return int(after[11]) + int(after[12])            # utime, stime (fields 14 and 15 of proc(5))


def snapshot(pids: Iterable[int]) -> Snapshot | None:
    machine = _machine()
    if machine is None:
        return None
    return Snapshot(*machine, sum(_process_ticks(p) for p in set(pids)), time.monotonic())


def share(before: Snapshot | None, after: Snapshot | None) -> dict | None:
    """What the machine did between two snapshots (shares of its whole CPU capacity), or None."""
    if before is None or after is None or after.total <= before.total:
        return None
    dt = after.total - before.total
    busy = 1.0 - (after.idle - before.idle) / dt
    ours = min(busy, max(0.0, (after.ours - before.ours) / dt))
    return {"seconds": round(after.at - before.at, 2), "busy": round(busy, 4), "narbench": round(ours, 4),
            "others": round(max(0.0, busy - ours), 4), "steal": round((after.steal - before.steal) / dt, 4),
            "load_avg_1m": round(os.getloadavg()[0], 2)}


def sample(pids: Iterable[int], seconds: float) -> dict | None:
    """``share`` over ``seconds`` from now (the machine before a measurement, the run's processes idle)."""
    pids = list(pids)
    first = snapshot(pids)
    time.sleep(seconds)
    return share(first, snapshot(pids))
