"""Shared test set-up: a private data root per session, JAX's persistent compilation cache, and a second
narbench process holding a folder (``second_process``)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# Tests never touch the user's data root unless NARBENCH_TEST_DATA points at a shared one (CI caches
# the Bible wheel and vocabularies there between steps).
os.environ.setdefault("NARBENCH_DATA", os.environ.get("NARBENCH_TEST_DATA", "/tmp/narbench-test-data"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")     # the Ray executor's tests report nothing to Ray

import pytest  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _compilation_cache():
    from narbench_core.paths import enable_compilation_cache

    return enable_compilation_cache()


ROOT = str(Path(__file__).resolve().parents[1])

# A second narbench process: holds a folder (or registers as busy) until its stdin closes; "die" is killed
# by SIGKILL while holding, which leaves its lock file behind.
SECOND_PROCESS = """
import os, signal, sys
sys.path.insert(0, sys.argv[1])
from narbench_core import lock
mode, target = sys.argv[2], sys.argv[3]
with (lock.hold(target, "narbench run --suite test") if mode != "busy" else lock.busy(target)):
    print("ready", flush=True)
    if mode == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.stdin.read()
"""


class SecondProcess:
    """A second process holding ``target`` (mode "hold"), registered busy as doing ``target`` ("busy"), or
    killed by SIGKILL while holding it ("die"); ready when constructed."""

    def __init__(self, mode: str, target):
        self.proc = subprocess.Popen([sys.executable, "-c", SECOND_PROCESS, ROOT, mode, str(target)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=dict(os.environ))
        assert self.proc.stdout.readline().strip() == b"ready"
        self.pid = self.proc.pid
        if mode == "die":
            self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
        self.proc.wait()
        self.proc.stdout.close()


@pytest.fixture
def second_process():
    """``second_process(mode, target)`` starts a ``SecondProcess``; each is stopped after the test."""
    started = []
    yield lambda mode, target: started.append(SecondProcess(mode, target)) or started[-1]
    for p in started:
        p.stop()


def pytest_terminal_summary(terminalreporter):
    """Ray's start-up time and memory in the Ray executor's tests (tests/bench/test_ray_executor.py), for CI's log."""
    notes = getattr(sys.modules.get("test_ray_executor"), "RAY_NOTES", None)
    if notes:
        terminalreporter.section("Ray")
        for line in notes:
            terminalreporter.write_line(line)
