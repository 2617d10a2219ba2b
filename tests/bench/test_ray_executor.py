"""The Ray executor (``narbench run --executor ray``) on a Ray cluster on this machine: a head that runs
no task and two 1-CPU worker nodes (``ray.cluster_utils.Cluster``), with fake trainings that sleep
(``ray_fakes``). Ray's start-up time and memory are printed in pytest's summary."""
from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import ray
from ray.cluster_utils import Cluster

import grid_fakes
import ray_fakes
from bench import executors, store as st
from bench.executors.raycluster import RayExecutor
from bench.families import load_suite
from bench.runner import Runner
from grid_fakes import fake_spec
from narbench_core.errors import UserError

HERE = Path(__file__).resolve().parent
OBJECT_STORE = 80 * 2**20
RAY_NOTES: list[str] = []           # printed by tests/conftest.py's pytest_terminal_summary

ray.cloudpickle.register_pickle_by_value(ray_fakes)
ray.cloudpickle.register_pickle_by_value(grid_fakes)     # fake decoders go to a timing node with the deps


def _ray_rss_mb() -> float:
    """Resident memory of every Ray process of this machine (raylets, GCS, workers), in MB."""
    total = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"ray" not in cmd or int(pid) == os.getpid():
                continue
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


@pytest.fixture(scope="module")
def cluster():
    start = time.perf_counter()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "object_store_memory": OBJECT_STORE,
                                                      "include_dashboard": False})
    for _ in range(2):
        c.add_node(num_cpus=1, object_store_memory=OBJECT_STORE)
    c.wait_for_nodes()
    RAY_NOTES.append(f"Ray {ray.__version__} test cluster (head + two 1-CPU nodes): up in "
                     f"{time.perf_counter() - start:.1f} s, Ray processes {_ray_rss_mb():.0f} MB resident")
    yield c
    if ray.is_initialized():
        ray.shutdown()
    c.shutdown()


@pytest.fixture
def root(tmp_path, monkeypatch):
    """A fresh data root, passed to the Ray workers by the executor (NARBENCH_DATA), with made-up machine peaks."""
    monkeypatch.setenv("NARBENCH_DATA", str(tmp_path / "data"))
    ray_fakes.seed_machine_peaks(tmp_path / "data")
    return tmp_path / "data"


def _executor(cluster, **kw) -> RayExecutor:
    return RayExecutor(address=cluster.address, poll_s=0.2, **kw)


def _interval(events: list[dict], job: str) -> tuple[float, float]:
    start = next(e["time"] for e in events if e["job"] == job and e["kind"] == "start")
    end = next(e["time"] for e in events if e["job"] == job and e["kind"] == "end")
    return start, end


def test_needs_come_first_and_independent_jobs_run_in_parallel(cluster, root):
    def job(name, needs=()):
        return executors.Job(name, "train", lambda results, n=name: functools.partial(ray_fakes.sleep_job, n, 1.0),
                             needs=tuple(needs))

    def together(name):            # ends only once two of the four have started: they must run at the same time
        return executors.Job(name, "train", lambda results: functools.partial(ray_fakes.together_job, name, 2, 300))

    jobs = [job("teacher"), job("distill", ["teacher"]), job("student", ["distill"]),
            *(together(f"together{i}") for i in range(4))]
    saved = []
    board = executors.Board("ray", save=saved.append)
    executor = _executor(cluster)
    start = time.perf_counter()
    try:
        results = executor.run(jobs, board)
    finally:
        executor.shutdown()
    elapsed = time.perf_counter() - start
    assert results["student"] == "teacher>distill>student"       # each got its needs' results, in order
    events = ray_fakes.events(root)
    t, d, s = (_interval(events, n) for n in ("teacher", "distill", "student"))
    assert t[1] <= d[0] and d[1] <= s[0]                           # a job starts once its needs have ended
    assert all(results[f"together{i}"] == f"together{i}" for i in range(4))   # two at a time at least
    starts = [e for e in events if e["kind"] == "start"]
    assert len({e["node"] for e in starts}) == 2                   # on both worker nodes
    assert len({e["pid"] for e in starts}) == len(jobs)            # each in a fresh worker process
    assert saved[-1]["executor"] == "ray" and {c["state"] for c in saved[-1]["cells"]} == {"done"}
    busy = sum(b - a for a, b in (_interval(events, e["job"]) for e in starts))
    RAY_NOTES.append(f"7 jobs (a chain of 3 sleeping 1 s, 4 that wait for each other) on two 1-CPU nodes: "
                     f"{elapsed:.1f} s in all, {busy:.1f} s inside the jobs, the rest starting a worker per job")


def test_a_user_error_is_not_retried_and_reaches_the_user(cluster, root):
    job = executors.Job("refusing", "train",
                        lambda results: functools.partial(ray_fakes.refuse_job, "the spec is wrong; fix it"))
    board = executors.Board("ray")
    executor = _executor(cluster, max_retries=3)
    with pytest.raises(UserError) as err:
        executor.run([job], board)
    assert str(err.value) == "refusing: the spec is wrong; fix it"
    assert len(ray_fakes.events(root, "start")) == 1               # one attempt: never retried
    assert board.cells["refusing"].state == "failed"
    assert not ray.is_initialized()                                # the driver let the cluster go


