"""Shared test set-up: a private data root per session (one per pytest-xdist worker), JAX's persistent
compilation cache, how the tests are shared out between two workers, and a second narbench process holding
a folder (``second_process``)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# Tests never touch the user's data root (NARBENCH_DATA): theirs is NARBENCH_TEST_DATA, or a folder in /tmp.
# Each pytest-xdist worker has a folder of its own there ("main" without workers), so two processes never write one
# data cache, and the compilation cache beside them is never inside a data root a test moves.
_TEST_DATA = os.environ.get("NARBENCH_TEST_DATA", "/tmp/narbench-test-data")
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")             # gw0, gw1: set by pytest-xdist in its workers
os.environ["NARBENCH_DATA"] = os.path.join(_TEST_DATA, _WORKER or "main")   # "main": one process (-n 0)
# Compiled programs are no data: both workers, and every process a test starts (CLI runs on data roots of their own,
# timing workers, Ray workers), share one compilation cache, so a program compiled once is loaded everywhere after.
if os.environ.get("NARBENCH_JAX_CACHE", "1") != "0":
    os.environ["NARBENCH_JAX_CACHE"] = os.path.join(_TEST_DATA, "jax_cache")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")     # the Ray executor's tests report nothing to Ray

import pytest  # noqa: E402


# -- two workers ----------------------------------------------------------------------------------------
# `python -m pytest` runs the tests in two pytest-xdist processes (pyproject's addopts `-n auto`; the count is
# `pytest_xdist_auto_num_workers` below), each pinned to a core of its own: most of a test's time is JAX
# compiling on one core, so two workers fill a 2-core machine, and pinned, their thread pools do not slow
# each other. A worker runs whole groups: a module (its module fixtures are made once), or the modules of
# one of GROUPS, which share a costly session fixture (SHARED_FIXTURES), or one test of a SPREAD module. The longest
# group starts first, then the EARLY modules.
GROUPS = {
    "smoke": ("tests/bench/test_smoke_e2e.py", "tests/bench/test_ray_executor.py"),
    "bible": ("tests/data/test_bible_corpus.py", "tests/data/test_cli_data.py", "tests/data/test_seqio_tasks.py",
              "tests/data/test_vocab_spm.py"),
}
SHARED_FIXTURES = {"smoke_run": "smoke", "bible_prepared": "bible", "bible_de_vocab": "bible"}
FIRST_GROUP = "smoke"
# Modules whose tests share no module fixture and take minutes together: each test is a unit of its own, which
# either worker may take.
SPREAD = ("tests/models/test_train.py",)
# Units handed out right after the smoke group, the longest first: one that starts last finishes alone (2026-12-03:
# test_train, handed out at 794 s, ran 222 s on one worker while the other had been idle since 907 s).
EARLY = ("tests/models/test_train.py", "tests/models/test_padir_recipe.py", "tests/models/test_ort.py",
         "tests/data/test_packs.py", "tests/bench/test_serving.py")
WORKERS = 2
_GROUP_OF = {module: group for group, modules in GROUPS.items() for module in modules}

if _WORKER and hasattr(os, "sched_setaffinity"):
    _cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {_cpus[int(_WORKER.removeprefix("gw")) % len(_cpus)]})


def group_of(nodeid: str) -> str:
    """The group a test runs in: its module's, unless GROUPS puts the module in a named one (SPREAD: its own)."""
    module = nodeid.split("::")[0]
    return nodeid if module in SPREAD else _GROUP_OF.get(module, module)


def _dispatch_rank(nodeid: str) -> int:
    """Where a test's unit is handed out: the smoke group first, then EARLY in its order, then the rest."""
    module = nodeid.split("::")[0]
    if _GROUP_OF.get(module) == FIRST_GROUP:
        return 0
    return 1 + EARLY.index(module) if module in EARLY else 1 + len(EARLY)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """Two workers; none (one process) for timed benchmarks, which must have the machine to themselves."""
    if config.getoption("benchmark_enable", False) or (os.cpu_count() or 1) < WORKERS:
        return 0
    return WORKERS


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadscope` (pyproject's addopts) with our groups for scopes."""
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return GroupScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    for item in items:
        module = item.nodeid.split("::")[0]
        for name, group in SHARED_FIXTURES.items():
            if name in item.fixturenames and _GROUP_OF.get(module) != group:
                raise pytest.UsageError(f"{module} uses the fixture {name}: add it to GROUPS[{group!r}] in "
                                        f"tests/conftest.py, so that one worker makes {name} once")
    items.sort(key=lambda item: _dispatch_rank(item.nodeid))                  # stable: the rest keep their order


# -- compile time -----------------------------------------------------------------------------------------
# Most of the suite's time is XLA compiling tiny models, not running them, so tests compile without XLA's backend
# optimizations (JAX_DISABLE_MOST_OPTIMIZATIONS: LLVM at -O0 and no expensive passes; the same programs, compiled
# sooner), in this process and every child it starts. Measured 2026-11-29 (Intel Xeon, a core each, cold caches):
# test_sharding 67 -> 36 s, test_speedmap's real decoders 55 -> 33 s, test_ort's float32 graphs 39-43 -> 27-29 s;
# but tests that run hundreds of training steps ran slower (test_padir_learns_copy 40-47 -> 61-66 s): those are
# marked `optimized` and compile as users do. Timed benchmarks (--benchmark-enable) always compile as users do.
NO_OPTIMIZATION = "JAX_DISABLE_MOST_OPTIMIZATIONS"


def pytest_configure(config):
    config.addinivalue_line("markers", "optimized: runs many steps; compiles with XLA's optimizations (conftest.py)")
    if not config.getoption("benchmark_enable", False):
        os.environ.setdefault(NO_OPTIMIZATION, "1")


@pytest.fixture(autouse=True)
def _optimized_compiles(request):
    """A test marked ``optimized`` compiles with XLA's optimizations (its compilations are cached apart)."""
    if request.node.get_closest_marker("optimized") is None:
        yield
        return
    from xla_settings import optimizations

    with optimizations(True):
        yield


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
    if getattr(config.option, "numprocesses", 0) and any(
            getattr(r, "nodeid", "").startswith("tests/benchmarks/")
            for reports in terminalreporter.stats.values() for r in reports):
        terminalreporter.write_line("narbench latency of tests/benchmarks: not printed when two test workers share "
                                    "the CPU; python -m pytest tests/benchmarks -n 0 prints it")
