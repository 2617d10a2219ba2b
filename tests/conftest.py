"""Shared test set-up: a private data root per session (one per pytest-xdist worker), JAX's persistent
compilation cache, how the tests are shared out between two workers, and a second narbench process holding
a folder (``second_process``)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# Tests never touch the user's data root (NARBENCH_DATA): theirs is NARBENCH_TEST_DATA, or a folder in /tmp.
# Each pytest-xdist worker has a folder of its own there, so two processes never write one cache.
_TEST_DATA = os.environ.get("NARBENCH_TEST_DATA", "/tmp/narbench-test-data")
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")             # gw0, gw1: set by pytest-xdist in its workers
os.environ["NARBENCH_DATA"] = os.path.join(_TEST_DATA, _WORKER) if _WORKER else _TEST_DATA
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")     # the Ray executor's tests report nothing to Ray

import pytest  # noqa: E402


# -- two workers ----------------------------------------------------------------------------------------
# `python -m pytest` runs the tests in two pytest-xdist processes (pyproject's addopts: `-n auto`, and the
# worker count below): most of a test's time is JAX compiling on one core, so two fill a 2-core machine. A
# module's tests stay in one worker (its module fixtures are made once), and so do the modules that share
# a costly session fixture, named here with their group. The smoke group, the longest, starts first.
SHARED_FIXTURES = {"smoke_run": "smoke", "bible_prepared": "bible", "bible_de_vocab": "bible"}
FIRST_GROUP = "smoke"
WORKERS = 2


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """Two workers; none (one process) for timed benchmarks, which must have the machine to themselves."""
    if config.getoption("benchmark_enable", False) or (os.cpu_count() or 1) < WORKERS:
        return 0
    return WORKERS


@pytest.hookimpl(tryfirst=True)             # before pytest-xdist reads the groups (its --dist loadgroup)
def pytest_collection_modifyitems(config, items):
    groups: dict[str, str] = {}                  # module -> its group
    for item in items:
        module = item.nodeid.split("::")[0]
        shared = next((g for name, g in SHARED_FIXTURES.items() if name in item.fixturenames), None)
        if shared is not None:
            groups[module] = shared
        else:
            groups.setdefault(module, module)
    for item in items:
        item.add_marker(pytest.mark.xdist_group(groups[item.nodeid.split("::")[0]]))
    items.sort(key=lambda item: groups[item.nodeid.split("::")[0]] != FIRST_GROUP)     # stable


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


# -- Ray's figures in the summary ------------------------------------------------------------------------
WORKER_RAY_NOTES: list[str] = []               # the controller's copy of what the workers noted


def _ray_notes() -> list[str]:
    """What tests/bench/test_ray_executor.py noted in this process (Ray's start-up time and memory)."""
    return list(getattr(sys.modules.get("test_ray_executor"), "RAY_NOTES", []))


def pytest_sessionfinish(session):
    out = getattr(session.config, "workeroutput", None)        # set in a pytest-xdist worker only
    if out is not None:
        out["ray_notes"] = _ray_notes()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    WORKER_RAY_NOTES.extend(getattr(node, "workeroutput", {}).get("ray_notes", []))


def pytest_terminal_summary(terminalreporter, config):
    """Ray's start-up time and memory in the Ray executor's tests, for CI's log; where the benchmarks' latency
    table is when the tests ran in workers (tests/benchmarks/conftest.py prints it in a single process)."""
    notes = _ray_notes() + WORKER_RAY_NOTES
    if notes:
        terminalreporter.section("Ray")
        for line in notes:
            terminalreporter.write_line(line)
    ran = [r.nodeid for reports in terminalreporter.stats.values() for r in reports if hasattr(r, "nodeid")]
    if getattr(config, "workerinput", None) is None and getattr(config.option, "numprocesses", 0) and any(
            nodeid.startswith("tests/benchmarks/") for nodeid in ran):
        terminalreporter.write_line("narbench latency of tests/benchmarks: not printed when two test workers share "
                                    "the CPU; python -m pytest tests/benchmarks -n 0 prints it")