def test_a_worker_that_does_not_see_the_data_root_refuses(cluster, root, monkeypatch):
    """The marker check, in the workers: a driver whose marker the workers cannot find (here: it writes it
    under another name, as if its data root were a disk of its own) stops the run in one line."""
    from bench.executors import raycluster

    monkeypatch.setattr(raycluster, "MARKER_PREFIX", "not-shared-")     # the driver's side only
    job = executors.Job("x", "train", lambda results: functools.partial(ray_fakes.sleep_job, "x", 0))
    with pytest.raises(UserError, match="does not see the driver's data root .*NARBENCH_DATA on a filesystem"):
        _executor(cluster).run([job], executors.Board("ray"))
    assert ray_fakes.events(root) == []


SPEC = fake_spec("raygrid", test=["test"], ar_decoders=["greedy"], padir_iterations=[2], max_test_sentences=8)


def _spec(tmp_path):
    path = tmp_path / "raygrid.toml"
    path.write_text(SPEC)
    return load_suite(path)


STABLE = ("system", "test_set", "bleu", "chrf", "n_sentences", "passes_mean", "checkpoint", "train_steps", "distill",
          "stutter_per_1k_words")


def _stable(rows) -> list[dict]:
    return sorted(({k: r.get(k) for k in STABLE} for r in rows), key=lambda r: (r["system"], r["test_set"]))


def _run_through(cluster, tmp_path) -> st.RunStore:
    """The fake suite run by the Ray executor on the test cluster; its run folder, released."""
    spec = _spec(tmp_path)
    run = st.open_run(tmp_path / "results", spec.name, spec.spec_hash(), spec.to_toml(), "narbench run")[0]
    try:
        executor = _executor(cluster, run_id=run.run_id, logs_to=run.path / st.LOGS)
        Runner(spec, ray_fakes.deps(), run, progress=False, executor=executor).run()
    finally:
        run.release()
    return run


def test_a_lost_node_is_retried_elsewhere(cluster, root, tmp_path, monkeypatch):
    monkeypatch.setenv(ray_fakes.SLEEP_ENV, "4")
    removed = []

    def remove_a_busy_node():                      # the first node a training starts on goes away
        while not removed:
            started = ray_fakes.events(root, "start") if (root / "fake-events").is_dir() else []
            node = next((n for n in cluster.worker_nodes for e in started if e["node"] == n.node_id), None)
            if node is not None:
                cluster.remove_node(node)
                removed.append(node.node_id)
            time.sleep(0.1)

    killer = threading.Thread(target=remove_a_busy_node, daemon=True)
    killer.start()
    try:
        run = _run_through(cluster, tmp_path)
    finally:
        removed.append(None)
        cluster.add_node(num_cpus=1, object_store_memory=OBJECT_STORE)    # back to two nodes for the next tests
        cluster.wait_for_nodes()
    assert removed[0] is not None
    board = json.loads((run.path / st.CELLS).read_text())
    assert max(c["attempt"] for c in board["cells"]) >= 2          # the lost job ran again
    assert {c["state"] for c in board["cells"]} == {"done"}
    trained = sorted(p.name for p in (root / "fake-checkpoints").iterdir())
    assert len(trained) == 3                                       # one checkpoint per hash: AR, PaDIR, distilled PaDIR
    keys = [(r["system"], r["test_set"]) for r in run.rows()]
    assert len(keys) == len(set(keys)) == 3
    logs = sorted(p.name for p in (run.path / st.LOGS).iterdir())
    assert any(name.endswith(".2.log") for name in logs)           # each attempt's log reached the run folder


def test_a_timing_node_times_every_system_and_trains_nothing(cluster, root, tmp_path):
    node = cluster.add_node(num_cpus=0, resources={"narbench_timing": 1}, object_store_memory=OBJECT_STORE)
    cluster.wait_for_nodes()
    try:
        run = _run_through(cluster, tmp_path)
    finally:
        cluster.remove_node(node)
    env = json.loads((run.path / st.ENV).read_text())
    assert env["executor"]["timing_node"] == node.node_id and env["cpu_signature"]
    assert node.node_id not in {e["node"] for e in ray_fakes.events(root, "start")}   # it trained nothing
    board = {c["cell"]: c for c in json.loads((run.path / st.CELLS).read_text())["cells"]}
    assert board["time+score fake_task:test"]["state"] == "done"
    timing_log = next((run.path / st.LOGS).glob("time-score-fake_task-test-*.1.log"))
    assert json.loads(timing_log.read_text().splitlines()[0])["pid"] != os.getpid()     # timed in a Ray worker
    assert sorted(r.system for r in run.rows()) == ["ar-greedy", "padir-s2-u0.15", "padir-s2-u0.15-distill"]
    assert len(run.samples()) == 3 * 8 and all(s["hypothesis"] for s in run.samples())
    from bench.verify import verify_run
    assert verify_run(run.path) == []


