"""narbench_core.stopped: a clock that stands still while the process is stopped (SIGSTOP), for the seconds a
training records."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from narbench_core.stopped import LATE, TICK, StoppedClock


def test_a_late_reading_without_cpu_counts_as_stopped_and_one_with_cpu_does_not():
    now, cpu = [100.0], [7.0]
    clock = StoppedClock(clock=lambda: now[0], cpu=lambda: cpu[0], start_thread=False)

    def later(wall: float, used: float) -> float:
        now[0] += wall
        cpu[0] += used
        return clock.read()[1]

    assert later(TICK, 2 * TICK) == 0.0                       # on time, two cores busy
    assert later(5.0, 0.01) == pytest.approx(5.0 - TICK - 0.01)   # stopped: no CPU while the wall clock ran
    assert later(30.0, 30.0) == pytest.approx(4.79)           # the GIL held through a compilation: it ran
    assert later(3.0, 1.0) == pytest.approx(4.79 + 3.0 - TICK - 1.0)   # stopped for part of it
    assert later(LATE, 0.0) == pytest.approx(6.59)            # not later than LATE: no stop is read into it
    assert clock.running() == pytest.approx(now[0] - 6.59)


CHILD = """
import sys, time
from narbench_core import stopped
start = stopped.running()
print("ready", flush=True)
sys.stdin.readline()                       # the parent stops us, lets us go on, then writes a line
print(stopped.stopped_seconds(), stopped.running() - start, flush=True)
"""


def test_a_process_stopped_with_sigstop_sees_the_pause_as_stopped_time():
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=os.getcwd()))
    try:
        assert proc.stdout.readline().strip() == "ready"
        began = time.monotonic()
        proc.send_signal(signal.SIGSTOP)
        time.sleep(3.0)
        proc.send_signal(signal.SIGCONT)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        stopped, ran = map(float, proc.stdout.readline().split())
        elapsed = time.monotonic() - began
    finally:
        proc.kill()
        proc.wait()
    # The stop is seen, and the clock that stands still while stopped leaves out what was seen: stopped and running
    # seconds together are no more than the time that passed (a tick of slack: the reading that closes the stop).
    assert 0.0 < stopped <= elapsed
    assert ran + stopped <= elapsed + TICK