def _driver(cluster, out: Path, spec_path: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(HERE / "ray_driver.py"), cluster.address, str(out), str(spec_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))


def test_a_killed_driver_resumes_without_retraining(cluster, tmp_path, monkeypatch):
    spec = _spec(tmp_path)
    spec_path = tmp_path / "raygrid.toml"
    # Uninterrupted, in this process with the local executor, on its own data root.
    monkeypatch.setenv("NARBENCH_DATA", str(tmp_path / "data-whole"))
    ray_fakes.seed_machine_peaks(tmp_path / "data-whole")
    whole = st.open_run(tmp_path / "whole", spec.name, spec.spec_hash(), spec.to_toml(), "narbench run")[0]
    Runner(spec, ray_fakes.deps(), whole, progress=False).run()
    whole.release()
    # Killed (SIGKILL) once the first training has ended, then started again.
    root = tmp_path / "data"
    monkeypatch.setenv("NARBENCH_DATA", str(root))
    ray_fakes.seed_machine_peaks(root)
    monkeypatch.setenv(ray_fakes.SLEEP_ENV, "2")
    first = _driver(cluster, tmp_path / "results", spec_path)
    while not ((root / "fake-events").is_dir() and ray_fakes.events(root, "end")):
        assert first.poll() is None, first.communicate()[1]
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.communicate()
    ended = {e["job"] for e in ray_fakes.events(root, "end")}
    runs = [p for p in (tmp_path / "results" / spec.name).iterdir() if p.is_dir()]
    again = _driver(cluster, tmp_path / "results", spec_path)
    out, err = again.communicate(timeout=600)
    assert again.returncode == 0, err
    assert [p for p in (tmp_path / "results" / spec.name).iterdir() if p.is_dir()] == runs
    assert Path(out.strip()) == runs[0]                            # the same run id
    ends = [e["job"] for e in ray_fakes.events(root, "end") if not e["job"].startswith("distill")]
    assert len(ends) == len(set(ends)) == 3                        # no model trained twice ...
    assert ended <= set(ends)                                      # ... the one finished before the kill included
    assert _stable(st.RunStore(runs[0]).rows()) == _stable(whole.rows())


@pytest.mark.slow
def test_the_smoke_suite_through_ray_matches_the_local_executor(cluster, smoke_run, tmp_path):
    """The real trainer and distiller in Ray workers: the same checkpoints (hashes) as the local executor's
    run (``smoke_run``), the distillation and the distilled PaDIR model trained again (the local run's are
    moved aside first; the AR teacher and the raw PaDIR model, trained by the same job code, are reused) and,
    on this machine, the same hypotheses; every figure verifies."""
    import shutil

    from bench.cli import main
    from models.distill import RECORD_NAME
    from narbench_core.paths import data_root, resolve

    code, err, local_out = smoke_run
    assert code == 0, err
    local = st.RunStore(st.resolve_run_dir(local_out / "smoke"))
    trained = sorted({resolve(r.checkpoint) for r in local.rows() if r.distill})
    # The run's own distillation: the folder whose record the run copied (the worker's data root may hold other
    # tests' distillations of the same task, made before this one or after).
    record = json.loads((local.path / st.DISTILL).read_text())
    distilled = [path for path in sorted((data_root() / "distill").glob("synthetic_d0-*"))
                 if (path / RECORD_NAME).is_file() and json.loads((path / RECORD_NAME).read_text()) == record]
    assert len(trained) == 1 and len(distilled) == 1
    aside = {path: tmp_path / "aside" / path.parent.name / path.name for path in [*trained, *distilled]}
    for path, to in aside.items():
        to.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(path, to)
    try:
        start = time.perf_counter()
        assert main(["run", "--suite", "smoke", "--out", str(tmp_path / "results"), "--no-progress",
                     "--executor", "ray", "--address", cluster.address]) == 0
        RAY_NOTES.append(f"the smoke suite through the Ray executor (a distillation and a training): "
                         f"{time.perf_counter() - start:.0f} s")
    finally:
        for path, to in aside.items():
            if not path.exists():
                shutil.move(to, path)
    remote = st.RunStore(st.resolve_run_dir(tmp_path / "results" / "smoke"))
    assert sorted((r.system, r.checkpoint) for r in remote.rows()) == sorted((r.system, r.checkpoint)
                                                                             for r in local.rows())
    assert all((path / "narbench.json").is_file() for path in trained)      # trained again, by the workers
    hyps = lambda run: sorted((s["system"], s["test_set"], s["index"], s["hypothesis"]) for s in run.samples())
    assert hyps(remote) == hyps(local)
    board = json.loads((remote.path / st.CELLS).read_text())
    assert board["executor"] == "ray" and {c["state"] for c in board["cells"]} == {"done"}
    assert {c["kind"] for c in board["cells"]} == {"train", "distill", "evaluate"}
    models = {r.checkpoint for r in local.rows()}                  # a training job each (finished ones: found)
    assert len(list((remote.path / st.LOGS).glob("train-*.1.log"))) == len(models) == 3
    assert json.loads((remote.path / "env.json").read_text())["executor"]["executor"] == "ray"
